//! Usage reported by a provider, read from Python values (SPEC ).

use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyDict, PyInt};
use tollgate::{Counter, Usage};

/// `TypeError` unless `value` is an `int` (a `bool` is not).
pub(crate) fn expect_int(name: &str, value: &Bound<'_, PyAny>) -> PyResult<()> {
    if value.is_instance_of::<PyBool>() || !value.is_instance_of::<PyInt>() {
        let kind = value
            .get_type()
            .name()
            .map(|n| n.to_string())
            .unwrap_or_default();
        return Err(PyTypeError::new_err(format!(
            "{name} must be an int, got {kind}"
        )));
    }
    Ok(())
}

/// A count given by the caller: an `int >= 0`, else `TypeError` /
/// `ValueError` (a programming error, not provider data).
pub(crate) fn strict_count(name: &str, value: &Bound<'_, PyAny>) -> PyResult<Counter> {
    if value.is_none() {
        return Ok(Counter::Absent);
    }
    expect_int(name, value)?;
    match value.extract::<i128>() {
        Ok(n) if n < 0 => Err(PyValueError::new_err(format!(
            "{name} must be >= 0, got {n}"
        ))),
        Ok(n) => u64::try_from(n)
            .map(Counter::Value)
            .map_err(|_| PyValueError::new_err(format!("{name} must be below 2**64, got {n}"))),
        Err(_) => Err(PyValueError::new_err(format!(
            "{name} is out of range (0 to 2**64 - 1)"
        ))),
    }
}

/// A counter found in provider data (SPEC Q-6): absent, a valid count, or
/// invalid (null, negative, fractional, text...).
fn data_count(value: Option<Bound<'_, PyAny>>) -> Counter {
    let Some(value) = value else {
        return Counter::Absent;
    };
    if value.is_none() || value.is_instance_of::<PyBool>() || !value.is_instance_of::<PyInt>() {
        return Counter::Invalid;
    }
    value
        .extract::<u64>()
        .map_or(Counter::Invalid, Counter::Value)
}

/// Reads member `name` of a dict or attribute of an object; absent when
/// neither has it.
fn member<'py>(obj: &Bound<'py, PyAny>, name: &str) -> Option<Bound<'py, PyAny>> {
    if let Ok(d) = obj.cast::<PyDict>() {
        return d.get_item(name).ok().flatten();
    }
    obj.getattr(name).ok()
}

/// The usage an OpenAI (`prompt_tokens` / `completion_tokens` /
/// `total_tokens`, or the Responses API's `input_tokens` / `output_tokens`)
/// or Anthropic (`input_tokens` / `output_tokens`) usage object or dict
/// reports, by the rules of Q-6. An object with neither is unknown usage.
pub(crate) fn from_object(obj: &Bound<'_, PyAny>) -> PyResult<Usage> {
    let total = member(obj, "total_tokens");
    let input = member(obj, "prompt_tokens").or_else(|| member(obj, "input_tokens"));
    let output = member(obj, "completion_tokens").or_else(|| member(obj, "output_tokens"));
    // Anthropic reports cache reads and writes apart from input_tokens;
    // its limiter counts them as input (cache reads excepted, which are
    // telemetry like OpenAI's cached tokens).
    let cache_write = member(obj, "cache_creation_input_tokens");
    let input = match (data_count(input), data_count(cache_write)) {
        (Counter::Value(i), Counter::Value(w)) => Counter::Value(i.saturating_add(w)),
        (i, _) => i,
    };
    Ok(Usage::from_counters(
        data_count(total),
        input,
        data_count(output),
        Counter::Absent,
    ))
}

/// The usage `value` reports: the object `extractor(value)` returns, or
/// without an extractor `value`'s `usage` member (an SDK response or
/// stream event, or a dict). `None` when there is none (or the extractor
/// returned `None`); an extractor that raises is reported as a
/// `RuntimeWarning` and counts as none (the estimate stays charged).
pub(crate) fn reported(
    value: &Bound<'_, PyAny>,
    extractor: Option<&Bound<'_, PyAny>>,
) -> Option<Usage> {
    let py = value.py();
    let found = match extractor {
        Some(f) => match f.call1((value,)) {
            Ok(u) => Some(u),
            Err(e) => {
                let _ = warn(
                    py,
                    &format!("the usage= function raised {e}; usage counted as unknown"),
                );
                None
            }
        },
        None => member(value, "usage"),
    };
    let found = found.filter(|u| !u.is_none())?;
    from_object(&found).ok()
}

/// `warnings.warn(message, RuntimeWarning)`.
fn warn(py: Python<'_>, message: &str) -> PyResult<()> {
    let category = py.get_type::<pyo3::exceptions::PyRuntimeWarning>();
    py.import("warnings")?
        .call_method1("warn", (message, category))?;
    Ok(())
}

//! Engine errors as the package's Python exceptions (SPEC PY-6).
//!
//! The code, status, message and retry hint of an admission or call error
//! come from the gateway's own mapping (`tollgate_gateway::error::ApiError`),
//! so `exc.code` is exactly the `error.code` the gateway answers with.

use std::time::Duration;

use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyDict, PyType};
use tollgate::clock::Instant;
use tollgate::lifecycle::CallError;
use tollgate::{AdmissionError, Phase};
use tollgate_gateway::config::ConfigError;
use tollgate_gateway::error::ApiError;

/// The exception class `name` of `tollgate._errors`.
pub(crate) fn class<'py>(py: Python<'py>, name: &str) -> PyResult<Bound<'py, PyType>> {
    static MODULE: PyOnceLock<Py<PyModule>> = PyOnceLock::new();
    let module = MODULE.get_or_try_init(py, || {
        Ok::<_, PyErr>(py.import("tollgate._errors")?.unbind())
    })?;
    Ok(module.bind(py).getattr(name)?.cast_into::<PyType>()?)
}

/// `tollgate._errors.<name>(message, **details)` as a `PyErr`.
pub(crate) fn make(
    py: Python<'_>,
    name: &str,
    message: String,
    details: &[(&str, Py<PyAny>)],
) -> PyErr {
    let built = (|| -> PyResult<PyErr> {
        let kwargs = PyDict::new(py);
        for (key, value) in details {
            kwargs.set_item(key, value)?;
        }
        let exc = class(py, name)?.call((message,), Some(&kwargs))?;
        Ok(PyErr::from_value(exc))
    })();
    built.unwrap_or_else(|e| e)
}

/// `value` as a Python object (`None` if it cannot be converted).
pub(crate) fn any<'py, T: IntoPyObject<'py>>(py: Python<'py>, value: T) -> Py<PyAny> {
    use pyo3::IntoPyObjectExt;
    value.into_py_any(py).unwrap_or_else(|_| py.None())
}

/// The class for a gateway error code.
fn class_of(code: &str, phase: Option<Phase>) -> &'static str {
    match code {
        "admission_rejected" => "AdmissionRejected",
        "admission_wait_deadline_exceeded" | "deadline_exceeded" => "DeadlineExceeded",
        "estimate_exceeds_limit" => "EstimateExceedsLimit",
        "token_estimate_required" => "TokenEstimateRequired",
        "quota_store_unavailable" => "QuotaStoreUnavailable",
        "shutting_down" => "Closed",
        "circuit_open" => "CircuitOpen",
        c if c.starts_with("upstream_") => "UpstreamError",
        _ if phase.is_some() => "DeadlineExceeded",
        _ => "AdmissionError",
    }
}

/// The Python exception of a gateway error response, with `code`,
/// `status`, `retry_after` and the extra `details`.
fn from_api(
    py: Python<'_>,
    api: &ApiError,
    code_override: Option<&str>,
    phase: Option<Phase>,
    scope: Option<&str>,
    details: &mut Vec<(&'static str, Py<PyAny>)>,
) -> PyErr {
    let code = code_override.unwrap_or_else(|| api.reason()).to_owned();
    let mut message = api.body.error.message.clone();
    if let Some(scope) = scope {
        message = format!("{message} (scope {scope:?})");
    }
    let name = class_of(&code, phase);
    let retry_after = api.retry_after.map(|d| d.as_secs_f64());
    details.push(("code", any(py, code)));
    details.push(("status", any(py, api.status.as_u16())));
    details.push(("retry_after", any(py, retry_after)));
    if let Some(phase) = phase {
        details.push(("phase", any(py, phase.as_str())));
    }
    if let Some(scope) = scope {
        details.push(("scope", any(py, scope)));
    }
    make(py, name, message, details)
}

/// The exception of an admission refusal on `scope`.
pub(crate) fn admission(py: Python<'_>, e: &AdmissionError, scope: &str) -> PyErr {
    let mut api = ApiError::from_admission(e, Instant::now());
    // Codes the gateway folds into an internal error keep the engine's name.
    let code = (api.reason() == "admission_error").then(|| e.kind());
    if let AdmissionError::TokenEstimateRequired { .. } = e {
        api.body.error.message =
            "the scope limits tokens, so every call needs tokens= (or input_tokens= / \
             output_tokens=)"
                .to_owned();
    }
    from_api(py, &api, code, e.phase(), Some(scope), &mut Vec::new())
}

/// The exception of a supervised call that did not complete.
#[allow(dead_code)] // used by the supervised calls (next step)
pub(crate) fn call(py: Python<'_>, e: &CallError, scope: &str) -> PyErr {
    if let CallError::Admission(a) = e {
        return admission(py, a, scope);
    }
    let api = ApiError::from_call(e, Instant::now());
    let code = match api.reason() {
        "internal_error" | "admission_error" => Some(e.kind()),
        _ => None,
    };
    let mut details = Vec::new();
    if let CallError::Provider { attempts, .. } = e {
        details.push(("attempts", any(py, attempts)));
    }
    from_api(py, &api, code, e.phase(), Some(scope), &mut details)
}

/// The exception of an invalid configuration. `located` says whether the
/// line and column mean something to the user (a file, not keyword
/// arguments turned into TOML).
pub(crate) fn config(py: Python<'_>, e: &ConfigError, located: bool) -> PyErr {
    let mut message = match &e.field {
        Some(field) => format!("{}: {field}: {}", e.file, e.reason),
        None => format!("{}: {}", e.file, e.reason),
    };
    let (line, column) = match (located, e.position()) {
        (true, Some((l, c))) => {
            message.push_str(&format!(" (line {l}, column {c})"));
            (Some(l), Some(c))
        }
        _ => (None, None),
    };
    let obj = |v: Option<String>| any(py, v);
    let num = |v: Option<usize>| any(py, v);
    make(
        py,
        "ConfigError",
        message,
        &[
            ("kind", obj(Some(e.kind.as_str().to_owned()))),
            ("field", obj(e.field.clone())),
            ("file", obj(Some(e.file.clone()))),
            ("line", num(line)),
            ("column", num(column)),
        ],
    )
}

/// A configuration error of a keyword argument checked here rather than by
/// the gateway's parser.
pub(crate) fn invalid(py: Python<'_>, field: &str, reason: impl std::fmt::Display) -> PyErr {
    make(
        py,
        "ConfigError",
        format!("{field}: {reason}"),
        &[("kind", any(py, "invalid")), ("field", any(py, field))],
    )
}

/// Seconds as a duration: finite and not negative, else `ValueError`.
pub(crate) fn seconds(name: &str, value: f64) -> PyResult<Duration> {
    if !(value.is_finite() && value >= 0.0) {
        return Err(pyo3::exceptions::PyValueError::new_err(format!(
            "{name} must be a finite number of seconds >= 0, got {value}"
        )));
    }
    Duration::try_from_secs_f64(value)
        .map_err(|e| pyo3::exceptions::PyValueError::new_err(format!("{name}: {e}")))
}

//! A limiter's configuration: keyword arguments or a TOML file, both read
//! by the gateway's own parser and rules (SPEC PY-2, CFG-1..3).
//!
//! Keyword arguments are turned into the TOML document they stand for
//! (`scopes={"openai": {"rpm": 500}}` is `[scopes.openai] rpm = 500`) and
//! parsed by `GatewayConfig::library_from_toml`, so both spellings accept
//! exactly the same settings and report the same errors, naming the
//! setting. Two defaults are the library's rather than the gateway's
//! (SPEC ADM-5): a full queue makes callers wait (`overflow = "wait"`),
//! and a scope's queue holds 1024 waiting calls, unless `[admission]`
//! says otherwise.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::types::{
    PyBool, PyDelta, PyDeltaAccess, PyDict, PyFloat, PyInt, PyList, PyString, PyTuple,
};
use tollgate::AdmissionController;
use tollgate::config::{ControllerConfig, Overflow};
use tollgate_gateway::config::{GatewayConfig, QuotaStoreConfig};
use tollgate_redis::{RedisBackend, RedisSettings};

use crate::errors;
use crate::runtime;

/// The library's default queue capacity per scope.
const QUEUE_CAPACITY: usize = 1024;

/// The origin keyword arguments are reported as.
const KWARGS: &str = "<Limiter arguments>";

/// A validated configuration and what its text set explicitly.
pub(crate) struct Settings {
    pub(crate) gateway: GatewayConfig,
    overflow_set: bool,
    queue_capacity_set: bool,
}

impl Settings {
    /// From keyword arguments: each table name with its Python value
    /// (`None` = not given).
    pub(crate) fn from_kwargs(
        py: Python<'_>,
        tables: &[(&str, Option<&Bound<'_, PyAny>>)],
    ) -> PyResult<Settings> {
        let mut doc = toml::Table::new();
        for (name, value) in tables {
            if let Some(value) = value.filter(|v| !v.is_none())
                && let Some(v) = to_toml(value, name, &mut Vec::new())?
            {
                doc.insert((*name).to_owned(), v);
            }
        }
        let text = toml::to_string(&doc).map_err(|e| {
            PyTypeError::new_err(format!("cannot express the settings as TOML: {e}"))
        })?;
        let gateway = GatewayConfig::library_from_toml(&text, KWARGS)
            .map_err(|e| errors::config(py, &e, false))?;
        Ok(Settings::new(gateway, &doc))
    }

    /// From a TOML file.
    pub(crate) fn from_file(py: Python<'_>, path: &Path) -> PyResult<Settings> {
        let gateway =
            GatewayConfig::load_library(path).map_err(|e| errors::config(py, &e, true))?;
        let text = std::fs::read_to_string(path).unwrap_or_default();
        let doc = text.parse::<toml::Table>().unwrap_or_default();
        Ok(Settings::new(gateway, &doc))
    }

    /// From TOML text; `origin` names it in errors.
    pub(crate) fn from_text(py: Python<'_>, text: &str, origin: &str) -> PyResult<Settings> {
        let gateway = GatewayConfig::library_from_toml(text, origin)
            .map_err(|e| errors::config(py, &e, true))?;
        let doc = text.parse::<toml::Table>().unwrap_or_default();
        Ok(Settings::new(gateway, &doc))
    }

    fn new(gateway: GatewayConfig, doc: &toml::Table) -> Settings {
        let admission = doc.get("admission").and_then(toml::Value::as_table);
        let set = |key: &str| admission.is_some_and(|a| a.contains_key(key));
        Settings {
            gateway,
            overflow_set: set("overflow"),
            queue_capacity_set: set("queue_capacity"),
        }
    }

    /// The engine's controller settings.
    pub(crate) fn controller_config(&self, concurrency: Option<u64>) -> ControllerConfig {
        let admission = &self.gateway.admission;
        ControllerConfig {
            scopes: self
                .gateway
                .scopes
                .iter()
                .map(|s| s.to_scope_config())
                .collect(),
            queue_capacity: if self.queue_capacity_set {
                admission.queue_capacity
            } else {
                QUEUE_CAPACITY
            },
            overflow: if self.overflow_set {
                admission.overflow
            } else {
                Overflow::Wait
            },
            concurrency,
            pools: Vec::new(),
            max_wait: admission.max_wait,
            cooldown: self.gateway.cooldown,
        }
    }

    /// Builds the controller, on the shared store when `[quota_store]`
    /// says `redis` (SPEC PY-5).
    pub(crate) fn build(
        &self,
        py: Python<'_>,
        concurrency: Option<u64>,
    ) -> PyResult<AdmissionController> {
        let mut builder =
            AdmissionController::builder().config(self.controller_config(concurrency));
        if let QuotaStoreConfig::Redis(redis) = &self.gateway.quota_store {
            let url = self
                .gateway
                .quota_store_url()
                .map_err(|e| errors::config(py, &e, false))?
                .unwrap_or_default();
            let settings = RedisSettings::new(url)
                .prefix(redis.prefix.clone())
                .timeout(redis.timeout)
                .on_unavailable(redis.on_unavailable);
            let _runtime = runtime::enter();
            let backend = RedisBackend::new(settings)
                .map_err(|e| errors::invalid(py, "quota_store.url", e))?;
            builder = builder.shared_store(Arc::new(backend));
        }
        let _runtime = runtime::enter();
        builder
            .build()
            .map_err(|e| errors::invalid(py, &e.field, &e.reason))
    }
}

/// How deeply settings may nest (dicts and lists): far more than any real
/// configuration, and a bound that keeps settings nested without end from
/// overflowing the stack.
const MAX_DEPTH: usize = 64;

/// A Python value as TOML; `None` (no value) for `None`. `inside` holds
/// the dicts and lists `value` is in: one that contains itself, or
/// nesting deeper than [`MAX_DEPTH`], is refused with a `ConfigError`
/// naming the setting rather than recursing until the stack overflows.
fn to_toml(
    value: &Bound<'_, PyAny>,
    path: &str,
    inside: &mut Vec<*mut pyo3::ffi::PyObject>,
) -> PyResult<Option<toml::Value>> {
    if value.is_none() {
        return Ok(None);
    }
    let container = value.is_instance_of::<PyDict>()
        || value.is_instance_of::<PyList>()
        || value.is_instance_of::<PyTuple>();
    if container {
        let reason = if inside.contains(&value.as_ptr()) {
            "contains itself (a dict or list inside its own value)".to_owned()
        } else if inside.len() >= MAX_DEPTH {
            format!("nested more than {MAX_DEPTH} levels deep")
        } else {
            inside.push(value.as_ptr());
            let converted = container_to_toml(value, path, inside);
            inside.pop();
            return converted;
        };
        return Err(errors::invalid(value.py(), path, reason));
    }
    if value.is_instance_of::<PyBool>() {
        return Ok(Some(toml::Value::Boolean(value.extract()?)));
    }
    if value.is_instance_of::<PyInt>() {
        let n: i64 = value.extract().map_err(|_| {
            errors::invalid(
                value.py(),
                path,
                format!("{value} is out of range (a signed 64-bit integer)"),
            )
        })?;
        return Ok(Some(toml::Value::Integer(n)));
    }
    if value.is_instance_of::<PyFloat>() {
        return Ok(Some(toml::Value::Float(value.extract()?)));
    }
    if value.is_instance_of::<PyString>() {
        return Ok(Some(toml::Value::String(value.extract()?)));
    }
    if let Ok(delta) = value.cast::<PyDelta>() {
        let micros = i64::from(delta.get_days())
            .checked_mul(86_400_000_000)
            .and_then(|us| us.checked_add(i64::from(delta.get_seconds()) * 1_000_000))
            .and_then(|us| us.checked_add(i64::from(delta.get_microseconds())))
            .ok_or_else(|| {
                errors::invalid(
                    value.py(),
                    path,
                    format!("{value} is out of range (at most 2**63 - 1 microseconds)"),
                )
            })?;
        return Ok(Some(toml::Value::String(format!("{micros}us"))));
    }
    let kind = value
        .get_type()
        .name()
        .map(|n| n.to_string())
        .unwrap_or_default();
    Err(PyTypeError::new_err(format!(
        "{path}: expected a number, string, bool, timedelta, dict or list, got {kind}"
    )))
}

/// A dict as a TOML table, a list or tuple as an array (see [`to_toml`]).
fn container_to_toml(
    value: &Bound<'_, PyAny>,
    path: &str,
    inside: &mut Vec<*mut pyo3::ffi::PyObject>,
) -> PyResult<Option<toml::Value>> {
    if let Ok(dict) = value.cast::<PyDict>() {
        let mut table = toml::Table::new();
        for (k, v) in dict.iter() {
            let key: String = k.extract().map_err(|_| {
                PyTypeError::new_err(format!(
                    "{path}: keys must be strings, got {}",
                    k.repr().map(|r| r.to_string()).unwrap_or_default()
                ))
            })?;
            if let Some(v) = to_toml(&v, &format!("{path}.{key}"), inside)? {
                table.insert(key, v);
            }
        }
        return Ok(Some(toml::Value::Table(table)));
    }
    let mut items = Vec::new();
    for (i, v) in value.try_iter()?.enumerate() {
        if let Some(v) = to_toml(&v?, &format!("{path}[{i}]"), inside)? {
            items.push(v);
        }
    }
    Ok(Some(toml::Value::Array(items)))
}

/// Seconds (`float`/`int`) or a `timedelta` as a duration.
pub(crate) fn duration(name: &str, value: &Bound<'_, PyAny>) -> PyResult<Duration> {
    if let Ok(delta) = value.cast::<PyDelta>() {
        let secs = f64::from(delta.get_days()) * 86_400.0
            + f64::from(delta.get_seconds())
            + f64::from(delta.get_microseconds()) / 1e6;
        return errors::seconds(name, secs);
    }
    if value.is_instance_of::<PyBool>() {
        return Err(PyTypeError::new_err(format!(
            "{name} must be a number of seconds, got bool"
        )));
    }
    let secs: f64 = value.extract().map_err(|_| {
        let kind = value
            .get_type()
            .name()
            .map(|n| n.to_string())
            .unwrap_or_default();
        PyTypeError::new_err(format!("{name} must be a number of seconds, got {kind}"))
    })?;
    errors::seconds(name, secs)
}

/// A count setting given as a keyword argument (`concurrency=`,
/// `default_max_tokens=`): an `int` (else `TypeError`) from 1 to 2**64 - 1
/// (else `ConfigError`, a `ValueError`, naming it); `None` when not given.
pub(crate) fn positive_count(
    name: &str,
    value: Option<&Bound<'_, PyAny>>,
) -> PyResult<Option<u64>> {
    let Some(value) = value.filter(|v| !v.is_none()) else {
        return Ok(None);
    };
    crate::usage::expect_int(name, value)?;
    match value.extract::<u64>() {
        Ok(n) if n >= 1 => Ok(Some(n)),
        _ => Err(errors::invalid(
            value.py(),
            name,
            format!("must be at least 1 and below 2**64, got {value}"),
        )),
    }
}

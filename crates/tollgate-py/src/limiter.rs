//! `tollgate.Limiter`: the engine's admission controller from Python
//! (SPEC PY-2, PY-5).

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyString, PyTuple};
use tollgate::{
    AdmissionController, AdmissionError, Call, Deadline, Lease, ScopeId, TokenEstimate,
};

use crate::config::{self, Settings};
use crate::driver::{self, Driver, Ready};
use crate::errors;
use crate::lease::PyLease;
use crate::runtime;
use crate::snapshot;
use crate::usage::strict_count;

/// How long a blocking wait sleeps before it checks for a signal
/// (Ctrl-C) from Python.
const SIGNAL_CHECK: Duration = Duration::from_millis(50);

/// One scope, by name.
pub(crate) struct ScopeEntry {
    pub(crate) id: ScopeId,
    pub(crate) name: Py<PyString>,
}

/// What a limiter shares with its transports and supervised calls.
pub(crate) struct Shared {
    pub(crate) controller: AdmissionController,
    pub(crate) scopes: HashMap<String, ScopeEntry>,
    /// The configuration (retry, cooldown, providers) the supervised
    /// calls and transports read.
    #[allow(dead_code)] // read by the supervised calls (next step)
    pub(crate) settings: Settings,
}

impl Shared {
    /// The scope called `name`, or `UnknownScope`.
    pub(crate) fn scope(&self, py: Python<'_>, name: &str) -> PyResult<&ScopeEntry> {
        self.scopes.get(name).ok_or_else(|| {
            let mut known: Vec<&str> = self.scopes.keys().map(String::as_str).collect();
            known.sort_unstable();
            errors::make(
                py,
                "UnknownScope",
                format!(
                    "no scope {name:?} in this limiter (scopes: {})",
                    known.join(", ")
                ),
                &[("scope", errors::any(py, name))],
            )
        })
    }
}

/// A rate limiter over named quota scopes: request and token limits that
/// are never exceeded, a bounded FIFO queue per scope, an optional
/// concurrency limit and one deadline per call.
///
/// Build it from keyword arguments (the gateway's `[scopes.*]`,
/// `[admission]`, `[retry]`, `[cooldown]` and `[quota_store]` tables as
/// dicts) or with `Limiter.from_toml(path)`. One limiter may be used from
/// several threads and event loops at once.
#[pyclass(frozen, module = "tollgate._tollgate", name = "Limiter")]
pub(crate) struct Limiter {
    pub(crate) shared: Arc<Shared>,
}

impl Limiter {
    fn build(py: Python<'_>, settings: Settings, concurrency: Option<u64>) -> PyResult<Limiter> {
        if concurrency == Some(0) {
            return Err(errors::invalid(py, "concurrency", "must be at least 1"));
        }
        let controller = settings.build(py, concurrency)?;
        let snapshot = controller.snapshot();
        let scopes = snapshot
            .scopes
            .iter()
            .map(|s| {
                (
                    s.name.clone(),
                    ScopeEntry {
                        id: s.id,
                        name: PyString::intern(py, &s.name).unbind(),
                    },
                )
            })
            .collect();
        Ok(Limiter {
            shared: Arc::new(Shared {
                controller,
                scopes,
                settings,
            }),
        })
    }

    /// The call to admit, validated: scope, estimate, deadline.
    fn call(
        &self,
        py: Python<'_>,
        scope: &str,
        tokens: Option<&Bound<'_, PyAny>>,
        input_tokens: Option<&Bound<'_, PyAny>>,
        output_tokens: Option<&Bound<'_, PyAny>>,
        timeout: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<(Call, Deadline, Py<PyString>)> {
        let entry = self.shared.scope(py, scope)?;
        let estimate = estimate(tokens, input_tokens, output_tokens)?;
        let mut call = Call::new(entry.id);
        call.estimate = estimate;
        let deadline = deadline(timeout)?;
        Ok((call, deadline, entry.name.clone_ref(py)))
    }
}

/// The estimate of `tokens=` or `input_tokens=` / `output_tokens=`.
pub(crate) fn estimate(
    tokens: Option<&Bound<'_, PyAny>>,
    input_tokens: Option<&Bound<'_, PyAny>>,
    output_tokens: Option<&Bound<'_, PyAny>>,
) -> PyResult<Option<TokenEstimate>> {
    let value = |name: &str, v: Option<&Bound<'_, PyAny>>| -> PyResult<Option<u64>> {
        Ok(match v.map(|v| strict_count(name, v)).transpose()? {
            Some(tollgate::Counter::Value(n)) => Some(n),
            _ => None,
        })
    };
    let tokens = value("tokens", tokens)?;
    let input = value("input_tokens", input_tokens)?;
    let output = value("output_tokens", output_tokens)?;
    let estimate = match (tokens, input, output) {
        (None, None, None) => return Ok(None),
        (Some(t), None, None) => TokenEstimate::new(t, 0),
        (None, i, o) => TokenEstimate::new(i.unwrap_or(0), o.unwrap_or(0)),
        _ => {
            return Err(PyTypeError::new_err(
                "give tokens= or input_tokens=/output_tokens=, not both",
            ));
        }
    };
    if estimate.input.checked_add(estimate.output).is_none() {
        return Err(PyValueError::new_err(
            "the estimate overflows a 64-bit count",
        ));
    }
    Ok(Some(estimate))
}

/// The call's one deadline from `timeout=` seconds (SPEC DL-1): made here,
/// once, at the outermost boundary.
pub(crate) fn deadline(timeout: Option<&Bound<'_, PyAny>>) -> PyResult<Deadline> {
    match timeout.filter(|t| !t.is_none()) {
        None => Ok(Deadline::NONE),
        Some(t) => Ok(Deadline::after(config::duration("timeout", t)?)),
    }
}

#[pymethods]
impl Limiter {
    #[new]
    #[pyo3(signature = (scopes = None, *, concurrency = None, admission = None, retry = None, cooldown = None, providers = None, quota_store = None, redis = None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        scopes: Option<&Bound<'_, PyAny>>,
        concurrency: Option<u64>,
        admission: Option<&Bound<'_, PyAny>>,
        retry: Option<&Bound<'_, PyAny>>,
        cooldown: Option<&Bound<'_, PyAny>>,
        providers: Option<&Bound<'_, PyAny>>,
        quota_store: Option<&Bound<'_, PyAny>>,
        redis: Option<&str>,
    ) -> PyResult<Limiter> {
        for (name, value) in [
            ("scopes", scopes),
            ("admission", admission),
            ("retry", retry),
            ("cooldown", cooldown),
            ("providers", providers),
            ("quota_store", quota_store),
        ] {
            if let Some(v) = value.filter(|v| !v.is_none())
                && !v.is_instance_of::<PyDict>()
            {
                let kind = v
                    .get_type()
                    .name()
                    .map(|n| n.to_string())
                    .unwrap_or_default();
                return Err(PyTypeError::new_err(format!(
                    "{name} must be a dict, got {kind}"
                )));
            }
        }
        let store = match (redis, quota_store.filter(|q| !q.is_none())) {
            (Some(_), Some(_)) => {
                return Err(PyTypeError::new_err(
                    "give redis= or quota_store=, not both",
                ));
            }
            (Some(url), None) => {
                let d = PyDict::new(py);
                d.set_item("backend", "redis")?;
                d.set_item("url", url)?;
                Some(d.into_any())
            }
            (None, q) => q.cloned(),
        };
        let settings = Settings::from_kwargs(
            py,
            &[
                ("scopes", scopes),
                ("admission", admission),
                ("retry", retry),
                ("cooldown", cooldown),
                ("providers", providers),
                ("quota_store", store.as_ref()),
            ],
        )?;
        Limiter::build(py, settings, concurrency)
    }

    /// A limiter from a TOML file in the gateway's syntax (`[scopes.*]`,
    /// `[admission]`, `[retry]`, `[cooldown]`, `[providers.*]`,
    /// `[quota_store]`). Errors name the file, the setting, the line and
    /// the column.
    #[staticmethod]
    #[pyo3(signature = (path, *, concurrency = None))]
    fn from_toml(py: Python<'_>, path: PathBuf, concurrency: Option<u64>) -> PyResult<Limiter> {
        let settings = Settings::from_file(py, &path)?;
        Limiter::build(py, settings, concurrency)
    }

    /// A limiter from TOML text (see `from_toml`).
    #[staticmethod]
    #[pyo3(signature = (text, *, concurrency = None, origin = "<string>"))]
    fn from_toml_str(
        py: Python<'_>,
        text: &str,
        concurrency: Option<u64>,
        origin: &str,
    ) -> PyResult<Limiter> {
        let settings = Settings::from_text(py, text, origin)?;
        Limiter::build(py, settings, concurrency)
    }

    /// Admits one call on `scope`: waits (FIFO) until its request and
    /// `tokens` fit in every limit, then for a concurrency permit, within
    /// `timeout` seconds (the call's one deadline; `None`: no deadline).
    /// Use it as `async with limiter.acquire(...) as lease:` or
    /// `lease = await limiter.acquire(...)`.
    ///
    /// Cancelling the awaiting task at any point gives back whatever it
    /// held: its place in the queue, its reservation and its permit
    /// (SPEC Q-9).
    #[pyo3(signature = (scope, tokens = None, *, input_tokens = None, output_tokens = None, timeout = None))]
    fn acquire(
        &self,
        py: Python<'_>,
        scope: &str,
        tokens: Option<&Bound<'_, PyAny>>,
        input_tokens: Option<&Bound<'_, PyAny>>,
        output_tokens: Option<&Bound<'_, PyAny>>,
        timeout: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<AcquireCall> {
        let (call, deadline, name) =
            self.call(py, scope, tokens, input_tokens, output_tokens, timeout)?;
        let controller = self.shared.controller.clone();
        let future = Box::pin(async move { controller.acquire(&call, deadline).await });
        Ok(AcquireCall {
            driver: Mutex::new(Driver::new(future)),
            scope: name,
            estimate: call.estimate.unwrap_or_default(),
            lease: Mutex::new(None),
        })
    }

    /// `acquire` for threads: blocks this thread (not holding the GIL)
    /// until admitted, and returns the lease, usable as `with lease:`.
    /// Ctrl-C (a signal) interrupts the wait and gives everything back.
    #[pyo3(signature = (scope, tokens = None, *, input_tokens = None, output_tokens = None, timeout = None))]
    fn acquire_blocking(
        &self,
        py: Python<'_>,
        scope: &str,
        tokens: Option<&Bound<'_, PyAny>>,
        input_tokens: Option<&Bound<'_, PyAny>>,
        output_tokens: Option<&Bound<'_, PyAny>>,
        timeout: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<PyLease> {
        let (call, deadline, name) =
            self.call(py, scope, tokens, input_tokens, output_tokens, timeout)?;
        let controller = &self.shared.controller;
        let mut future = Box::pin(controller.acquire(&call, deadline));
        let result = loop {
            let step = py.detach(|| {
                runtime::handle()
                    .block_on(async { tokio::time::timeout(SIGNAL_CHECK, &mut future).await })
            });
            match step {
                Ok(result) => break result,
                Err(_) => {
                    if let Err(e) = py.check_signals() {
                        let _runtime = runtime::enter();
                        drop(future);
                        return Err(e);
                    }
                }
            }
        };
        lease_of(py, result, name, call.estimate.unwrap_or_default())
    }

    /// The limiter's state as plain dicts (see the stub for the keys):
    /// queues, reservations, permits, every limit's availability,
    /// cooldowns and counters. Never payloads or keys.
    fn snapshot<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let snapshot = {
            let _runtime = runtime::enter();
            self.shared.controller.snapshot()
        };
        snapshot::to_dict(py, &snapshot)
    }

    /// The scope names.
    #[getter]
    fn scopes(&self) -> Vec<String> {
        let mut names: Vec<String> = self.shared.scopes.keys().cloned().collect();
        names.sort_unstable();
        names
    }

    /// Closes the limiter (SPEC LC-7): later acquisitions fail with
    /// `Closed`, waiting ones are refused. Idempotent. Returns an
    /// awaitable that resolves once every lease was released; awaiting it
    /// is optional.
    fn close(&self) -> crate::driver::Pending {
        let controller = self.shared.controller.clone();
        {
            // Close now, synchronously: `close()` without await closes too.
            let _runtime = runtime::enter();
            let mut first = Box::pin(controller.close());
            let waker = std::task::Waker::noop();
            let _ = std::future::Future::poll(
                first.as_mut(),
                &mut std::task::Context::from_waker(waker),
            );
        }
        crate::driver::Pending::new(Box::pin(async move {
            controller.close().await;
            let out: crate::driver::Output = Box::new(|py| Ok(py.None()));
            out
        }))
    }

    fn __repr__(&self) -> String {
        format!("<tollgate.Limiter scopes={:?}>", self.scopes())
    }
}

/// A lease, or the exception of a refusal.
fn lease_of(
    py: Python<'_>,
    result: Result<Lease, AdmissionError>,
    scope: Py<PyString>,
    estimate: TokenEstimate,
) -> PyResult<PyLease> {
    match result {
        Ok(lease) => Ok(PyLease::new(lease, scope, estimate)),
        Err(e) => {
            let name = scope.bind(py).to_string();
            Err(errors::admission(py, &e, &name))
        }
    }
}

/// The awaitable of `Limiter.acquire`: `await` it for a lease, or use it
/// as an async context manager that releases the lease on exit.
#[pyclass(frozen, module = "tollgate._tollgate", name = "Acquire")]
pub(crate) struct AcquireCall {
    driver: Mutex<Driver<Result<Lease, AdmissionError>>>,
    scope: Py<PyString>,
    estimate: TokenEstimate,
    /// The lease handed to `async with`, released by `__aexit__`.
    lease: Mutex<Option<Py<PyLease>>>,
}

#[pymethods]
impl AcquireCall {
    fn __await__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    fn __iter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    fn __next__(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        driver::iterate(py, &self.driver, |py, result| {
            let lease = Py::new(
                py,
                lease_of(py, result, self.scope.clone_ref(py), self.estimate)?,
            )?;
            *self.lease.lock() = Some(lease.clone_ref(py));
            Ok(lease.into_any())
        })
    }

    fn send(&self, py: Python<'_>, _value: &Bound<'_, PyAny>) -> PyResult<Py<PyAny>> {
        self.__next__(py)
    }

    #[pyo3(signature = (typ, val = None, _tb = None))]
    fn throw(
        &self,
        typ: &Bound<'_, PyAny>,
        val: Option<&Bound<'_, PyAny>>,
        _tb: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Py<PyAny>> {
        self.driver.lock().cancel();
        Err(driver::thrown(typ, val))
    }

    fn close(&self) {
        self.driver.lock().cancel();
    }

    fn __aenter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    #[pyo3(signature = (*_args))]
    fn __aexit__(&self, py: Python<'_>, _args: &Bound<'_, PyTuple>) -> PyResult<Py<Ready>> {
        if let Some(lease) = self.lease.lock().take() {
            lease.get().release_now();
        }
        Ready::none(py)
    }
}

//! `tollgate.Limiter`: the engine's admission controller from Python
//! (SPEC PY-2, PY-5).

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;

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
use crate::process::Made;
use crate::runtime;
use crate::snapshot;
use crate::usage::strict_count;

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
    pub(crate) settings: Settings,
    /// The supervisors of `call` and `stream`.
    pub(crate) supervisors: crate::supervised::Supervisors,
    /// The process the limiter was made in: the only one it works in.
    pub(crate) made: Made,
}

impl Shared {
    /// The `[providers.<name>]` table called `name`, or `ConfigError`.
    pub(crate) fn provider(
        &self,
        py: Python<'_>,
        name: &str,
    ) -> PyResult<&tollgate_gateway::config::ProviderConfig> {
        let providers = &self.settings.gateway.providers;
        providers.iter().find(|p| p.name == name).ok_or_else(|| {
            let known: Vec<&str> = providers.iter().map(|p| p.name.as_str()).collect();
            errors::invalid(
                py,
                "provider",
                format!(
                    "no [providers.{name}] in this limiter's configuration (providers: {})",
                    if known.is_empty() {
                        "none".to_owned()
                    } else {
                        known.join(", ")
                    }
                ),
            )
        })
    }

    /// The scope `name`, or the only scope when `name` is `None`.
    pub(crate) fn scope_or_only(
        &self,
        py: Python<'_>,
        name: Option<&str>,
    ) -> PyResult<&ScopeEntry> {
        match name {
            Some(name) => self.scope(py, name),
            None if self.scopes.len() == 1 => Ok(self.scopes.values().next().expect("one scope")),
            None => {
                let mut known: Vec<&str> = self.scopes.keys().map(String::as_str).collect();
                known.sort_unstable();
                Err(PyTypeError::new_err(format!(
                    "scope= is required: this limiter has {} scopes ({})",
                    known.len(),
                    known.join(", ")
                )))
            }
        }
    }

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
    fn build(
        py: Python<'_>,
        settings: Settings,
        concurrency: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Limiter> {
        let made = Made::here()?;
        let concurrency = config::positive_count("concurrency", concurrency)?;
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
                supervisors: crate::supervised::Supervisors::default(),
                made,
            }),
        })
    }

    /// The limiter's state, or `RuntimeError` in a process other than the
    /// one it was made in (a child made by `fork()`).
    pub(crate) fn shared(&self) -> PyResult<&Arc<Shared>> {
        self.shared.made.check("Limiter")?;
        Ok(&self.shared)
    }

    /// The call to admit, validated: scope, estimate, deadline.
    fn admission_call(
        &self,
        py: Python<'_>,
        scope: &str,
        tokens: Option<&Bound<'_, PyAny>>,
        input_tokens: Option<&Bound<'_, PyAny>>,
        output_tokens: Option<&Bound<'_, PyAny>>,
        timeout: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<(Call, Deadline, Py<PyString>)> {
        let entry = self.shared()?.scope(py, scope)?;
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
        concurrency: Option<&Bound<'_, PyAny>>,
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
    fn from_toml(
        py: Python<'_>,
        path: PathBuf,
        concurrency: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Limiter> {
        let settings = Settings::from_file(py, &path)?;
        Limiter::build(py, settings, concurrency)
    }

    /// A limiter from TOML text (see `from_toml`).
    #[staticmethod]
    #[pyo3(signature = (text, *, concurrency = None, origin = "<string>"))]
    fn from_toml_str(
        py: Python<'_>,
        text: &str,
        concurrency: Option<&Bound<'_, PyAny>>,
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
            self.admission_call(py, scope, tokens, input_tokens, output_tokens, timeout)?;
        let controller = self.shared()?.controller.clone();
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
            self.admission_call(py, scope, tokens, input_tokens, output_tokens, timeout)?;
        let controller = &self.shared()?.controller;
        let result = crate::blocking::block_on(py, controller.acquire(&call, deadline))?;
        lease_of(py, result, name, call.estimate.unwrap_or_default())
    }

    /// Runs `func(*args)` under the engine's supervised lifecycle (SPEC
    /// PY-3): admitted on `scope` with `tokens` (or `input_tokens` /
    /// `output_tokens`), retried with backoff, jitter and the provider's
    /// hints as floors, behind the scope's circuit breaker and cooldown,
    /// all within `timeout` seconds (the call's one deadline). `func` may
    /// be a coroutine function or a plain one. Its result's usage (its
    /// `usage` member, or what `usage(result)` returns) settles the
    /// reservation. Returns an awaitable of `func`'s result.
    ///
    /// `provider=` names a `[providers.*]` table whose accounting and
    /// circuit settings apply; `idempotent=False` never retries.
    #[pyo3(signature = (func, /, *args, scope = None, tokens = None, input_tokens = None, output_tokens = None, timeout = None, idempotent = true, usage = None, provider = None))]
    #[allow(clippy::too_many_arguments)]
    fn call(
        &self,
        py: Python<'_>,
        func: &Bound<'_, PyAny>,
        args: &Bound<'_, PyTuple>,
        scope: Option<&str>,
        tokens: Option<&Bound<'_, PyAny>>,
        input_tokens: Option<&Bound<'_, PyAny>>,
        output_tokens: Option<&Bound<'_, PyAny>>,
        timeout: Option<&Bound<'_, PyAny>>,
        idempotent: bool,
        usage: Option<&Bound<'_, PyAny>>,
        provider: Option<&str>,
    ) -> PyResult<crate::driver::Pending> {
        let args = crate::supervised::Args {
            func,
            args,
            scope,
            tokens,
            input_tokens,
            output_tokens,
            timeout,
            idempotent,
            usage,
            provider,
        };
        Ok(crate::supervised::Prepared::new(py, self.shared()?, args)?.invoke(py))
    }

    /// Runs `func(*args)`, which returns an async iterable (or an
    /// awaitable of one, e.g. an SDK's `create(stream=True)`), as a
    /// supervised stream (SPEC PY-3, LC-3): an async iterator of its
    /// items. Admission, retries and the circuit apply up to the first
    /// item; after it a failure is raised, never replayed. The usage an
    /// item reports (its `usage` member, or `usage(item)`) settles the
    /// reservation when the stream ends; a stream left early keeps its
    /// estimate (SPEC Q-5). Arguments as `call`.
    #[pyo3(signature = (func, /, *args, scope = None, tokens = None, input_tokens = None, output_tokens = None, timeout = None, idempotent = true, usage = None, provider = None))]
    #[allow(clippy::too_many_arguments)]
    fn stream(
        &self,
        py: Python<'_>,
        func: &Bound<'_, PyAny>,
        args: &Bound<'_, PyTuple>,
        scope: Option<&str>,
        tokens: Option<&Bound<'_, PyAny>>,
        input_tokens: Option<&Bound<'_, PyAny>>,
        output_tokens: Option<&Bound<'_, PyAny>>,
        timeout: Option<&Bound<'_, PyAny>>,
        idempotent: bool,
        usage: Option<&Bound<'_, PyAny>>,
        provider: Option<&str>,
    ) -> PyResult<crate::supervised::SupervisedStream> {
        let args = crate::supervised::Args {
            func,
            args,
            scope,
            tokens,
            input_tokens,
            output_tokens,
            timeout,
            idempotent,
            usage,
            provider,
        };
        Ok(crate::supervised::Prepared::new(py, self.shared()?, args)?.into_stream())
    }

    /// The limiter's state as plain dicts (see the stub for the keys):
    /// queues, reservations, permits, every limit's availability,
    /// cooldowns and counters. Never payloads or keys.
    fn snapshot<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let shared = self.shared()?;
        let snapshot = {
            let _runtime = runtime::enter();
            shared.controller.snapshot()
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
    fn close(&self) -> PyResult<crate::driver::Pending> {
        let controller = self.shared()?.controller.clone();
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
        Ok(crate::driver::Pending::none_after(async move {
            controller.close().await;
        }))
    }

    fn __repr__(&self) -> String {
        format!("<tollgate.Limiter scopes={:?}>", self.scopes())
    }
}

impl Drop for Limiter {
    fn drop(&mut self) {
        // In a forked child the state is the parent's: never dropped here.
        self.shared.made.keeps(&self.shared);
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
        self.driver.lock().cancel_held(typ.py());
        Err(driver::thrown(typ, val))
    }

    fn close(&self, py: Python<'_>) {
        self.driver.lock().cancel_held(py);
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

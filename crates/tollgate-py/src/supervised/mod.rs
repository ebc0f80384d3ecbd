//! `Limiter.call` and `Limiter.stream`: the engine's supervised lifecycle
//! around a Python callable (SPEC PY-3, §7–§9): one deadline, retries
//! with jitter and the provider's hints as floors, the circuit breaker,
//! the scope's cooldown, settlement from the reported usage.
//!
//! Each attempt calls the function again (a fresh estimate and reservation
//! each time, Q-8); its exception is classified (`classify.rs`). When the
//! call gives up, the error raised is the engine's (`UpstreamError`,
//! `DeadlineExceeded`, `CircuitOpen`, ... with the gateway's codes) with
//! the last attempt's exception as its `__cause__`; an exception that is
//! not a provider failure is re-raised as it is, after one attempt.

mod closing;
mod provider;
mod stream;

use std::collections::HashMap;
use std::sync::Arc;

use parking_lot::Mutex;
use pyo3::prelude::*;
use pyo3::types::{PyString, PyTuple};
use tollgate::lifecycle::{
    Accounting, CallError, CallOptions, CircuitBreaker, CircuitConfig, Supervisor,
};
use tollgate::{EstimateError, ScopeId};

pub(crate) use provider::{CallProvider, CallRequest, LastFailure, fail};
pub(crate) use stream::SupervisedStream;

use crate::errors;
use crate::limiter::Shared;
use crate::pyawait::Stragglers;

/// A supervisor's identity: scope, `[providers.*]` name, whether its
/// calls carry an estimate.
type Key = (ScopeId, Option<String>, bool);

/// The supervisors and breakers of one limiter's supervised calls.
#[derive(Default)]
pub(crate) struct Supervisors {
    calls: Mutex<HashMap<Key, Supervisor<CallProvider>>>,
    /// One breaker per scope and provider: the calls with and without an
    /// estimate share it.
    breakers: Mutex<HashMap<(ScopeId, Option<String>), CircuitBreaker>>,
}

/// How a provider's limiter counts and its breaker's settings: the
/// `[providers.<name>]` table's, or the engine's defaults.
pub(crate) fn provider_settings(
    py: Python<'_>,
    shared: &Shared,
    provider: Option<&str>,
) -> PyResult<(Accounting, CircuitConfig)> {
    let Some(name) = provider else {
        return Ok((Accounting::default(), CircuitConfig::default()));
    };
    let config = shared.provider(py, name)?;
    Ok((config.engine_accounting(), config.circuit))
}

impl Supervisors {
    /// The supervisor of calls to `scope` (through `provider`'s settings).
    pub(crate) fn call(
        &self,
        py: Python<'_>,
        shared: &Shared,
        scope: ScopeId,
        provider: Option<&str>,
        estimated: bool,
    ) -> PyResult<Supervisor<CallProvider>> {
        let key = (scope, provider.map(str::to_owned), estimated);
        if let Some(s) = self.calls.lock().get(&key) {
            return Ok(s.clone());
        }
        let (accounting, circuit) = provider_settings(py, shared, provider)?;
        let breaker = self.breaker(py, (scope, key.1.clone()), circuit)?;
        let mut builder = Supervisor::builder(shared.controller.clone(), CallProvider)
            .scope(scope)
            .policy(shared.settings.gateway.retry)
            .breaker(breaker)
            .accounting(accounting);
        if estimated {
            builder = builder.estimator(|r: &CallRequest| {
                r.estimate
                    .ok_or_else(|| EstimateError::new("the call carries no estimate"))
            });
        }
        let supervisor = builder
            .build()
            .map_err(|e| errors::invalid(py, &e.field, &e.reason))?;
        Ok(self.calls.lock().entry(key).or_insert(supervisor).clone())
    }

    /// The breaker of `key`, made with `config` the first time.
    pub(crate) fn breaker(
        &self,
        py: Python<'_>,
        key: (ScopeId, Option<String>),
        config: CircuitConfig,
    ) -> PyResult<CircuitBreaker> {
        let mut breakers = self.breakers.lock();
        if let Some(b) = breakers.get(&key) {
            return Ok(b.clone());
        }
        let _runtime = crate::runtime::enter();
        let breaker =
            CircuitBreaker::new(config).map_err(|e| errors::invalid(py, &e.field, &e.reason))?;
        breakers.insert(key, breaker.clone());
        Ok(breaker)
    }
}

/// The exception of a supervised call that did not complete: the
/// attempt's own exception when it was not a provider failure, else the
/// engine's error with it as the `__cause__`.
pub(crate) fn call_error(
    py: Python<'_>,
    error: &CallError,
    scope: &str,
    failure: &LastFailure,
) -> PyErr {
    let last = failure.lock().take();
    let cause = match (error, last) {
        (CallError::Provider { .. } | CallError::Stream { .. }, Some(f)) => {
            if f.foreign {
                return f.err;
            }
            Some(f.err)
        }
        _ => None,
    };
    let err = errors::call(py, error, scope);
    if let Some(cause) = cause {
        err.set_cause(py, Some(cause));
    }
    err
}

/// The arguments of `Limiter.call` and `Limiter.stream`.
pub(crate) struct Args<'a, 'py> {
    pub(crate) func: &'a Bound<'py, PyAny>,
    pub(crate) args: &'a Bound<'py, PyTuple>,
    pub(crate) scope: Option<&'a str>,
    pub(crate) tokens: Option<&'a Bound<'py, PyAny>>,
    pub(crate) input_tokens: Option<&'a Bound<'py, PyAny>>,
    pub(crate) output_tokens: Option<&'a Bound<'py, PyAny>>,
    pub(crate) timeout: Option<&'a Bound<'py, PyAny>>,
    pub(crate) idempotent: bool,
    pub(crate) usage: Option<&'a Bound<'py, PyAny>>,
    pub(crate) provider: Option<&'a str>,
}

/// A supervised call, validated and ready to run.
pub(crate) struct Prepared {
    supervisor: Supervisor<CallProvider>,
    request: CallRequest,
    options: CallOptions,
    scope: Py<PyString>,
}

impl Prepared {
    /// Validates `args` (scope, estimate, deadline, callables) and picks
    /// the scope's supervisor.
    pub(crate) fn new(py: Python<'_>, shared: &Shared, args: Args<'_, '_>) -> PyResult<Prepared> {
        let entry = shared.scope_or_only(py, args.scope)?;
        let estimate =
            crate::limiter::estimate(args.tokens, args.input_tokens, args.output_tokens)?;
        let deadline = crate::limiter::deadline(args.timeout)?;
        let request = request(py, args.func, args.args, args.usage, estimate)?;
        let supervisor =
            shared
                .supervisors
                .call(py, shared, entry.id, args.provider, estimate.is_some())?;
        Ok(Prepared {
            supervisor,
            request,
            options: CallOptions {
                id: None,
                deadline,
                idempotent: args.idempotent,
            },
            scope: entry.name.clone_ref(py),
        })
    }

    /// `Limiter.call`: an awaitable of the function's result.
    pub(crate) fn invoke(self, py: Python<'_>) -> crate::driver::Pending {
        let Prepared {
            supervisor,
            request,
            options,
            scope,
        } = self;
        let scope = scope.bind(py).to_string();
        crate::driver::Pending::new(Box::pin(async move {
            let result = supervisor.invoke(&request, options).await;
            // No attempt runs on after the call answers (DL-6).
            request.stragglers.wait().await;
            let failure = Arc::clone(&request.failure);
            let out: crate::driver::Output = Box::new(move |py| match result {
                Ok(done) => Ok(done.response),
                Err(e) => Err(call_error(py, &e, &scope, &failure)),
            });
            out
        }))
    }

    /// `Limiter.stream`: the async iterator.
    pub(crate) fn into_stream(self) -> SupervisedStream {
        SupervisedStream::new(self.supervisor, self.request, self.options, self.scope)
    }
}

/// The request of a supervised call.
fn request(
    py: Python<'_>,
    func: &Bound<'_, PyAny>,
    args: &Bound<'_, PyTuple>,
    usage: Option<&Bound<'_, PyAny>>,
    estimate: Option<tollgate::TokenEstimate>,
) -> PyResult<CallRequest> {
    if !func.is_callable() {
        return Err(pyo3::exceptions::PyTypeError::new_err(format!(
            "the first argument must be callable, got {}",
            func.get_type().name()?
        )));
    }
    if let Some(u) = usage.filter(|u| !u.is_none())
        && !u.is_callable()
    {
        return Err(pyo3::exceptions::PyTypeError::new_err(
            "usage= must be a callable (result -> usage object) or None",
        ));
    }
    let event_loop = py
        .import("asyncio")?
        .call_method0("get_running_loop")
        .map_err(|_| {
            pyo3::exceptions::PyRuntimeError::new_err(
                "Limiter.call and Limiter.stream run on an asyncio event loop (await them)",
            )
        })?;
    Ok(CallRequest {
        func: func.clone().unbind(),
        args: args.clone().unbind(),
        usage: usage.filter(|u| !u.is_none()).map(|u| u.clone().unbind()),
        estimate,
        event_loop: event_loop.unbind(),
        failure: Arc::new(Mutex::new(None)),
        stragglers: Stragglers::default(),
    })
}

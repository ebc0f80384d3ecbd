//! The httpx transports for the OpenAI and Anthropic SDKs (SPEC PY-4).
//!
//! `tollgate.AsyncTransport` / `tollgate.Transport` (python/tollgate/
//! _transport.py) hand every request to [`TransportCore`], which:
//!
//! 1. routes it (`route.rs`): a `POST` to chat completions, embeddings,
//!    Responses or Messages is a model call; anything else goes straight
//!    to the wrapped transport, unadmitted;
//! 2. estimates the body with the gateway's tokenizer and the accounting
//!    profile of the flavour (OpenAI's character rule for OpenAI's APIs,
//!    Anthropic's profile for Messages, or a `[providers.*]` table's), and
//!    makes the call's one deadline (`x-request-timeout`, else the
//!    transport's `timeout`, else `[admission] default_timeout`; SPEC
//!    GW-3, DL-1);
//! 3. runs it under the engine's `Supervisor` (`provider.rs`): admission,
//!    attempts through the wrapped transport, retries with jitter and the
//!    provider's hints as floors, the circuit breaker, the scope's
//!    cooldown on a 429, budget reports fed back, settlement from
//!    the reported usage (streams: from the final event, read by the
//!    relay's SSE reader);
//! 4. answers the SDK (`answer.rs`, `body.rs`).

mod answer;
mod body;
mod provider;
mod route;

use std::collections::HashMap;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use bytes::Bytes;
use parking_lot::Mutex;
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict};
use tollgate::ScopeId;
use tollgate::clock::Instant;
use tollgate::lifecycle::{CallError, CallOptions, CircuitBreaker, Supervisor};
use tollgate_gateway::config::{Flavor, GatewayConfig, ProviderConfig};
use tollgate_gateway::error::{ApiError, Dialect};
use tollgate_openai::provider::Endpoint;
use tollgate_openai::tokens::TokenEstimator;
use tollgate_openai::wire::CapField;

pub(crate) use body::ResponseBody;
use provider::{HttpxProvider, HttpxRequest, Kit};

use crate::driver::{Output, Pending};
use crate::errors;
use crate::limiter::{Limiter, Shared};
use crate::pyawait::{Mode, Stragglers};

/// The supervisor and estimator of one accounting (a flavour's defaults
/// or a `[providers.*]` table).
#[derive(Clone)]
struct Accounted {
    supervisor: Supervisor<HttpxProvider>,
    estimator: TokenEstimator,
    /// Where a chat request's output cap goes when one is set (the
    /// flavour's field).
    cap_field: CapField,
}

/// The Rust side of `tollgate.Transport` / `tollgate.AsyncTransport`.
#[pyclass(frozen, module = "tollgate._tollgate", name = "TransportCore")]
pub(crate) struct TransportCore {
    shared: Arc<Shared>,
    scope: ScopeId,
    scope_name: String,
    /// A fixed flavour (`flavor=`); `None`: by endpoint.
    flavor: Option<Flavor>,
    /// `provider=`: a `[providers.*]` table of the limiter.
    provider: Option<String>,
    /// `timeout=`: the default deadline of a call.
    timeout: Option<Duration>,
    default_max_tokens: u64,
    mode: Mode,
    accounted: Mutex<HashMap<&'static str, Accounted>>,
    /// One breaker for everything this transport sends (SPEC CB-1).
    breaker: OnceLock<CircuitBreaker>,
}

/// What to do with one request.
enum Plan {
    /// Not a model call: straight to the wrapped transport.
    Pass {
        inner: Py<PyAny>,
        request: Py<PyAny>,
    },
    /// Answered at once (a body that is not a valid request).
    Answer(Output),
    /// A supervised call.
    Call {
        accounted: Accounted,
        request: Box<HttpxRequest>,
        options: CallOptions,
        stream: bool,
        dialect: Dialect,
        scope: String,
    },
}

/// The `[providers.*]` defaults of `flavor`, exactly as the gateway's
/// parser fills them in for a provider that sets nothing else.
fn default_provider(flavor: Flavor) -> ProviderConfig {
    static DEFAULTS: OnceLock<Vec<(Flavor, ProviderConfig)>> = OnceLock::new();
    let defaults = DEFAULTS.get_or_init(|| {
        [
            Flavor::OpenAi,
            Flavor::Anthropic,
            Flavor::Azure,
            Flavor::OpenAiCompatible,
        ]
        .into_iter()
        .filter_map(|f| {
            let extra = if f == Flavor::Azure {
                "api_version = \"2024-10-21\"\n"
            } else {
                ""
            };
            let text = format!(
                "[providers.p]\nbase_url = \"http://localhost\"\nflavor = \"{}\"\n{extra}",
                f.as_str()
            );
            let config = GatewayConfig::library_from_toml(&text, "<defaults>").ok()?;
            Some((f, config.providers.into_iter().next()?))
        })
        .collect()
    });
    defaults
        .iter()
        .find(|(f, _)| *f == flavor)
        .map(|(_, c)| c.clone())
        .expect("every flavour's defaults parse")
}

impl TransportCore {
    /// The supervisor and estimator for a call to `endpoint`.
    fn accounted(&self, py: Python<'_>, endpoint: Endpoint) -> PyResult<Accounted> {
        let config = match &self.provider {
            Some(name) => self.shared.provider(py, name)?.clone(),
            None => default_provider(self.flavor.unwrap_or(route::flavor_of(endpoint))),
        };
        let flavor = config.wire.flavor;
        if let Some(a) = self.accounted.lock().get(flavor.as_str()) {
            return Ok(a.clone());
        }
        let breaker = match self.breaker.get() {
            Some(b) => b.clone(),
            None => {
                let _runtime = crate::runtime::enter();
                let b = CircuitBreaker::new(config.circuit)
                    .map_err(|e| errors::invalid(py, &e.field, &e.reason))?;
                self.breaker.get_or_init(|| b).clone()
            }
        };
        let supervisor = Supervisor::builder(self.shared.controller.clone(), HttpxProvider)
            .scope(self.scope)
            .policy(self.shared.settings.gateway.retry)
            .breaker(breaker)
            .transport_timeout(config.attempt_timeout)
            .accounting(config.engine_accounting())
            .estimator(|r: &HttpxRequest| Ok(r.estimate))
            .build()
            .map_err(|e| errors::invalid(py, &e.field, &e.reason))?;
        let accounted = Accounted {
            supervisor,
            estimator: TokenEstimator::new()
                .with_default_output(self.default_max_tokens)
                .with_profile(config.accounting),
            cap_field: config.wire.cap_field(),
        };
        Ok(self
            .accounted
            .lock()
            .entry(flavor.as_str())
            .or_insert(accounted)
            .clone())
    }

    /// Reads the SDK's request and decides what to do with it.
    fn plan(
        &self,
        py: Python<'_>,
        request: &Bound<'_, PyAny>,
        kit: Kit,
        mode: Mode,
    ) -> PyResult<Plan> {
        self.shared.made.check("transport")?;
        let method: String = request.getattr("method")?.extract()?;
        let url = request.getattr("url")?;
        let path: String = url.getattr("path")?.extract()?;
        let Some(endpoint) = route::endpoint(&method, &path) else {
            return Ok(Plan::Pass {
                inner: kit.inner,
                request: request.clone().unbind(),
            });
        };
        let content = request.getattr("content")?;
        let content = content.cast::<PyBytes>()?;
        let body = Bytes::copy_from_slice(content.as_bytes());
        let accounted = self.accounted(py, endpoint)?;
        let dialect = route::dialect(endpoint);
        let routed = match route::route(endpoint, &body, &accounted.estimator, accounted.cap_field)
        {
            Ok(r) => r,
            Err(api) => {
                let response = kit.response;
                return Ok(Plan::Answer(Box::new(move |py| {
                    gateway_answer(py, &response, api, dialect)
                })));
            }
        };
        let pairs: Vec<(String, String)> = request
            .getattr("headers")?
            .call_method0("multi_items")?
            .extract()?;
        let map = crate::classify::headers_of(request);
        let headers = pairs
            .into_iter()
            .filter(|(n, _)| {
                // The body is sent whole: its length is recomputed.
                ![
                    "content-length",
                    "transfer-encoding",
                    tollgate_gateway::deadline::REQUEST_TIMEOUT_HEADER,
                ]
                .iter()
                .any(|h| n.eq_ignore_ascii_case(h))
            })
            .collect();
        let admission = &self.shared.settings.gateway.admission;
        let deadline = tollgate_gateway::deadline::request_deadline(
            &map,
            Instant::now(),
            self.timeout.unwrap_or(admission.default_timeout),
            admission.max_timeout,
        );
        let extensions = request
            .getattr("extensions")?
            .cast_into::<PyDict>()
            .map_err(|_| PyTypeError::new_err("request.extensions must be a dict"))?;
        let event_loop = match mode {
            Mode::Async => Some(
                py.import("asyncio")?
                    .call_method0("get_running_loop")?
                    .unbind(),
            ),
            Mode::Blocking => None,
        };
        let body = if routed.body == body {
            content.clone().unbind()
        } else {
            PyBytes::new(py, &routed.body).unbind()
        };
        Ok(Plan::Call {
            accounted,
            request: Box::new(HttpxRequest {
                kit,
                mode,
                method: request.getattr("method")?.unbind(),
                url: url.unbind(),
                headers,
                body,
                extensions: extensions.unbind(),
                endpoint,
                forward_usage: routed.forward_usage,
                estimate: routed.estimate,
                answer: Mutex::new(None),
                head: Mutex::new(None),
                failure: Arc::new(Mutex::new(None)),
                event_loop,
                stragglers: Stragglers::default(),
            }),
            options: CallOptions {
                id: None,
                deadline,
                idempotent: true,
            },
            stream: routed.stream,
            dialect,
            scope: self.scope_name.clone(),
        })
    }
}

/// Carries out `plan` (polled on the loop's thread, or blocked on).
async fn run(plan: Plan, mode: Mode) -> Output {
    match plan {
        Plan::Answer(out) => out,
        Plan::Pass { inner, request } => {
            let method = match mode {
                Mode::Async => "handle_async_request",
                Mode::Blocking => "handle_request",
            };
            let result = mode
                .run(|py| {
                    inner
                        .bind(py)
                        .call_method1(method, (request,))
                        .map(Bound::unbind)
                })
                .await;
            Box::new(move |_py| result)
        }
        Plan::Call {
            accounted,
            request,
            options,
            stream: false,
            dialect,
            ..
        } => {
            let result = accounted.supervisor.invoke(&request, options).await;
            // No attempt runs on after the SDK has its answer (DL-6).
            request.stragglers.wait().await;
            match result {
                Ok(done) => {
                    let answer = done.response;
                    let class = Python::attach(|py| request.kit.response.clone_ref(py));
                    Box::new(move |py| {
                        let headers = provider::decoded_headers(answer.headers);
                        answer::response(
                            py,
                            &class,
                            answer.status,
                            &headers,
                            answer::Body::Content(answer.content.bind(py)),
                        )
                    })
                }
                Err(e) => give_up(e, request, dialect),
            }
        }
        Plan::Call {
            accounted,
            request,
            options,
            stream: true,
            dialect,
            scope,
        } => {
            let result = accounted.supervisor.stream(&request, options).await;
            request.stragglers.wait().await;
            match result {
                Ok(stream) => {
                    let head = request.head.lock().take();
                    let (status, headers, finished) = match head {
                        Some(h) => (h.status, h.headers, h.finished),
                        None => (200, Vec::new(), Arc::default()),
                    };
                    let failure = Arc::clone(&request.failure);
                    let stragglers = request.stragglers.clone();
                    let kit = request.kit;
                    Box::new(move |py| {
                        let body = ResponseBody::new(stream, scope, failure, finished, stragglers);
                        let body = Py::new(py, body)?;
                        let body = kit.body.bind(py).call1((body,))?;
                        answer::response(
                            py,
                            &kit.response,
                            status,
                            &headers,
                            answer::Body::Stream(body),
                        )
                    })
                }
                Err(e) => give_up(e, request, dialect),
            }
        }
    }
}

/// The SDK's answer when a call did not complete; see `answer.rs`.
fn give_up(error: CallError, request: Box<HttpxRequest>, dialect: Dialect) -> Output {
    let failure = request.failure.lock().take();
    let answer = request.answer.lock().take();
    let class = request.kit.response;
    Box::new(move |py| {
        if let Some(f) = failure.filter(|f| f.foreign) {
            return Err(f.err);
        }
        let from_provider =
            matches!(&error, CallError::Provider { error, .. } if error.status.is_some());
        if let (true, Some(answer)) = (from_provider, answer) {
            let headers = answer::final_headers(answer.headers);
            return answer::response(
                py,
                &class,
                answer.status,
                &headers,
                answer::Body::Content(answer.content.bind(py)),
            );
        }
        gateway_answer(
            py,
            &class,
            ApiError::from_call(&error, Instant::now()),
            dialect,
        )
    })
}

/// The gateway's error response as an httpx response.
fn gateway_answer(
    py: Python<'_>,
    class: &Py<PyAny>,
    error: ApiError,
    dialect: Dialect,
) -> PyResult<Py<PyAny>> {
    let (status, headers, body) = answer::gateway(error, dialect);
    let content = PyBytes::new(py, &body);
    answer::response(py, class, status, &headers, answer::Body::Content(&content))
}

#[pymethods]
impl TransportCore {
    #[new]
    #[pyo3(signature = (limiter, scope = None, *, flavor = None, provider = None, timeout = None, default_max_tokens = None, blocking = false))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        limiter: &Bound<'_, Limiter>,
        scope: Option<&str>,
        flavor: Option<&str>,
        provider: Option<&str>,
        timeout: Option<&Bound<'_, PyAny>>,
        default_max_tokens: Option<&Bound<'_, PyAny>>,
        blocking: bool,
    ) -> PyResult<TransportCore> {
        let shared = Arc::clone(limiter.get().shared()?);
        let entry = shared.scope_or_only(py, scope)?;
        let flavor = flavor
            .map(|name| {
                Flavor::parse(name).ok_or_else(|| {
                    PyValueError::new_err(format!(
                        "flavor must be \"openai\", \"azure\", \"openai_compatible\" or \
                         \"anthropic\", got {name:?}"
                    ))
                })
            })
            .transpose()?;
        if flavor.is_some() && provider.is_some() {
            return Err(PyTypeError::new_err(
                "give flavor= or provider= (whose flavour applies), not both",
            ));
        }
        if let Some(name) = provider {
            shared.provider(py, name)?;
        }
        let default_max_tokens =
            crate::config::positive_count("default_max_tokens", default_max_tokens)?;
        let timeout = match timeout.filter(|t| !t.is_none()) {
            Some(t) => Some(crate::config::duration("timeout", t)?)
                .filter(|d| !d.is_zero())
                .ok_or_else(|| PyValueError::new_err("timeout must be > 0"))
                .map(Some)?,
            None => None,
        };
        let (id, name) = (entry.id, entry.name.bind(py).to_string());
        Ok(TransportCore {
            shared,
            scope: id,
            scope_name: name,
            flavor,
            provider: provider.map(str::to_owned),
            timeout,
            default_max_tokens: default_max_tokens
                .unwrap_or(tollgate_gateway::config::DEFAULT_MAX_TOKENS),
            mode: if blocking {
                Mode::Blocking
            } else {
                Mode::Async
            },
            accounted: Mutex::new(HashMap::new()),
            breaker: OnceLock::new(),
        })
    }

    /// Sends `request` (an httpx request whose body was read) with the
    /// module's `kit`: an awaitable of the response.
    fn handle(
        &self,
        py: Python<'_>,
        request: &Bound<'_, PyAny>,
        kit: &Bound<'_, PyAny>,
    ) -> PyResult<Pending> {
        if self.mode != Mode::Async {
            return Err(PyTypeError::new_err(
                "this transport is synchronous: use handle_blocking",
            ));
        }
        let plan = self.plan(py, request, Kit::of(kit)?, Mode::Async)?;
        Ok(Pending::new(Box::pin(run(plan, Mode::Async))))
    }

    /// Sends `request` on this thread (the GIL released while it waits):
    /// the response.
    fn handle_blocking(
        &self,
        py: Python<'_>,
        request: &Bound<'_, PyAny>,
        kit: &Bound<'_, PyAny>,
    ) -> PyResult<Py<PyAny>> {
        if self.mode != Mode::Blocking {
            return Err(PyTypeError::new_err(
                "this transport is asynchronous: use handle",
            ));
        }
        let plan = self.plan(py, request, Kit::of(kit)?, Mode::Blocking)?;
        let out = crate::blocking::block_on(py, run(plan, Mode::Blocking))?;
        out(py)
    }

    /// The scope every call spends.
    #[getter]
    fn scope(&self) -> &str {
        &self.scope_name
    }
}

impl Drop for TransportCore {
    fn drop(&mut self) {
        // In a forked child the limiter's state is the parent's: never
        // dropped here.
        self.shared.made.keeps(&self.shared);
    }
}

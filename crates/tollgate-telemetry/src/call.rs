//! The spans of one call: the call's span (SERVER for a gateway client's
//! call, INTERNAL for a batch item) and one CLIENT span per upstream
//! attempt (SPEC OBS-5).

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use http::{HeaderMap, HeaderName, HeaderValue};
use opentelemetry::propagation::{Extractor, Injector, TextMapPropagator};
use opentelemetry::trace::{SpanKind, Status, TraceContextExt, Tracer as _};
use opentelemetry::{Context, KeyValue};
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::SdkTracer;
use parking_lot::Mutex;
use tollgate::lifecycle::ProviderError;
use tollgate::{Admission, Usage};

use super::Telemetry;
use super::semconv as sc;

/// The W3C trace-context header.
pub const TRACEPARENT: HeaderName = HeaderName::from_static("traceparent");
const TRACESTATE: HeaderName = HeaderName::from_static("tracestate");

/// Room for every attribute a call span can end with (begin's, the
/// requested model, [`CallEnd`]'s), so the span's list grows no more.
const CALL_ATTRIBUTES: usize = 20;
/// The same for an attempt span (start's, and its outcome's).
const ATTEMPT_ATTRIBUTES: usize = 14;

/// What an attempt span says about its deployment, made once per
/// deployment at build.
#[derive(Debug, Clone)]
pub struct AttemptTarget {
    /// `gen_ai.provider.name`.
    pub provider: Arc<str>,
    /// `server.address`.
    pub address: Option<Arc<str>>,
    /// `server.port`.
    pub port: Option<u16>,
    /// The model name sent upstream (`gen_ai.request.model` of the
    /// attempt, and its `gen_ai.response.model` once it answered).
    pub upstream_model: Arc<str>,
    /// The configured deployment (the gateway's; a batch run has none).
    pub deployment: Option<Arc<str>>,
}

impl AttemptTarget {
    /// The target of a deployment named `deployment` sending
    /// `upstream_model` to `base_url` of a provider known to the
    /// conventions as `provider`.
    pub fn new(
        provider: &str,
        base_url: &str,
        upstream_model: &str,
        deployment: Option<&str>,
    ) -> Self {
        let uri = base_url.parse::<http::Uri>().ok();
        let port = uri.as_ref().and_then(|u| {
            u.port_u16().or(match u.scheme_str() {
                Some("https") => Some(443),
                Some("http") => Some(80),
                _ => None,
            })
        });
        AttemptTarget {
            provider: Arc::from(provider),
            address: uri.as_ref().and_then(|u| u.host()).map(Arc::from),
            port,
            upstream_model: Arc::from(upstream_model),
            deployment: deployment.map(Arc::from),
        }
    }
}

/// A call's trace: its span, and what its attempts share. Clones share it.
#[derive(Clone)]
pub struct CallTrace(Arc<Inner>);

struct Inner {
    tracer: SdkTracer,
    /// The client's context with the call span in it.
    cx: Context,
    operation: &'static str,
    /// Why the last attempt failed: the next one's retry cause.
    last_error: Mutex<Option<&'static str>>,
    /// The attempt whose stream is being relayed: it ends with the call.
    streaming: Mutex<Option<AttemptSpan>>,
}

impl std::fmt::Debug for CallTrace {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CallTrace")
            .field("span", &self.0.cx.span().span_context())
            .finish_non_exhaustive()
    }
}

struct Headers<'a>(&'a HeaderMap);

impl Extractor for Headers<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|v| v.to_str().ok())
    }

    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(HeaderName::as_str).collect()
    }
}

#[derive(Default)]
struct Carrier(Vec<(HeaderName, HeaderValue)>);

impl Injector for Carrier {
    fn set(&mut self, key: &str, value: String) {
        if let (Ok(k), Ok(v)) = (
            HeaderName::from_bytes(key.as_bytes()),
            HeaderValue::from_str(&value),
        ) {
            self.0.push((k, v));
        }
    }
}

impl Telemetry {
    /// The span of a client call of `operation` (a `gen_ai.operation.name`)
    /// on `route` whose head arrived at `start`, continuing the trace of
    /// the request's `traceparent` if it has a valid one; `None` when
    /// tracing is off.
    pub fn call(
        &self,
        headers: &HeaderMap,
        operation: &'static str,
        route: &'static str,
        start: SystemTime,
    ) -> Option<CallTrace> {
        self.tracer()?;
        let parent = TraceContextPropagator::new().extract(&Headers(headers));
        self.begin(parent, SpanKind::Server, operation, route, start, None)
    }

    /// The span of a batch item `custom_id`, a call of `operation` on
    /// `route` taken at `start`: the root of its own trace; `None` when
    /// tracing is off.
    pub fn item(
        &self,
        custom_id: &str,
        operation: &'static str,
        route: &'static str,
        start: SystemTime,
    ) -> Option<CallTrace> {
        let attribute = KeyValue::new(sc::TOLLGATE_CUSTOM_ID, custom_id.to_owned());
        self.begin(
            Context::new(),
            SpanKind::Internal,
            operation,
            route,
            start,
            Some(attribute),
        )
    }

    fn begin(
        &self,
        parent: Context,
        kind: SpanKind,
        operation: &'static str,
        route: &'static str,
        start: SystemTime,
        extra: Option<KeyValue>,
    ) -> Option<CallTrace> {
        let tracer = self.tracer()?;
        let mut attributes = Vec::with_capacity(CALL_ATTRIBUTES);
        attributes.push(KeyValue::new(sc::GEN_AI_OPERATION_NAME, operation));
        attributes.push(KeyValue::new(sc::TOLLGATE_ROUTE, route));
        attributes.extend(extra);
        let span = tracer
            .span_builder(operation)
            .with_kind(kind)
            .with_start_time(start)
            .with_attributes(attributes)
            .start_with_context(tracer, &parent);
        Some(CallTrace(Arc::new(Inner {
            tracer: tracer.clone(),
            cx: parent.with_span(span),
            operation,
            last_error: Mutex::new(None),
            streaming: Mutex::new(None),
        })))
    }
}

/// What a call's span says when it ends: what the caller recorded of the
/// call (the gateway's access-log record, the batch runner's output
/// line). Unknown values are left out of the span.
#[derive(Debug, Default, Clone, Copy)]
pub struct CallEnd<'a> {
    /// The HTTP status sent (gateway) or recorded (batch).
    pub status: Option<u16>,
    /// Whether the response was a stream.
    pub stream: bool,
    /// Attempts that reached an upstream.
    pub attempts: u32,
    /// All admission waiting of the call.
    pub queue: Option<Duration>,
    /// The gateway's request id.
    pub request_id: Option<&'a str>,
    /// The tenant's name.
    pub tenant: Option<&'a str>,
    /// The deployment of the last attempt.
    pub deployment: Option<&'a str>,
    /// The priority class the call was admitted in.
    pub class: Option<&'static str>,
    /// The limits that kept the call waiting (`none` if it did not wait).
    pub limited_by: Option<&'static str>,
    /// How the served attempt was admitted.
    pub admission: Option<&'a Admission>,
    /// Tokens reserved for the call.
    pub tokens_estimated: Option<u64>,
    /// What the call cost, in micro-dollars.
    pub cost: Option<u64>,
    /// What the upstream reported.
    pub usage: Option<Usage>,
    /// The error class that ended the call, if it failed.
    pub error: Option<&'a str>,
}

fn millis(d: Duration) -> f64 {
    (d.as_secs_f64() * 1e6).round() / 1e3
}

impl CallTrace {
    /// Names the call after the model the client asked for.
    pub fn requested(&self, model: &str) {
        let span = self.0.cx.span();
        span.set_attribute(KeyValue::new(sc::GEN_AI_REQUEST_MODEL, model.to_owned()));
        span.update_name([self.0.operation, " ", model].concat());
    }

    /// Starts the span of attempt `number` (from 1, across the call's
    /// deployments and fallbacks) on `target`, `deadline_left` before the
    /// call's deadline.
    pub fn attempt(
        &self,
        target: &AttemptTarget,
        number: u32,
        deadline_left: Option<Duration>,
    ) -> AttemptSpan {
        let i = &*self.0;
        let mut attributes = Vec::with_capacity(ATTEMPT_ATTRIBUTES);
        attributes.extend([
            KeyValue::new(sc::GEN_AI_OPERATION_NAME, i.operation),
            // The target's `Arc<str>`s are shared, not copied, per span.
            KeyValue::new(sc::GEN_AI_REQUEST_MODEL, Arc::clone(&target.upstream_model)),
            KeyValue::new(sc::GEN_AI_PROVIDER_NAME, Arc::clone(&target.provider)),
            KeyValue::new(sc::TOLLGATE_ATTEMPT, i64::from(number)),
        ]);
        if let Some(d) = &target.deployment {
            attributes.push(KeyValue::new(sc::TOLLGATE_DEPLOYMENT, Arc::clone(d)));
        }
        if let Some(a) = &target.address {
            attributes.push(KeyValue::new(sc::SERVER_ADDRESS, Arc::clone(a)));
        }
        if let Some(p) = target.port {
            attributes.push(KeyValue::new(sc::SERVER_PORT, i64::from(p)));
        }
        if let Some(left) = deadline_left {
            attributes.push(KeyValue::new(sc::TOLLGATE_DEADLINE_LEFT_MS, millis(left)));
        }
        if let Some(cause) = *i.last_error.lock() {
            attributes.push(KeyValue::new(sc::TOLLGATE_RETRY_CAUSE, cause));
        }
        let span = i
            .tracer
            .span_builder([i.operation, " ", &target.upstream_model].concat())
            .with_kind(SpanKind::Client)
            .with_attributes(attributes)
            .start_with_context(&i.tracer, &i.cx);
        AttemptSpan {
            cx: i.cx.with_span(span),
            call: Arc::downgrade(&self.0),
            model: Arc::clone(&target.upstream_model),
            ended: false,
        }
    }

    /// Ends the call's span (and the span of the attempt whose stream it
    /// relayed) with what `end` says.
    pub fn finish(&self, end: &CallEnd<'_>) {
        if let Some(mut attempt) = self.0.streaming.lock().take() {
            match end.error {
                Some(e) => attempt.fail(e.to_owned(), None),
                None => attempt.succeed(end.usage),
            }
        }
        let span = self.0.cx.span();
        let mut a = vec![
            KeyValue::new(sc::TOLLGATE_STREAM, end.stream),
            KeyValue::new(sc::TOLLGATE_ATTEMPT, i64::from(end.attempts)),
        ];
        let text = |key, v: Option<&str>| v.map(|t| KeyValue::new(key, t.to_owned()));
        a.extend(
            end.status
                .map(|s| KeyValue::new(sc::HTTP_RESPONSE_STATUS_CODE, i64::from(s))),
        );
        a.extend(
            end.queue
                .map(|q| KeyValue::new(sc::TOLLGATE_QUEUE_MS, millis(q))),
        );
        a.extend(text(sc::TOLLGATE_REQUEST_ID, end.request_id));
        a.extend(text(sc::TOLLGATE_TENANT, end.tenant));
        a.extend(text(sc::TOLLGATE_DEPLOYMENT, end.deployment));
        a.extend(end.class.map(|c| KeyValue::new(sc::TOLLGATE_CLASS, c)));
        a.extend(
            end.limited_by
                .map(|l| KeyValue::new(sc::TOLLGATE_LIMITED_BY, l)),
        );
        if let Some(adm) = end.admission {
            a.push(KeyValue::new(
                sc::TOLLGATE_QUOTA_WAIT_MS,
                millis(adm.quota_wait),
            ));
            a.push(KeyValue::new(
                sc::TOLLGATE_CONCURRENCY_WAIT_MS,
                millis(adm.concurrency_wait),
            ));
        }
        a.extend(
            end.tokens_estimated
                .map(|t| KeyValue::new(sc::TOLLGATE_TOKENS_ESTIMATED, t as i64)),
        );
        a.extend(
            end.cost
                .map(|c| KeyValue::new(sc::TOLLGATE_COST_USD, c as f64 / 1e6)),
        );
        a.extend(usage_attributes(end.usage));
        if let Some(e) = end.error {
            a.push(KeyValue::new(sc::ERROR_TYPE, e.to_owned()));
            span.set_status(Status::error(e.to_owned()));
        }
        span.set_attributes(a);
        span.end();
    }
}

fn usage_attributes(usage: Option<Usage>) -> impl Iterator<Item = KeyValue> {
    let u = usage.unwrap_or(Usage::UNKNOWN);
    [
        u.input()
            .map(|n| KeyValue::new(sc::GEN_AI_USAGE_INPUT_TOKENS, n as i64)),
        u.output()
            .map(|n| KeyValue::new(sc::GEN_AI_USAGE_OUTPUT_TOKENS, n as i64)),
    ]
    .into_iter()
    .flatten()
}

/// The span of one upstream attempt. Dropped without an outcome (the
/// attempt was abandoned: its timeout, the deadline, the client left) it
/// ends with `error.type = cancelled`.
pub struct AttemptSpan {
    cx: Context,
    call: std::sync::Weak<Inner>,
    model: Arc<str>,
    ended: bool,
}

impl AttemptSpan {
    /// The `traceparent` (and `tracestate`) headers naming this attempt,
    /// for the upstream request.
    pub fn headers(&self) -> Vec<(HeaderName, HeaderValue)> {
        let mut carrier = Carrier::default();
        TraceContextPropagator::new().inject_context(&self.cx, &mut carrier);
        carrier
            .0
            .into_iter()
            .filter(|(k, _)| *k == TRACEPARENT || *k == TRACESTATE)
            .collect()
    }

    /// The upstream answered; a one-shot attempt ends here with `usage`.
    pub fn succeed(&mut self, usage: Option<Usage>) {
        let span = self.cx.span();
        span.set_attribute(KeyValue::new(
            sc::GEN_AI_RESPONSE_MODEL,
            Arc::clone(&self.model),
        ));
        span.set_attributes(usage_attributes(usage));
        span.end();
        self.ended = true;
    }

    /// The attempt failed with `error`; the next attempt names it as its
    /// retry cause.
    pub fn failed(mut self, error: &ProviderError) {
        if let Some(call) = self.call.upgrade() {
            *call.last_error.lock() = Some(error.kind.as_str());
        }
        self.fail(error.kind.as_str().to_owned(), error.status);
    }

    /// A stream began: its span stays open until the call's ends.
    pub fn streaming(self) {
        if let Some(call) = self.call.upgrade() {
            *call.streaming.lock() = Some(self);
        }
    }

    fn fail(&mut self, kind: String, status: Option<u16>) {
        let span = self.cx.span();
        if let Some(s) = status {
            span.set_attribute(KeyValue::new(sc::HTTP_RESPONSE_STATUS_CODE, i64::from(s)));
        }
        span.set_attribute(KeyValue::new(sc::ERROR_TYPE, kind.clone()));
        span.set_status(Status::error(kind));
        span.end();
        self.ended = true;
    }
}

impl Drop for AttemptSpan {
    fn drop(&mut self) {
        if !self.ended {
            self.fail("cancelled".to_owned(), None);
        }
    }
}

//! The spans of one client call: the call's SERVER span and one CLIENT
//! span per upstream attempt (SPEC OBS-5).

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use http::{HeaderMap, HeaderName, HeaderValue};
use opentelemetry::propagation::{Extractor, Injector, TextMapPropagator};
use opentelemetry::trace::{SpanKind, Status, TraceContextExt, Tracer as _};
use opentelemetry::{Context, KeyValue};
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::SdkTracer;
use parking_lot::Mutex;
use tollgate::Usage;
use tollgate::lifecycle::ProviderError;

use super::Telemetry;
use super::semconv as sc;
use crate::access_log::Record;

/// The W3C trace-context header.
pub const TRACEPARENT: HeaderName = HeaderName::from_static("traceparent");
const TRACESTATE: HeaderName = HeaderName::from_static("tracestate");

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
    /// The configured deployment.
    pub deployment: Arc<str>,
}

impl AttemptTarget {
    /// The target of a deployment named `deployment` sending
    /// `upstream_model` to `base_url` of a provider known to the
    /// conventions as `provider`.
    pub fn new(provider: &str, base_url: &str, upstream_model: &str, deployment: &str) -> Self {
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
            deployment: Arc::from(deployment),
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
    /// The span of a call of `operation` (a `gen_ai.operation.name`) on
    /// `route` whose head arrived at `start`, continuing the trace of the
    /// request's `traceparent` if it has a valid one; `None` when tracing
    /// is off.
    pub fn call(
        &self,
        headers: &HeaderMap,
        operation: &'static str,
        route: &'static str,
        start: SystemTime,
    ) -> Option<CallTrace> {
        let tracer = self.tracer()?;
        let parent = TraceContextPropagator::new().extract(&Headers(headers));
        let span = tracer
            .span_builder(operation)
            .with_kind(SpanKind::Server)
            .with_start_time(start)
            .with_attributes([
                KeyValue::new(sc::GEN_AI_OPERATION_NAME, operation),
                KeyValue::new(sc::TOLLGATE_ROUTE, route),
            ])
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

fn millis(d: Duration) -> f64 {
    (d.as_secs_f64() * 1e6).round() / 1e3
}

impl CallTrace {
    /// Names the call after the model the client asked for.
    pub fn requested(&self, model: &str) {
        let span = self.0.cx.span();
        span.set_attribute(KeyValue::new(sc::GEN_AI_REQUEST_MODEL, model.to_owned()));
        span.update_name(format!("{} {model}", self.0.operation));
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
        let mut attributes = vec![
            KeyValue::new(sc::GEN_AI_OPERATION_NAME, i.operation),
            KeyValue::new(sc::GEN_AI_REQUEST_MODEL, target.upstream_model.to_string()),
            KeyValue::new(sc::GEN_AI_PROVIDER_NAME, target.provider.to_string()),
            KeyValue::new(sc::TOLLGATE_DEPLOYMENT, target.deployment.to_string()),
            KeyValue::new(sc::TOLLGATE_ATTEMPT, i64::from(number)),
        ];
        if let Some(a) = &target.address {
            attributes.push(KeyValue::new(sc::SERVER_ADDRESS, a.to_string()));
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
            .span_builder(format!("{} {}", i.operation, target.upstream_model))
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
    /// relayed) with what `record`, the call's access-log record, says.
    pub fn finish(&self, record: &Record) {
        if let Some(mut attempt) = self.0.streaming.lock().take() {
            match &record.error {
                Some(e) => attempt.fail(e.clone(), None),
                None => attempt.succeed(record.usage),
            }
        }
        let span = self.0.cx.span();
        let mut a = vec![
            KeyValue::new(sc::HTTP_RESPONSE_STATUS_CODE, i64::from(record.status)),
            KeyValue::new(sc::TOLLGATE_STREAM, record.stream),
            KeyValue::new(sc::TOLLGATE_ATTEMPT, i64::from(record.attempts)),
            KeyValue::new(sc::TOLLGATE_QUEUE_MS, millis(record.queue)),
            KeyValue::new(sc::TOLLGATE_REQUEST_ID, record.request_id.clone()),
        ];
        let name =
            |key, v: &Option<Arc<str>>| v.as_deref().map(|n| KeyValue::new(key, n.to_owned()));
        a.extend(name(sc::TOLLGATE_TENANT, &record.tenant));
        a.extend(name(sc::TOLLGATE_DEPLOYMENT, &record.deployment));
        a.extend(record.class.map(|c| KeyValue::new(sc::TOLLGATE_CLASS, c)));
        a.extend(
            record
                .limited_by
                .map(|l| KeyValue::new(sc::TOLLGATE_LIMITED_BY, l)),
        );
        if let Some(adm) = &record.admission {
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
            record
                .tokens_estimated
                .map(|t| KeyValue::new(sc::TOLLGATE_TOKENS_ESTIMATED, t as i64)),
        );
        a.extend(
            record
                .cost
                .map(|c| KeyValue::new(sc::TOLLGATE_COST_USD, c as f64 / 1e6)),
        );
        a.extend(usage_attributes(record.usage));
        if let Some(e) = &record.error {
            a.push(KeyValue::new(sc::ERROR_TYPE, e.clone()));
            span.set_status(Status::error(e.clone()));
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
            self.model.to_string(),
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

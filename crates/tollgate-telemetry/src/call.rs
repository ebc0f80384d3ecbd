//! The spans of one call: the call's span (SERVER for a gateway client's
//! call, INTERNAL for a batch item) and one CLIENT span per upstream
//! attempt (SPEC OBS-5).
//!
//! A span is the crate's own [`Record`], filled on the request path with
//! the values the caller already holds (names as `&'static str` or shared
//! `Arc<str>`, no concatenation) and pushed to the export buffer when it
//! ends. A span the sampler leaves out records nothing but still has its
//! ids: the `traceparent` sent upstream names it, unsampled.

use std::sync::{Arc, Weak};
use std::time::{Duration, SystemTime};

use http::{HeaderMap, HeaderName, HeaderValue};
use parking_lot::Mutex;
use tollgate::lifecycle::ProviderError;
use tollgate::{Admission, Usage};

use super::Telemetry;
use super::semconv as sc;
use crate::encode::put_attribute;
use crate::queue::Buffer;
use crate::span::{self, Kind, Record, Text};
use crate::w3c;

/// The W3C trace-context header.
pub const TRACEPARENT: HeaderName = HeaderName::from_static("traceparent");
const TRACESTATE: HeaderName = HeaderName::from_static("tracestate");

/// What an attempt span says about its deployment, made once per
/// deployment at build: the model's name and the deployment's attributes,
/// encoded once for all its spans.
#[derive(Debug, Clone)]
pub struct AttemptTarget {
    /// The model name sent upstream (the span's name).
    upstream_model: Arc<str>,
    /// `gen_ai.request.model` (the upstream model), `gen_ai.provider.name`,
    /// then `tollgate.deployment`, `server.address`, `server.port`,
    /// encoded; the attempt's number goes between the two parts.
    attributes: Arc<[u8]>,
    /// Where the second part of `attributes` starts.
    split: usize,
    /// `gen_ai.response.model` (the upstream model), encoded.
    response_model: Arc<[u8]>,
}

impl AttemptTarget {
    /// The target of a deployment named `deployment` (the gateway's; a
    /// batch run has none) sending `upstream_model` to `base_url` of a
    /// provider known to the conventions as `provider`.
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
        let mut attributes = Vec::new();
        put_attribute(
            sc::GEN_AI_REQUEST_MODEL,
            upstream_model.into(),
            &mut attributes,
        );
        put_attribute(sc::GEN_AI_PROVIDER_NAME, provider.into(), &mut attributes);
        let split = attributes.len();
        if let Some(d) = deployment {
            put_attribute(sc::TOLLGATE_DEPLOYMENT, d.into(), &mut attributes);
        }
        if let Some(host) = uri.as_ref().and_then(|u| u.host()) {
            put_attribute(sc::SERVER_ADDRESS, host.into(), &mut attributes);
        }
        if let Some(p) = port {
            put_attribute(sc::SERVER_PORT, i64::from(p).into(), &mut attributes);
        }
        let mut response_model = Vec::new();
        put_attribute(
            sc::GEN_AI_RESPONSE_MODEL,
            upstream_model.into(),
            &mut response_model,
        );
        AttemptTarget {
            upstream_model: Arc::from(upstream_model),
            attributes: attributes.into(),
            split,
            response_model: response_model.into(),
        }
    }
}

/// A call's trace: its span, and what its attempts share. Clones share it.
#[derive(Clone)]
pub struct CallTrace(Arc<Inner>);

/// What a span's children and its `traceparent` need of it.
#[derive(Clone)]
struct Ids {
    trace_id: [u8; 16],
    span_id: [u8; 8],
    /// Recorded and exported (the W3C `sampled` flag).
    sampled: bool,
    /// The client's `tracestate`, passed on.
    trace_state: Option<Arc<str>>,
}

struct Inner {
    buffer: Arc<Buffer>,
    ids: Ids,
    operation: &'static str,
    state: Mutex<State>,
}

struct State {
    /// The call's span while it is open and sampled.
    record: Option<Box<Record>>,
    /// Why the last attempt failed: the next one's retry cause.
    last_error: Option<&'static str>,
    /// The attempt whose stream is being relayed: it ends with the call.
    streaming: Option<AttemptSpan>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        // As the SDK's spans did: a call span never finished ends when
        // its trace is dropped, after the attempt it was relaying.
        let state = self.state.get_mut();
        drop(state.streaming.take());
        if let Some(mut record) = state.record.take() {
            record.end = span::now();
            self.buffer.push(record);
        }
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

impl std::fmt::Debug for CallTrace {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let ids = &self.0.ids;
        f.debug_struct("CallTrace")
            .field("trace_id", &hex(&ids.trace_id))
            .field("span_id", &hex(&ids.span_id))
            .field("sampled", &ids.sampled)
            .finish_non_exhaustive()
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
        self.exporting()?;
        let parent = headers
            .get(&TRACEPARENT)
            .and_then(|v| v.to_str().ok())
            .and_then(w3c::parse_traceparent)
            .map(|p| (p, tracestate(headers)));
        self.begin(parent, Kind::Server, operation, route, start, None)
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
        self.begin(
            None,
            Kind::Internal,
            operation,
            route,
            start,
            Some(custom_id),
        )
    }

    fn begin(
        &self,
        parent: Option<(w3c::Parent, Option<Arc<str>>)>,
        kind: Kind,
        operation: &'static str,
        route: &'static str,
        start: SystemTime,
        custom_id: Option<&str>,
    ) -> Option<CallTrace> {
        let exporting = self.exporting()?;
        let span_id = w3c::span_id();
        // ParentBased(TraceIdRatioBased): a valid parent's flag decides,
        // the ratio a new trace.
        let (ids, parent_id) = match parent {
            Some((p, trace_state)) => (
                Ids {
                    trace_id: p.trace_id,
                    span_id,
                    sampled: p.sampled,
                    trace_state,
                },
                Some(p.span_id),
            ),
            None => {
                let trace_id = w3c::trace_id();
                let sampled = w3c::sampled_root(exporting.sample_ratio, &trace_id);
                let ids = Ids {
                    trace_id,
                    span_id,
                    sampled,
                    trace_state: None,
                };
                (ids, None)
            }
        };
        let buffer = exporting.queue.buffer();
        let record = ids.sampled.then(|| {
            let mut record = buffer.record();
            *record = Record {
                trace_id: ids.trace_id,
                span_id,
                parent_id: parent_id.unwrap_or_default(),
                parent_remote: parent_id.is_some(),
                flags: 1,
                trace_state: ids.trace_state.clone(),
                kind,
                operation,
                model: None,
                start: span::nanos(start),
                end: 0,
                attributes: std::mem::take(&mut record.attributes),
                error: None,
                text: std::mem::take(&mut record.text),
            };
            record.set(sc::GEN_AI_OPERATION_NAME, operation);
            record.set(sc::TOLLGATE_ROUTE, route);
            if let Some(id) = custom_id {
                record.set(sc::TOLLGATE_CUSTOM_ID, id);
            }
            record
        });
        Some(CallTrace(Arc::new(Inner {
            buffer: Arc::clone(buffer),
            ids,
            operation,
            state: Mutex::new(State {
                record,
                last_error: None,
                streaming: None,
            }),
        })))
    }
}

/// The client's `tracestate`: its header lines joined by `,` as one list
/// (W3C: several lines are one header), `None` if a line is not text.
fn tracestate(headers: &HeaderMap) -> Option<Arc<str>> {
    let mut lines = headers.get_all(&TRACESTATE).iter();
    let first = lines.next()?.to_str().ok()?;
    let Some(second) = lines.next() else {
        return w3c::tracestate(first);
    };
    let mut joined = format!("{first},{}", second.to_str().ok()?);
    for line in lines {
        joined.push(',');
        joined.push_str(line.to_str().ok()?);
    }
    w3c::tracestate(&joined)
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

/// `d` in milliseconds, rounded to the microsecond (in integers: no
/// floating-point rounding per attribute).
fn millis(d: Duration) -> f64 {
    let micros = d
        .as_secs()
        .saturating_mul(1_000_000)
        .saturating_add(u64::from((d.subsec_nanos() + 500) / 1_000));
    micros as f64 / 1e3
}

impl CallTrace {
    /// Names the call after the model the client asked for.
    pub fn requested(&self, model: &str) {
        let mut state = self.0.state.lock();
        if let Some(record) = &mut state.record {
            record.set(sc::GEN_AI_REQUEST_MODEL, model);
            record.model = Some(record.own(model));
        }
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
        let ids = Ids {
            span_id: w3c::span_id(),
            ..i.ids.clone()
        };
        let record = ids.sampled.then(|| {
            let mut r = i.buffer.record();
            *r = Record {
                trace_id: ids.trace_id,
                span_id: ids.span_id,
                parent_id: i.ids.span_id,
                parent_remote: false,
                flags: 1,
                trace_state: ids.trace_state.clone(),
                kind: Kind::Client,
                operation: i.operation,
                model: Some(Text::Shared(Arc::clone(&target.upstream_model))),
                start: span::now(),
                end: 0,
                attributes: std::mem::take(&mut r.attributes),
                error: None,
                text: std::mem::take(&mut r.text),
            };
            let (first, second) = target
                .attributes
                .split_at_checked(target.split)
                .unwrap_or((&target.attributes, &[]));
            r.set(sc::GEN_AI_OPERATION_NAME, i.operation);
            r.attributes.extend_from_slice(first);
            r.set(sc::TOLLGATE_ATTEMPT, i64::from(number));
            r.attributes.extend_from_slice(second);
            if let Some(left) = deadline_left {
                r.set(sc::TOLLGATE_DEADLINE_LEFT_MS, millis(left));
            }
            if let Some(cause) = i.state.lock().last_error {
                r.set(sc::TOLLGATE_RETRY_CAUSE, cause);
            }
            r
        });
        AttemptSpan {
            ids,
            record,
            response_model: Arc::clone(&target.response_model),
            buffer: Arc::clone(&i.buffer),
            call: Arc::downgrade(&self.0),
            ended: false,
        }
    }

    /// Ends the call's span (and the span of the attempt whose stream it
    /// relayed) with what `end` says.
    pub fn finish(&self, end: &CallEnd<'_>) {
        let (streaming, record) = {
            let mut state = self.0.state.lock();
            (state.streaming.take(), state.record.take())
        };
        if let Some(mut attempt) = streaming {
            match end.error {
                Some(e) => attempt.fail(Err(e), None),
                None => attempt.succeed(end.usage),
            }
        }
        let Some(mut r) = record else {
            return;
        };
        r.set(sc::TOLLGATE_STREAM, end.stream);
        r.set(sc::TOLLGATE_ATTEMPT, i64::from(end.attempts));
        if let Some(s) = end.status {
            r.set(sc::HTTP_RESPONSE_STATUS_CODE, i64::from(s));
        }
        if let Some(q) = end.queue {
            r.set(sc::TOLLGATE_QUEUE_MS, millis(q));
        }
        let texts = [
            (sc::TOLLGATE_REQUEST_ID, end.request_id),
            (sc::TOLLGATE_TENANT, end.tenant),
            (sc::TOLLGATE_DEPLOYMENT, end.deployment),
            (sc::TOLLGATE_CLASS, end.class),
            (sc::TOLLGATE_LIMITED_BY, end.limited_by),
        ];
        for (key, text) in texts {
            if let Some(t) = text {
                r.set(key, t);
            }
        }
        if let Some(adm) = end.admission {
            r.set(sc::TOLLGATE_QUOTA_WAIT_MS, millis(adm.quota_wait));
            r.set(
                sc::TOLLGATE_CONCURRENCY_WAIT_MS,
                millis(adm.concurrency_wait),
            );
        }
        if let Some(t) = end.tokens_estimated {
            r.set(sc::TOLLGATE_TOKENS_ESTIMATED, t as i64);
        }
        if let Some(c) = end.cost {
            r.set(sc::TOLLGATE_COST_USD, c as f64 / 1e6);
        }
        set_usage(&mut r, end.usage);
        if let Some(e) = end.error {
            r.set(sc::ERROR_TYPE, e);
            r.error = Some(r.own(e));
        }
        r.end = span::now();
        self.0.buffer.push(r);
    }
}

fn set_usage(r: &mut Record, usage: Option<Usage>) {
    let u = usage.unwrap_or(Usage::UNKNOWN);
    if let Some(n) = u.input() {
        r.set(sc::GEN_AI_USAGE_INPUT_TOKENS, n as i64);
    }
    if let Some(n) = u.output() {
        r.set(sc::GEN_AI_USAGE_OUTPUT_TOKENS, n as i64);
    }
}

/// The headers an attempt adds to its upstream request: its
/// `traceparent`, then the client's `tracestate` if it sent one. Held in
/// place (nothing allocated but the values); read as a slice.
#[derive(Debug, Clone)]
pub struct TraceHeaders {
    headers: [(HeaderName, HeaderValue); 2],
    len: usize,
}

impl Default for TraceHeaders {
    /// None: the call is not traced.
    fn default() -> Self {
        let unused = || (TRACEPARENT, HeaderValue::from_static(""));
        TraceHeaders {
            headers: [unused(), unused()],
            len: 0,
        }
    }
}

impl TraceHeaders {
    fn push(&mut self, name: HeaderName, value: HeaderValue) {
        if let Some(slot) = self.headers.get_mut(self.len) {
            *slot = (name, value);
            self.len += 1;
        }
    }
}

impl std::ops::Deref for TraceHeaders {
    type Target = [(HeaderName, HeaderValue)];

    fn deref(&self) -> &Self::Target {
        &self.headers[..self.len]
    }
}

/// The span of one upstream attempt. Dropped without an outcome (the
/// attempt was abandoned: its timeout, the deadline, the client left) it
/// ends with `error.type = cancelled`.
pub struct AttemptSpan {
    ids: Ids,
    /// The span while it is open and sampled.
    record: Option<Box<Record>>,
    /// Its target's `gen_ai.response.model`, encoded.
    response_model: Arc<[u8]>,
    buffer: Arc<Buffer>,
    call: Weak<Inner>,
    ended: bool,
}

impl AttemptSpan {
    /// The `traceparent` (and `tracestate`) headers naming this attempt,
    /// for the upstream request.
    pub fn headers(&self) -> TraceHeaders {
        let ids = &self.ids;
        let mut out = TraceHeaders::default();
        let traceparent = w3c::traceparent(&ids.trace_id, &ids.span_id, ids.sampled);
        if let Ok(v) = HeaderValue::from_bytes(&traceparent) {
            out.push(TRACEPARENT, v);
        }
        // The client's `tracestate`, when it sent one; none is sent empty
        // (W3C: accept empty ones, avoid sending them).
        let state = ids.trace_state.as_deref().filter(|s| !s.is_empty());
        if let Some(v) = state.and_then(|s| HeaderValue::from_str(s).ok()) {
            out.push(TRACESTATE, v);
        }
        out
    }

    /// The upstream answered; a one-shot attempt ends here with `usage`.
    pub fn succeed(&mut self, usage: Option<Usage>) {
        if let Some(mut r) = self.record.take() {
            r.attributes.extend_from_slice(&self.response_model);
            set_usage(&mut r, usage);
            r.end = span::now();
            self.buffer.push(r);
        }
        self.ended = true;
    }

    /// The attempt failed with `error`; the next attempt names it as its
    /// retry cause.
    pub fn failed(mut self, error: &ProviderError) {
        if let Some(call) = self.call.upgrade() {
            call.state.lock().last_error = Some(error.kind.as_str());
        }
        self.fail(Ok(error.kind.as_str()), error.status);
    }

    /// A stream began: its span stays open until the call's ends.
    pub fn streaming(self) {
        if let Some(call) = self.call.upgrade() {
            call.state.lock().streaming = Some(self);
        }
    }

    /// Ends the span with error `kind`: a constant, or (`Err`) a value
    /// copied.
    fn fail(&mut self, kind: Result<&'static str, &str>, status: Option<u16>) {
        if let Some(mut r) = self.record.take() {
            if let Some(s) = status {
                r.set(sc::HTTP_RESPONSE_STATUS_CODE, i64::from(s));
            }
            let (Ok(text) | Err(text)) = kind;
            r.set(sc::ERROR_TYPE, text);
            r.error = Some(match kind {
                Ok(constant) => Text::Static(constant),
                Err(lent) => r.own(lent),
            });
            r.end = span::now();
            self.buffer.push(r);
        }
        self.ended = true;
    }
}

impl Drop for AttemptSpan {
    fn drop(&mut self) {
        if !self.ended {
            self.fail(Ok("cancelled"), None);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, SystemTime};

    use http::{HeaderMap, HeaderValue};

    use crate::testing::{Collector, SpanKind, hex, kind};
    use crate::{AttemptTarget, CallEnd, Telemetry, TelemetryConfig};

    const TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
    const CLIENT_SPAN: &str = "00f067aa0ba902b7";

    async fn telemetry(collector: &Collector, sample_ratio: f64) -> Telemetry {
        Telemetry::start_with(
            &TelemetryConfig {
                endpoint: Some(collector.endpoint.clone()),
                sample_ratio,
                ..TelemetryConfig::default()
            },
            "tollgate-test",
            |_| None,
        )
        .expect("telemetry")
    }

    fn client(traceparent: Option<&str>, tracestate: Option<&str>) -> HeaderMap {
        let mut h = HeaderMap::new();
        if let Some(tp) = traceparent {
            h.insert("traceparent", HeaderValue::from_str(tp).expect("header"));
        }
        if let Some(ts) = tracestate {
            h.insert("tracestate", HeaderValue::from_str(ts).expect("header"));
        }
        h
    }

    /// One call with one attempt; the attempt's upstream headers.
    fn one_call(t: &Telemetry, headers: &HeaderMap) -> (String, Option<String>) {
        let target = AttemptTarget::new("openai", "http://127.0.0.1:9/v1", "up-model", None);
        let call = t
            .call(headers, "chat", "chat", SystemTime::now())
            .expect("on");
        call.requested("model");
        let mut attempt = call.attempt(&target, 1, Some(Duration::from_secs(1)));
        let sent = attempt.headers().to_vec();
        attempt.succeed(None);
        call.finish(&CallEnd::default());
        let get = |name: &str| {
            sent.iter()
                .find(|(k, _)| k == name)
                .map(|(_, v)| v.to_str().expect("ASCII").to_owned())
        };
        let state = get("tracestate");
        assert_eq!(sent.len(), 1 + usize::from(state.is_some()), "{sent:?}");
        (get("traceparent").expect("a traceparent"), state)
    }

    /// proves: OBS-5 (a `tracestate` sent as several header lines is one
    /// list: passed on joined, in order)
    #[tokio::test]
    async fn tracestate_lines_are_joined() {
        let collector = Collector::start().await;
        let t = telemetry(&collector, 1.0).await;
        let mut headers = client(Some(&format!("00-{TRACE}-{CLIENT_SPAN}-01")), Some("a=1"));
        headers.append("tracestate", HeaderValue::from_static("b=2, c=3"));
        headers.append("tracestate", HeaderValue::from_static("d=4"));
        let (_, ts) = one_call(&t, &headers);
        assert_eq!(ts.as_deref(), Some("a=1,b=2,c=3,d=4"));
        // A line that is not text: no tracestate at all.
        let mut headers = client(Some(&format!("00-{TRACE}-{CLIENT_SPAN}-01")), Some("a=1"));
        headers.append(
            "tracestate",
            HeaderValue::from_bytes(b"b=\xff").expect("opaque bytes"),
        );
        let (_, ts) = one_call(&t, &headers);
        assert_eq!(ts, None);
        t.flush().await;
    }

    /// The parts of a traceparent.
    fn parts(tp: &str) -> Vec<&str> {
        let p: Vec<&str> = tp.split('-').collect();
        assert_eq!((p.len(), p[0], tp.len()), (4, "00", 55), "{tp}");
        p
    }

    /// proves: OBS-5 (sampling: a client's sampled traceparent is recorded
    /// whatever the ratio, continuing its trace and passing its tracestate
    /// on; an unsampled one is not recorded but upstream still gets the
    /// trace with a fresh span id and flags 00)
    #[tokio::test]
    async fn the_clients_sampled_flag_decides() {
        let collector = Collector::start().await;
        let t = telemetry(&collector, 0.0).await;
        let (tp, ts) = one_call(
            &t,
            &client(
                Some(&format!("00-{TRACE}-{CLIENT_SPAN}-01")),
                Some("congo=t61rcWkgMzE, rojo=1"),
            ),
        );
        let p = parts(&tp);
        assert_eq!((p[1], p[3]), (TRACE, "01"));
        assert_eq!(ts.as_deref(), Some("congo=t61rcWkgMzE,rojo=1"));
        t.flush().await;
        let spans: Vec<_> = collector.spans().into_iter().map(|(_, s)| s).collect();
        assert_eq!(spans.len(), 2, "{spans:#?}");
        let call = spans
            .iter()
            .find(|s| kind(s) == SpanKind::Server)
            .expect("call");
        let attempt = spans
            .iter()
            .find(|s| kind(s) == SpanKind::Client)
            .expect("attempt");
        assert_eq!(hex(&call.trace_id), TRACE);
        assert_eq!(hex(&call.parent_span_id), CLIENT_SPAN);
        assert_eq!(call.flags, 0x301, "sampled, parent remote");
        assert_eq!(call.trace_state, "congo=t61rcWkgMzE,rojo=1");
        assert_eq!(call.name, "chat model");
        assert_eq!(attempt.parent_span_id, call.span_id);
        assert_eq!(attempt.flags, 0x101, "sampled, parent local");
        assert_eq!(attempt.trace_state, call.trace_state);
        assert_eq!(attempt.name, "chat up-model");
        assert_eq!(hex(&attempt.span_id), p[2], "upstream names the attempt");

        // Unsampled by the client, at ratio 1: nothing recorded.
        let collector = Collector::start().await;
        let t = telemetry(&collector, 1.0).await;
        let (tp, ts) = one_call(
            &t,
            &client(Some(&format!("00-{TRACE}-{CLIENT_SPAN}-00")), Some("k=v")),
        );
        let p = parts(&tp);
        assert_eq!((p[1], p[3]), (TRACE, "00"));
        assert_ne!(p[2], CLIENT_SPAN);
        assert_ne!(p[2], "0".repeat(16));
        assert_eq!(ts.as_deref(), Some("k=v"));
        t.flush().await;
        assert!(collector.spans().is_empty());
        assert_eq!(t.dropped(), 0, "not sampled is not dropped");
    }

    /// proves: OBS-5 (a new trace is recorded at ratio 1 and not at 0;
    /// either way each attempt sends a traceparent of its own, and an
    /// invalid client traceparent or a tracestate without it is ignored)
    #[tokio::test]
    async fn new_traces_follow_the_ratio() {
        let collector = Collector::start().await;
        let t = telemetry(&collector, 0.0).await;
        let mut traces = std::collections::HashSet::new();
        for _ in 0..20 {
            let (tp, ts) = one_call(&t, &client(None, None));
            let p = parts(&tp);
            assert_eq!(p[3], "00");
            assert_eq!(ts, None, "no tracestate when the client sent none");
            assert!(traces.insert(p[1].to_owned()), "a new trace per call");
        }
        t.flush().await;
        assert!(collector.spans().is_empty());

        let collector = Collector::start().await;
        let t = telemetry(&collector, 1.0).await;
        let invalid = format!("00-{}-{CLIENT_SPAN}-01", TRACE.to_uppercase());
        let (tp, ts) = one_call(&t, &client(Some(&invalid), Some("k=v")));
        let p = parts(&tp);
        assert_ne!(p[1], TRACE);
        assert_eq!((p[3], ts), ("01", None));
        t.flush().await;
        let spans: Vec<_> = collector.spans().into_iter().map(|(_, s)| s).collect();
        assert_eq!(spans.len(), 2);
        let call = spans
            .iter()
            .find(|s| kind(s) == SpanKind::Server)
            .expect("call");
        assert!(call.parent_span_id.is_empty(), "a root");
        assert_eq!(call.flags, 0x101);
        assert_eq!(call.trace_state, "");
        assert_eq!(hex(&call.trace_id), p[1]);
    }

    /// proves: OBS-5 (a call span never finished is still exported when
    /// its trace is dropped, after the stream attempt it relayed, which
    /// ends `cancelled`)
    #[tokio::test]
    async fn an_unfinished_call_ends_when_dropped() {
        let collector = Collector::start().await;
        let t = telemetry(&collector, 1.0).await;
        let target = AttemptTarget::new("openai", "https://api.example/v1", "m", Some("d"));
        let call = t
            .item("item-1", "chat", "chat", SystemTime::now())
            .expect("on");
        call.attempt(&target, 1, None).streaming();
        drop(call);
        t.flush().await;
        let spans: Vec<_> = collector.spans().into_iter().map(|(_, s)| s).collect();
        assert_eq!(spans.len(), 2, "{spans:#?}");
        assert_eq!(kind(&spans[0]), SpanKind::Client);
        assert_eq!(
            crate::testing::string(&spans[0], "error.type").as_deref(),
            Some("cancelled")
        );
        assert_eq!(crate::testing::int(&spans[0], "server.port"), Some(443));
        assert_eq!(kind(&spans[1]), SpanKind::Internal);
        assert_eq!(
            crate::testing::string(&spans[1], "tollgate.custom_id").as_deref(),
            Some("item-1")
        );
        assert!(spans[0].end_time_unix_nano <= spans[1].end_time_unix_nano);
    }
}

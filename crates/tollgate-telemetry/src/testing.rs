//! Test support (feature `testing`): a real OTLP/HTTP trace receiver run
//! in the test's process (axum on 127.0.0.1:0, decoding
//! `ExportTraceServiceRequest` with the protocol's own prost types), and
//! readers of the spans it received. Used by the gateway's and the batch
//! runner's trace tests.

use std::sync::Arc;

use axum::Router;
use axum::extract::State;
use axum::routing::post;
use bytes::Bytes;
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
pub use opentelemetry_proto::tonic::common::v1::any_value::Value as Any;
pub use opentelemetry_proto::tonic::trace::v1::Span;
pub use opentelemetry_proto::tonic::trace::v1::span::SpanKind;
use opentelemetry_proto::tonic::trace::v1::status::StatusCode;
use parking_lot::Mutex;
use prost::Message;
use tokio::net::TcpListener;

/// An OTLP/HTTP trace receiver keeping every request body as received.
/// Stops when dropped.
pub struct Collector {
    /// `http://127.0.0.1:PORT`: the `endpoint` to export to.
    pub endpoint: String,
    bodies: Arc<Mutex<Vec<Bytes>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Collector {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn receive(State(bodies): State<Arc<Mutex<Vec<Bytes>>>>, body: Bytes) -> Vec<u8> {
    bodies.lock().push(body);
    ExportTraceServiceResponse::default().encode_to_vec()
}

impl Collector {
    /// Starts one on a free port of 127.0.0.1, on the current runtime.
    ///
    /// # Panics
    /// No port can be bound (a test's setup failing).
    pub async fn start() -> Collector {
        let bodies = Arc::new(Mutex::new(Vec::new()));
        let app = Router::new()
            .route("/v1/traces", post(receive))
            .with_state(Arc::clone(&bodies));
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let endpoint = format!("http://{}", listener.local_addr().expect("addr"));
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Collector {
            endpoint,
            bodies,
            task,
        }
    }

    /// Every span received so far, with its service name.
    ///
    /// # Panics
    /// A body is not an OTLP protobuf request (what the test checks).
    pub fn spans(&self) -> Vec<(String, Span)> {
        let mut out = Vec::new();
        for body in self.bodies.lock().iter() {
            let request = ExportTraceServiceRequest::decode(body.as_ref()).expect("OTLP protobuf");
            for rs in request.resource_spans {
                let service = rs
                    .resource
                    .as_ref()
                    .and_then(|r| r.attributes.iter().find(|a| a.key == "service.name"))
                    .and_then(|a| a.value.as_ref()?.value.clone());
                let service = match service {
                    Some(Any::StringValue(s)) => s,
                    _ => String::new(),
                };
                for ss in rs.scope_spans {
                    out.extend(ss.spans.into_iter().map(|s| (service.clone(), s)));
                }
            }
        }
        out
    }

    /// Every byte exported to it.
    pub fn raw(&self) -> Vec<u8> {
        self.bodies.lock().iter().flat_map(|b| b.to_vec()).collect()
    }
}

/// The value of `span`'s attribute `key`.
pub fn attr<'s>(span: &'s Span, key: &str) -> Option<&'s Any> {
    span.attributes
        .iter()
        .find(|a| a.key == key)
        .and_then(|a| a.value.as_ref()?.value.as_ref())
}

/// A string attribute.
pub fn string(span: &Span, key: &str) -> Option<String> {
    match attr(span, key) {
        Some(Any::StringValue(s)) => Some(s.clone()),
        _ => None,
    }
}

/// An integer attribute.
pub fn int(span: &Span, key: &str) -> Option<i64> {
    match attr(span, key) {
        Some(Any::IntValue(i)) => Some(*i),
        _ => None,
    }
}

/// A floating-point attribute.
pub fn double(span: &Span, key: &str) -> Option<f64> {
    match attr(span, key) {
        Some(Any::DoubleValue(d)) => Some(*d),
        _ => None,
    }
}

/// The span's kind.
pub fn kind(span: &Span) -> SpanKind {
    SpanKind::try_from(span.kind).unwrap_or(SpanKind::Unspecified)
}

/// Whether the span's status is an error.
pub fn is_error(span: &Span) -> bool {
    span.status.as_ref().map(|s| s.code) == Some(StatusCode::Error as i32)
}

/// Bytes (an id) as lowercase hex.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The CLIENT spans (attempts) whose parent is `call`, by attempt number.
pub fn attempts_of<'s>(spans: &'s [Span], call: &Span) -> Vec<&'s Span> {
    let mut out: Vec<&Span> = spans
        .iter()
        .filter(|s| kind(s) == SpanKind::Client && s.parent_span_id == call.span_id)
        .collect();
    out.sort_by_key(|s| int(s, crate::semconv::TOLLGATE_ATTEMPT));
    out
}

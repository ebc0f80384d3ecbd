//! Ended spans straight to the bytes of an OTLP `ExportTraceServiceRequest`
//! (opentelemetry-proto's `trace.proto`, `collector/trace/v1`), written
//! with `prost::encoding` from the SDK's `SpanData` as it is: no
//! intermediate protobuf structs, no copy of a key or a value before it
//! is written (issue 25).
//!
//! Covers what this crate's spans carry (attributes of booleans, integers,
//! doubles and strings, events, links, status, the W3C ids and flags);
//! array attribute values, which it never sets, are left out.

use std::time::{SystemTime, UNIX_EPOCH};

use opentelemetry::trace::{SpanContext, SpanId, SpanKind, Status};
use opentelemetry::{InstrumentationScope, Key, KeyValue, Value};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::trace::SpanData;
use prost::encoding::{WireType, encode_key, encode_varint, encoded_len_varint, key_len};

/// The encoder of one process's export requests: its resource encoded
/// once, and the buffers reused from batch to batch.
#[derive(Debug, Default)]
pub(crate) struct Encoder {
    /// The `Resource` message's bytes (its attributes).
    resource: Vec<u8>,
    /// The resource's schema URL.
    schema_url: Option<String>,
    /// One span's bytes while its length is not known yet.
    span: Vec<u8>,
    /// The spans of each scope (all of a process's spans share one).
    scopes: Vec<(InstrumentationScope, Vec<u8>)>,
}

impl Encoder {
    /// An encoder for spans of `resource`.
    pub(crate) fn new(resource: &Resource) -> Self {
        let mut bytes = Vec::new();
        for (key, value) in resource.iter() {
            put_key_value(1, key, value, &mut bytes);
        }
        Encoder {
            resource: bytes,
            schema_url: resource.schema_url().map(str::to_owned),
            ..Encoder::default()
        }
    }

    /// The request exporting `spans`.
    pub(crate) fn request(&mut self, spans: &[SpanData]) -> Vec<u8> {
        for (_, bytes) in &mut self.scopes {
            bytes.clear();
        }
        for span in spans {
            self.span.clear();
            put_span(span, &mut self.span);
            let i = match self
                .scopes
                .iter()
                .position(|(s, _)| *s == span.instrumentation_scope)
            {
                Some(i) => i,
                None => {
                    self.scopes
                        .push((span.instrumentation_scope.clone(), Vec::new()));
                    self.scopes.len() - 1
                }
            };
            put_bytes(2, &self.span, &mut self.scopes[i].1);
        }
        // The outer messages' lengths first, so that each span's bytes
        // are copied once more, into the body.
        // ScopeSpans { scope = 1, spans = 2, schema_url = 3 }
        let scopes: Vec<(Vec<u8>, &[u8], &str, usize)> = self
            .scopes
            .iter()
            .filter(|(_, b)| !b.is_empty())
            .map(|(scope, spans)| {
                let mut message = Vec::new();
                put_str(1, scope.name(), &mut message);
                put_str(2, scope.version().unwrap_or_default(), &mut message);
                for kv in scope.attributes() {
                    put_kv(3, kv, &mut message);
                }
                let url = scope.schema_url().unwrap_or_default();
                let len = bytes_len(1, message.len()) + spans.len() + str_len(3, url);
                (message, spans.as_slice(), url, len)
            })
            .collect();
        // ResourceSpans { resource = 1, scope_spans = 2, schema_url = 3 }
        let url = self.schema_url.as_deref().unwrap_or_default();
        let resource_spans = bytes_len(1, self.resource.len())
            + scopes.iter().map(|s| bytes_len(2, s.3)).sum::<usize>()
            + str_len(3, url);
        // ExportTraceServiceRequest { resource_spans = 1 }
        let mut request = Vec::with_capacity(bytes_len(1, resource_spans));
        encode_key(1, WireType::LengthDelimited, &mut request);
        encode_varint(resource_spans as u64, &mut request);
        put_bytes(1, &self.resource, &mut request);
        for (message, spans, url, len) in &scopes {
            encode_key(2, WireType::LengthDelimited, &mut request);
            encode_varint(*len as u64, &mut request);
            put_bytes(1, message, &mut request);
            request.extend_from_slice(spans);
            put_str(3, url, &mut request);
        }
        put_str(3, url, &mut request);
        debug_assert_eq!(request.len(), request.capacity());
        request
    }
}

fn nanos(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
}

/// `Span` (trace/v1) of `span`.
fn put_span(span: &SpanData, buf: &mut Vec<u8>) {
    let cx = &span.span_context;
    put_ids(cx, buf);
    if span.parent_span_id != SpanId::INVALID {
        put_bytes(4, &span.parent_span_id.to_bytes(), buf);
    }
    put_str(5, &span.name, buf);
    let kind: u64 = match span.span_kind {
        SpanKind::Internal => 1,
        SpanKind::Server => 2,
        SpanKind::Client => 3,
        SpanKind::Producer => 4,
        SpanKind::Consumer => 5,
    };
    put_varint(6, kind, buf);
    put_fixed64(7, nanos(span.start_time), buf);
    put_fixed64(8, nanos(span.end_time), buf);
    for kv in &span.attributes {
        put_kv(9, kv, buf);
    }
    put_varint(10, u64::from(span.dropped_attributes_count), buf);
    for event in span.events.iter() {
        // Event { time_unix_nano = 1, name = 2, attributes = 3, dropped = 4 }
        let mut e = Vec::new();
        put_fixed64(1, nanos(event.timestamp), &mut e);
        put_str(2, &event.name, &mut e);
        for kv in &event.attributes {
            put_kv(3, kv, &mut e);
        }
        put_varint(4, u64::from(event.dropped_attributes_count), &mut e);
        put_bytes(11, &e, buf);
    }
    put_varint(12, u64::from(span.events.dropped_count), buf);
    for link in span.links.iter() {
        // Link { trace_id = 1, span_id = 2, trace_state = 3, attributes = 4,
        // dropped = 5, flags = 6 }
        let mut l = Vec::new();
        put_ids(&link.span_context, &mut l);
        for kv in &link.attributes {
            put_kv(4, kv, &mut l);
        }
        put_varint(5, u64::from(link.dropped_attributes_count), &mut l);
        put_fixed32(
            6,
            flags(link.span_context.is_remote(), &link.span_context),
            &mut l,
        );
        put_bytes(13, &l, buf);
    }
    put_varint(14, u64::from(span.links.dropped_count), buf);
    // Status { message = 2, code = 3 }: always present, as the SDK's
    // exporter sends it.
    let (code, message): (u64, &str) = match &span.status {
        Status::Unset => (0, ""),
        Status::Ok => (1, ""),
        Status::Error { description } => (2, description),
    };
    let status_len = str_len(2, message) + varint_len(3, code);
    encode_key(15, WireType::LengthDelimited, buf);
    encode_varint(status_len as u64, buf);
    put_str(2, message, buf);
    put_varint(3, code, buf);
    put_fixed32(16, flags(span.parent_span_is_remote, cx), buf);
}

/// `trace_id = 1`, `span_id = 2`, `trace_state = 3` (Span and Link alike).
fn put_ids(cx: &SpanContext, buf: &mut Vec<u8>) {
    put_bytes(1, &cx.trace_id().to_bytes(), buf);
    put_bytes(2, &cx.span_id().to_bytes(), buf);
    let state = cx.trace_state().header();
    put_str(3, &state, buf);
}

/// The W3C flags plus `SPAN_FLAGS_CONTEXT_HAS_IS_REMOTE_MASK` (0x100) and,
/// if `remote`, `SPAN_FLAGS_CONTEXT_IS_REMOTE_MASK` (0x200).
fn flags(remote: bool, cx: &SpanContext) -> u32 {
    u32::from(cx.trace_flags().to_u8()) | 0x100 | if remote { 0x200 } else { 0 }
}

/// `KeyValue { key = 1, value = 2 (AnyValue) }` as field `tag`; an array
/// value (never set by this crate) is left out.
fn put_kv(tag: u32, kv: &KeyValue, buf: &mut Vec<u8>) {
    put_key_value(tag, &kv.key, &kv.value, buf);
}

fn put_key_value(tag: u32, key: &Key, value: &Value, buf: &mut Vec<u8>) {
    // AnyValue { string = 1, bool = 2, int = 3, double = 4 }
    let value_len = match value {
        Value::String(s) => bytes_len(1, s.as_str().len()),
        Value::Bool(_) => key_len(2) + 1,
        Value::I64(i) => key_len(3) + encoded_len_varint(*i as u64),
        Value::F64(_) => key_len(4) + 8,
        _ => return,
    };
    let key = key.as_str();
    let len = bytes_len(1, key.len()) + bytes_len(2, value_len);
    encode_key(tag, WireType::LengthDelimited, buf);
    encode_varint(len as u64, buf);
    put_bytes(1, key.as_bytes(), buf);
    encode_key(2, WireType::LengthDelimited, buf);
    encode_varint(value_len as u64, buf);
    match value {
        Value::String(s) => put_bytes(1, s.as_str().as_bytes(), buf),
        Value::Bool(b) => {
            encode_key(2, WireType::Varint, buf);
            encode_varint(u64::from(*b), buf);
        }
        Value::I64(i) => {
            encode_key(3, WireType::Varint, buf);
            encode_varint(*i as u64, buf);
        }
        Value::F64(d) => {
            encode_key(4, WireType::SixtyFourBit, buf);
            buf.extend_from_slice(&d.to_le_bytes());
        }
        _ => {}
    }
}

fn bytes_len(tag: u32, len: usize) -> usize {
    key_len(tag) + encoded_len_varint(len as u64) + len
}

/// A proto3 string field's length; an empty one is not written.
fn str_len(tag: u32, s: &str) -> usize {
    if s.is_empty() {
        0
    } else {
        bytes_len(tag, s.len())
    }
}

/// A proto3 varint field's length; zero is not written.
fn varint_len(tag: u32, v: u64) -> usize {
    if v == 0 {
        0
    } else {
        key_len(tag) + encoded_len_varint(v)
    }
}

fn put_bytes(tag: u32, bytes: &[u8], buf: &mut Vec<u8>) {
    encode_key(tag, WireType::LengthDelimited, buf);
    encode_varint(bytes.len() as u64, buf);
    buf.extend_from_slice(bytes);
}

fn put_str(tag: u32, s: &str, buf: &mut Vec<u8>) {
    if !s.is_empty() {
        put_bytes(tag, s.as_bytes(), buf);
    }
}

fn put_varint(tag: u32, v: u64, buf: &mut Vec<u8>) {
    if v != 0 {
        encode_key(tag, WireType::Varint, buf);
        encode_varint(v, buf);
    }
}

fn put_fixed64(tag: u32, v: u64, buf: &mut Vec<u8>) {
    if v != 0 {
        encode_key(tag, WireType::SixtyFourBit, buf);
        buf.extend_from_slice(&v.to_le_bytes());
    }
}

fn put_fixed32(tag: u32, v: u32, buf: &mut Vec<u8>) {
    if v != 0 {
        encode_key(tag, WireType::ThirtyTwoBit, buf);
        buf.extend_from_slice(&v.to_le_bytes());
    }
}

#[cfg(test)]
mod tests {
    use std::borrow::Cow;
    use std::time::{Duration, UNIX_EPOCH};

    use opentelemetry::trace::{
        Event, Link, SpanContext, SpanId, SpanKind, Status, TraceFlags, TraceId, TraceState,
    };
    use opentelemetry::{InstrumentationScope, KeyValue};
    use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
    use opentelemetry_proto::transform::common::tonic::ResourceAttributesWithSchema;
    use opentelemetry_proto::transform::trace::tonic::group_spans_by_resource_and_scope;
    use opentelemetry_sdk::Resource;
    use opentelemetry_sdk::trace::{SpanData, SpanEvents, SpanLinks};
    use prost::Message;

    use super::Encoder;

    fn context(trace: u128, span: u64, remote: bool, state: &str) -> SpanContext {
        SpanContext::new(
            TraceId::from(trace),
            SpanId::from(span),
            TraceFlags::SAMPLED,
            remote,
            state.parse::<TraceState>().expect("trace state"),
        )
    }

    fn span(
        scope: &InstrumentationScope,
        kind: SpanKind,
        parent: u64,
        remote: bool,
        status: Status,
    ) -> SpanData {
        let start = UNIX_EPOCH;
        let mut events = SpanEvents::default();
        events.events = vec![Event::new(
            "first-byte",
            start + Duration::from_micros(5),
            vec![KeyValue::new("k", 1_i64)],
            1,
        )];
        events.dropped_count = 2;
        let mut links = SpanLinks::default();
        links.links = vec![Link::new(
            context(7, 9, true, ""),
            vec![KeyValue::new("why", "batch")],
            4,
        )];
        links.dropped_count = 5;
        SpanData {
            span_context: context(
                0x0af7_6519_16cd_43dd_8448_eb21_1c80_319c,
                0xb7ad_6b71_6920_3331,
                false,
                "vendor=a,other=b",
            ),
            parent_span_id: SpanId::from(parent),
            parent_span_is_remote: remote,
            span_kind: kind,
            name: Cow::Owned("chat gpt-4o-mini".to_owned()),
            start_time: start,
            end_time: start + Duration::from_nanos(1_234_567),
            attributes: vec![
                KeyValue::new("gen_ai.operation.name", "chat"),
                KeyValue::new("tollgate.tenant", "team-ä".to_owned()),
                KeyValue::new("tollgate.stream", false),
                KeyValue::new("tollgate.attempt", 2_i64),
                KeyValue::new("tollgate.tokens_estimated", -7_i64),
                KeyValue::new("tollgate.queue_ms", 0.125),
                KeyValue::new("tollgate.cost_usd", 0.0),
                KeyValue::new("empty", ""),
            ],
            dropped_attributes_count: 3,
            events,
            links,
            status,
            instrumentation_scope: scope.clone(),
        }
    }

    // proves: OBS-5 (the spans exported are exactly what the SDK's own
    // OTLP exporter sent: every id, name, kind, time, attribute, event,
    // link, status and flag, under the same resource and scopes)
    #[test]
    fn request_decodes_to_what_the_sdk_exporter_built() {
        let gateway = InstrumentationScope::builder("tollgate-gateway")
            .with_version("0.1.0")
            .with_schema_url("https://opentelemetry.io/schemas/1.37.0")
            .build();
        let other = InstrumentationScope::builder("other")
            .with_attributes([KeyValue::new("scope.attr", true)])
            .build();
        let resource = Resource::builder_empty()
            .with_service_name("tollgate-test")
            .build();
        let at = |s: u64| UNIX_EPOCH + Duration::from_secs(1_764_000_000 + s);
        let mut spans = vec![
            span(&gateway, SpanKind::Server, 0x1111, true, Status::Unset),
            span(
                &gateway,
                SpanKind::Client,
                0,
                false,
                Status::error("rate_limited"),
            ),
            span(&other, SpanKind::Internal, 0x2222, false, Status::Ok),
            span(&gateway, SpanKind::Producer, 0, false, Status::Unset),
            span(&other, SpanKind::Consumer, 0, false, Status::Unset),
        ];
        for (i, s) in spans.iter_mut().enumerate() {
            s.start_time = at(i as u64);
            s.end_time = at(i as u64 + 1);
        }
        let mut encoder = Encoder::new(&resource);
        let ours = ExportTraceServiceRequest::decode(encoder.request(&spans).as_slice())
            .expect("a valid request");
        let theirs = ExportTraceServiceRequest {
            resource_spans: group_spans_by_resource_and_scope(
                spans.clone(),
                &ResourceAttributesWithSchema::from(&resource),
            ),
        };
        assert_eq!(ours, theirs);
        // The encoder's reused buffers leave nothing of one batch in the next.
        let ours = ExportTraceServiceRequest::decode(encoder.request(&spans[2..3]).as_slice())
            .expect("a valid request");
        let theirs = ExportTraceServiceRequest {
            resource_spans: group_spans_by_resource_and_scope(
                spans[2..3].to_vec(),
                &ResourceAttributesWithSchema::from(&resource),
            ),
        };
        assert_eq!(ours, theirs);
    }
}

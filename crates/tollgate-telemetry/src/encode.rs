//! Ended spans straight to the bytes of an OTLP `ExportTraceServiceRequest`
//! (opentelemetry-proto's `trace.proto`, `collector/trace/v1`), written
//! with `prost::encoding` from the crate's own [`Record`]s: no
//! intermediate protobuf structs, no copy of a key or a value before it
//! is written (issue 25). The resource (`service.name`) and the
//! instrumentation scope are the process's, encoded once.
//!
//! What is written is what OpenTelemetry's SDK exporter wrote for the
//! same spans (the tests compare the two): ids, name, kind, times,
//! attributes (booleans, integers, doubles, strings), the status (always
//! present), the W3C flags with the "has is-remote" bits.

use prost::encoding::{WireType, encode_key, encode_varint, encoded_len_varint, key_len};

use crate::span::{Record, Text, Value};

/// The encoder of one process's export requests: its resource and scope
/// encoded once, and the buffers reused from batch to batch.
#[derive(Debug)]
pub(crate) struct Encoder {
    /// The `Resource` message's bytes (its attributes).
    resource: Vec<u8>,
    /// The `InstrumentationScope` message's bytes.
    scope: Vec<u8>,
    /// The scope's schema URL.
    scope_schema_url: String,
    /// One span's bytes while its length is not known yet.
    span: Vec<u8>,
    /// The batch's spans, each as `ScopeSpans.spans` (field 2).
    spans: Vec<u8>,
}

impl Encoder {
    /// An encoder for spans of service `service_name`, of the scope
    /// `scope` at `version` with `schema_url`.
    pub(crate) fn new(service_name: &str, scope: &str, version: &str, schema_url: &str) -> Self {
        let mut resource = Vec::new();
        put_attribute(
            1,
            "service.name",
            &Value::Text(Text::Shared(service_name.into())),
            "",
            &mut resource,
        );
        // InstrumentationScope { name = 1, version = 2 }
        let mut scope_bytes = Vec::new();
        put_str(1, scope, &mut scope_bytes);
        put_str(2, version, &mut scope_bytes);
        Encoder {
            resource,
            scope: scope_bytes,
            scope_schema_url: schema_url.to_owned(),
            span: Vec::new(),
            spans: Vec::new(),
        }
    }

    /// The request exporting `spans`.
    pub(crate) fn request(&mut self, spans: &[Record]) -> Vec<u8> {
        self.spans.clear();
        for span in spans {
            self.span.clear();
            put_span(span, &mut self.span);
            put_bytes(2, &self.span, &mut self.spans);
        }
        // The outer messages' lengths first, so that each span's bytes
        // are copied once more, into the body.
        // ScopeSpans { scope = 1, spans = 2, schema_url = 3 }
        let scope_spans = if self.spans.is_empty() {
            0
        } else {
            bytes_len(1, self.scope.len()) + self.spans.len() + str_len(3, &self.scope_schema_url)
        };
        // ResourceSpans { resource = 1, scope_spans = 2 } (no schema URL)
        let resource_spans = bytes_len(1, self.resource.len())
            + if scope_spans == 0 {
                0
            } else {
                bytes_len(2, scope_spans)
            };
        // ExportTraceServiceRequest { resource_spans = 1 }
        let mut request = Vec::with_capacity(bytes_len(1, resource_spans));
        encode_key(1, WireType::LengthDelimited, &mut request);
        encode_varint(resource_spans as u64, &mut request);
        put_bytes(1, &self.resource, &mut request);
        if scope_spans != 0 {
            encode_key(2, WireType::LengthDelimited, &mut request);
            encode_varint(scope_spans as u64, &mut request);
            put_bytes(1, &self.scope, &mut request);
            request.extend_from_slice(&self.spans);
            put_str(3, &self.scope_schema_url, &mut request);
        }
        debug_assert_eq!(request.len(), request.capacity());
        request
    }
}

/// `Span` (trace/v1) of `span`.
fn put_span(span: &Record, buf: &mut Vec<u8>) {
    put_bytes(1, &span.trace_id, buf);
    put_bytes(2, &span.span_id, buf);
    put_str(3, span.trace_state.as_deref().unwrap_or_default(), buf);
    if span.parent_id != [0; 8] {
        put_bytes(4, &span.parent_id, buf);
    }
    // The name: operation, then " " and the model, without a copy.
    let model = span.model();
    encode_key(5, WireType::LengthDelimited, buf);
    encode_varint(
        (span.operation.len() + model.map_or(0, |m| 1 + m.len())) as u64,
        buf,
    );
    buf.extend_from_slice(span.operation.as_bytes());
    if let Some(model) = model {
        buf.push(b' ');
        buf.extend_from_slice(model.as_bytes());
    }
    put_varint(6, span.kind as u64, buf);
    put_fixed64(7, span.start, buf);
    put_fixed64(8, span.end, buf);
    for (key, value) in &span.attributes {
        put_attribute(9, key, value, &span.text, buf);
    }
    // Status { message = 2, code = 3 }: always present, as the SDK's
    // exporter sent it (code 0 unset, 2 error).
    let (code, message): (u64, &str) = match &span.error {
        None => (0, ""),
        Some(description) => (2, description.as_str(&span.text)),
    };
    let status_len = str_len(2, message) + varint_len(3, code);
    encode_key(15, WireType::LengthDelimited, buf);
    encode_varint(status_len as u64, buf);
    put_str(2, message, buf);
    put_varint(3, code, buf);
    // The W3C flags plus `SPAN_FLAGS_CONTEXT_HAS_IS_REMOTE_MASK` (0x100)
    // and, if the parent is remote, `SPAN_FLAGS_CONTEXT_IS_REMOTE_MASK`
    // (0x200).
    let flags = u32::from(span.flags) | 0x100 | if span.parent_remote { 0x200 } else { 0 };
    put_fixed32(16, flags, buf);
}

/// `KeyValue { key = 1, value = 2 (AnyValue) }` as field `tag`; `own` is
/// the text of the value's record. Written byte by byte into room reserved
/// once (a span has a few dozen of these: they are most of an export's
/// work).
fn put_attribute(tag: u32, key: &str, value: &Value, own: &str, buf: &mut Vec<u8>) {
    // AnyValue { string = 1, bool = 2, int = 3, double = 4 }
    let text = match value {
        Value::Text(s) => s.as_str(own),
        _ => "",
    };
    let value_len = match value {
        Value::Text(_) => bytes_len(1, text.len()),
        Value::Bool(_) => key_len(2) + 1,
        Value::I64(i) => key_len(3) + encoded_len_varint(*i as u64),
        Value::F64(_) => key_len(4) + 8,
    };
    let len = bytes_len(1, key.len()) + bytes_len(2, value_len);
    buf.reserve(len + 2 * MAX_VARINT);
    push_varint(u64::from(tag << 3 | LEN), buf);
    push_varint(len as u64, buf);
    buf.push(1 << 3 | LEN as u8);
    push_varint(key.len() as u64, buf);
    buf.extend_from_slice(key.as_bytes());
    buf.push(2 << 3 | LEN as u8);
    push_varint(value_len as u64, buf);
    match value {
        Value::Text(_) => {
            buf.push(1 << 3 | LEN as u8);
            push_varint(text.len() as u64, buf);
            buf.extend_from_slice(text.as_bytes());
        }
        Value::Bool(b) => {
            buf.push(2 << 3);
            buf.push(u8::from(*b));
        }
        Value::I64(i) => {
            buf.push(3 << 3);
            push_varint(*i as u64, buf);
        }
        Value::F64(d) => {
            buf.push(4 << 3 | 1);
            buf.extend_from_slice(&d.to_le_bytes());
        }
    }
}

/// The length-delimited wire type.
const LEN: u32 = 2;

/// The longest varint (a `u64`'s).
const MAX_VARINT: usize = 10;

/// Appends `v` as a varint, as `prost::encoding::encode_varint` does.
fn push_varint(mut v: u64, buf: &mut Vec<u8>) {
    while v >= 0x80 {
        buf.push(v as u8 | 0x80);
        v >>= 7;
    }
    buf.push(v as u8);
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
    use std::sync::Arc;
    use std::time::{Duration, UNIX_EPOCH};

    use opentelemetry::trace::{
        SpanContext, SpanId, SpanKind, Status, TraceFlags, TraceId, TraceState,
    };
    use opentelemetry::{InstrumentationScope, KeyValue};
    use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
    use opentelemetry_proto::tonic::common::v1::any_value::Value as Any;
    use opentelemetry_proto::transform::common::tonic::ResourceAttributesWithSchema;
    use opentelemetry_proto::transform::trace::tonic::group_spans_by_resource_and_scope;
    use opentelemetry_sdk::Resource;
    use opentelemetry_sdk::trace::{SpanData, SpanEvents, SpanLinks};
    use prost::Message;

    use super::Encoder;
    use crate::span::{Kind, Record, Text, Value};

    const SCHEMA: &str = "https://opentelemetry.io/schemas/1.37.0";

    fn record(kind: Kind, parent: u64, remote: bool, error: Option<&'static str>) -> Record {
        let mut r = Record {
            trace_id: 0x0af7_6519_16cd_43dd_8448_eb21_1c80_319c_u128.to_be_bytes(),
            span_id: 0xb7ad_6b71_6920_3331_u64.to_be_bytes(),
            parent_id: parent.to_be_bytes(),
            parent_remote: remote,
            flags: 1,
            trace_state: remote.then(|| Arc::from("vendor=a,other=b")),
            kind,
            operation: "chat",
            model: None,
            start: 1_764_000_000_000_000_000,
            end: 1_764_000_000_001_234_567,
            attributes: vec![
                ("gen_ai.operation.name", Value::from("chat")),
                (
                    "gen_ai.request.model",
                    Value::from(Arc::<str>::from("gpt-4o")),
                ),
                (
                    "tollgate.deployment",
                    Value::from(Arc::<str>::from("primary")),
                ),
                ("tollgate.stream", Value::Bool(false)),
                ("tollgate.attempt", Value::I64(2)),
                ("tollgate.tokens_estimated", Value::I64(-7)),
                ("tollgate.queue_ms", Value::F64(0.125)),
                ("tollgate.cost_usd", Value::F64(0.0)),
                ("empty", Value::from("")),
                // Lengths of two varint bytes.
                ("long", Value::from(Arc::<str>::from("x".repeat(300)))),
            ],
            error: None,
            text: String::new(),
        };
        if kind != Kind::Internal {
            r.model = Some(r.own("gpt-4o-mini"));
        }
        let tenant = r.owned("team-ä");
        r.attributes.push(("tollgate.tenant", tenant));
        r.error = error.map(|e| {
            if kind == Kind::Client {
                Text::Static(e)
            } else {
                r.own(e)
            }
        });
        r
    }

    /// The same span as the OpenTelemetry SDK held it.
    fn sdk(r: &Record, scope: &InstrumentationScope) -> SpanData {
        let state = r.trace_state.as_deref().unwrap_or_default();
        let at = |n: u64| UNIX_EPOCH + Duration::from_nanos(n);
        SpanData {
            span_context: SpanContext::new(
                TraceId::from_bytes(r.trace_id),
                SpanId::from_bytes(r.span_id),
                TraceFlags::new(r.flags),
                false,
                state.parse::<TraceState>().expect("trace state"),
            ),
            parent_span_id: SpanId::from_bytes(r.parent_id),
            parent_span_is_remote: r.parent_remote,
            span_kind: match r.kind {
                Kind::Internal => SpanKind::Internal,
                Kind::Server => SpanKind::Server,
                Kind::Client => SpanKind::Client,
            },
            name: Cow::Owned(match r.model() {
                Some(m) => format!("{} {m}", r.operation),
                None => r.operation.to_owned(),
            }),
            start_time: at(r.start),
            end_time: at(r.end),
            attributes: r
                .attributes
                .iter()
                .map(|(k, v)| match v {
                    Value::Text(t) => KeyValue::new(*k, t.as_str(&r.text).to_owned()),
                    Value::I64(i) => KeyValue::new(*k, *i),
                    Value::F64(d) => KeyValue::new(*k, *d),
                    Value::Bool(b) => KeyValue::new(*k, *b),
                })
                .collect(),
            dropped_attributes_count: 0,
            events: SpanEvents::default(),
            links: SpanLinks::default(),
            status: match &r.error {
                None => Status::Unset,
                Some(e) => Status::error(e.as_str(&r.text).to_owned()),
            },
            instrumentation_scope: scope.clone(),
        }
    }

    /// proves: OBS-5 (the spans exported are exactly what the OpenTelemetry
    /// SDK's own OTLP exporter sent for the same spans: every id, name,
    /// kind, time, attribute, status, trace state and flag, under the
    /// same resource and scope)
    #[test]
    fn request_decodes_to_what_the_sdk_exporter_built() {
        let scope = InstrumentationScope::builder("tollgate-gateway")
            .with_version("0.1.0")
            .with_schema_url(SCHEMA)
            .build();
        let resource = Resource::builder_empty()
            .with_service_name("tollgate-test")
            .build();
        let mut records = vec![
            record(Kind::Server, 0x1111, true, None),
            record(Kind::Client, 0x2222, false, Some("rate_limited")),
            record(Kind::Internal, 0, false, None),
            record(Kind::Server, 0, false, Some("stream_failed")),
        ];
        for (i, r) in records.iter_mut().enumerate() {
            r.span_id[0] = i as u8;
            r.start += i as u64;
        }
        let mut encoder = Encoder::new("tollgate-test", "tollgate-gateway", "0.1.0", SCHEMA);
        let theirs = |records: &[Record]| ExportTraceServiceRequest {
            resource_spans: group_spans_by_resource_and_scope(
                records.iter().map(|r| sdk(r, &scope)).collect(),
                &ResourceAttributesWithSchema::from(&resource),
            ),
        };
        let ours = ExportTraceServiceRequest::decode(encoder.request(&records).as_slice())
            .expect("a valid request");
        assert_eq!(ours, theirs(&records));

        // A few fields by hand, so that the comparison is not with itself.
        let spans = &ours.resource_spans[0].scope_spans[0].spans;
        assert_eq!(spans.len(), 4);
        assert_eq!(spans[0].name, "chat gpt-4o-mini");
        assert_eq!(spans[2].name, "chat");
        assert_eq!(spans[0].flags, 0x301, "sampled, has-is-remote, is-remote");
        assert_eq!(spans[1].flags, 0x101, "sampled, has-is-remote");
        assert_eq!(spans[0].trace_state, "vendor=a,other=b");
        assert_eq!(spans[0].parent_span_id, 0x1111_u64.to_be_bytes());
        assert!(spans[2].parent_span_id.is_empty(), "a root has no parent");
        assert_eq!(spans[1].kind, 3);
        let status = spans[1].status.as_ref().expect("status");
        assert_eq!((status.code, status.message.as_str()), (2, "rate_limited"));
        assert_eq!(spans[0].status.as_ref().map(|s| s.code), Some(0));
        assert_eq!(
            spans[0]
                .attributes
                .iter()
                .find(|a| a.key == "tollgate.tenant")
                .and_then(|a| a.value.as_ref()?.value.clone()),
            Some(Any::StringValue("team-ä".to_owned()))
        );
        assert_eq!(
            ours.resource_spans[0].scope_spans[0].schema_url, SCHEMA,
            "the semantic conventions' schema"
        );

        // The encoder's reused buffers leave nothing of one batch in the next.
        let ours = ExportTraceServiceRequest::decode(encoder.request(&records[2..3]).as_slice())
            .expect("a valid request");
        assert_eq!(ours, theirs(&records[2..3]));
    }
}

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

use crate::span::{Record, Value};

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
    /// The batch's spans' layouts.
    lens: Vec<Layout>,
    /// The last request's bytes, given back once sent, for the next one:
    /// a batch's body is written into memory already mapped and recently
    /// used, not a new allocation of a few hundred kilobytes per batch.
    pub(crate) body: Vec<u8>,
}

/// The largest body kept for the next batch.
const KEEP_BODY: usize = 8 << 20;

impl Encoder {
    /// An encoder for spans of service `service_name`, of the scope
    /// `scope` at `version` with `schema_url`.
    pub(crate) fn new(service_name: &str, scope: &str, version: &str, schema_url: &str) -> Self {
        let mut resource = Vec::new();
        put_key_value(1, "service.name", Value::Str(service_name), &mut resource);
        // InstrumentationScope { name = 1, version = 2 }
        let mut scope_bytes = Vec::new();
        put_str(1, scope, &mut scope_bytes);
        put_str(2, version, &mut scope_bytes);
        Encoder {
            resource,
            scope: scope_bytes,
            scope_schema_url: schema_url.to_owned(),
            lens: Vec::new(),
            body: Vec::new(),
        }
    }

    /// Takes back the bytes of a request once sent, for the next one.
    pub(crate) fn reuse(&mut self, mut body: Vec<u8>) {
        if body.capacity() <= KEEP_BODY {
            body.clear();
            self.body = body;
        }
    }

    /// The request exporting `spans`, each span written once, straight
    /// into the body (the lengths of every message are computed first).
    pub(crate) fn request(&mut self, spans: &[Box<Record>]) -> Vec<u8> {
        self.lens.clear();
        self.lens.extend(spans.iter().map(|s| Layout::of(s)));
        let spans_len: usize = self.lens.iter().map(|l| bytes_len(2, l.len)).sum();
        // ScopeSpans { scope = 1, spans = 2, schema_url = 3 }
        let scope_spans = if spans.is_empty() {
            0
        } else {
            bytes_len(1, self.scope.len()) + spans_len + str_len(3, &self.scope_schema_url)
        };
        // ResourceSpans { resource = 1, scope_spans = 2 } (no schema URL)
        let resource_spans = bytes_len(1, self.resource.len())
            + if scope_spans == 0 {
                0
            } else {
                bytes_len(2, scope_spans)
            };
        // ExportTraceServiceRequest { resource_spans = 1 }
        let len = bytes_len(1, resource_spans);
        let mut request = std::mem::take(&mut self.body);
        request.clear();
        request.reserve_exact(len);
        encode_key(1, WireType::LengthDelimited, &mut request);
        encode_varint(resource_spans as u64, &mut request);
        put_bytes(1, &self.resource, &mut request);
        if scope_spans != 0 {
            encode_key(2, WireType::LengthDelimited, &mut request);
            encode_varint(scope_spans as u64, &mut request);
            put_bytes(1, &self.scope, &mut request);
            for (span, layout) in spans.iter().zip(&self.lens) {
                encode_key(2, WireType::LengthDelimited, &mut request);
                encode_varint(layout.len as u64, &mut request);
                put_span(span, layout, &mut request);
            }
            put_str(3, &self.scope_schema_url, &mut request);
        }
        debug_assert_eq!(request.len(), len);
        request
    }
}

/// What a span's encoding needs twice, for its length and its bytes.
#[derive(Debug, Clone, Copy)]
struct Layout {
    /// The `Span` message's length.
    len: usize,
    /// The name's length: operation, then " " and the model.
    name: usize,
    /// The `Status` message's length.
    status: usize,
}

impl Layout {
    fn of(span: &Record) -> Layout {
        let name = span.operation.len() + span.model().map_or(0, |m| 1 + m.len());
        let (code, message) = status(span);
        let status = str_len(2, message) + varint_len(3, code);
        let len = bytes_len(1, 16)
            + bytes_len(2, 8)
            + str_len(3, span.trace_state.as_deref().unwrap_or_default())
            + if span.parent_id == [0; 8] {
                0
            } else {
                bytes_len(4, 8)
            }
            + bytes_len(5, name)
            + varint_len(6, span.kind as u64)
            + fixed_len(7, span.start, 8)
            + fixed_len(8, span.end, 8)
            + span.attributes.len()
            + bytes_len(15, status)
            + fixed_len(16, u64::from(flags(span)), 4);
        Layout { len, name, status }
    }
}

/// `Status { message = 2, code = 3 }`'s values: always present, as the
/// SDK's exporter sent it (code 0 unset, 2 error).
fn status(span: &Record) -> (u64, &str) {
    match &span.error {
        None => (0, ""),
        Some(description) => (2, span.str(description)),
    }
}

/// The W3C flags plus `SPAN_FLAGS_CONTEXT_HAS_IS_REMOTE_MASK` (0x100) and,
/// if the parent is remote, `SPAN_FLAGS_CONTEXT_IS_REMOTE_MASK` (0x200).
fn flags(span: &Record) -> u32 {
    u32::from(span.flags) | 0x100 | if span.parent_remote { 0x200 } else { 0 }
}

/// `Span` (trace/v1) of `span`, laid out as `layout` says.
fn put_span(span: &Record, layout: &Layout, buf: &mut Vec<u8>) {
    put_bytes(1, &span.trace_id, buf);
    put_bytes(2, &span.span_id, buf);
    put_str(3, span.trace_state.as_deref().unwrap_or_default(), buf);
    if span.parent_id != [0; 8] {
        put_bytes(4, &span.parent_id, buf);
    }
    encode_key(5, WireType::LengthDelimited, buf);
    encode_varint(layout.name as u64, buf);
    buf.extend_from_slice(span.operation.as_bytes());
    if let Some(model) = span.model() {
        buf.push(b' ');
        buf.extend_from_slice(model.as_bytes());
    }
    put_varint(6, span.kind as u64, buf);
    put_fixed64(7, span.start, buf);
    put_fixed64(8, span.end, buf);
    buf.extend_from_slice(&span.attributes);
    let (code, message) = status(span);
    encode_key(15, WireType::LengthDelimited, buf);
    encode_varint(layout.status as u64, buf);
    put_str(2, message, buf);
    put_varint(3, code, buf);
    put_fixed32(16, flags(span), buf);
}

/// Span attribute `key` = `value`, as a `Span.attributes` field (9).
///
/// A span has a few dozen of these, written on the request path, so the
/// usual case (every length under 128) appends a few heads of fixed size
/// and the two texts or the number; inlined where `key` is a
/// constant, the key's copy is a few moves. Anything else goes through
/// [`put_key_value`].
#[inline(always)]
pub(crate) fn put_attribute(key: &str, value: Value<'_>, buf: &mut Vec<u8>) {
    const FIELD: u8 = 9 << 3 | LEN as u8;
    const KEY: u8 = 1 << 3 | LEN as u8;
    const VALUE: u8 = 2 << 3 | LEN as u8;
    // KeyValue's length without the value's: the key's field.
    let k = 2 + key.len();
    match value {
        Value::Str(s) if k + 4 + s.len() < 128 => {
            let v = 2 + s.len();
            buf.reserve(k + 4 + v);
            buf.extend_from_slice(&[FIELD, (k + 2 + v) as u8, KEY, key.len() as u8]);
            buf.extend_from_slice(key.as_bytes());
            buf.extend_from_slice(&[VALUE, v as u8, 1 << 3 | LEN as u8, s.len() as u8]);
            buf.extend_from_slice(s.as_bytes());
        }
        Value::I64(i) if k + 13 < 128 => {
            let n = encoded_len_varint(i as u64);
            buf.reserve(k + 5 + n);
            buf.extend_from_slice(&[FIELD, (k + 3 + n) as u8, KEY, key.len() as u8]);
            buf.extend_from_slice(key.as_bytes());
            buf.extend_from_slice(&[VALUE, (1 + n) as u8, 3 << 3]);
            encode_varint(i as u64, buf);
        }
        Value::F64(d) if k + 11 < 128 => {
            buf.reserve(k + 13);
            buf.extend_from_slice(&[FIELD, (k + 11) as u8, KEY, key.len() as u8]);
            buf.extend_from_slice(key.as_bytes());
            buf.extend_from_slice(&[VALUE, 9, 4 << 3 | 1]);
            buf.extend_from_slice(&d.to_le_bytes());
        }
        Value::Bool(b) if k + 4 < 128 => {
            buf.reserve(k + 6);
            buf.extend_from_slice(&[FIELD, (k + 4) as u8, KEY, key.len() as u8]);
            buf.extend_from_slice(key.as_bytes());
            buf.extend_from_slice(&[VALUE, 2, 2 << 3, u8::from(b)]);
        }
        _ => put_key_value(9, key, value, buf),
    }
}

/// `KeyValue { key = 1, value = 2 (AnyValue) }` as field `tag`, any
/// lengths.
fn put_key_value(tag: u32, key: &str, value: Value<'_>, buf: &mut Vec<u8>) {
    // AnyValue { string = 1, bool = 2, int = 3, double = 4 }
    let value_len = match value {
        Value::Str(s) => bytes_len(1, s.len()),
        Value::Bool(_) => key_len(2) + 1,
        Value::I64(i) => key_len(3) + encoded_len_varint(i as u64),
        Value::F64(_) => key_len(4) + 8,
    };
    let len = bytes_len(1, key.len()) + bytes_len(2, value_len);
    buf.reserve(bytes_len(tag, len));
    encode_key(tag, WireType::LengthDelimited, buf);
    encode_varint(len as u64, buf);
    put_str_always(1, key, buf);
    encode_key(2, WireType::LengthDelimited, buf);
    encode_varint(value_len as u64, buf);
    match value {
        Value::Str(s) => put_str_always(1, s, buf),
        Value::Bool(b) => {
            encode_key(2, WireType::Varint, buf);
            buf.push(u8::from(b));
        }
        Value::I64(i) => {
            encode_key(3, WireType::Varint, buf);
            encode_varint(i as u64, buf);
        }
        Value::F64(d) => {
            encode_key(4, WireType::SixtyFourBit, buf);
            buf.extend_from_slice(&d.to_le_bytes());
        }
    }
}

/// A string field written even when empty (inside a message that is
/// written, as the SDK's exporter does for keys and string values).
fn put_str_always(tag: u32, s: &str, buf: &mut Vec<u8>) {
    put_bytes(tag, s.as_bytes(), buf);
}

/// The length-delimited wire type.
const LEN: u32 = 2;

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

/// A proto3 fixed field's length (`size` bytes); zero is not written.
fn fixed_len(tag: u32, v: u64, size: usize) -> usize {
    if v == 0 { 0 } else { key_len(tag) + size }
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

    use proptest::prelude::*;

    use super::{Encoder, put_attribute, put_key_value};
    use crate::span::{Kind, Record, Text, Value};

    const SCHEMA: &str = "https://opentelemetry.io/schemas/1.37.0";

    /// A span as the encoder has it, and its attributes as the SDK's.
    fn record(
        kind: Kind,
        parent: u64,
        remote: bool,
        error: Option<&'static str>,
    ) -> (Record, Vec<KeyValue>) {
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
            attributes: Vec::new(),
            error: None,
            text: String::new(),
        };
        let long = "x".repeat(300);
        let attributes = [
            ("gen_ai.operation.name", Value::from("chat")),
            ("gen_ai.request.model", Value::from("gpt-4o")),
            ("tollgate.deployment", Value::from("primary")),
            ("tollgate.stream", Value::Bool(false)),
            ("tollgate.attempt", Value::I64(2)),
            ("tollgate.tokens_estimated", Value::I64(-7)),
            ("tollgate.big", Value::I64(i64::MAX)),
            ("tollgate.queue_ms", Value::F64(0.125)),
            ("tollgate.cost_usd", Value::F64(0.0)),
            ("empty", Value::from("")),
            // Lengths of two varint bytes.
            ("long", Value::from(long.as_str())),
            ("tollgate.tenant", Value::from("team-ä")),
        ];
        let mut sdk = Vec::new();
        for (key, value) in attributes {
            set(&mut r, &mut sdk, key, value);
        }
        if kind != Kind::Internal {
            r.model = Some(r.own("gpt-4o-mini"));
        }
        r.error = error.map(|e| {
            if kind == Kind::Client {
                Text::Static(e)
            } else {
                r.own(e)
            }
        });
        (r, sdk)
    }

    /// The same span as the OpenTelemetry SDK held it.
    /// Sets `key` to `value` on the record and in the SDK's attributes.
    fn set(r: &mut Record, sdk: &mut Vec<KeyValue>, key: &'static str, value: Value<'_>) {
        r.set(key, value);
        sdk.push(match value {
            Value::Str(s) => KeyValue::new(key, s.to_owned()),
            Value::I64(i) => KeyValue::new(key, i),
            Value::F64(d) => KeyValue::new(key, d),
            Value::Bool(b) => KeyValue::new(key, b),
        });
    }

    /// Our request for `records` (decoded) and the one the SDK's exporter
    /// built for the same spans, under the same resource and scope.
    fn both(
        encoder: &mut Encoder,
        records: &[(Record, Vec<KeyValue>)],
    ) -> (
        Result<ExportTraceServiceRequest, prost::DecodeError>,
        ExportTraceServiceRequest,
    ) {
        let scope = InstrumentationScope::builder("tollgate-gateway")
            .with_version("0.1.0")
            .with_schema_url(SCHEMA)
            .build();
        let resource = Resource::builder_empty()
            .with_service_name("tollgate-test")
            .build();
        let ours: Vec<Box<Record>> = records.iter().map(|(r, _)| Box::new(r.clone())).collect();
        let ours = ExportTraceServiceRequest::decode(encoder.request(&ours).as_slice());
        let theirs = ExportTraceServiceRequest {
            resource_spans: group_spans_by_resource_and_scope(
                records.iter().map(|r| sdk(r, &scope)).collect(),
                &ResourceAttributesWithSchema::from(&resource),
            ),
        };
        (ours, theirs)
    }

    fn encoder() -> Encoder {
        Encoder::new("tollgate-test", "tollgate-gateway", "0.1.0", SCHEMA)
    }

    fn sdk((r, attributes): &(Record, Vec<KeyValue>), scope: &InstrumentationScope) -> SpanData {
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
            attributes: attributes.clone(),
            dropped_attributes_count: 0,
            events: SpanEvents::default(),
            links: SpanLinks::default(),
            status: match &r.error {
                None => Status::Unset,
                Some(e) => Status::error(r.str(e).to_owned()),
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
        let mut records = vec![
            record(Kind::Server, 0x1111, true, None),
            record(Kind::Client, 0x2222, false, Some("rate_limited")),
            record(Kind::Internal, 0, false, None),
            record(Kind::Server, 0, false, Some("stream_failed")),
        ];
        for (i, (r, _)) in records.iter_mut().enumerate() {
            r.span_id[0] = i as u8;
            r.start += i as u64;
        }
        let mut encoder = encoder();
        let (ours, theirs) = both(&mut encoder, &records);
        let ours = ours.expect("a valid request");
        assert_eq!(ours, theirs);

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
        let (ours, theirs) = both(&mut encoder, &records[2..3]);
        assert_eq!(ours.expect("a valid request"), theirs);
    }

    /// proves: OBS-5 (at the short form's bounds, a text attribute whose
    /// `KeyValue` is 127 bytes long and one of 128 and more, with keys
    /// and values on both sides of 128, are written as the general form
    /// writes them and decode to their key and value)
    #[test]
    fn attributes_at_the_short_forms_bounds() {
        for key_len in [0, 1, 60, 121, 122, 123, 126, 127, 128, 130] {
            for value_len in [0, 1, 60, 120, 121, 122, 123, 127, 128, 130] {
                let key = "k".repeat(key_len);
                let value = "v".repeat(value_len);
                let mut short = Vec::new();
                put_attribute(&key, Value::Str(&value), &mut short);
                let mut general = Vec::new();
                put_key_value(9, &key, Value::Str(&value), &mut general);
                assert_eq!(short, general, "key {key_len}, value {value_len}");
                let span = opentelemetry_proto::tonic::trace::v1::Span::decode(short.as_slice())
                    .expect("a valid span field");
                let kv = &span.attributes[0];
                assert_eq!(kv.key, key);
                assert_eq!(
                    kv.value.as_ref().and_then(|a| a.value.clone()),
                    Some(Any::StringValue(value))
                );
            }
        }
    }

    fn value() -> impl Strategy<Value = Owned> {
        prop_oneof![
            ".{0,130}".prop_map(Owned::Str),
            any::<i64>().prop_map(Owned::I64),
            (-3_i64..200).prop_map(Owned::I64),
            any::<f64>().prop_map(Owned::F64),
            any::<bool>().prop_map(Owned::Bool),
        ]
    }

    #[derive(Debug, Clone)]
    enum Owned {
        Str(String),
        I64(i64),
        F64(f64),
        Bool(bool),
    }

    proptest! {
        /// proves: OBS-5 (an attribute is written as the `KeyValue` it
        /// names, whatever its lengths: the short form for lengths under
        /// 128 gives the same bytes as the general one, and prost decodes
        /// them to the same key and value)
        #[test]
        fn attributes_encode_as_their_key_value(key in "[a-z._]{0,140}", v in value()) {
            let value = match &v {
                Owned::Str(s) => Value::Str(s),
                Owned::I64(i) => Value::I64(*i),
                Owned::F64(d) => Value::F64(*d),
                Owned::Bool(b) => Value::Bool(*b),
            };
            let mut short = vec![7];
            put_attribute(&key, value, &mut short);
            let mut general = vec![7];
            put_key_value(9, &key, value, &mut general);
            prop_assert_eq!(&short, &general);
            // As a span's attributes field: decoded back.
            let span = opentelemetry_proto::tonic::trace::v1::Span::decode(&short[1..])
                .expect("a valid span field");
            prop_assert_eq!(span.attributes.len(), 1);
            let kv = &span.attributes[0];
            prop_assert_eq!(&kv.key, &key);
            let got = kv.value.as_ref().and_then(|a| a.value.clone());
            let want = match v {
                Owned::Str(s) => Any::StringValue(s),
                Owned::I64(i) => Any::IntValue(i),
                Owned::F64(d) => Any::DoubleValue(d),
                Owned::Bool(b) => Any::BoolValue(b),
            };
            match (got, want) {
                (Some(Any::DoubleValue(a)), Any::DoubleValue(b)) => {
                    prop_assert_eq!(a.to_bits(), b.to_bits());
                }
                (got, want) => prop_assert_eq!(got, Some(want)),
            }
        }
    }

    /// Attribute keys: short ones, and one whose length alone needs two
    /// varint bytes.
    const KEYS: &[&str] = &[
        "a",
        "tollgate.tenant",
        "gen_ai.usage.input_tokens",
        concat!(
            "kkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkk",
            "kkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkk"
        ),
    ];

    fn kind() -> impl Strategy<Value = Kind> {
        prop_oneof![Just(Kind::Internal), Just(Kind::Server), Just(Kind::Client)]
    }

    proptest! {
        /// proves: OBS-5 (whatever a batch's spans hold, each span's
        /// length computed before it is written is the length written:
        /// the request decodes to exactly what the SDK's exporter built)
        #[test]
        fn any_batch_decodes_to_what_the_sdk_exporter_built(
            spans in proptest::collection::vec(
                (
                    kind(),
                    any::<u64>(),
                    any::<bool>(),
                    prop::sample::select(vec!["", "vendor=a", "a=1,b=2"]),
                    proptest::option::of(".{0,140}"),
                    proptest::option::of(".{0,140}"),
                    prop::sample::select(vec![0_u64, 1, u64::MAX]),
                    proptest::collection::vec((prop::sample::select(KEYS), value()), 0..6),
                ),
                0..4,
            )
        ) {
            let mut records = Vec::new();
            for (i, (kind, parent, remote, state, model, error, end, attributes)) in
                spans.into_iter().enumerate()
            {
                let (mut r, _) = record(kind, parent, remote, None);
                r.span_id[0] = i as u8;
                r.trace_state = (!state.is_empty() || remote).then(|| Arc::from(state));
                r.attributes.clear();
                r.text.clear();
                r.model = model.map(|m| r.own(&m));
                r.error = error.map(|e| r.own(&e));
                r.end = end;
                let mut sdk = Vec::new();
                for (key, v) in &attributes {
                    let value = match v {
                        Owned::Str(s) => Value::Str(s),
                        Owned::I64(i) => Value::I64(*i),
                        // (NaN is not equal to itself in the comparison.)
                        Owned::F64(d) if d.is_nan() => Value::F64(0.5),
                        Owned::F64(d) => Value::F64(*d),
                        Owned::Bool(b) => Value::Bool(*b),
                    };
                    set(&mut r, &mut sdk, key, value);
                }
                records.push((r, sdk));
            }
            let (ours, theirs) = both(&mut encoder(), &records);
            prop_assert_eq!(ours.ok(), Some(theirs));
        }
    }
}

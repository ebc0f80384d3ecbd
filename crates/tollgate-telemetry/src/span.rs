//! The crate's own span record (SPEC OBS-5): what an ended span exports,
//! kept as plain values (ids as bytes, times as Unix nanoseconds, the name
//! as the `&'static str` and shared `Arc<str>` it already is). Attributes
//! are written as OTLP `KeyValue` bytes when they are set, once: no list
//! of values to keep, copy or free, and the export task only copies them
//! into its request.

use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

/// A text value: a constant, a shared name, or a copy of a value the
/// caller only lent, kept in its record's own [`Record::text`].
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Text {
    /// A constant (`chat`, an error kind).
    Static(&'static str),
    /// A name shared with its deployment.
    Shared(Arc<str>),
    /// Bytes `start..start + len` of the record's `text`.
    Own {
        /// Where it starts.
        start: u32,
        /// Its length.
        len: u32,
    },
}

impl Text {
    /// The text, `own` being its record's [`Record::text`].
    pub(crate) fn as_str<'a>(&'a self, own: &'a str) -> &'a str {
        match self {
            Text::Static(s) => s,
            Text::Shared(s) => s,
            Text::Own { start, len } => {
                let start = *start as usize;
                own.get(start..start + *len as usize).unwrap_or_default()
            }
        }
    }
}

/// An attribute's value, lent for as long as it takes to encode it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Value<'a> {
    /// A string.
    Str(&'a str),
    /// An integer.
    I64(i64),
    /// A double.
    F64(f64),
    /// A boolean.
    Bool(bool),
}

impl<'a> From<&'a str> for Value<'a> {
    fn from(s: &'a str) -> Self {
        Value::Str(s)
    }
}

impl From<i64> for Value<'_> {
    fn from(i: i64) -> Self {
        Value::I64(i)
    }
}

impl From<f64> for Value<'_> {
    fn from(d: f64) -> Self {
        Value::F64(d)
    }
}

impl From<bool> for Value<'_> {
    fn from(b: bool) -> Self {
        Value::Bool(b)
    }
}

/// The span kinds this crate records (OTLP's numbers).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// A batch item.
    Internal = 1,
    /// A gateway client's call.
    Server = 2,
    /// An upstream attempt.
    Client = 3,
}

/// One recorded (sampled) span.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Record {
    /// The trace.
    pub trace_id: [u8; 16],
    /// The span.
    pub span_id: [u8; 8],
    /// Its parent; all zeros for a root.
    pub parent_id: [u8; 8],
    /// Whether the parent is a client's (from `traceparent`).
    pub parent_remote: bool,
    /// The W3C trace flags (`01`: sampled).
    pub flags: u8,
    /// The client's `tracestate`, if it sent a valid one.
    pub trace_state: Option<Arc<str>>,
    /// SERVER, CLIENT or INTERNAL.
    pub kind: Kind,
    /// The name's first part (`gen_ai.operation.name`).
    pub operation: &'static str,
    /// The name's second part after a space, once known (the model).
    pub model: Option<Text>,
    /// Start, Unix nanoseconds.
    pub start: u64,
    /// End, Unix nanoseconds.
    pub end: u64,
    /// Attributes in the order they were set, already encoded: each an
    /// OTLP `Span.attributes` field (a `KeyValue`).
    pub attributes: Vec<u8>,
    /// `Some(description)`: the span's status is an error.
    pub error: Option<Text>,
    /// The copies of the caller's text for the name and the status
    /// ([`Text::Own`]): one buffer per span, reused from span to span.
    pub text: String,
}

impl Record {
    /// A blank record whose attribute list and text buffer have room for
    /// `attributes` and `text` bytes.
    pub(crate) fn empty(attributes: usize, text: usize) -> Self {
        Record {
            trace_id: [0; 16],
            span_id: [0; 8],
            parent_id: [0; 8],
            parent_remote: false,
            flags: 0,
            trace_state: None,
            kind: Kind::Internal,
            operation: "",
            model: None,
            start: 0,
            end: 0,
            attributes: Vec::with_capacity(attributes),
            error: None,
            text: String::with_capacity(text),
        }
    }

    /// The model part of the span's name, if known.
    pub(crate) fn model(&self) -> Option<&str> {
        self.model.as_ref().map(|m| m.as_str(&self.text))
    }

    /// A copy of `s` in the span's own text.
    pub(crate) fn own(&mut self, s: &str) -> Text {
        match (u32::try_from(self.text.len()), u32::try_from(s.len())) {
            (Ok(start), Ok(len)) if start.checked_add(len).is_some() => {
                self.text.push_str(s);
                Text::Own { start, len }
            }
            _ => Text::Shared(Arc::from(s)),
        }
    }

    /// Sets attribute `key` to `value` (encoded now, copied once).
    #[inline]
    pub(crate) fn set<'a>(&mut self, key: &'static str, value: impl Into<Value<'a>>) {
        crate::encode::put_attribute(key, value.into(), &mut self.attributes);
    }

    /// The text of `t`, one of this record's.
    pub(crate) fn str<'a>(&'a self, t: &'a Text) -> &'a str {
        t.as_str(&self.text)
    }
}

/// `t` in Unix nanoseconds (0 before 1970, saturated past 2554).
pub(crate) fn nanos(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
}

/// Now, in Unix nanoseconds.
pub(crate) fn now() -> u64 {
    nanos(SystemTime::now())
}

//! The streaming dialects of the upstream APIs (SPEC WIRE-1, WIRE-3): what
//! [`ChunkStream`](super::ChunkStream) reads in an event of each, and how
//! each reports usage.
//!
//! * **Chat completions** (OpenAI `POST /v1/chat/completions`): `data:
//!   <json>` events, `data: [DONE]` ends the stream, usage comes in the
//!   usage-only chunk. Read by `stream.rs` itself (its original protocol).
//! * **Responses** (OpenAI `POST /v1/responses`): `event: <type>` and
//!   `data: <json>` with the same `type`; no `[DONE]`.
//!   `response.completed` and `response.incomplete` end the stream normally
//!   and carry `response.usage`; `response.failed` (`response.error`) and
//!   `error` are declared errors.
//! * **Messages** (Anthropic `POST /v1/messages`): `event: <type>` and
//!   `data: <json>`; `message_start` carries `message.usage`,
//!   `message_delta` the cumulative `usage`, `message_stop` ends the stream
//!   normally and `error` is a declared error.
//!
//! Implementation notes (invariants):
//! * Only what settlement needs is read from an event ([`EventProbe`]):
//!   `type`, `error`, `usage`, and the `usage`/`error` members of
//!   `response` and `message`. Everything else is skipped unread (still
//!   checked to be valid JSON); the large `response` object of a terminal
//!   event is never materialised.
//! * An event's type is its JSON `type` when that is a string, else its SSE
//!   event name. An event is a declared error when either names `error` or
//!   when it has a non-null top-level `error` member (no event of either
//!   dialect has one otherwise), so an error is never forwarded as output.
//! * Anthropic's counters are merged event by event: each counter an event
//!   reports replaces the earlier value ([`AnthropicUsage::merge`]).

use std::fmt;

use serde::Deserialize;
use serde::de::{Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde_json::Value;
use tollgate::Counter;

use super::classify::declared_message;
use super::request::Endpoint;
use super::stream::{engine_usage, parse_object, raw_value};
use crate::wire;

/// The streaming protocol an upstream endpoint speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Dialect {
    /// OpenAI chat completions: `data:` events ended by `data: [DONE]`.
    Chat,
    /// OpenAI Responses: named events ended by `response.completed` (or
    /// `response.incomplete`).
    Responses,
    /// Anthropic Messages: named events ended by `message_stop`.
    Messages,
}

impl Dialect {
    /// The dialect of `endpoint`'s streams (embeddings do not stream; they
    /// are read as chat).
    pub(super) const fn of(endpoint: Endpoint) -> Dialect {
        match endpoint {
            Endpoint::ChatCompletions | Endpoint::Embeddings => Dialect::Chat,
            Endpoint::Responses => Dialect::Responses,
            Endpoint::Messages => Dialect::Messages,
        }
    }

    /// The event that ends a stream normally, as error messages name it.
    pub(super) const fn terminal(self) -> &'static str {
        match self {
            Dialect::Chat => "[DONE]",
            Dialect::Responses => "response.completed",
            Dialect::Messages => "message_stop",
        }
    }

    /// Whether events carry an SSE event name (`event: <type>`).
    pub(super) const fn is_named(self) -> bool {
        !matches!(self, Dialect::Chat)
    }

    /// The API's name, for messages.
    pub(super) const fn api(self) -> &'static str {
        match self {
            Dialect::Chat => "chat completions",
            Dialect::Responses => "Responses",
            Dialect::Messages => "Messages",
        }
    }
}

/// What one event of a named dialect means for the stream.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Step {
    /// Forward the event. With usage when the event updated the usage seen
    /// so far (the usage to settle with if the stream breaks now).
    Forward(Option<tollgate::Usage>),
    /// The terminal event: report this usage, forward the event, then read
    /// the body to its end.
    Complete(tollgate::Usage),
    /// A provider-declared error: forward the event with the error and end
    /// the stream (SPEC LC-4). `usage` is what the event itself reported.
    Declared {
        /// The provider's message (not yet sanitised).
        message: String,
        /// Usage carried by the error event, if any.
        usage: Option<tollgate::Usage>,
    },
}

/// Reads the events of a named dialect, keeping what must be remembered
/// between them (Anthropic's usage counters).
#[derive(Debug, Clone)]
pub(super) struct EventReader {
    dialect: Dialect,
    anthropic: AnthropicUsage,
}

impl EventReader {
    /// A reader for `dialect`'s streams.
    pub(super) fn new(dialect: Dialect) -> Self {
        EventReader {
            dialect,
            anthropic: AnthropicUsage::default(),
        }
    }

    /// The dialect read.
    pub(super) fn dialect(&self) -> Dialect {
        self.dialect
    }

    /// One event: `name` is its SSE event name, `data` its payload.
    ///
    /// # Errors
    /// When `data` is not a JSON object (the reason names the position of
    /// the fault, never the content).
    pub(super) fn read(&mut self, name: Option<&str>, data: &[u8]) -> Result<Step, String> {
        let mut probe: EventProbe = parse_object(data)?;
        let name = name.filter(|n| *n != "message");
        let kind = probe.kind.take();
        let kind = kind.as_ref().and_then(Value::as_str).or(name);
        let declared_error = kind == Some("error")
            || name == Some("error")
            || probe.error.as_ref().is_some_and(|e| !e.is_null());
        if declared_error {
            let message = serde_json::from_slice::<Value>(data)
                .ok()
                .and_then(|v| declared_message(&v))
                .unwrap_or_else(|| "upstream declared an error in the stream".to_owned());
            return Ok(Step::Declared {
                message,
                usage: None,
            });
        }
        let kind = kind.unwrap_or_default();
        Ok(match self.dialect {
            Dialect::Chat => Step::Forward(None),
            Dialect::Responses => responses_step(kind, probe),
            Dialect::Messages => self.messages_step(kind, probe),
        })
    }

    /// An Anthropic event. `message_start`'s `output_tokens` is a
    /// placeholder (Anthropic sends 1 before anything is generated), so
    /// output is taken only from `message_delta` (cumulative): a stream
    /// whose deltas carry no usage keeps its output unknown, and so its
    /// whole output allowance charged, never the placeholder.
    fn messages_step(&mut self, kind: &str, probe: EventProbe) -> Step {
        let update = match kind {
            "message_start" => probe.message.and_then(|m| m.usage).map(|mut raw| {
                if let Some(members) = raw.as_object_mut() {
                    members.remove("output_tokens");
                }
                raw
            }),
            "message_delta" => probe.usage,
            "message_stop" => return Step::Complete(self.anthropic.to_engine()),
            _ => None,
        };
        match update {
            Some(raw) => {
                self.anthropic.merge(&raw);
                Step::Forward(Some(self.anthropic.to_engine()))
            }
            None => Step::Forward(None),
        }
    }
}

/// A Responses event (errors already handled).
fn responses_step(kind: &str, probe: EventProbe) -> Step {
    let response = probe.response.unwrap_or_default();
    match kind {
        "response.completed" | "response.incomplete" => Step::Complete(
            response
                .usage
                .map_or(tollgate::Usage::UNKNOWN, engine_usage),
        ),
        "response.failed" => Step::Declared {
            message: response
                .error
                .and_then(|error| declared_message(&serde_json::json!({ "error": error })))
                .unwrap_or_else(|| "upstream reported the response as failed".to_owned()),
            usage: response.usage.map(engine_usage),
        },
        _ => Step::Forward(None),
    }
}

/// A one-shot body's `usage` value in the engine's terms, read the way
/// `endpoint` reports it (SPEC Q-6): Anthropic's counters for
/// [`Endpoint::Messages`] ([`anthropic_usage`]), OpenAI's (chat
/// `prompt_tokens`/`completion_tokens` or Responses `input_tokens`/
/// `output_tokens`, [`engine_usage`]) for the others.
pub(super) fn usage_of(endpoint: Endpoint, raw: Value) -> tollgate::Usage {
    match Dialect::of(endpoint) {
        Dialect::Messages => anthropic_usage(&raw),
        Dialect::Chat | Dialect::Responses => engine_usage(raw),
    }
}

/// [`usage_of`] a `usage` member kept as raw text (`null` is unknown
/// usage). OpenAI's counters are read straight from the text; what that
/// typed read refuses (a repeated key, a value of another shape) is read
/// through a `Value` as a whole-body parse would, so the result is the
/// same either way. An invalid member (a number out of range) is an
/// error.
pub(super) fn usage_of_raw(endpoint: Endpoint, raw: &str) -> Result<tollgate::Usage, String> {
    if Dialect::of(endpoint) != Dialect::Messages
        && let Ok(usage) = serde_json::from_str::<wire::Usage>(raw)
    {
        return Ok(usage.to_engine());
    }
    Ok(raw_value(Some(raw))?
        .filter(|u| !u.is_null())
        .map_or(tollgate::Usage::UNKNOWN, |u| usage_of(endpoint, u)))
}

impl Endpoint {
    /// The `usage` object of a one-shot response body of this endpoint in
    /// the engine's terms (SPEC, BUD-2): token counts for the
    /// limits and the priced [`Parts`](tollgate::Parts), read the way
    /// this endpoint's provider nests them.
    pub fn engine_usage(self, raw: Value) -> tollgate::Usage {
        usage_of(self, raw)
    }
}

/// Anthropic's `usage` object in the engine's terms (SPEC ).
///
/// Anthropic's `input_tokens` excludes the prompt tokens written to and
/// read from its cache. Cache writes count toward its input-token rate
/// limit, cache reads do not, so:
///
/// * input = `input_tokens` + `cache_creation_input_tokens`;
/// * output = `output_tokens`;
/// * total = input + output (Anthropic reports no total);
/// * cached = `cache_read_input_tokens`, telemetry only, never charged.
///
/// A counter that is absent or `null` (Anthropic types them as optional)
/// counts as not reported; any other value that is not a valid count is
/// invalid and makes its dimension, and so the total, unknown. A value
/// that is not an object is unknown usage.
pub(super) fn anthropic_usage(raw: &Value) -> tollgate::Usage {
    let mut usage = AnthropicUsage::default();
    usage.merge(raw);
    usage.to_engine()
}

/// Anthropic's usage counters as reported so far in a response.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct AnthropicUsage {
    /// `input_tokens` (uncached input only).
    input: Counter,
    /// `cache_creation_input_tokens` (input written to the cache, both
    /// lifetimes).
    cache_creation: Counter,
    /// `cache_creation.ephemeral_1h_input_tokens` (the part written to the
    /// one-hour cache).
    cache_creation_1h: Counter,
    /// `cache_read_input_tokens` (input read from the cache).
    cache_read: Counter,
    /// `output_tokens` (cumulative in a stream).
    output: Counter,
}

impl AnthropicUsage {
    /// Takes the counters `raw` reports: each one present and not `null`
    /// replaces the earlier value (a stream's `message_delta` counters are
    /// cumulative, and newer API versions repeat the input counters there,
    /// possibly as `null`). A `null` usage changes nothing; a usage that is
    /// not an object makes input and output invalid.
    pub(super) fn merge(&mut self, raw: &Value) {
        match raw {
            Value::Null => {}
            Value::Object(members) => {
                for (key, counter) in [
                    ("input_tokens", &mut self.input),
                    ("cache_creation_input_tokens", &mut self.cache_creation),
                    ("cache_read_input_tokens", &mut self.cache_read),
                    ("output_tokens", &mut self.output),
                ] {
                    if let Some(value) = members.get(key).filter(|v| !v.is_null()) {
                        *counter = wire::Counter::classify(value).into();
                    }
                }
                let one_hour = members
                    .get("cache_creation")
                    .and_then(|c| c.get("ephemeral_1h_input_tokens"))
                    .filter(|v| !v.is_null());
                if let Some(value) = one_hour {
                    self.cache_creation_1h = wire::Counter::classify(value).into();
                }
            }
            _ => {
                self.input = Counter::Invalid;
                self.output = Counter::Invalid;
            }
        }
    }

    /// The engine's view: see [`anthropic_usage`].
    ///
    /// Anthropic always reports `output_tokens`: where it has not (a stream
    /// whose `message_delta` carried no usage), the output is unknown, not
    /// zero, so the usage is unknown and the whole reservation stays
    /// counted (SPEC Q-5).
    pub(super) fn to_engine(self) -> tollgate::Usage {
        let output = match self.output {
            Counter::Absent => Counter::Invalid,
            reported => reported,
        };
        tollgate::Usage::from_counters(
            Counter::Absent,
            sum(self.input, self.cache_creation),
            output,
            self.cache_read,
        )
        .with_parts(self.parts())
    }

    /// The tokens by how they are priced (SPEC BUD-2): Anthropic's
    /// counters are disjoint already (`input_tokens` is the uncached
    /// input); `cache_creation.ephemeral_1h_input_tokens` is the part of
    /// the cache writes that went to the one-hour cache. `None` when the
    /// input or the output is not a valid count, or a cache counter is
    /// invalid (the cost is then unknown and the reservation stays).
    fn parts(&self) -> Option<tollgate::Parts> {
        let (Counter::Value(input), Counter::Value(output)) = (self.input, self.output) else {
            return None;
        };
        let or_zero = |c: Counter| match c {
            Counter::Absent => Some(0),
            Counter::Value(v) => Some(v),
            Counter::Invalid => None,
        };
        let written = or_zero(self.cache_creation)?;
        let written_1h = or_zero(self.cache_creation_1h)?;
        Some(tollgate::Parts {
            input,
            cached_input: or_zero(self.cache_read)?,
            cache_write: written.checked_sub(written_1h)?,
            cache_write_1h: written_1h,
            output,
            ..tollgate::Parts::default()
        })
    }
}

/// The sum of two counters: invalid if either is, absent if both are
/// (absent counts as zero otherwise).
fn sum(a: Counter, b: Counter) -> Counter {
    match (a, b) {
        (Counter::Invalid, _) | (_, Counter::Invalid) => Counter::Invalid,
        (Counter::Absent, Counter::Absent) => Counter::Absent,
        (Counter::Value(v), Counter::Absent) | (Counter::Absent, Counter::Value(v)) => {
            Counter::Value(v)
        }
        (Counter::Value(a), Counter::Value(b)) => Counter::Value(a.saturating_add(b)),
    }
}

/// The members of a Responses or Messages event the reader looks at.
/// Unknown members are skipped (still checked to be valid JSON).
#[derive(Deserialize)]
struct EventProbe {
    /// The event type (a string in both dialects; anything else is
    /// ignored).
    #[serde(default, rename = "type")]
    kind: Option<Value>,
    /// A declared error (Anthropic's `error` event; some compatible
    /// servers').
    #[serde(default)]
    error: Option<Value>,
    /// Anthropic's `message_delta` usage.
    #[serde(default)]
    usage: Option<Value>,
    /// The Responses object of `response.*` lifecycle events.
    #[serde(default)]
    response: Option<Members>,
    /// Anthropic's `message_start` message (a string in a Responses `error`
    /// event, hence [`Members`]' leniency).
    #[serde(default)]
    message: Option<Members>,
}

/// The `usage` and `error` members of a nested object; every other member
/// is skipped unread. A value that is not an object has neither.
#[derive(Debug, Default)]
struct Members {
    usage: Option<Value>,
    error: Option<Value>,
}

/// The member names [`Members`] tells apart.
#[derive(Deserialize)]
#[serde(field_identifier, rename_all = "lowercase")]
enum Key {
    Usage,
    Error,
    #[serde(other)]
    Other,
}

impl<'de> Deserialize<'de> for Members {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(MembersVisitor)
    }
}

struct MembersVisitor;

impl<'de> Visitor<'de> for MembersVisitor {
    type Value = Members;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Members, A::Error> {
        let mut members = Members::default();
        while let Some(key) = map.next_key::<Key>()? {
            match key {
                Key::Usage => members.usage = map.next_value::<Option<Value>>()?,
                Key::Error => members.error = map.next_value::<Option<Value>>()?,
                Key::Other => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(members)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Members, A::Error> {
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(Members::default())
    }

    fn visit_bool<E>(self, _: bool) -> Result<Members, E> {
        Ok(Members::default())
    }

    fn visit_i64<E>(self, _: i64) -> Result<Members, E> {
        Ok(Members::default())
    }

    fn visit_u64<E>(self, _: u64) -> Result<Members, E> {
        Ok(Members::default())
    }

    fn visit_f64<E>(self, _: f64) -> Result<Members, E> {
        Ok(Members::default())
    }

    fn visit_str<E>(self, _: &str) -> Result<Members, E> {
        Ok(Members::default())
    }

    fn visit_unit<E>(self) -> Result<Members, E> {
        Ok(Members::default())
    }
}

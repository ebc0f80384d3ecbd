//! Chat completions: request, response and stream chunk.

use serde::de::Deserializer;
use serde::ser::{SerializeMap, Serializer};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::usage::Usage;

/// `object` of a one-shot chat completion response.
pub const CHAT_COMPLETION_OBJECT: &str = "chat.completion";
/// `object` of a chat completion stream chunk.
pub const CHAT_COMPLETION_CHUNK_OBJECT: &str = "chat.completion.chunk";

/// `POST /v1/chat/completions` request body.
///
/// Only the fields that tollgate reads are typed; everything else
/// (`temperature`, `tool_choice`, `response_format`, `user`, …) lives in
/// [`ChatCompletionRequest::extra`] and is written back unchanged.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ChatCompletionRequest {
    /// Model (or deployment) name.
    pub model: String,
    /// The conversation.
    pub messages: Vec<ChatMessage>,
    /// `true` for a server-sent-events response.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stream: Option<bool>,
    /// Stream options (`include_usage`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stream_options: Option<StreamOptions>,
    /// Legacy output cap.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tokens: Option<u64>,
    /// Output cap including reasoning tokens; wins over `max_tokens`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_completion_tokens: Option<u64>,
    /// Number of choices to generate.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub n: Option<u64>,
    /// Tool definitions, kept as raw JSON.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tools: Option<Vec<Value>>,
    /// Legacy function definitions, kept as raw JSON.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub functions: Option<Vec<Value>>,
    /// Every other field, kept verbatim.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

impl ChatCompletionRequest {
    /// A request for `model` with `messages` and nothing else.
    pub fn new(model: impl Into<String>, messages: Vec<ChatMessage>) -> Self {
        ChatCompletionRequest {
            model: model.into(),
            messages,
            ..Default::default()
        }
    }

    /// `true` when the client asked for a stream.
    pub fn is_stream(&self) -> bool {
        self.stream == Some(true)
    }

    /// `true` when the client asked for the final usage chunk
    /// (`stream_options.include_usage: true`).
    pub fn wants_stream_usage(&self) -> bool {
        self.stream_options
            .as_ref()
            .and_then(|o| o.include_usage)
            .unwrap_or(false)
    }

    /// Makes the upstream stream end with a usage chunk (SPEC GW-5) by
    /// setting `stream_options.include_usage = true`, keeping any other
    /// stream option. Returns whether the client had asked for it itself; when
    /// it had not, the gateway strips the usage chunk again
    /// ([`ChatCompletionChunk::is_usage_only`]).
    pub fn request_stream_usage(&mut self) -> bool {
        let client_asked = self.wants_stream_usage();
        self.stream_options
            .get_or_insert_with(StreamOptions::default)
            .include_usage = Some(true);
        client_asked
    }

    /// The requested output cap: the larger of `max_completion_tokens`
    /// and `max_tokens` when both are set. Providers differ in which one
    /// they read (OpenAI prefers the first, some OpenAI-compatible servers
    /// know only the second), so what is reserved covers either reading
    /// (SPEC Q-7).
    pub fn max_output_tokens(&self) -> Option<u64> {
        match (self.max_completion_tokens, self.max_tokens) {
            (Some(a), Some(b)) => Some(a.max(b)),
            (a, b) => a.or(b),
        }
    }

    /// The value `field` must be given before the request goes to a
    /// provider that reads that field, if the request does not carry it:
    /// `tokens` (the allowance its reservation counted) when the request
    /// sets no cap; the request's own `max_completion_tokens` when `field`
    /// is `max_tokens` and only the other one is set (a server that knows
    /// only `max_tokens` would otherwise generate up to its own default);
    /// else none.
    pub fn cap_to_set(&self, tokens: u64, field: CapField) -> Option<u64> {
        match (self.max_output_tokens(), field, self.max_tokens) {
            (None, _, _) => Some(tokens),
            (Some(set), CapField::MaxTokens, None) => Some(set),
            _ => None,
        }
    }

    /// Sets `field` as [`cap_to_set`](Self::cap_to_set) says, so that the
    /// provider never generates, and bills, more than was reserved (SPEC
    /// Q-7, BUD-2). Returns whether it set one.
    pub fn cap_output(&mut self, tokens: u64, field: CapField) -> bool {
        let Some(tokens) = self.cap_to_set(tokens, field) else {
            return false;
        };
        match field {
            CapField::MaxCompletionTokens => self.max_completion_tokens = Some(tokens),
            CapField::MaxTokens => self.max_tokens = Some(tokens),
        }
        true
    }

    /// Number of choices requested (`n`, default 1; 0 is treated as 1).
    pub fn choice_count(&self) -> u64 {
        self.n.unwrap_or(1).max(1)
    }
}

/// Where a chat completion's output cap goes when the gateway sets one
/// ([`ChatCompletionRequest::cap_output`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CapField {
    /// `max_completion_tokens`: OpenAI's and Azure's (the only one their
    /// reasoning models take).
    #[default]
    MaxCompletionTokens,
    /// `max_tokens`: what every OpenAI-compatible server understands.
    MaxTokens,
}

impl CapField {
    /// The member's name in the request body.
    pub const fn member(self) -> &'static str {
        match self {
            CapField::MaxCompletionTokens => "max_completion_tokens",
            CapField::MaxTokens => "max_tokens",
        }
    }
}

/// `stream_options` of a chat request.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct StreamOptions {
    /// Ask for a final chunk with `usage` and no choices.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub include_usage: Option<bool>,
    /// Every other field, kept verbatim.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

/// One message of a conversation, or the message of a response choice.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ChatMessage {
    /// `system`, `developer`, `user`, `assistant`, `tool`, `function`, or any
    /// other role a provider accepts.
    pub role: String,
    /// Text or content parts; `None` when absent or `null` (an assistant
    /// message that only calls tools).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content: Option<MessageContent>,
    /// Optional participant name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Tool calls made by an assistant message.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<ToolCall>>,
    /// The call a `tool` message answers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
    /// Legacy function call of an assistant message.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub function_call: Option<FunctionCall>,
    /// A refusal written by the model.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refusal: Option<String>,
    /// Every other field, kept verbatim.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

impl ChatMessage {
    /// A message with a role and text content.
    pub fn new(role: impl Into<String>, text: impl Into<String>) -> Self {
        ChatMessage {
            role: role.into(),
            content: Some(MessageContent::Text(text.into())),
            ..Default::default()
        }
    }

    /// A `system` message.
    pub fn system(text: impl Into<String>) -> Self {
        Self::new("system", text)
    }

    /// A `user` message.
    pub fn user(text: impl Into<String>) -> Self {
        Self::new("user", text)
    }

    /// An `assistant` message.
    pub fn assistant(text: impl Into<String>) -> Self {
        Self::new("assistant", text)
    }
}

/// Message content: a plain string or an array of parts.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum MessageContent {
    /// `"content": "text"`.
    Text(String),
    /// `"content": [{"type": "text", ...}, {"type": "image_url", ...}]`.
    Parts(Vec<ContentPart>),
    /// Any other JSON shape, passed through so the provider can judge it.
    Other(Value),
}

impl MessageContent {
    /// The text of the content: the string itself, or the text parts joined
    /// with nothing in between. Non-text parts are skipped.
    pub fn text(&self) -> String {
        match self {
            MessageContent::Text(t) => t.clone(),
            MessageContent::Parts(parts) => parts.iter().filter_map(ContentPart::as_text).collect(),
            MessageContent::Other(_) => String::new(),
        }
    }
}

/// One element of an array `content`.
///
/// Text parts are typed; every other kind (`image_url`, `input_audio`,
/// `file`, `refusal`, future kinds) is kept as raw JSON in
/// [`ContentPart::Other`].
#[derive(Debug, Clone, PartialEq)]
pub enum ContentPart {
    /// `{"type": "text", "text": ...}`.
    Text {
        /// The text.
        text: String,
        /// Other fields of the part, kept verbatim.
        extra: Map<String, Value>,
    },
    /// Any other part.
    Other(Value),
}

impl ContentPart {
    /// A text part.
    pub fn text(text: impl Into<String>) -> Self {
        ContentPart::Text {
            text: text.into(),
            extra: Map::new(),
        }
    }

    /// The text of a text part.
    pub fn as_text(&self) -> Option<&str> {
        match self {
            ContentPart::Text { text, .. } => Some(text),
            ContentPart::Other(_) => None,
        }
    }

    /// The `type` of the part (`"text"`, `"image_url"`, …), if it has one.
    pub fn kind(&self) -> Option<&str> {
        match self {
            ContentPart::Text { .. } => Some("text"),
            ContentPart::Other(v) => v.get("type").and_then(Value::as_str),
        }
    }
}

impl Serialize for ContentPart {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self {
            ContentPart::Text { text, extra } => {
                let mut map = serializer.serialize_map(None)?;
                map.serialize_entry("type", "text")?;
                map.serialize_entry("text", text)?;
                for (k, v) in extra {
                    if k != "type" && k != "text" {
                        map.serialize_entry(k, v)?;
                    }
                }
                map.end()
            }
            ContentPart::Other(v) => v.serialize(serializer),
        }
    }
}

impl<'de> Deserialize<'de> for ContentPart {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let value = Value::deserialize(deserializer)?;
        let is_text = value.get("type").and_then(Value::as_str) == Some("text")
            && value.get("text").is_some_and(Value::is_string);
        match value {
            Value::Object(mut map) if is_text => {
                let text = match map.remove("text") {
                    Some(Value::String(t)) => t,
                    // Checked just above: `text` is a string.
                    _ => String::new(),
                };
                map.remove("type");
                Ok(ContentPart::Text { text, extra: map })
            }
            other => Ok(ContentPart::Other(other)),
        }
    }
}

/// A tool call in an assistant message, or a fragment of one in a stream
/// delta (where `index` is set and the other fields arrive piecemeal).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ToolCall {
    /// Position of the call (stream deltas only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub index: Option<u32>,
    /// Call id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// Call type, `"function"`.
    #[serde(default, rename = "type", skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    /// The function called.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub function: Option<FunctionCall>,
    /// Every other field, kept verbatim.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

/// Name and JSON-encoded arguments of a function call.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct FunctionCall {
    /// Function name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Arguments as JSON text (possibly partial in a stream delta).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub arguments: Option<String>,
    /// Every other field, kept verbatim.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

/// One-shot chat completion response.
///
/// Missing `id`, `object`, `created` or `model` deserialize to empty/zero
/// rather than failing, so a sloppy compatible provider is still usable.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ChatCompletionResponse {
    /// Response id.
    #[serde(default)]
    pub id: String,
    /// `"chat.completion"`.
    #[serde(default)]
    pub object: String,
    /// Unix seconds.
    #[serde(default)]
    pub created: u64,
    /// Model that answered.
    #[serde(default)]
    pub model: String,
    /// The choices.
    #[serde(default)]
    pub choices: Vec<ChatChoice>,
    /// Token usage, when reported.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
    /// Every other field (`system_fingerprint`, `service_tier`, …).
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

/// One choice of a one-shot response.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ChatChoice {
    /// Choice index.
    #[serde(default)]
    pub index: u32,
    /// The generated message.
    #[serde(default)]
    pub message: ChatMessage,
    /// `stop`, `length`, `tool_calls`, `content_filter`, … (written as
    /// `null` when `None`).
    #[serde(default)]
    pub finish_reason: Option<String>,
    /// Every other field (`logprobs`, …).
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

/// One `data:` payload of a streamed chat completion.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ChatCompletionChunk {
    /// Stream id (the same in every chunk).
    #[serde(default)]
    pub id: String,
    /// `"chat.completion.chunk"`.
    #[serde(default)]
    pub object: String,
    /// Unix seconds.
    #[serde(default)]
    pub created: u64,
    /// Model that answers.
    #[serde(default)]
    pub model: String,
    /// Choice deltas; empty in the final usage chunk.
    #[serde(default)]
    pub choices: Vec<ChunkChoice>,
    /// Usage: set in the final chunk when `include_usage` was requested,
    /// `None` (omitted) otherwise. An explicit `null` reads as `None`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
    /// Every other field, kept verbatim.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

impl ChatCompletionChunk {
    /// An empty chunk (no choices, no usage) with `object` set.
    pub fn new(id: impl Into<String>, created: u64, model: impl Into<String>) -> Self {
        ChatCompletionChunk {
            id: id.into(),
            object: CHAT_COMPLETION_CHUNK_OBJECT.to_owned(),
            created,
            model: model.into(),
            ..Default::default()
        }
    }

    /// Adds a choice.
    pub fn with_choice(mut self, choice: ChunkChoice) -> Self {
        self.choices.push(choice);
        self
    }

    /// Sets the usage.
    pub fn with_usage(mut self, usage: Usage) -> Self {
        self.usage = Some(usage);
        self
    }

    /// `true` for the final usage chunk: usage set and no choices. The
    /// gateway drops such a chunk when the client did not ask for usage
    /// (SPEC GW-5).
    pub fn is_usage_only(&self) -> bool {
        self.usage.is_some() && self.choices.is_empty()
    }
}

/// One choice delta of a stream chunk.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ChunkChoice {
    /// Choice index.
    #[serde(default)]
    pub index: u32,
    /// What this chunk adds.
    #[serde(default)]
    pub delta: ChatDelta,
    /// Set in the last chunk of the choice; written as `null` otherwise.
    #[serde(default)]
    pub finish_reason: Option<String>,
    /// Every other field (`logprobs`, …).
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

impl ChunkChoice {
    /// The first delta of a choice, carrying only the role.
    pub fn role(index: u32, role: impl Into<String>) -> Self {
        ChunkChoice {
            index,
            delta: ChatDelta {
                role: Some(role.into()),
                ..Default::default()
            },
            ..Default::default()
        }
    }

    /// A content delta.
    pub fn content(index: u32, text: impl Into<String>) -> Self {
        ChunkChoice {
            index,
            delta: ChatDelta {
                content: Some(text.into()),
                ..Default::default()
            },
            ..Default::default()
        }
    }

    /// The closing delta: empty, with a finish reason.
    pub fn finish(index: u32, reason: impl Into<String>) -> Self {
        ChunkChoice {
            index,
            finish_reason: Some(reason.into()),
            ..Default::default()
        }
    }
}

/// The incremental part of a stream choice.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ChatDelta {
    /// Role, in the first delta.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub role: Option<String>,
    /// Content text fragment.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content: Option<String>,
    /// Refusal text fragment.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refusal: Option<String>,
    /// Tool call fragments.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<ToolCall>>,
    /// Legacy function call fragment.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub function_call: Option<FunctionCall>,
    /// Every other field, kept verbatim.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn round_trip<T>(raw: &Value) -> T
    where
        T: serde::de::DeserializeOwned + Serialize,
    {
        let typed: T = serde_json::from_value(raw.clone()).expect("deserialize");
        let back = serde_json::to_value(&typed).expect("serialize");
        assert_eq!(&back, raw, "round trip changed the body");
        typed
    }

    #[test]
    fn request_unknown_fields_round_trip() {
        let raw = json!({
            "model": "gpt-4o-mini",
            "messages": [
                {"role": "developer", "content": "be brief", "x-msg": 1},
                {"role": "user", "name": "ann", "content": [
                    {"type": "text", "text": "what is this?", "cache_control": {"type": "ephemeral"}},
                    {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA", "detail": "low"}},
                    {"type": "future_part", "blob": [1, 2, 3]}
                ]},
                {"role": "assistant", "tool_calls": [
                    {"id": "call_1", "type": "function",
                     "function": {"name": "lookup", "arguments": "{\"q\":1}"}, "x-call": true}
                ]},
                {"role": "tool", "tool_call_id": "call_1", "content": "42"}
            ],
            "stream": true,
            "stream_options": {"include_usage": false, "x-opt": "keep"},
            "max_completion_tokens": 64,
            "n": 2,
            "temperature": 0.2,
            "tools": [{"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}],
            "tool_choice": "auto",
            "response_format": {"type": "json_object"},
            "metadata": {"a": "b"},
            "some_future_field": [null, {"deep": true}]
        });
        let req: ChatCompletionRequest = round_trip(&raw);
        assert!(req.is_stream());
        assert!(!req.wants_stream_usage());
        assert_eq!(req.max_output_tokens(), Some(64));
        assert_eq!(req.choice_count(), 2);
        assert_eq!(req.extra.get("temperature"), Some(&json!(0.2)));
        assert!(req.extra.contains_key("some_future_field"));
        let parts = match &req.messages[1].content {
            Some(MessageContent::Parts(p)) => p,
            other => panic!("expected parts, got {other:?}"),
        };
        assert_eq!(parts[0].as_text(), Some("what is this?"));
        assert_eq!(parts[1].kind(), Some("image_url"));
        assert_eq!(parts[2].kind(), Some("future_part"));
        assert_eq!(req.messages[2].content, None);
    }

    // proves: GW-5
    #[test]
    fn request_stream_usage_reports_what_the_client_asked() {
        let mut req: ChatCompletionRequest = serde_json::from_value(json!({
            "model": "m", "messages": [], "stream": true
        }))
        .expect("request");
        assert!(!req.request_stream_usage());
        assert!(req.wants_stream_usage());

        let mut req: ChatCompletionRequest = serde_json::from_value(json!({
            "model": "m", "messages": [], "stream": true,
            "stream_options": {"include_usage": true, "continuous_usage_stats": false}
        }))
        .expect("request");
        assert!(req.request_stream_usage());
        let back = serde_json::to_value(&req).expect("serialize");
        assert_eq!(
            back["stream_options"],
            json!({"include_usage": true, "continuous_usage_stats": false})
        );
    }

    // proves: Q-7, BUD-2 (a request without a cap takes the reserved
    // allowance in the flavour's field; one with a cap keeps its value,
    // copied into max_tokens for a deployment that reads only that)
    #[test]
    fn cap_output_sets_only_a_missing_cap() {
        let mut req = ChatCompletionRequest::new("m", vec![]);
        assert!(req.cap_output(64, CapField::MaxCompletionTokens));
        assert_eq!(
            (req.max_completion_tokens, req.max_tokens),
            (Some(64), None)
        );
        assert!(!req.cap_output(32, CapField::MaxCompletionTokens));
        assert!(req.cap_output(32, CapField::MaxTokens));
        assert_eq!(
            (req.max_completion_tokens, req.max_tokens),
            (Some(64), Some(64))
        );
        assert!(!req.cap_output(32, CapField::MaxTokens));
        assert_eq!(req.max_output_tokens(), Some(64));
        let mut legacy = ChatCompletionRequest::new("m", vec![]);
        assert!(legacy.cap_output(16, CapField::MaxTokens));
        assert_eq!(
            (legacy.max_completion_tokens, legacy.max_tokens),
            (None, Some(16))
        );
        let json = serde_json::to_value(&legacy).expect("serialises");
        assert_eq!(json["max_tokens"], 16);
        assert!(json.get("max_completion_tokens").is_none());
    }

    // proves: Q-7 (the output reserved covers either cap a provider may
    // read: the larger of the two when both are set; and a deployment that
    // reads only max_tokens is sent the cap in max_tokens)
    #[test]
    fn max_output_is_the_larger_cap_and_max_tokens_gets_it() {
        let mut req = ChatCompletionRequest::new("m", vec![ChatMessage::user("hi")]);
        assert_eq!(req.max_output_tokens(), None);
        req.max_tokens = Some(10);
        assert_eq!(req.max_output_tokens(), Some(10));
        req.max_completion_tokens = Some(20);
        assert_eq!(req.max_output_tokens(), Some(20));
        req.max_tokens = Some(30);
        assert_eq!(req.max_output_tokens(), Some(30));
        req.n = Some(0);
        assert_eq!(req.choice_count(), 1);

        let mut only_new = ChatCompletionRequest::new("m", vec![ChatMessage::user("hi")]);
        only_new.max_completion_tokens = Some(7);
        assert_eq!(
            only_new.cap_to_set(100, CapField::MaxCompletionTokens),
            None
        );
        assert_eq!(only_new.cap_to_set(100, CapField::MaxTokens), Some(7));
        assert!(only_new.cap_output(100, CapField::MaxTokens));
        assert_eq!(
            (only_new.max_completion_tokens, only_new.max_tokens),
            (Some(7), Some(7))
        );
        let mut only_old = ChatCompletionRequest::new("m", vec![ChatMessage::user("hi")]);
        only_old.max_tokens = Some(9);
        assert_eq!(
            only_old.cap_to_set(100, CapField::MaxCompletionTokens),
            None
        );
        assert_eq!(only_old.cap_to_set(100, CapField::MaxTokens), None);
        let none = ChatCompletionRequest::new("m", vec![ChatMessage::user("hi")]);
        assert_eq!(none.cap_to_set(100, CapField::MaxTokens), Some(100));
        assert_eq!(
            none.cap_to_set(100, CapField::MaxCompletionTokens),
            Some(100)
        );
    }

    #[test]
    fn response_round_trip_with_unknown_fields() {
        let raw = json!({
            "id": "chatcmpl-1", "object": "chat.completion", "created": 1_700_000_000u64,
            "model": "gpt-4o-mini-2024-07-18",
            "choices": [{
                "index": 0,
                "message": {"role": "assistant", "content": "hi", "refusal": null, "annotations": []},
                "logprobs": null,
                "finish_reason": "stop"
            }],
            "usage": {"prompt_tokens": 9, "completion_tokens": 1, "total_tokens": 10,
                      "prompt_tokens_details": {"cached_tokens": 0, "audio_tokens": 0},
                      "completion_tokens_details": {"reasoning_tokens": 0}},
            "service_tier": "default",
            "system_fingerprint": "fp_1"
        });
        // `refusal: null` is a known optional field: it reads as None and is
        // omitted on output; everything else is unchanged.
        let resp: ChatCompletionResponse = serde_json::from_value(raw.clone()).expect("resp");
        let mut expected = raw.clone();
        if let Some(msg) = expected["choices"][0]["message"].as_object_mut() {
            msg.remove("refusal");
        }
        assert_eq!(serde_json::to_value(&resp).expect("serialize"), expected);
        assert_eq!(resp.usage.as_ref().and_then(Usage::known_total), Some(10));
        assert!(resp.choices[0].message.extra.contains_key("annotations"));
    }

    #[test]
    fn stream_chunks_round_trip() {
        let role = json!({"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m",
            "system_fingerprint": "fp",
            "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": null, "finish_reason": null}]});
        let content = json!({"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m",
            "choices": [{"index": 0, "delta": {"content": "Hel"}, "finish_reason": null}]});
        let tool = json!({"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m",
            "choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"arguments": "{\"a"}}]}, "finish_reason": null}]});
        let finish = json!({"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m",
            "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]});
        let usage = json!({"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m",
            "choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7}});
        for raw in [&role, &content, &tool, &finish] {
            let chunk: ChatCompletionChunk = round_trip(raw);
            assert!(!chunk.is_usage_only());
        }
        let chunk: ChatCompletionChunk = round_trip(&usage);
        assert!(chunk.is_usage_only());
    }

    #[test]
    fn null_usage_in_a_chunk_reads_as_none() {
        let chunk: ChatCompletionChunk = serde_json::from_value(json!({
            "id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m",
            "choices": [{"index": 0, "delta": {"content": "x"}, "finish_reason": null}],
            "usage": null
        }))
        .expect("chunk");
        assert_eq!(chunk.usage, None);
        assert!(!chunk.is_usage_only());
    }

    #[test]
    fn chunk_builders_produce_openai_shapes() {
        let chunk =
            ChatCompletionChunk::new("c", 7, "m").with_choice(ChunkChoice::content(0, "hi"));
        assert_eq!(
            serde_json::to_value(&chunk).expect("serialize"),
            json!({"id": "c", "object": "chat.completion.chunk", "created": 7, "model": "m",
                   "choices": [{"index": 0, "delta": {"content": "hi"}, "finish_reason": null}]})
        );
        let last = ChatCompletionChunk::new("c", 7, "m").with_usage(Usage::from_counts(3, 4));
        assert!(last.is_usage_only());
        let first = ChunkChoice::role(0, "assistant");
        assert_eq!(first.delta.role.as_deref(), Some("assistant"));
        assert_eq!(
            ChunkChoice::finish(1, "length").finish_reason.as_deref(),
            Some("length")
        );
    }

    #[test]
    fn content_text_joins_text_parts() {
        let content: MessageContent = serde_json::from_value(json!([
            {"type": "text", "text": "a"},
            {"type": "image_url", "image_url": {"url": "x"}},
            {"type": "text", "text": "b"}
        ]))
        .expect("content");
        assert_eq!(content.text(), "ab");
        assert_eq!(MessageContent::Text("t".into()).text(), "t");
        // A text part whose `text` is not a string is kept raw.
        let odd: ContentPart =
            serde_json::from_value(json!({"type": "text", "text": 5})).expect("part");
        assert_eq!(odd, ContentPart::Other(json!({"type": "text", "text": 5})));
        let other: MessageContent = serde_json::from_value(json!(42)).expect("content");
        assert_eq!(other, MessageContent::Other(json!(42)));
    }

    // Found by fuzzing: a float in an unknown field must survive
    // parse → serialise → parse unchanged.
    #[test]
    fn floats_in_unknown_fields_round_trip_exactly() {
        let text =
            r#"{"model":"m","messages":[],"x":1.6666666666666667e+70,"y":0.1,"z":-2.5e-308}"#;
        let first: ChatCompletionRequest = serde_json::from_str(text).expect("request");
        let again: ChatCompletionRequest =
            serde_json::from_str(&serde_json::to_string(&first).expect("serialize"))
                .expect("request");
        assert_eq!(first, again);
    }

    #[test]
    fn malformed_requests_are_errors_not_panics() {
        for raw in [
            json!({"messages": []}),
            json!({"model": "m"}),
            json!({"model": "m", "messages": [{"content": "no role"}]}),
            json!({"model": "m", "messages": [], "max_tokens": -1}),
            json!({"model": "m", "messages": [], "n": "two"}),
            json!([]),
        ] {
            assert!(serde_json::from_value::<ChatCompletionRequest>(raw).is_err());
        }
    }
}

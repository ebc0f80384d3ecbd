//! Anthropic Messages API: the request (SPEC WIRE-3).

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// `POST /v1/messages` request body (Anthropic's Messages API).
///
/// Only the fields that tollgate reads are typed; everything else
/// (`temperature`, `tool_choice`, `thinking`, `metadata`,
/// `stop_sequences`, …) lives in [`MessagesRequest::extra`] and is written
/// back unchanged. Anthropic requires `max_tokens`; it is optional here so
/// that the provider, not the gateway, judges a request without it (the
/// estimate then uses the default output allowance).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct MessagesRequest {
    /// Model name.
    pub model: String,
    /// The conversation: alternating `user` and `assistant` turns.
    pub messages: Vec<AnthropicMessage>,
    /// The system prompt: a string or an array of `text` blocks; `None`
    /// when absent or `null`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub system: Option<Value>,
    /// Output cap.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tokens: Option<u64>,
    /// `true` for a server-sent-events response.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stream: Option<bool>,
    /// Tool definitions (client tools with `name`, `description`,
    /// `input_schema`; server tools with a versioned `type`), kept as raw
    /// JSON.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tools: Option<Vec<Value>>,
    /// Every other field, kept verbatim.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

impl MessagesRequest {
    /// A request for `model` with `messages` and a `max_tokens` cap.
    pub fn new(model: impl Into<String>, messages: Vec<AnthropicMessage>, max_tokens: u64) -> Self {
        MessagesRequest {
            model: model.into(),
            messages,
            max_tokens: Some(max_tokens),
            ..Default::default()
        }
    }

    /// `true` when the client asked for a stream.
    pub fn is_stream(&self) -> bool {
        self.stream == Some(true)
    }
}

/// One turn of a Messages conversation.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct AnthropicMessage {
    /// `user` or `assistant`.
    pub role: String,
    /// A string, or an array of content blocks (`text`, `image`,
    /// `document`, `tool_use`, `tool_result`, `thinking`, …), kept as raw
    /// JSON.
    pub content: Value,
    /// Every other field, kept verbatim.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

impl AnthropicMessage {
    /// A message with a role and string content.
    pub fn new(role: impl Into<String>, text: impl Into<String>) -> Self {
        AnthropicMessage {
            role: role.into(),
            content: Value::String(text.into()),
            extra: Map::new(),
        }
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

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    // proves: WIRE-3 (a Messages request passes through with every field it
    // does not model kept verbatim)
    #[test]
    fn request_unknown_fields_round_trip() {
        let raw = json!({
            "model": "claude-sonnet-4-5",
            "max_tokens": 1024,
            "system": [{"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}}],
            "messages": [
                {"role": "user", "content": [
                    {"type": "text", "text": "what is this?"},
                    {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AAAA"}}
                ]},
                {"role": "assistant", "content": [
                    {"type": "tool_use", "id": "toolu_1", "name": "lookup", "input": {"q": 1}}
                ], "x-msg": 1},
                {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": "toolu_1", "content": "42"}
                ]}
            ],
            "stream": true,
            "tools": [{"name": "lookup", "description": "d", "input_schema": {"type": "object"}}],
            "tool_choice": {"type": "auto"},
            "thinking": {"type": "enabled", "budget_tokens": 2048},
            "temperature": 0.25,
            "some_future_field": [null, {"deep": true}]
        });
        let req: MessagesRequest = serde_json::from_value(raw.clone()).expect("request");
        assert_eq!(serde_json::to_value(&req).expect("serialize"), raw);
        assert!(req.is_stream());
        assert_eq!(req.max_tokens, Some(1024));
        assert_eq!(req.messages.len(), 3);
        assert_eq!(req.messages[1].role, "assistant");
        assert!(req.messages[1].extra.contains_key("x-msg"));
        assert!(req.extra.contains_key("thinking"));
        assert!(req.extra.contains_key("some_future_field"));
    }

    #[test]
    fn builders_and_null_fields() {
        let req = MessagesRequest::new(
            "claude-haiku-4-5",
            vec![
                AnthropicMessage::user("hi"),
                AnthropicMessage::assistant("hello"),
            ],
            16,
        );
        assert!(!req.is_stream());
        assert_eq!(
            serde_json::to_value(&req).expect("serialize"),
            json!({"model": "claude-haiku-4-5", "max_tokens": 16, "messages": [
                {"role": "user", "content": "hi"},
                {"role": "assistant", "content": "hello"}
            ]})
        );
        let nulls: MessagesRequest = serde_json::from_value(json!({
            "model": "m", "messages": [], "system": null, "max_tokens": null, "stream": null
        }))
        .expect("request");
        assert_eq!(nulls.system, None);
        assert_eq!(nulls.max_tokens, None);
        assert_eq!(
            serde_json::to_value(&nulls).expect("serialize"),
            json!({"model": "m", "messages": []})
        );
    }

    #[test]
    fn floats_in_unknown_fields_round_trip_exactly() {
        let text = r#"{"model":"m","messages":[{"role":"user","content":[{"x":1.6666666666666667e+70}]}],"y":0.1,"z":-2.5e-308}"#;
        let first: MessagesRequest = serde_json::from_str(text).expect("request");
        let again: MessagesRequest =
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
            json!({"model": "m", "messages": [{"role": "user"}]}),
            json!({"model": "m", "messages": {"role": "user", "content": "x"}}),
            json!({"model": "m", "messages": [], "max_tokens": -1}),
            json!({"model": "m", "messages": [], "max_tokens": 1.5}),
            json!({"model": "m", "messages": [], "stream": "yes"}),
            json!({"model": "m", "messages": [], "tools": "none"}),
            json!([]),
        ] {
            assert!(
                serde_json::from_value::<MessagesRequest>(raw.clone()).is_err(),
                "{raw}"
            );
        }
        for bytes in [
            &b"{"[..],
            b"",
            b"{\"model\":\"m\",\"messages\":[],}",
            b"\xff",
        ] {
            assert!(serde_json::from_slice::<MessagesRequest>(bytes).is_err());
        }
    }
}

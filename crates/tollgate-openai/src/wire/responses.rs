//! OpenAI Responses API: the request (SPEC WIRE-1).

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// `POST /v1/responses` request body.
///
/// Only the fields that tollgate reads are typed; everything else
/// (`temperature`, `tool_choice`, `text`, `reasoning`,
/// `previous_response_id`, `store`, `metadata`, …) lives in
/// [`ResponsesRequest::extra`] and is written back unchanged. `input` is
/// kept as raw JSON (a string, or an array of items of many kinds) and read
/// through [`ResponsesRequest::input_text`] and
/// [`ResponsesRequest::input_items`].
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ResponsesRequest {
    /// Model (or deployment) name.
    pub model: String,
    /// The input: a string (one user message) or an array of items
    /// (`message`s with a `role` and a string or parts `content`,
    /// `function_call`, `function_call_output`, `reasoning`, …). `None`
    /// when absent or `null` (a request that only continues a stored
    /// conversation).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input: Option<Value>,
    /// A system (developer) message placed before the input; `None` when
    /// absent or `null`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instructions: Option<String>,
    /// Output cap, reasoning tokens included.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_output_tokens: Option<u64>,
    /// `true` for a server-sent-events response.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stream: Option<bool>,
    /// Tool definitions, kept as raw JSON.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tools: Option<Vec<Value>>,
    /// Every other field, kept verbatim.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

impl ResponsesRequest {
    /// A request for `model` with a string `input` and nothing else.
    pub fn new(model: impl Into<String>, input: impl Into<String>) -> Self {
        ResponsesRequest {
            model: model.into(),
            input: Some(Value::String(input.into())),
            ..Default::default()
        }
    }

    /// Sets `max_output_tokens` of a request that has none to `tokens`:
    /// the allowance its reservation counted (SPEC Q-7, BUD-2). Returns
    /// whether it was set.
    pub fn cap_output(&mut self, tokens: u64) -> bool {
        if self.max_output_tokens.is_some() {
            return false;
        }
        self.max_output_tokens = Some(tokens);
        true
    }

    /// `true` when the client asked for a stream.
    pub fn is_stream(&self) -> bool {
        self.stream == Some(true)
    }

    /// The input when it is a plain string (one user message).
    pub fn input_text(&self) -> Option<&str> {
        self.input.as_ref().and_then(Value::as_str)
    }

    /// The input items when the input is an array; empty for a string,
    /// absent or otherwise shaped input.
    pub fn input_items(&self) -> &[Value] {
        match &self.input {
            Some(Value::Array(items)) => items,
            _ => &[],
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    // proves: WIRE-1 (a Responses request passes through the gateway with
    // every field it does not model kept verbatim)
    #[test]
    fn request_unknown_fields_round_trip() {
        let raw = json!({
            "model": "gpt-4.1-mini",
            "instructions": "Be brief.",
            "input": [
                {"role": "user", "content": [
                    {"type": "input_text", "text": "what is this?"},
                    {"type": "input_image", "image_url": "data:image/png;base64,AAAA", "detail": "low"}
                ]},
                {"type": "function_call", "call_id": "call_1", "name": "lookup",
                 "arguments": "{\"q\":1}", "x-item": true},
                {"type": "function_call_output", "call_id": "call_1", "output": "42"},
                {"type": "future_item", "blob": [1, 2.5, null]}
            ],
            "max_output_tokens": 64,
            "stream": true,
            "tools": [{"type": "function", "name": "lookup", "parameters": {"type": "object"}}],
            "tool_choice": "auto",
            "text": {"format": {"type": "text"}},
            "reasoning": {"effort": "low"},
            "previous_response_id": "resp_1",
            "store": false,
            "some_future_field": [null, {"deep": true}]
        });
        let req: ResponsesRequest = serde_json::from_value(raw.clone()).expect("request");
        assert_eq!(serde_json::to_value(&req).expect("serialize"), raw);
        assert!(req.is_stream());
        assert_eq!(req.max_output_tokens, Some(64));
        assert_eq!(req.instructions.as_deref(), Some("Be brief."));
        assert_eq!(req.input_items().len(), 4);
        assert_eq!(req.input_text(), None);
        assert!(req.extra.contains_key("previous_response_id"));
        assert!(req.extra.contains_key("some_future_field"));
    }

    #[test]
    fn string_input_and_null_fields() {
        let req: ResponsesRequest = serde_json::from_value(json!({
            "model": "m", "input": "hello", "instructions": null, "stream": false
        }))
        .expect("request");
        assert_eq!(req.input_text(), Some("hello"));
        assert!(req.input_items().is_empty());
        assert!(!req.is_stream());
        assert_eq!(req.instructions, None);
        // `null` known fields read as absent and are omitted again.
        assert_eq!(
            serde_json::to_value(&req).expect("serialize"),
            json!({"model": "m", "input": "hello", "stream": false})
        );
        assert_eq!(
            req,
            ResponsesRequest {
                stream: Some(false),
                ..ResponsesRequest::new("m", "hello")
            }
        );
        // No input at all (a continuation of a stored conversation).
        let bare: ResponsesRequest =
            serde_json::from_value(json!({"model": "m"})).expect("request");
        assert_eq!(bare.input, None);
        assert!(bare.input_items().is_empty());
    }

    #[test]
    fn floats_in_unknown_fields_round_trip_exactly() {
        let text = r#"{"model":"m","input":[{"x":1.6666666666666667e+70}],"y":0.1,"z":-2.5e-308}"#;
        let first: ResponsesRequest = serde_json::from_str(text).expect("request");
        let again: ResponsesRequest =
            serde_json::from_str(&serde_json::to_string(&first).expect("serialize"))
                .expect("request");
        assert_eq!(first, again);
    }

    #[test]
    fn malformed_requests_are_errors_not_panics() {
        for raw in [
            json!({"input": "no model"}),
            json!({"model": 5, "input": "x"}),
            json!({"model": "m", "instructions": ["not", "a", "string"]}),
            json!({"model": "m", "max_output_tokens": -1}),
            json!({"model": "m", "max_output_tokens": "ten"}),
            json!({"model": "m", "stream": "yes"}),
            json!({"model": "m", "tools": {"type": "function"}}),
            json!([]),
            json!("model"),
        ] {
            assert!(
                serde_json::from_value::<ResponsesRequest>(raw.clone()).is_err(),
                "{raw}"
            );
        }
        for bytes in [&b"{"[..], b"", b"{\"model\":\"m\",}", b"\xff"] {
            assert!(serde_json::from_slice::<ResponsesRequest>(bytes).is_err());
        }
    }
}

//! Anthropic wire types: the request fields the simulator reads, the
//! message it answers, and the error body
//! `{"type":"error","error":{"type","message"}}`.

use axum::Json;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The fields of a Messages request the simulator uses; the rest are
/// accepted and ignored.
#[derive(Debug, Deserialize)]
pub(crate) struct MessagesRequest {
    pub(crate) model: Option<String>,
    /// A string or an array of text blocks.
    pub(crate) system: Option<Value>,
    pub(crate) messages: Option<Vec<InputMessage>>,
    pub(crate) max_tokens: Option<u64>,
    pub(crate) stream: Option<bool>,
}

/// One input message: a role and a string or an array of content blocks.
#[derive(Debug, Deserialize)]
pub(crate) struct InputMessage {
    pub(crate) role: Option<String>,
    pub(crate) content: Option<Value>,
}

/// `usage` of a message.
#[derive(Debug, Clone, Copy, Serialize)]
pub(crate) struct MessagesUsage {
    pub(crate) input_tokens: u64,
    pub(crate) output_tokens: u64,
}

/// One text block of the answer.
#[derive(Debug, Serialize)]
pub(crate) struct TextBlock<'a> {
    #[serde(rename = "type")]
    pub(crate) kind: &'static str,
    pub(crate) text: &'a str,
}

/// A one-shot message (also the `message` of `message_start`, with empty
/// content and no stop reason).
#[derive(Debug, Serialize)]
pub(crate) struct Message<'a> {
    pub(crate) id: &'a str,
    #[serde(rename = "type")]
    pub(crate) kind: &'static str,
    pub(crate) role: &'static str,
    pub(crate) model: &'a str,
    pub(crate) content: Vec<TextBlock<'a>>,
    pub(crate) stop_reason: Option<&'static str>,
    pub(crate) stop_sequence: Option<()>,
    pub(crate) usage: MessagesUsage,
}

/// An Anthropic-format error response.
#[derive(Debug, Clone)]
pub(crate) struct AnthropicError {
    pub(crate) status: StatusCode,
    /// `invalid_request_error`, `authentication_error`, `rate_limit_error`,
    /// `api_error`, `overloaded_error`.
    pub(crate) kind: &'static str,
    pub(crate) message: String,
}

#[derive(Serialize)]
struct Envelope<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    error: Body<'a>,
}

#[derive(Serialize)]
struct Body<'a> {
    #[serde(rename = "type")]
    kind: &'a str,
    message: &'a str,
}

impl AnthropicError {
    /// A 400 `invalid_request_error`.
    pub(crate) fn invalid(message: impl Into<String>) -> Self {
        Self {
            status: StatusCode::BAD_REQUEST,
            kind: "invalid_request_error",
            message: message.into(),
        }
    }
}

impl IntoResponse for AnthropicError {
    fn into_response(self) -> Response {
        let envelope = Envelope {
            kind: "error",
            error: Body {
                kind: self.kind,
                message: &self.message,
            },
        };
        (self.status, Json(envelope)).into_response()
    }
}

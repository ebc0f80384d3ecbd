//! OpenAI wire types: the request fields the simulator reads, the responses
//! and stream chunks it writes, and the error body.

use axum::Json;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The fields of a chat completion request the simulator uses; the rest are
/// accepted and ignored.
#[derive(Debug, Deserialize)]
pub(crate) struct ChatRequest {
    pub(crate) model: Option<String>,
    pub(crate) messages: Option<Vec<ChatMessage>>,
    #[serde(default)]
    pub(crate) stream: Option<bool>,
    pub(crate) stream_options: Option<StreamOptions>,
    pub(crate) max_tokens: Option<u64>,
    pub(crate) max_completion_tokens: Option<u64>,
    pub(crate) n: Option<u64>,
}

/// One chat message; only `content` is counted.
#[derive(Debug, Deserialize)]
pub(crate) struct ChatMessage {
    #[allow(dead_code)] // required by the format, not used
    pub(crate) role: String,
    pub(crate) content: Option<Value>,
}

/// `stream_options` of a chat request.
#[derive(Debug, Deserialize)]
pub(crate) struct StreamOptions {
    #[serde(default)]
    pub(crate) include_usage: Option<bool>,
}

/// The fields of an embeddings request the simulator uses.
#[derive(Debug, Deserialize)]
pub(crate) struct EmbeddingsRequest {
    pub(crate) model: Option<String>,
    pub(crate) input: Option<Value>,
    pub(crate) encoding_format: Option<String>,
    pub(crate) dimensions: Option<u32>,
}

/// `usage` of a chat completion.
#[derive(Debug, Clone, Copy, Serialize)]
pub(crate) struct Usage {
    pub(crate) prompt_tokens: u64,
    pub(crate) completion_tokens: u64,
    pub(crate) total_tokens: u64,
}

/// `usage` of an embeddings response.
#[derive(Debug, Clone, Copy, Serialize)]
pub(crate) struct EmbeddingUsage {
    pub(crate) prompt_tokens: u64,
    pub(crate) total_tokens: u64,
}

/// A one-shot chat completion.
#[derive(Debug, Serialize)]
pub(crate) struct ChatCompletion<'a> {
    pub(crate) id: &'a str,
    pub(crate) object: &'static str,
    pub(crate) created: u64,
    pub(crate) model: &'a str,
    pub(crate) system_fingerprint: &'static str,
    pub(crate) choices: [Choice<'a>; 1],
    pub(crate) usage: Usage,
}

/// The one choice of a one-shot completion.
#[derive(Debug, Serialize)]
pub(crate) struct Choice<'a> {
    pub(crate) index: u32,
    pub(crate) message: AssistantMessage<'a>,
    pub(crate) logprobs: Option<()>,
    pub(crate) finish_reason: &'a str,
}

/// The generated message.
#[derive(Debug, Serialize)]
pub(crate) struct AssistantMessage<'a> {
    pub(crate) role: &'static str,
    pub(crate) content: &'a str,
    pub(crate) refusal: Option<()>,
}

/// One `chat.completion.chunk` event.
#[derive(Debug, Serialize)]
pub(crate) struct ChatChunk<'a> {
    pub(crate) id: &'a str,
    pub(crate) object: &'static str,
    pub(crate) created: u64,
    pub(crate) model: &'a str,
    pub(crate) system_fingerprint: &'static str,
    pub(crate) choices: &'a [ChunkChoice<'a>],
    /// Absent unless the client asked for usage; then `null` on every chunk
    /// but the last, which carries the numbers (as OpenAI does).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) usage: Option<Option<Usage>>,
}

/// The choice of a chunk.
#[derive(Debug, Serialize)]
pub(crate) struct ChunkChoice<'a> {
    pub(crate) index: u32,
    pub(crate) delta: Delta<'a>,
    pub(crate) logprobs: Option<()>,
    pub(crate) finish_reason: Option<&'a str>,
}

/// The delta of a chunk.
#[derive(Debug, Default, Serialize)]
pub(crate) struct Delta<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) role: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) content: Option<&'a str>,
}

/// An embeddings response.
#[derive(Debug, Serialize)]
pub(crate) struct EmbeddingList<'a> {
    pub(crate) object: &'static str,
    pub(crate) data: Vec<Embedding>,
    pub(crate) model: &'a str,
    pub(crate) usage: EmbeddingUsage,
}

/// One embedding.
#[derive(Debug, Serialize)]
pub(crate) struct Embedding {
    pub(crate) object: &'static str,
    pub(crate) index: usize,
    pub(crate) embedding: EmbeddingVector,
}

/// An embedding as floats or as base64 of little-endian `f32`s.
#[derive(Debug, Serialize)]
#[serde(untagged)]
pub(crate) enum EmbeddingVector {
    Float(Vec<f32>),
    Base64(String),
}

/// An OpenAI-format error response: `{"error":{"message","type","param","code"}}`.
#[derive(Debug, Clone)]
pub(crate) struct ApiError {
    pub(crate) status: StatusCode,
    pub(crate) message: String,
    pub(crate) kind: &'static str,
    pub(crate) param: Option<&'static str>,
    pub(crate) code: Option<&'static str>,
}

#[derive(Serialize)]
struct ErrorEnvelope<'a> {
    error: ErrorBody<'a>,
}

#[derive(Serialize)]
struct ErrorBody<'a> {
    message: &'a str,
    #[serde(rename = "type")]
    kind: &'a str,
    param: Option<&'a str>,
    code: Option<&'a str>,
}

impl ApiError {
    /// A 400 `invalid_request_error`.
    pub(crate) fn invalid(message: impl Into<String>, param: Option<&'static str>) -> Self {
        Self {
            status: StatusCode::BAD_REQUEST,
            message: message.into(),
            kind: "invalid_request_error",
            param,
            code: None,
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let envelope = ErrorEnvelope {
            error: ErrorBody {
                message: &self.message,
                kind: self.kind,
                param: self.param,
                code: self.code,
            },
        };
        (self.status, Json(envelope)).into_response()
    }
}

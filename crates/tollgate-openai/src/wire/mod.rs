//! Serde types for the OpenAI HTTP API as a gateway, simulator and client see
//! it: chat completions, embeddings, models, errors, the Responses API
//! request ([`ResponsesRequest`], SPEC WIRE-1), and Anthropic's Messages API
//! request ([`MessagesRequest`], SPEC WIRE-3).
//!
//! Every request and response struct has an `extra` map filled through
//! `#[serde(flatten)]`: fields this crate does not model are kept and written
//! back on serialisation, so a proxy that parses a body, edits a field and
//! re-serialises it never drops what it does not understand. Known optional
//! fields that are absent (or `null`) deserialize to `None` and are omitted
//! again on output, except where OpenAI always writes them (`finish_reason`,
//! error `param`/`code`), which are written as `null`.
//!
//! Usage counters are kept as raw JSON values ([`Usage`]) and classified on
//! demand into [`Counter`], so the quota layer can tell an absent counter from
//! an invalid one and from a valid zero (SPEC ).

mod chat;
mod embeddings;
mod error;
mod messages;
mod models;
mod responses;
mod usage;

pub use chat::{
    CHAT_COMPLETION_CHUNK_OBJECT, CHAT_COMPLETION_OBJECT, CapField, ChatChoice,
    ChatCompletionChunk, ChatCompletionRequest, ChatCompletionResponse, ChatDelta, ChatMessage,
    ChunkChoice, ContentPart, FunctionCall, MessageContent, StreamOptions, ToolCall,
};
pub use embeddings::{
    Embedding, EmbeddingInput, EmbeddingVector, EmbeddingsRequest, EmbeddingsResponse,
};
pub use error::{ErrorBody, ErrorResponse};
pub use messages::{AnthropicMessage, MessagesRequest};
pub use models::{Model, ModelList};
pub use responses::ResponsesRequest;
pub use usage::{Counter, Usage, UsageCounters};

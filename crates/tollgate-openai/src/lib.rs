//! OpenAI-compatible building blocks for tollgate:
//!
//! * [`wire`]: serde types for chat completions (request, response, stream
//!   chunk), embeddings, the models list and the OpenAI error body. Every
//!   struct keeps fields it does not know in an `extra` map, so a proxy that
//!   parses and re-serialises a body never drops them. Usage counters are
//!   kept raw and classified on demand ([`wire::Counter`]); the charge is
//!   computed by the engine's SPEC Q-6 rules ([`wire::Usage::to_engine`]).
//! * [`sse`]: an incremental, memory-bounded server-sent-events decoder
//!   (bytes in with arbitrary splits, events out) and the matching encoder.
//! * [`rate_limit`]: rate-limit hints from response headers (`retry-after`,
//!   `retry-after-ms`, OpenAI `x-ratelimit-*`, Anthropic
//!   `anthropic-ratelimit-*`), SPEC RT-3 and CD-1.
//! * [`tokens`]: token estimation for chat and embeddings requests with the
//!   tokenizer of the model family (SPEC GW-5, Q-3), usable as the engine's
//!   `tollgate::TokenEstimator`.
//! * [`provider`]: [`HttpProvider`], the engine's
//!   `tollgate::lifecycle::Provider` over an OpenAI-compatible HTTP API
//!   (one-shot and SSE streams, RT-2 error classes, LC-3..5 stream ends).
//!
//! * [`prices`]: the price table of common models (the repository's
//!   `data/prices.toml`, SPEC BUD-1), with overrides, for the engine's
//!   integer [`tollgate::Price`].
//!
//! Nothing in this crate panics on input: malformed headers are ignored,
//! malformed SSE yields typed errors, and malformed JSON fails to
//! deserialize.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod prices;
pub mod provider;
pub mod rate_limit;
pub mod sse;
pub mod tokens;
pub mod wire;

pub use provider::{Endpoint, HttpProvider, UpstreamRequest};
pub use rate_limit::{DimensionHints, RateLimitHints};
pub use sse::{SseDecoder, SseError, SseEvent, SseItem};
pub use tokens::{TokenEstimate, TokenEstimator, TokenizerKind};
pub use wire::{
    ChatCompletionChunk, ChatCompletionRequest, ChatCompletionResponse, ChatMessage, Counter,
    EmbeddingsRequest, EmbeddingsResponse, ErrorResponse, MessagesRequest, ModelList,
    ResponsesRequest, Usage,
};

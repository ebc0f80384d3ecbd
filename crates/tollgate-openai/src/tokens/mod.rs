//! Token estimation for admission (SPEC Q-3, GW-5).
//!
//! The estimate reserves quota before the provider is called; it is
//! reconciled with the reported usage afterwards, so it aims to be
//! close and, where a choice is needed, slightly high rather than low.
//!
//! * [`TokenizerKind::for_model`] picks the tokenizer of a model family:
//!   `o200k_base` for gpt-4o / gpt-4.1 / gpt-4.5 / gpt-5 / o1 / o3 / o4 /
//!   gpt-oss, `cl100k_base` for gpt-4 / gpt-3.5 / text-embedding-3 / ada-002,
//!   and a character ratio (4 characters per token, rounded up) for any
//!   other model.
//! * Each tokenizer is built once per process (tiktoken-rs singletons;
//!   building one takes tens of milliseconds). [`warm_up`] builds both at
//!   start-up so that no request pays for it.
//! * [`TokenEstimator`] counts chat, embeddings, Responses (SPEC WIRE-1)
//!   and Anthropic Messages (WIRE-3) requests into a [`TokenEstimate`]
//!   (`input` + `output`). Anthropic publishes no offline tokenizer, so
//!   Messages requests are counted at a documented character ratio
//!   ([`ANTHROPIC_CHARS_PER_TOKEN`]). It is also the engine's
//!   [`tollgate::TokenEstimator`] for those four requests and for already
//!   serialised [`UpstreamRequest`](crate::provider::UpstreamRequest)s.

mod admission;
mod encoding;
mod estimator;
mod messages;
mod responses;

pub use encoding::{TokenizerKind, warm_up};
pub use estimator::{
    DEFAULT_NON_TEXT_PART_TOKENS, DEFAULT_OUTPUT_TOKENS, DEFINITIONS_OVERHEAD_TOKENS,
    MIN_RESPONSES_OUTPUT_TOKENS, Profile, REPLY_PRIMING_TOKENS, TOKENS_PER_MESSAGE,
    TOKENS_PER_NAME, TOKENS_PER_TOOL_CALL, TokenEstimate, TokenEstimator,
};
pub use messages::{
    ANTHROPIC_CHARS_PER_TOKEN, ANTHROPIC_REQUEST_OVERHEAD, ANTHROPIC_TOKENS_PER_MESSAGE,
    ANTHROPIC_TOOLS_OVERHEAD_TOKENS,
};

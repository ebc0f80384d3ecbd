//! Rate-limit hints from provider response headers (SPEC RT-3, CD-1).
//!
//! [`RateLimitHints::from_headers`] reads `retry-after`, `retry-after-ms`,
//! OpenAI `x-ratelimit-{limit,remaining,reset}-{requests,tokens}` and
//! Anthropic `anthropic-ratelimit-{requests,tokens,input-tokens,output-tokens}-{limit,remaining,reset}`
//! into one provider-neutral struct. Absolute times are converted to
//! durations against an injected wall clock `now`.
//!
//! Every value is parsed leniently: an invalid value is ignored (`None`),
//! never an error and never a panic. Durations larger than [`MAX_HINT`]
//! (one week) are clamped to it, so an absurd hint still reads as "a very
//! long wait" (and makes the retry policy fail fast, RT-4) without any
//! overflow. Counts that do not fit in a `u64` are ignored.

mod hints;
pub mod parse;

pub use hints::{DimensionHints, HEADER_NAMES, RateLimitHints};
pub use parse::MAX_HINT;

#[cfg(test)]
mod tests;

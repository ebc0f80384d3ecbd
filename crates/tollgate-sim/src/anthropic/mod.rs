//! Anthropic's Messages API as the simulator speaks it (`POST /v1/messages`):
//! its continuously replenished request, input-token and output-token limits
//! ([`bucket`], [`limits`]), wire types and errors, rate-limit headers and
//! SSE event stream. The route itself is `routes/anthropic.rs`.

pub mod bucket;
pub(crate) mod headers;
pub mod limits;
pub(crate) mod stream;
pub(crate) mod wire;

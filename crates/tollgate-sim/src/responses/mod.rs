//! OpenAI's Responses API as the simulator speaks it (`POST /v1/responses`):
//! the request fields it reads and the response object it writes
//! ([`wire`]), and the typed SSE event stream ([`stream`]). The route is
//! `routes/responses.rs`; it shares the chat route's limits, faults and
//! latency.

pub(crate) mod stream;
pub(crate) mod wire;

//! Server-sent events: an incremental decoder for provider streams and an
//! encoder for the simulator and the gateway.
//!
//! The decoder follows the WHATWG event-stream rules (LF, CRLF and CR line
//! endings, `:` comments, `event`/`data`/`id`/`retry` fields, one optional
//! space after the colon, a leading BOM) with three additions for LLM
//! streams:
//!
//! * the OpenAI `data: [DONE]` sentinel comes out as [`SseItem::Done`];
//! * memory is bounded by a maximum event size, and exceeding it is
//!   [`SseError::EventTooLarge`], never unbounded growth;
//! * a stream that ends inside an event is reported by
//!   [`SseDecoder::finish`] as [`SseError::Truncated`] (the partial event is
//!   discarded, never dispatched), so a cut-off stream is never mistaken for
//!   a normal end (SPEC LC-3).

mod decode;
mod encode;
mod error;
mod event;
mod stream;

pub use decode::{DEFAULT_MAX_EVENT_SIZE, SseDecoder};
pub use encode::{DONE_FRAME, encode_comment, encode_data, encode_json};
pub use error::SseError;
pub use event::{SseEvent, SseItem};
pub use stream::{SseStream, SseStreamError};

#[cfg(test)]
mod tests;

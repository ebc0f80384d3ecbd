//! A streamed body written from an event script: the typed SSE streams of
//! the Responses API and of Anthropic's Messages API (the chat completion
//! stream keeps its own module, [`crate::stream`]).
//!
//! A script says how many events a complete stream has, the delay before
//! each and its bytes. The body sends them in order; a planned disconnect
//! after `k` events sends the first `k`, then ends the body with an error
//! (hyper aborts the connection: the client sees a truncated transfer and
//! never the final event). The body owns the request's [`RequestGuard`]: the
//! slot is held until the last event is produced, the cut, or the client
//! going away (counted as a client disconnect when the body is dropped
//! early).

use std::time::Duration;

use axum::body::Body;
use axum::http::{HeaderValue, header};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use futures_util::stream;
use serde::Serialize;

use crate::state::RequestGuard;
use crate::stream::SimulatedDisconnect;

/// The events of one stream.
pub(crate) trait EventScript: Send + 'static {
    /// Events of a complete stream.
    fn len(&self) -> u32;
    /// Delay before event `i`.
    fn delay(&self, i: u32) -> Duration;
    /// The bytes of event `i` (`i < len()`).
    fn event(&self, i: u32) -> Bytes;
}

struct ScriptState<S> {
    script: S,
    guard: RequestGuard,
    next: u32,
    disconnect_after: Option<u32>,
    ended: bool,
}

/// The `text/event-stream` response that plays `script`.
pub(crate) fn script_response<S: EventScript>(
    script: S,
    guard: RequestGuard,
    disconnect_after: Option<u32>,
) -> Response {
    let state = ScriptState {
        script,
        guard,
        next: 0,
        disconnect_after,
        ended: false,
    };
    let mut response = Body::from_stream(stream::unfold(state, next_event)).into_response();
    let h = response.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream"),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    response
}

async fn next_event<S: EventScript>(
    mut st: ScriptState<S>,
) -> Option<(Result<Bytes, SimulatedDisconnect>, ScriptState<S>)> {
    if st.ended || st.next >= st.script.len() {
        return None;
    }
    if st.disconnect_after == Some(st.next) {
        // Let hyper flush the events already produced before the cut.
        tokio::task::yield_now().await;
        st.ended = true;
        st.guard.finish(|c| c.faults.disconnect += 1);
        return Some((Err(SimulatedDisconnect), st));
    }
    let delay = st.script.delay(st.next);
    if !delay.is_zero() {
        tokio::time::sleep(delay).await;
    }
    let bytes = st.script.event(st.next);
    st.next += 1;
    if st.next == st.script.len() {
        st.guard.finish(|_| {});
    }
    Some((Ok(bytes), st))
}

/// `event: <name>\ndata: <json>\n\n`.
pub(crate) fn sse_event(name: &str, data: &impl Serialize) -> Bytes {
    let mut out = Vec::with_capacity(256);
    out.extend_from_slice(b"event: ");
    out.extend_from_slice(name.as_bytes());
    out.extend_from_slice(b"\ndata: ");
    // Serialising a `serde_json::Value` or plain struct cannot fail; an
    // empty object keeps the stream well-formed should it ever.
    if serde_json::to_writer(&mut out, data).is_err() {
        out.extend_from_slice(b"{}");
    }
    out.extend_from_slice(b"\n\n");
    Bytes::from(out)
}

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
use axum::response::Response;
use bytes::Bytes;
use futures_util::stream;
use serde::Serialize;

use crate::config::SimConfig;
use crate::state::RequestGuard;
use crate::stream::{SimulatedDisconnect, event_stream_response};

/// The events of one stream: `HEAD` events, one delta per output token,
/// then `TAIL` events.
pub(crate) trait EventScript: Send + 'static {
    /// Events before the first delta.
    const HEAD: u32;
    /// Events after the last delta.
    const TAIL: u32;
    /// Output tokens, one delta each.
    fn output_tokens(&self) -> u64;
    /// The bytes of event `i` (`i < len()`).
    fn event(&self, i: u32) -> Bytes;

    /// Deltas of a stream of `output_tokens`.
    fn deltas_of(output_tokens: u64) -> u32 {
        u32::try_from(output_tokens).unwrap_or(u32::MAX - Self::HEAD - Self::TAIL)
    }

    /// Events of a complete stream of `output_tokens`.
    fn event_count(output_tokens: u64) -> u32 {
        Self::deltas_of(output_tokens).saturating_add(Self::HEAD + Self::TAIL)
    }

    /// Deltas of this stream.
    fn deltas(&self) -> u32 {
        Self::deltas_of(self.output_tokens())
    }

    /// Events of this stream, complete.
    fn len(&self) -> u32 {
        Self::event_count(self.output_tokens())
    }

    /// Delay before event `i`: `ttft` before the first, `per_token` before
    /// each delta, none before the others.
    fn delay(&self, pacing: &Pacing, i: u32) -> Duration {
        if i == 0 {
            pacing.ttft
        } else if (Self::HEAD..Self::HEAD + self.deltas()).contains(&i) {
            pacing.per_token
        } else {
            Duration::ZERO
        }
    }
}

/// The latency model of an answer: `ttft` before the first token, then
/// `per_token` for each.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Pacing {
    pub(crate) ttft: Duration,
    pub(crate) per_token: Duration,
}

impl Pacing {
    /// The configured latency.
    pub(crate) fn of(config: &SimConfig) -> Self {
        Self {
            ttft: config.ttft,
            per_token: config.per_token,
        }
    }

    /// Waits as long as a one-shot answer of `tokens` output tokens takes
    /// (`ttft` plus `per_token` per token).
    pub(crate) async fn one_shot(&self, tokens: u64) {
        let tokens = u32::try_from(tokens).unwrap_or(u32::MAX);
        let delay = self
            .ttft
            .saturating_add(self.per_token.saturating_mul(tokens));
        if delay > Duration::ZERO {
            tokio::time::sleep(delay).await;
        }
    }
}

struct ScriptState<S> {
    script: S,
    pacing: Pacing,
    guard: RequestGuard,
    next: u32,
    disconnect_after: Option<u32>,
    ended: bool,
}

/// The `text/event-stream` response that plays `script` at `pacing`.
pub(crate) fn script_response<S: EventScript>(
    script: S,
    pacing: Pacing,
    guard: RequestGuard,
    disconnect_after: Option<u32>,
) -> Response {
    let state = ScriptState {
        script,
        pacing,
        guard,
        next: 0,
        disconnect_after,
        ended: false,
    };
    event_stream_response(Body::from_stream(stream::unfold(state, next_event)))
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
    let delay = st.script.delay(&st.pacing, st.next);
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

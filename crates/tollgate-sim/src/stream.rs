//! The streamed chat completion body: OpenAI's SSE chunk sequence, with
//! latency and the mid-stream disconnect fault.
//!
//! Event sequence (each `data: <json>\n\n`):
//!
//! 1. after `ttft`: a role chunk (`delta: {role: "assistant", content: ""}`);
//! 2. for each completion token, after `per_token`: a content chunk;
//! 3. a finish chunk (empty delta, `finish_reason`);
//! 4. only when `stream_options.include_usage` is true: a usage chunk with
//!    empty `choices` (the other chunks then carry `"usage": null`);
//! 5. `data: [DONE]`.
//!
//! A planned disconnect after `k` events sends the first `k` events, then
//! ends the body with an error: hyper aborts the connection, the client sees
//! a truncated transfer and never `[DONE]`.
//!
//! The body owns the request's [`RequestGuard`]: the concurrency slot is held
//! until the stream ends, and a body dropped before its end (the client went
//! away) is counted as a client disconnect.

use std::time::Duration;

use axum::body::Body;
use axum::http::{HeaderValue, header};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use futures_util::stream;

use crate::state::RequestGuard;
use crate::wire::{ChatChunk, ChunkChoice, Delta, Usage};

/// The error that ends a stream cut by the disconnect fault.
#[derive(Debug, thiserror::Error)]
#[error("simulated mid-stream disconnect")]
pub(crate) struct SimulatedDisconnect;

/// The `text/event-stream` (`no-cache`) response of an SSE `body`.
pub(crate) fn event_stream_response(body: Body) -> Response {
    let mut response = body.into_response();
    let h = response.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream"),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    response
}

/// What a stream will send.
#[derive(Debug, Clone)]
pub(crate) struct StreamPlan {
    pub(crate) id: String,
    pub(crate) model: String,
    pub(crate) created: u64,
    pub(crate) usage: Usage,
    pub(crate) finish_reason: &'static str,
    pub(crate) include_usage: bool,
    pub(crate) ttft: Duration,
    pub(crate) per_token: Duration,
    /// Events to send before cutting the connection, if the fault hit.
    pub(crate) disconnect_after: Option<u32>,
}

impl StreamPlan {
    /// Events a complete stream sends before `[DONE]`.
    pub(crate) fn event_count(completion_tokens: u64, include_usage: bool) -> u32 {
        let content = u32::try_from(completion_tokens).unwrap_or(u32::MAX);
        content
            .saturating_add(2)
            .saturating_add(u32::from(include_usage))
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Step {
    Role,
    Content(u64),
    Finish,
    Usage,
    Done,
    End,
}

struct StreamState {
    plan: StreamPlan,
    guard: RequestGuard,
    step: Step,
    /// Events sent so far (not counting `[DONE]`).
    sent: u32,
}

/// The SSE body of a streamed completion.
pub(crate) fn sse_body(plan: StreamPlan, guard: RequestGuard) -> Body {
    let state = StreamState {
        plan,
        guard,
        step: Step::Role,
        sent: 0,
    };
    Body::from_stream(stream::unfold(state, next_event))
}

async fn next_event(
    mut st: StreamState,
) -> Option<(Result<Bytes, SimulatedDisconnect>, StreamState)> {
    if st.step == Step::End {
        return None;
    }
    if st.plan.disconnect_after == Some(st.sent) {
        // hyper flushes what it has buffered when the body is pending; yield
        // once so the events already "sent" reach the client before the cut
        // (otherwise the abort can discard them, headers included).
        tokio::task::yield_now().await;
        st.step = Step::End;
        st.guard.finish(|c| c.faults.disconnect += 1);
        return Some((Err(SimulatedDisconnect), st));
    }
    let (delay, next) = match st.step {
        Step::Role => (
            st.plan.ttft,
            if st.plan.usage.completion_tokens > 0 {
                Step::Content(0)
            } else {
                Step::Finish
            },
        ),
        Step::Content(i) => (
            st.plan.per_token,
            if i + 1 < st.plan.usage.completion_tokens {
                Step::Content(i + 1)
            } else {
                Step::Finish
            },
        ),
        Step::Finish => (
            Duration::ZERO,
            if st.plan.include_usage {
                Step::Usage
            } else {
                Step::Done
            },
        ),
        Step::Usage => (Duration::ZERO, Step::Done),
        Step::Done | Step::End => (Duration::ZERO, Step::End),
    };
    if !delay.is_zero() {
        tokio::time::sleep(delay).await;
    }
    let bytes = if st.step == Step::Done {
        st.guard.finish(|_| {});
        Bytes::from_static(b"data: [DONE]\n\n")
    } else {
        st.sent += 1;
        event_bytes(&st.plan, st.step)
    };
    st.step = next;
    Some((Ok(bytes), st))
}

fn event_bytes(plan: &StreamPlan, step: Step) -> Bytes {
    let (delta, finish_reason, usage_chunk) = match step {
        Step::Role => (
            Delta {
                role: Some("assistant"),
                content: Some(""),
            },
            None,
            false,
        ),
        Step::Content(i) => (
            Delta {
                role: None,
                content: Some(crate::routes::chat::token_text(i)),
            },
            None,
            false,
        ),
        Step::Finish => (Delta::default(), Some(plan.finish_reason), false),
        Step::Usage | Step::Done | Step::End => (Delta::default(), None, true),
    };
    let choice = [ChunkChoice {
        index: 0,
        delta,
        logprobs: None,
        finish_reason,
    }];
    let chunk = ChatChunk {
        id: &plan.id,
        object: "chat.completion.chunk",
        created: plan.created,
        model: &plan.model,
        system_fingerprint: crate::routes::FINGERPRINT,
        choices: if usage_chunk { &[] } else { &choice },
        usage: match (plan.include_usage, usage_chunk) {
            (false, _) => None,
            (true, false) => Some(None),
            (true, true) => Some(Some(plan.usage)),
        },
    };
    let mut out = Vec::with_capacity(256);
    out.extend_from_slice(b"data: ");
    // Serialising these plain structs cannot fail; an empty object keeps
    // the stream well-formed should it ever.
    if serde_json::to_writer(&mut out, &chunk).is_err() {
        out.extend_from_slice(b"{}");
    }
    out.extend_from_slice(b"\n\n");
    Bytes::from(out)
}

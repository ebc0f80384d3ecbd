//! Anthropic's response headers: `anthropic-ratelimit-*` on every Messages
//! response (limit, remaining, and the reset as an RFC 3339 timestamp), the
//! 429 (`retry-after`) and the injected 5xx/529.

use std::time::SystemTime;

use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};

use super::limits::{BucketState, MessagesCause, MessagesRejection, MessagesState};
use super::wire::AnthropicError;
use crate::duration::{ceil_secs, rfc3339};
use crate::headers::{Names, REJECT_CAUSE_HEADER, add_limit_headers, insert};
use crate::state::MessagesDemand;

const REQUESTS: Names = [
    "anthropic-ratelimit-requests-limit",
    "anthropic-ratelimit-requests-remaining",
    "anthropic-ratelimit-requests-reset",
];
const INPUT: Names = [
    "anthropic-ratelimit-input-tokens-limit",
    "anthropic-ratelimit-input-tokens-remaining",
    "anthropic-ratelimit-input-tokens-reset",
];
const OUTPUT: Names = [
    "anthropic-ratelimit-output-tokens-limit",
    "anthropic-ratelimit-output-tokens-remaining",
    "anthropic-ratelimit-output-tokens-reset",
];

/// Writes the `anthropic-ratelimit-*` headers of the limited buckets and
/// `request-id`.
pub(crate) fn add_rate_headers(headers: &mut HeaderMap, state: &MessagesState, seq: u64) {
    let wall = SystemTime::now();
    for (names, bucket) in [
        (REQUESTS, state.requests),
        (INPUT, state.input_tokens),
        (OUTPUT, state.output_tokens),
    ] {
        if let Some(b) = bucket {
            add_bucket(headers, names, &b, wall);
        }
    }
    insert(headers, "request-id", &format!("req_sim_{seq}"));
}

/// The reset is an RFC 3339 timestamp: `wall` plus the wait.
fn add_bucket(headers: &mut HeaderMap, names: Names, b: &BucketState, wall: SystemTime) {
    let at = wall.checked_add(b.reset).unwrap_or(wall);
    let values = [b.limit.to_string(), b.remaining.to_string(), rfc3339(at)];
    add_limit_headers(headers, names, values);
}

/// The `x-sim-reject-cause` value of a Messages refusal.
pub(crate) fn cause_name(cause: MessagesCause) -> &'static str {
    match cause {
        MessagesCause::Requests => "anthropic_rpm",
        MessagesCause::InputTokens => "itpm",
        MessagesCause::OutputTokens => "otpm",
        MessagesCause::TooLarge => "too_large",
        MessagesCause::Concurrency => "concurrency",
    }
}

/// The 429 answer: Anthropic's `rate_limit_error` body, `retry-after`
/// (whole seconds, rounded up) when the wait is known, the rate-limit
/// headers and `x-sim-reject-cause`.
pub(crate) fn rejection_response(
    rejection: &MessagesRejection,
    demand: &MessagesDemand,
    seq: u64,
) -> Response {
    let limit = |b: Option<BucketState>| b.map_or(0, |b| b.limit);
    let state = &rejection.state;
    let message = match rejection.cause {
        MessagesCause::Requests => format!(
            "This request would exceed the rate limit for your organization of {} requests per minute.",
            limit(state.requests)
        ),
        MessagesCause::InputTokens => format!(
            "This request would exceed the rate limit for your organization of {} input tokens per minute \
             ({} input tokens requested).",
            limit(state.input_tokens),
            demand.input
        ),
        MessagesCause::OutputTokens => format!(
            "This request would exceed the rate limit for your organization of {} output tokens per minute \
             (max_tokens {} requested).",
            limit(state.output_tokens),
            demand.max_tokens
        ),
        MessagesCause::TooLarge => format!(
            "This request can never fit the rate limits: {} input tokens (limit {} per minute) and \
             max_tokens {} (limit {} per minute). Send a smaller request.",
            demand.input,
            state
                .input_tokens
                .map_or("none".to_owned(), |b| b.limit.to_string()),
            demand.max_tokens,
            state
                .output_tokens
                .map_or("none".to_owned(), |b| b.limit.to_string()),
        ),
        MessagesCause::Concurrency => {
            "Too many concurrent requests: all slots are in use.".to_owned()
        }
    };
    let mut response = AnthropicError {
        status: StatusCode::TOO_MANY_REQUESTS,
        kind: "rate_limit_error",
        message,
    }
    .into_response();
    let headers = response.headers_mut();
    if let Some(d) = rejection.retry_after {
        insert(headers, "retry-after", &ceil_secs(d).to_string());
    }
    insert(headers, REJECT_CAUSE_HEADER, cause_name(rejection.cause));
    add_rate_headers(headers, state, seq);
    response
}

/// An injected fault: 500 `api_error`, or (for a planned 503) Anthropic's
/// 529 `overloaded_error`.
pub(crate) fn server_error_response(status: u16, state: &MessagesState, seq: u64) -> Response {
    let error = if status == 503 {
        AnthropicError {
            // 529 is in the valid status range; 503 should it ever not be.
            status: StatusCode::from_u16(529).unwrap_or(StatusCode::SERVICE_UNAVAILABLE),
            kind: "overloaded_error",
            message: "Overloaded (injected fault).".to_owned(),
        }
    } else {
        AnthropicError {
            status: StatusCode::INTERNAL_SERVER_ERROR,
            kind: "api_error",
            message: "Internal server error (injected fault).".to_owned(),
        }
    };
    let mut response = error.into_response();
    add_rate_headers(response.headers_mut(), state, seq);
    response
}

//! Response headers: `x-ratelimit-*` on every API response, and the 429 and
//! 5xx responses.

use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};

use crate::duration::{ceil_millis, ceil_secs, go_duration};
use crate::referee::{Dimension, RateState, RejectCause, Rejection};
use crate::wire::ApiError;

/// Header naming the cause of a simulator 429 (`rpm`, `tpm`, `too_large`,
/// `concurrency`; on `POST /v1/messages` also `anthropic_rpm`, `itpm`,
/// `otpm`), for tests and debugging.
pub const REJECT_CAUSE_HEADER: &str = "x-sim-reject-cause";

/// Writes `x-ratelimit-{limit,remaining,reset}-{requests,tokens}` for the
/// limited dimensions, and `x-request-id`.
pub(crate) fn add_rate_headers(headers: &mut HeaderMap, state: &RateState, seq: u64) {
    if let Some(d) = state.requests {
        add_dimension(headers, REQUEST_HEADERS, &d);
    }
    if let Some(d) = state.tokens {
        add_dimension(headers, TOKEN_HEADERS, &d);
    }
    insert(headers, "x-request-id", &format!("req_sim_{seq}"));
}

/// The limit, remaining and reset header names of one limited dimension.
pub(crate) type Names = [&'static str; 3];

const REQUEST_HEADERS: Names = [
    "x-ratelimit-limit-requests",
    "x-ratelimit-remaining-requests",
    "x-ratelimit-reset-requests",
];

const TOKEN_HEADERS: Names = [
    "x-ratelimit-limit-tokens",
    "x-ratelimit-remaining-tokens",
    "x-ratelimit-reset-tokens",
];

fn add_dimension(headers: &mut HeaderMap, names: Names, d: &Dimension) {
    let values = [
        d.limit.to_string(),
        d.remaining.to_string(),
        go_duration(d.reset),
    ];
    add_limit_headers(headers, names, values);
}

/// Writes the limit, remaining and reset `values` of one limited dimension
/// under its `names`.
pub(crate) fn add_limit_headers(headers: &mut HeaderMap, names: Names, values: [String; 3]) {
    for (name, value) in names.into_iter().zip(values) {
        insert(headers, name, &value);
    }
}

/// Writes header `name`.
pub(crate) fn insert(headers: &mut HeaderMap, name: &'static str, value: &str) {
    // Values are digits, durations, timestamps or fixed ASCII words: always
    // valid, so a failed conversion is skipped rather than panicking.
    if let Ok(value) = HeaderValue::try_from(value) {
        headers.insert(HeaderName::from_static(name), value);
    }
}

/// The stats/header name of a cause.
pub(crate) fn cause_name(cause: RejectCause) -> &'static str {
    match cause {
        RejectCause::Requests => "rpm",
        RejectCause::Tokens => "tpm",
        RejectCause::TooLarge => "too_large",
        RejectCause::Concurrency => "concurrency",
    }
}

/// The 429 answer to a rejection: OpenAI error body, `retry-after` (whole
/// seconds, rounded up) and `retry-after-ms` when the wait is known, and the
/// `x-ratelimit-*` headers.
pub(crate) fn rejection_response(rejection: &Rejection, tokens: u64, seq: u64) -> Response {
    let wait = rejection
        .retry_after
        .map(|d| format!(" Please try again in {}.", go_duration(d)))
        .unwrap_or_default();
    let (message, kind) = match rejection.cause {
        RejectCause::Requests => (
            format!(
                "Rate limit reached for requests: limit {} per window.{wait}",
                rejection.state.requests.map_or(0, |d| d.limit)
            ),
            "requests",
        ),
        RejectCause::Tokens => (
            format!(
                "Rate limit reached for tokens: limit {} per window, requested {tokens}.{wait}",
                rejection.state.tokens.map_or(0, |d| d.limit)
            ),
            "tokens",
        ),
        RejectCause::TooLarge => (
            format!(
                "Request too large: {tokens} tokens requested but the limit is {} per window. \
                 Send a smaller request.",
                rejection.state.tokens.map_or(0, |d| d.limit)
            ),
            "tokens",
        ),
        RejectCause::Concurrency => (
            "Too many concurrent requests: all slots are in use.".to_owned(),
            "concurrency",
        ),
    };
    let mut response = ApiError {
        status: StatusCode::TOO_MANY_REQUESTS,
        message,
        kind,
        param: None,
        code: Some("rate_limit_exceeded"),
    }
    .into_response();
    add_rejection_headers(response.headers_mut(), rejection, seq);
    response
}

/// The headers of a 429 (OpenAI's and Azure's alike): `retry-after` (whole
/// seconds, rounded up) and `retry-after-ms` when the wait is known,
/// `x-sim-reject-cause`, and the `x-ratelimit-*` headers.
pub(crate) fn add_rejection_headers(headers: &mut HeaderMap, rejection: &Rejection, seq: u64) {
    if let Some(d) = rejection.retry_after {
        insert(headers, "retry-after", &ceil_secs(d).to_string());
        insert(headers, "retry-after-ms", &ceil_millis(d).to_string());
    }
    insert(headers, REJECT_CAUSE_HEADER, cause_name(rejection.cause));
    add_rate_headers(headers, &rejection.state, seq);
}

/// A simulated 500 or 503 with an OpenAI error body.
pub(crate) fn server_error_response(status: u16, state: &RateState, seq: u64) -> Response {
    let (status, message) = if status == 503 {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            "The simulated engine is overloaded (injected fault). Please retry.",
        )
    } else {
        (
            StatusCode::INTERNAL_SERVER_ERROR,
            "The simulated server failed while processing the request (injected fault).",
        )
    };
    let mut response = ApiError {
        status,
        message: message.to_owned(),
        kind: "server_error",
        param: None,
        code: None,
    }
    .into_response();
    add_rate_headers(response.headers_mut(), state, seq);
    response
}

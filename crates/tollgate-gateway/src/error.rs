//! HTTP errors in the OpenAI format (SPEC GW-1, GW-4).
//!
//! | what | status | `error.code` |
//! |---|---|---|
//! | queue or pool full | 429 | `admission_rejected` |
//! | deadline passed (or cannot be met) while waiting for admission | 429 | `admission_wait_deadline_exceeded` |
//! | quota further away than `max_wait` | 429 | `admission_wait_deadline_exceeded` |
//! | estimate larger than a whole token limit, or than one call may ask for | 400 | `estimate_exceeds_limit` |
//! | circuit open | 503 | `circuit_open` |
//! | deadline passed upstream (hook, retry delay, transport, stream), or while a large prompt was parsed or counted | 504 | `deadline_exceeded` |
//! | counting a large prompt's tokens failed (a defect) | 500 | `internal_error` |
//! | a spend budget cannot take the call's worst case in time (or ever) | 429 | `budget_exceeded` |
//! | upstream 429 after the retries | 429 | `upstream_rate_limited` |
//! | upstream 4xx (the request itself) | same status | `upstream_rejected` |
//! | upstream 5xx, connection, protocol, auth | 502 | `upstream_error` |
//! | shutting down | 503 | `shutting_down` |
//! | request body not received in time (body read timeout or deadline) | 408 | `request_timeout` |
//! | request body too large | 413 | `request_too_large` |
//! | a path no route serves | 404 | `unknown_url` |
//! | another method on a route | 405 | `method_not_allowed` |
//! | a client address already holding `server.max_connections_per_client` connections (refused before its request is read: [`too_many_connections`]) | 429 | `too_many_connections` |
//!
//! A 429 or 503 carries `retry-after` (whole seconds, rounded up) and
//! `retry-after-ms` when a time is known: the instant the engine computed
//! (early verdict, cooldown, circuit) or the upstream's own hint. Every 429
//! has one (SPEC GW-13): where nothing was computed (a full queue or
//! pool, an upstream 429 without a hint) it says [`BUSY_RETRY`].
//! A 408 or 413 carries `connection: close`: the rest of the body was not
//! read, so the connection cannot serve another request.

use std::time::Duration;

use axum::Json;
use axum::response::{IntoResponse, Response};
use http::{HeaderValue, StatusCode};
use tollgate::clock::{Instant, WallClock};
use tollgate::lifecycle::{CallError, ErrorKind};
use tollgate::{AdmissionError, Phase};
use tollgate_openai::ErrorResponse;

/// The retry hint of a 429 without a computed instant (a full queue or
/// pool, an upstream 429 without a hint): the cooldown's base delay.
pub const BUSY_RETRY: Duration = Duration::from_secs(1);

/// The most tokens one call may ask for: its prompt plus its output
/// allowance for every choice (SPEC GW-4). No model comes near it; it keeps
/// a single request from moving the shared token counters (`/metrics`)
/// by amounts no call can spend, on scopes without a token limit too.
pub const MAX_CALL_TOKENS: u64 = 1 << 32;

/// An error response.
#[derive(Debug, Clone)]
pub struct ApiError {
    /// The HTTP status.
    pub status: StatusCode,
    /// The OpenAI error body.
    pub body: Box<ErrorResponse>,
    /// `retry-after`, when known.
    pub retry_after: Option<Duration>,
}

impl ApiError {
    /// An error with `status` and `body`.
    pub fn new(status: StatusCode, body: ErrorResponse) -> Self {
        ApiError {
            status,
            body: Box::new(body),
            retry_after: None,
        }
    }

    /// 400 with an `invalid_request_error` and `code` (every error the
    /// gateway makes has a code: the client and the access log see the
    /// same one).
    pub fn bad_request(code: &str, message: impl Into<String>) -> Self {
        Self::new(
            StatusCode::BAD_REQUEST,
            ErrorResponse::invalid_request(message).with_code(code),
        )
    }

    /// 401 for a missing or unknown key.
    pub fn unauthorized() -> Self {
        Self::new(StatusCode::UNAUTHORIZED, ErrorResponse::invalid_api_key())
    }

    /// 404 for an unknown model.
    pub fn model_not_found(model: &str) -> Self {
        Self::new(StatusCode::NOT_FOUND, ErrorResponse::model_not_found(model))
    }

    /// 413 for an oversized body.
    pub fn too_large(limit: usize) -> Self {
        Self::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            ErrorResponse::invalid_request(format!("The request body exceeds {limit} bytes."))
                .with_code("request_too_large"),
        )
    }

    /// 408 for a request body that did not arrive in time (SPEC GW-17).
    pub fn request_timeout(message: impl Into<String>) -> Self {
        Self::new(
            StatusCode::REQUEST_TIMEOUT,
            ErrorResponse::invalid_request(message).with_code("request_timeout"),
        )
    }

    /// 429 `budget_exceeded` (SPEC BUD-4): a spend budget refused the
    /// call before any upstream byte; `budget` names it (`param`).
    pub fn budget_exceeded(message: impl Into<String>, budget: &str) -> Self {
        Self::new(
            StatusCode::TOO_MANY_REQUESTS,
            ErrorResponse::rate_limited("budget_exceeded", message).with_param(budget),
        )
    }

    /// 404 `unknown_url` for a path no route serves (SPEC GW-1).
    pub fn unknown_path(method: &http::Method, path: &str) -> Self {
        Self::new(
            StatusCode::NOT_FOUND,
            ErrorResponse::invalid_request(format!("Unknown request URL: {method} {path}."))
                .with_code("unknown_url"),
        )
    }

    /// 405 for a method a route does not serve (SPEC GW-1, WIRE-3).
    pub fn method_not_allowed(method: &http::Method, path: &str, allow: &str) -> Self {
        Self::new(
            StatusCode::METHOD_NOT_ALLOWED,
            ErrorResponse::invalid_request(format!(
                "{method} is not allowed on {path}; use {allow}."
            ))
            .with_code("method_not_allowed"),
        )
    }

    /// 400 `estimate_exceeds_limit` for a call that asks for more than
    /// [`MAX_CALL_TOKENS`] (SPEC GW-4): its prompt plus `max_tokens` times
    /// `n`, or a total no 64-bit count holds (`total` is `None`).
    pub fn call_too_large(total: Option<u64>) -> Self {
        let asked = total.map_or_else(|| "more than 2^64".to_owned(), |t| t.to_string());
        Self::bad_request(
            "estimate_exceeds_limit",
            format!(
                "The request asks for {asked} tokens (its prompt plus its output allowance \
                 for every choice); one call may ask for at most {MAX_CALL_TOKENS}."
            ),
        )
    }

    /// 503 while shutting down.
    pub fn shutting_down() -> Self {
        Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            ErrorResponse::server_error("shutting_down", "The gateway is shutting down."),
        )
    }

    fn retry_at(mut self, at: Option<Instant>, now: Instant) -> Self {
        self.retry_after = at.map(|t| t.saturating_duration_since(now));
        self
    }

    /// The stable reason label of this error for metrics and the access
    /// log: the `code` the client receives, or (for an error without one)
    /// its `type`.
    pub fn reason(&self) -> &str {
        self.body
            .error
            .code
            .as_deref()
            .unwrap_or(&self.body.error.kind)
    }

    /// The response for an admission refusal (tenant or model side).
    pub fn from_admission(e: &AdmissionError, now: Instant) -> Self {
        let rejected = |msg: String| {
            Self::new(
                StatusCode::TOO_MANY_REQUESTS,
                ErrorResponse::rate_limited("admission_rejected", msg),
            )
        };
        let wait_deadline = |msg: String| {
            Self::new(
                StatusCode::TOO_MANY_REQUESTS,
                ErrorResponse::rate_limited("admission_wait_deadline_exceeded", msg),
            )
        };
        match e {
            AdmissionError::QueueFull { .. } => {
                rejected("Too many requests are waiting; try again later.".into())
            }
            AdmissionError::PoolFull { .. } => {
                rejected("Too many requests are waiting for capacity.".into())
            }
            AdmissionError::DeadlineExceeded { phase, retry_at } => wait_deadline(format!(
                "The request's deadline ran out while waiting for admission ({phase}).{}",
                available_again(*retry_at, WallClock::system_at(now))
            ))
            .retry_at(*retry_at, now),
            AdmissionError::QuotaWaitTooLong { ready_at, .. } => wait_deadline(format!(
                "Quota would be available only after the longest accepted wait.{}",
                available_again(Some(*ready_at), WallClock::system_at(now))
            ))
            .retry_at(Some(*ready_at), now),
            AdmissionError::BudgetExceeded { retry_at, .. } => Self::budget_exceeded(
                "A spend budget has no room left for this request's worst-case cost.",
                "budget",
            )
            .retry_at(*retry_at, now),
            AdmissionError::EstimateExceedsLimit(x) if x.dimension.is_cost() => {
                let mut e = Self::budget_exceeded(
                    "This request's worst-case cost is more than a whole spend budget.",
                    "budget",
                );
                e.retry_after = Some(x.window);
                e
            }
            AdmissionError::EstimateExceedsLimit(x) => Self::bad_request(
                "estimate_exceeds_limit",
                format!(
                    "The request needs about {} tokens, more than the whole limit of {}.",
                    x.demand, x.limit
                ),
            ),
            // The gateway's estimates are the request's own numbers: one
            // that fails is one no count holds.
            AdmissionError::TokenEstimationFailed { reason } => Self::bad_request(
                "estimate_exceeds_limit",
                format!("The request's token estimate cannot be used: {reason}."),
            ),
            AdmissionError::Closed => Self::shutting_down(),
            AdmissionError::QuotaStoreUnavailable { .. } => Self::new(
                StatusCode::SERVICE_UNAVAILABLE,
                ErrorResponse::server_error(
                    "quota_store_unavailable",
                    "The shared quota store does not answer; try again shortly.",
                ),
            ),
            other => Self::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                ErrorResponse::server_error("admission_error", other.to_string()),
            ),
        }
    }

    /// The response for a supervised call that did not complete.
    pub fn from_call(e: &CallError, now: Instant) -> Self {
        match e {
            CallError::Admission(a) => Self::from_admission(a, now),
            CallError::Deadline { phase, retry_at } => match phase {
                Phase::Queue | Phase::Cooldown | Phase::Rate | Phase::Concurrency => {
                    Self::from_admission(
                        &AdmissionError::DeadlineExceeded {
                            phase: *phase,
                            retry_at: *retry_at,
                        },
                        now,
                    )
                }
                _ => Self::new(
                    StatusCode::GATEWAY_TIMEOUT,
                    ErrorResponse::deadline_exceeded(format!(
                        "The request's deadline ran out ({phase})."
                    )),
                ),
            },
            CallError::CircuitOpen(open) => Self::new(
                StatusCode::SERVICE_UNAVAILABLE,
                ErrorResponse::server_error(
                    "circuit_open",
                    "The upstream is failing; its circuit is open.",
                ),
            )
            .retry_at(open.retry_at, now),
            CallError::Provider { error, .. } | CallError::Stream { error } => match error.kind {
                ErrorKind::RateLimited => {
                    let mut e = Self::new(
                        StatusCode::TOO_MANY_REQUESTS,
                        ErrorResponse::rate_limited(
                            "upstream_rate_limited",
                            "The upstream is rate limiting.",
                        ),
                    );
                    e.retry_after = error.retry_after;
                    e
                }
                ErrorKind::Client => Self::new(
                    error
                        .status
                        .and_then(|s| StatusCode::from_u16(s).ok())
                        .unwrap_or(StatusCode::BAD_REQUEST),
                    ErrorResponse::invalid_request(error.message.clone())
                        .with_code("upstream_rejected"),
                ),
                ErrorKind::Timeout => Self::new(
                    StatusCode::GATEWAY_TIMEOUT,
                    ErrorResponse::server_error(
                        "upstream_timeout",
                        "The upstream did not answer in time.",
                    ),
                ),
                _ => Self::new(
                    StatusCode::BAD_GATEWAY,
                    ErrorResponse::server_error(
                        "upstream_error",
                        format!("The upstream failed ({}).", error.kind),
                    ),
                ),
            },
            CallError::Hook { message } => Self::new(
                StatusCode::FORBIDDEN,
                ErrorResponse::new("permission_error", message.clone()).with_code("hook_refused"),
            ),
            CallError::Closed => Self::shutting_down(),
            other => Self::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                ErrorResponse::server_error("internal_error", other.to_string()),
            ),
        }
    }
}

/// The error dialect of a route: what its clients parse (SPEC WIRE-3,
/// WIRE-4).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dialect {
    /// OpenAI chat completions and embeddings: `{"error": {...}}` bodies,
    /// a `data: {"error": ...}` event in a stream.
    OpenAi,
    /// OpenAI's Responses API: OpenAI error bodies, an `event: error` with
    /// `{"type": "error", "code", "message", "param"}` in a stream.
    Responses,
    /// Anthropic's Messages API: `{"type": "error", "error": {"type",
    /// "message"}}` bodies and `event: error` events.
    Anthropic,
}

impl Dialect {
    /// The error as this dialect's JSON body.
    pub fn body(self, error: &ApiError) -> serde_json::Value {
        match self {
            Dialect::OpenAi | Dialect::Responses => {
                serde_json::to_value(&*error.body).unwrap_or_default()
            }
            Dialect::Anthropic => serde_json::json!({
                "type": "error",
                "error": {
                    "type": anthropic_type(error.status),
                    "message": error.body.error.message,
                },
            }),
        }
    }

    /// The error as one server-sent event ending a stream of this dialect.
    pub fn event(self, error: &ApiError) -> bytes::Bytes {
        let data = match self {
            Dialect::OpenAi => self.body(error),
            Dialect::Responses => serde_json::json!({
                "type": "error",
                "code": error.body.error.code,
                "message": error.body.error.message,
                "param": null,
            }),
            Dialect::Anthropic => self.body(error),
        };
        let prefix = match self {
            Dialect::OpenAi => "",
            Dialect::Responses | Dialect::Anthropic => "event: error\n",
        };
        bytes::Bytes::from(format!("{prefix}data: {data}\n\n"))
    }
}

/// Anthropic's error `type` for an HTTP status.
fn anthropic_type(status: StatusCode) -> &'static str {
    match status.as_u16() {
        401 => "authentication_error",
        403 => "permission_error",
        404 => "not_found_error",
        413 => "request_too_large",
        429 => "rate_limit_error",
        408 | 504 => "timeout_error",
        503 | 529 => "overloaded_error",
        400..=499 => "invalid_request_error",
        _ => "api_error",
    }
}

impl ApiError {
    /// The response in `dialect`'s error format, with the same status and
    /// headers as [`IntoResponse`] gives (which is the OpenAI format).
    pub fn into_response_for(self, dialect: Dialect) -> Response {
        if matches!(dialect, Dialect::OpenAi | Dialect::Responses) {
            return self.into_response();
        }
        let body = dialect.body(&self);
        let mut response = self.into_response();
        let bytes = serde_json::to_vec(&body).unwrap_or_default();
        response.headers_mut().remove(http::header::CONTENT_LENGTH);
        *response.body_mut() = axum::body::Body::from(bytes);
        response
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut response = (self.status, Json(*self.body)).into_response();
        if matches!(
            self.status,
            StatusCode::REQUEST_TIMEOUT | StatusCode::PAYLOAD_TOO_LARGE
        ) {
            response
                .headers_mut()
                .insert(http::header::CONNECTION, HeaderValue::from_static("close"));
        }
        let busy = (self.status == StatusCode::TOO_MANY_REQUESTS).then_some(BUSY_RETRY);
        if let Some(after) = self.retry_after.or(busy) {
            // Whole seconds, rounded up, at least one; and milliseconds.
            let secs = after.as_secs() + u64::from(after.subsec_nanos() > 0);
            let ms = u64::try_from(after.as_nanos().div_ceil(1_000_000)).unwrap_or(u64::MAX);
            let h = response.headers_mut();
            h.insert(http::header::RETRY_AFTER, HeaderValue::from(secs.max(1)));
            h.insert(
                http::HeaderName::from_static("retry-after-ms"),
                HeaderValue::from(ms),
            );
        }
        response
    }
}

/// The whole HTTP/1.1 response that refuses a connection from a client
/// address already holding `server.max_connections_per_client`
/// connections (SPEC GW-17): 429 `too_many_connections` in the OpenAI
/// format, `retry-after` [`BUSY_RETRY`] and `connection: close`. It is
/// written before any byte of the request is read, so it is the same for
/// every such connection and is built once.
pub fn too_many_connections() -> bytes::Bytes {
    let body = ErrorResponse::rate_limited(
        "too_many_connections",
        "This client address holds as many connections as it may; close one and try again.",
    );
    let body = serde_json::to_string(&body).unwrap_or_default();
    let secs = BUSY_RETRY.as_secs().max(1);
    let ms = BUSY_RETRY.as_millis();
    bytes::Bytes::from(format!(
        "HTTP/1.1 429 Too Many Requests\r\ncontent-type: application/json\r\n\
         content-length: {}\r\nconnection: close\r\nretry-after: {secs}\r\n\
         retry-after-ms: {ms}\r\n\r\n{body}",
        body.len()
    ))
}

/// " It is available again at 2027-01-01T00:00:00Z." for a known instant
/// (in UTC on the system's clock, to the second, rounded up): a spent day
/// or month window says when it resets (SPEC BUD-3, Q-11).
fn available_again(at: Option<Instant>, wall: WallClock) -> String {
    available_again_rounded(at, wall, false)
}

/// [`available_again`] for the end of a calendar period (SPEC BUD-3),
/// which falls on a whole second: the instant is rounded to the nearest
/// second, so the reading of the monotonic clock on the system's does not
/// move it one second late.
pub(crate) fn available_again_at_boundary(at: Option<Instant>, wall: WallClock) -> String {
    available_again_rounded(at, wall, true)
}

fn available_again_rounded(at: Option<Instant>, wall: WallClock, nearest: bool) -> String {
    let Some(at) = at else {
        return String::new();
    };
    let utc = wall.utc(at);
    let Ok(since) = utc.duration_since(std::time::SystemTime::UNIX_EPOCH) else {
        return String::new();
    };
    let up = if nearest {
        since.subsec_nanos() >= 500_000_000
    } else {
        since.subsec_nanos() > 0
    };
    let secs = since.as_secs() + u64::from(up);
    match i64::try_from(secs)
        .ok()
        .and_then(|s| jiff::Timestamp::from_second(s).ok())
    {
        Some(ts) => format!(" It is available again at {ts}."),
        None => String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tollgate::ScopeId;
    use tollgate::lifecycle::{CircuitOpen, GiveUp, ProviderError};

    // proves: GW-4 (status codes and codes of rejections)
    #[test]
    fn status_table() {
        let now = Instant::now();
        let adm = |e: AdmissionError| ApiError::from_admission(&e, now);
        let full = adm(AdmissionError::QueueFull {
            scope: ScopeId::FIRST,
        });
        assert_eq!(
            (full.status.as_u16(), full.reason()),
            (429, "admission_rejected")
        );
        let late = adm(AdmissionError::DeadlineExceeded {
            phase: Phase::Rate,
            retry_at: Some(now + Duration::from_millis(1_500)),
        });
        assert_eq!(
            (late.status.as_u16(), late.reason()),
            (429, "admission_wait_deadline_exceeded")
        );
        assert_eq!(late.retry_after, Some(Duration::from_millis(1_500)));
        let call = |e: CallError| ApiError::from_call(&e, now);
        let open = call(CallError::CircuitOpen(CircuitOpen { retry_at: None }));
        assert_eq!((open.status.as_u16(), open.reason()), (503, "circuit_open"));
        let upstream = call(CallError::Deadline {
            phase: Phase::Transport,
            retry_at: None,
        });
        assert_eq!(upstream.status.as_u16(), 504);
        let limited = call(CallError::Provider {
            error: ProviderError::from_status(429, "x")
                .with_retry_after(Some(Duration::from_secs(7))),
            attempts: 3,
            gave_up: GiveUp::Exhausted,
        });
        assert_eq!(
            (limited.status.as_u16(), limited.retry_after),
            (429, Some(Duration::from_secs(7)))
        );
        let rejected = call(CallError::Provider {
            error: ProviderError::from_status(422, "bad schema"),
            attempts: 1,
            gave_up: GiveUp::NotRetryable,
        });
        assert_eq!(rejected.status.as_u16(), 422);
    }

    // proves: GW-17, GW-13 (the refusal of a connection past its client's
    // cap is one complete HTTP/1.1 429 in the OpenAI format: its length
    // is the body's, it closes, and it says when to retry)
    #[test]
    fn too_many_connections_is_a_complete_response() {
        let raw = too_many_connections();
        let text = std::str::from_utf8(&raw).expect("ascii");
        let (head, body) = text.split_once("\r\n\r\n").expect("a head and a body");
        assert!(
            head.starts_with("HTTP/1.1 429 Too Many Requests\r\n"),
            "{head}"
        );
        for line in [
            "connection: close",
            "retry-after: 1",
            "retry-after-ms: 1000",
            "content-type: application/json",
        ] {
            assert!(head.lines().any(|l| l == line), "{line} missing: {head}");
        }
        let length = format!("content-length: {}", body.len());
        assert!(head.lines().any(|l| l == length), "{head}");
        let parsed: ErrorResponse = serde_json::from_str(body).expect("an OpenAI error");
        assert_eq!(parsed.error.kind, "rate_limit_error");
        assert_eq!(parsed.error.code.as_deref(), Some("too_many_connections"));
    }

    // proves: GW-4 (retry-after is whole seconds, rounded up)
    #[test]
    fn retry_after_header_rounds_up() {
        let mut e = ApiError::shutting_down();
        e.retry_after = Some(Duration::from_millis(1_200));
        let r = e.into_response();
        assert_eq!(r.headers()[http::header::RETRY_AFTER], "2");
        assert_eq!(r.headers()["retry-after-ms"], "1200");
    }

    // proves: GW-13 (every 429 carries retry-after and retry-after-ms: the
    // engine's instant to the millisecond, or 1 s where none was computed)
    #[test]
    fn every_429_carries_both_retry_hints() {
        let now = Instant::now();
        let timed = ApiError::from_admission(
            &AdmissionError::DeadlineExceeded {
                phase: Phase::Rate,
                retry_at: Some(now + Duration::from_micros(86_399_000_001)),
            },
            now,
        )
        .into_response();
        assert_eq!(timed.headers()["retry-after-ms"], "86399001");
        assert_eq!(timed.headers()[http::header::RETRY_AFTER], "86400");
        let full = ApiError::from_admission(
            &AdmissionError::QueueFull {
                scope: ScopeId::FIRST,
            },
            now,
        )
        .into_response();
        assert_eq!(full.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(full.headers()["retry-after-ms"], "1000");
        assert_eq!(full.headers()[http::header::RETRY_AFTER], "1");
    }

    // proves: BUD-3, Q-11 (a refusal that knows when quota returns says
    // when in UTC, to the second, rounded up)
    #[test]
    fn a_known_reset_is_told_in_utc() {
        let now = Instant::now();
        let noon = std::time::SystemTime::UNIX_EPOCH + Duration::from_secs(1_798_804_800);
        let wall = WallClock::new(now, noon); // 2027-01-01T12:00:00Z
        let at = now + Duration::from_millis(43_199_001);
        assert_eq!(
            available_again(Some(at), wall),
            " It is available again at 2027-01-02T00:00:00Z."
        );
        assert_eq!(available_again(None, wall), "");
    }
}

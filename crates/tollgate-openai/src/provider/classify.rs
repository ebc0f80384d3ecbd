//! Provider failures into SPEC RT-2 classes, and safe error messages.

use std::error::Error as StdError;
use std::time::SystemTime;

use http::{HeaderMap, StatusCode};
use serde_json::Value;
use tollgate::lifecycle::{ErrorKind, ProviderError};

use super::transport::{BodyError, SendError};
use crate::rate_limit::RateLimitHints;
use crate::wire::ErrorResponse;

/// Longest message kept from a provider, in characters.
const MAX_MESSAGE_CHARS: usize = 512;

/// What replaces a secret in a message.
const REDACTED: &str = "[redacted]";

/// A failure of `send()` (no response yet): a connection that could not
/// be made (a connect timeout included), or that broke before the response
/// headers (SPEC RT-2: retryable). The attempt's own timeout is applied
/// around `send()`, not here. A connection that could not be made sent
/// nothing: the error says so, and the attempt costs nothing (SPEC Q-9,
/// BUD-5).
pub(super) fn send_error(err: &SendError, secret: Option<&str>) -> ProviderError {
    let error = ProviderError::new(ErrorKind::Connect, describe(err, secret));
    if err.is_connect() {
        error.never_sent()
    } else {
        error
    }
}

/// A failure while reading a one-shot body: the response started but did
/// not arrive whole.
pub(super) fn body_error(err: &BodyError, secret: Option<&str>) -> ProviderError {
    let kind = match err {
        BodyError::ReadTimeout(_) => ErrorKind::Timeout,
        BodyError::Http(e) if e.is_parse() => ErrorKind::Protocol,
        BodyError::TooLarge { .. } => ErrorKind::Protocol,
        _ => ErrorKind::Connect,
    };
    ProviderError::new(kind, describe(err, secret))
}

/// A non-2xx answer: the RT-2 class of its status, the server's retry floor
/// from its headers (RT-3) and the provider's own message, when the body
/// has one.
pub(super) fn status_error(
    status: StatusCode,
    headers: &HeaderMap,
    body: Option<&[u8]>,
    secret: Option<&str>,
) -> ProviderError {
    // The wall clock is read here, at the edge, only to turn an HTTP-date
    // `retry-after` into a duration.
    let hints = RateLimitHints::from_headers(headers, SystemTime::now());
    let message = body
        .and_then(error_message)
        .map(|m| sanitize(&m, secret))
        .unwrap_or_else(|| format!("upstream answered HTTP {}", status.as_u16()));
    ProviderError::from_status(status.as_u16(), message)
        .with_retry_after(hints.retry_floor())
        .with_budget(hints.budgets())
}

/// The message of an OpenAI-format error body (`{"error": {"message"}}`),
/// or of a bare `{"error": "text"}` / `{"message": "text"}`.
fn error_message(body: &[u8]) -> Option<String> {
    if let Ok(parsed) = serde_json::from_slice::<ErrorResponse>(body)
        && !parsed.error.message.is_empty()
    {
        return Some(parsed.error.message);
    }
    let value: Value = serde_json::from_slice(body).ok()?;
    declared_message(&value)
}

/// The message of a declared error value: the `error` member of a stream
/// chunk or body (an object with `message`, or a string), or a top-level
/// `message` string.
pub(super) fn declared_message(value: &Value) -> Option<String> {
    let text = match value.get("error") {
        Some(Value::String(s)) => Some(s.as_str()),
        Some(error) => error.get("message").and_then(Value::as_str),
        None => None,
    }
    .or_else(|| value.get("message").and_then(Value::as_str))?;
    (!text.is_empty()).then(|| text.to_owned())
}

/// A message safe to keep and log: the configured key and anything shaped
/// like an API key (`sk-…`, even when the provider masked part of it) are
/// replaced, control characters become spaces, and the length is capped.
pub(super) fn sanitize(message: &str, secret: Option<&str>) -> String {
    let mut text = match secret {
        Some(secret) if !secret.is_empty() => message.replace(secret, REDACTED),
        _ => message.to_owned(),
    };
    if text.contains("sk-") {
        text = text
            .split(' ')
            .map(|word| match key_start(word) {
                Some(at) => format!("{}{REDACTED}", word.get(..at).unwrap_or_default()),
                None => word.to_owned(),
            })
            .collect::<Vec<_>>()
            .join(" ");
    }
    let mut out: String = text
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .take(MAX_MESSAGE_CHARS)
        .collect();
    if text.chars().count() > MAX_MESSAGE_CHARS {
        out.push('…');
    }
    out
}

/// Where an `sk-` key starts in `word`: at its start or after a character
/// that is not alphanumeric (so "risk-free" is left alone).
fn key_start(word: &str) -> Option<usize> {
    word.match_indices("sk-").map(|(at, _)| at).find(|&at| {
        word.get(..at)
            .and_then(|before| before.chars().next_back())
            .is_none_or(|c| !c.is_alphanumeric())
    })
}

/// An error and its sources, joined with `": "`, sanitized.
pub(super) fn describe(err: &dyn StdError, secret: Option<&str>) -> String {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(inner) = source {
        let part = inner.to_string();
        if !text.contains(&part) {
            text.push_str(": ");
            text.push_str(&part);
        }
        source = inner.source();
    }
    sanitize(&text, secret)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use http::HeaderValue;
    use serde_json::json;

    use super::*;

    // proves: RT-2, RT-3 (status classes; the hint becomes the retry floor)
    #[test]
    fn statuses_carry_class_hint_and_message() {
        let mut headers = HeaderMap::new();
        headers.insert("retry-after-ms", HeaderValue::from_static("1500"));
        let body = br#"{"error":{"message":"Rate limit reached","type":"requests","param":null,"code":"rate_limit_exceeded"}}"#;
        let err = status_error(StatusCode::TOO_MANY_REQUESTS, &headers, Some(body), None);
        assert_eq!(err.kind, ErrorKind::RateLimited);
        assert_eq!(err.status, Some(429));
        assert_eq!(err.retry_after, Some(Duration::from_millis(1500)));
        assert_eq!(err.message, "Rate limit reached");

        let err = status_error(
            StatusCode::BAD_GATEWAY,
            &HeaderMap::new(),
            Some(b"<html>"),
            None,
        );
        assert_eq!(err.kind, ErrorKind::Server);
        assert_eq!(err.retry_after, None);
        assert_eq!(err.message, "upstream answered HTTP 502");

        let err = status_error(
            StatusCode::BAD_REQUEST,
            &HeaderMap::new(),
            Some(br#"{"error":"bad things"}"#),
            None,
        );
        assert_eq!(err.kind, ErrorKind::Client);
        assert_eq!(err.message, "bad things");
    }

    // proves: RT-7 (no keys in error messages)
    #[test]
    fn keys_never_survive_in_messages() {
        let secret = "sk-live-0123456789abcdef";
        let msg = format!("Incorrect API key provided: {secret}. Also sk-proj-***xyz.\nbye");
        let clean = sanitize(&msg, Some(secret));
        assert!(!clean.contains("0123456789abcdef"), "{clean}");
        assert!(!clean.contains("xyz"), "{clean}");
        assert!(!clean.contains('\n'));
        assert!(clean.starts_with("Incorrect API key provided: [redacted]"));
        assert_eq!(
            sanitize("a risk-free key='sk-abc'", None),
            "a risk-free key='[redacted]"
        );

        let body = json!({"error": {"message": format!("key {secret} is revoked")}}).to_string();
        let err = status_error(
            StatusCode::UNAUTHORIZED,
            &HeaderMap::new(),
            Some(body.as_bytes()),
            Some(secret),
        );
        assert_eq!(err.kind, ErrorKind::Auth);
        assert!(!err.message.contains(secret));

        let long = "x".repeat(5000);
        assert!(sanitize(&long, None).chars().count() <= MAX_MESSAGE_CHARS + 1);
    }

    #[test]
    fn declared_messages_in_every_shape() {
        assert_eq!(
            declared_message(&json!({"error": {"message": "boom", "type": "server_error"}})),
            Some("boom".to_owned())
        );
        assert_eq!(
            declared_message(&json!({"error": "boom"})),
            Some("boom".to_owned())
        );
        assert_eq!(declared_message(&json!({"error": {"code": 500}})), None);
        assert_eq!(
            declared_message(&json!({"message": "top"})),
            Some("top".to_owned())
        );
    }
}

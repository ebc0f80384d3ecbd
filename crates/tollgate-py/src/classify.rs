//! Python exceptions as the engine's provider failures (SPEC RT-2, RT-3).
//!
//! A supervised call (`Limiter.call`, `Limiter.stream`, the httpx
//! transports) runs Python code for each attempt; what it raises decides
//! whether the engine retries, cools the scope or counts a failure toward
//! the circuit:
//!
//! 1. `tollgate.ProviderError(kind=..., status=..., retry_after=...)`: the
//!    caller says what happened;
//! 2. an exception with an HTTP status (`status_code`, or a `response`
//!    with one: the OpenAI and Anthropic SDKs' `APIStatusError`, httpx's
//!    `HTTPStatusError`): the status's RT-2 class, and the retry floor and
//!    budget reports of its response's headers, read as the gateway reads
//!    them (`tollgate_openai::provider::answer_error`);
//! 3. a timeout (`TimeoutError`, httpx's `TimeoutException`, the SDKs'
//!    `APITimeoutError`): an attempt timeout;
//! 4. a connection failure (`ConnectionError`, httpx's `TransportError`,
//!    the SDKs' `APIConnectionError`): a connection error;
//! 5. anything else is not a provider failure ([`None`]): a bug or a
//!    refusal of the caller's own code, re-raised as it is, never retried.
//!
//! Classes are recognised by name along the exception's MRO, so neither
//! httpx nor an SDK is imported here.

use std::time::Duration;

use pyo3::exceptions::{PyConnectionError, PyTimeoutError};
use pyo3::prelude::*;
use pyo3::types::PyType;
use tollgate::lifecycle::{ErrorKind, ProviderError};

use crate::errors;

/// Longest message kept from an exception, in characters.
const MAX_MESSAGE: usize = 512;

/// Class names (anywhere in the MRO) of attempt timeouts.
const TIMEOUTS: [&str; 2] = ["TimeoutException", "APITimeoutError"];

/// Class names of connection failures (httpx's `TransportError` covers
/// connect, read, write, protocol and proxy errors).
const CONNECTION: [&str; 3] = ["TransportError", "APIConnectionError", "NetworkError"];

/// The provider failure `err` stands for, or `None` when it is not one.
pub(crate) fn provider_error(py: Python<'_>, err: &PyErr) -> Option<ProviderError> {
    let value = err.value(py);
    if let Ok(class) = errors::class(py, "ProviderError")
        && value.is_instance(&class).unwrap_or(false)
    {
        return declared(value).ok();
    }
    if let Some(status) = status_of(value) {
        let headers = value
            .getattr("response")
            .ok()
            .map(|r| headers_of(&r))
            .unwrap_or_default();
        let mut e = tollgate_openai::provider::answer_error(
            http::StatusCode::from_u16(status).unwrap_or(http::StatusCode::BAD_GATEWAY),
            &headers,
            None,
        );
        e.status = Some(status);
        e.message = message(value);
        return Some(e);
    }
    let names = mro_names(&value.get_type());
    if err.is_instance_of::<PyTimeoutError>(py) || names.iter().any(|n| TIMEOUTS.contains(&&**n)) {
        return Some(ProviderError::new(ErrorKind::Timeout, message(value)));
    }
    if err.is_instance_of::<PyConnectionError>(py)
        || names.iter().any(|n| CONNECTION.contains(&&**n))
    {
        return Some(ProviderError::new(ErrorKind::Connect, message(value)));
    }
    None
}

/// The failure of a `tollgate.ProviderError`: its `kind` or `status`, its
/// `retry_after` (seconds) and message.
fn declared(value: &Bound<'_, PyAny>) -> PyResult<ProviderError> {
    let kind: Option<String> = value.getattr("kind")?.extract()?;
    let status: Option<u16> = value.getattr("status")?.extract()?;
    let retry_after: Option<f64> = value.getattr("retry_after")?.extract()?;
    let text: String = value.getattr("message")?.extract()?;
    let mut e = match (kind.as_deref().and_then(kind_of), status) {
        (Some(kind), status) => ProviderError {
            status,
            ..ProviderError::new(kind, text)
        },
        (None, Some(status)) => ProviderError::from_status(status, text),
        (None, None) => ProviderError::new(ErrorKind::Server, text),
    };
    e.retry_after = retry_after.filter(|s| s.is_finite() && *s >= 0.0).map(|s| {
        Duration::from_secs_f64(s.min(tollgate_openai::rate_limit::MAX_HINT.as_secs_f64()))
    });
    Ok(e)
}

/// An RT-2 class by its name (`ErrorKind::as_str`).
pub(crate) fn kind_of(name: &str) -> Option<ErrorKind> {
    [
        ErrorKind::Connect,
        ErrorKind::Timeout,
        ErrorKind::RateLimited,
        ErrorKind::Server,
        ErrorKind::Auth,
        ErrorKind::Client,
        ErrorKind::Protocol,
        ErrorKind::StreamBroken,
        ErrorKind::Declared,
    ]
    .into_iter()
    .find(|k| k.as_str() == name)
}

/// An HTTP status carried by the exception (`status_code`, or
/// `response.status_code`).
fn status_of(value: &Bound<'_, PyAny>) -> Option<u16> {
    let direct = value
        .getattr("status_code")
        .ok()
        .and_then(|s| s.extract::<u16>().ok());
    direct
        .or_else(|| {
            value
                .getattr("response")
                .ok()
                .filter(|r| !r.is_none())
                .and_then(|r| r.getattr("status_code").ok())
                .and_then(|s| s.extract::<u16>().ok())
        })
        .filter(|s| (100..=999).contains(s))
}

/// The headers of an httpx response (or anything with `headers` whose
/// `multi_items()` or `items()` gives text pairs); invalid ones skipped.
pub(crate) fn headers_of(response: &Bound<'_, PyAny>) -> http::HeaderMap {
    let mut map = http::HeaderMap::new();
    let Ok(headers) = response.getattr("headers") else {
        return map;
    };
    let items = headers
        .call_method0("multi_items")
        .or_else(|_| headers.call_method0("items"));
    let Ok(items) = items.and_then(|i| i.try_iter()) else {
        return map;
    };
    for item in items.flatten() {
        let Ok((name, value)) = item.extract::<(String, String)>() else {
            continue;
        };
        if let (Ok(name), Ok(value)) = (
            http::HeaderName::from_bytes(name.as_bytes()),
            http::HeaderValue::from_str(&value),
        ) {
            map.append(name, value);
        }
    }
    map
}

/// `str(exception)`, or its class name when empty, at most
/// [`MAX_MESSAGE`] characters, control characters replaced.
fn message(value: &Bound<'_, PyAny>) -> String {
    let text = value.str().map(|s| s.to_string()).unwrap_or_default();
    let text = if text.is_empty() {
        value
            .get_type()
            .name()
            .map(|n| n.to_string())
            .unwrap_or_default()
    } else {
        text
    };
    text.chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .take(MAX_MESSAGE)
        .collect()
}

/// The class names along `class`'s MRO.
fn mro_names(class: &Bound<'_, PyType>) -> Vec<String> {
    class
        .mro()
        .iter()
        .filter_map(|c| c.getattr("__name__").ok()?.extract::<String>().ok())
        .collect()
}

//! The responses the transport gives the SDK (SPEC PY-4, GW-4).
//!
//! Every answer that ends a call carries `x-should-retry: false`, so an
//! SDK never retries on top of the engine's own retries (its `max_retries`
//! would otherwise multiply the attempts and break the call's one
//! deadline). A call that gives up after provider answers passes the
//! provider's last answer through; one refused by tollgate (queue full,
//! deadline, estimate over a limit, circuit open, a connection that never
//! answered) answers as the gateway would, in the endpoint's dialect.

use std::future::Future;
use std::pin::pin;
use std::task::{Context, Poll, Waker};

use bytes::Bytes;
use http_body_util::BodyExt;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList};
use tollgate_gateway::error::{ApiError, Dialect};

/// The header that tells an SDK not to retry.
pub(crate) const SHOULD_RETRY: (&str, &str) = ("x-should-retry", "false");

/// `Response(status, headers=..., content=... | stream=...)` of the SDK's
/// httpx module.
pub(crate) fn response(
    py: Python<'_>,
    class: &Py<PyAny>,
    status: u16,
    headers: &[(String, String)],
    body: Body<'_, '_>,
) -> PyResult<Py<PyAny>> {
    let kwargs = PyDict::new(py);
    kwargs.set_item("headers", PyList::new(py, headers)?)?;
    match body {
        Body::Content(content) => kwargs.set_item("content", content)?,
        Body::Stream(stream) => kwargs.set_item("stream", stream)?,
    }
    Ok(class.bind(py).call((status,), Some(&kwargs))?.unbind())
}

/// A response body.
pub(crate) enum Body<'a, 'py> {
    /// Whole.
    Content(&'a Bound<'py, PyBytes>),
    /// A byte stream object of the module.
    Stream(Bound<'py, PyAny>),
}

/// A provider's answer as the call's last word: its headers (the body is
/// decoded) and `x-should-retry: false`.
pub(crate) fn final_headers(headers: Vec<(String, String)>) -> Vec<(String, String)> {
    let mut headers = super::provider::decoded_headers(headers);
    headers.retain(|(n, _)| !n.eq_ignore_ascii_case(SHOULD_RETRY.0));
    headers.push((SHOULD_RETRY.0.to_owned(), SHOULD_RETRY.1.to_owned()));
    headers
}

/// The gateway's error response for `error` in `dialect`: status,
/// headers (`retry-after`, `retry-after-ms` when known) and body, with
/// `x-should-retry: false`.
pub(crate) fn gateway(error: ApiError, dialect: Dialect) -> (u16, Vec<(String, String)>, Bytes) {
    let response = error.into_response_for(dialect);
    let (parts, body) = response.into_parts();
    // The body is whole already: one poll collects it.
    let collected = {
        let mut collect = pin!(body.collect());
        match collect
            .as_mut()
            .poll(&mut Context::from_waker(Waker::noop()))
        {
            Poll::Ready(Ok(c)) => c.to_bytes(),
            _ => Bytes::new(),
        }
    };
    let headers = parts
        .headers
        .iter()
        .filter_map(|(n, v)| Some((n.as_str().to_owned(), v.to_str().ok()?.to_owned())))
        .collect();
    (parts.status.as_u16(), final_headers(headers), collected)
}

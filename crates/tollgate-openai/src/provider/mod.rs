//! The HTTP provider: the engine's [`tollgate::lifecycle::Provider`] over an
//! OpenAI-compatible API (SPEC RT-2, RT-3, DL-4, LC-3..5, GW-5).
//!
//! * [`UpstreamRequest`]: the body the gateway serialised once per call,
//!   with its endpoint and stream flags; cheap to clone per attempt.
//! * [`HttpProvider`]: one shared [`HttpClient`] (hyper, rustls) with
//!   connection pooling;
//!   one-shot attempts return the upstream body byte for byte with its usage,
//!   streams yield [`ChunkStream`] events, in the streaming dialect of the
//!   request's endpoint (chat completions, Responses, Anthropic Messages).
//! * [`HttpProviderBuilder`]: base URL, key, timeouts and pool settings,
//!   validated at build time ([`BuildError`]).

mod classify;
mod client;
mod config;
mod dialect;
mod edit;
mod h1;
mod members;
mod request;
mod shard;
mod stream;
mod transport;

pub use client::HttpProvider;
pub use config::{
    ApiKey, BuildError, DEFAULT_CONNECT_TIMEOUT, DEFAULT_MAX_ERROR_BODY, DEFAULT_MAX_RESPONSE_BODY,
    DEFAULT_POOL_IDLE_TIMEOUT, DEFAULT_POOL_MAX_IDLE_PER_HOST, HttpProviderBuilder,
};
pub use request::{Endpoint, UpstreamRequest};
pub use shard::pin_to_thread;
pub use stream::{BodyStream, ChunkItem, ChunkStream, DEFAULT_END_GRACE};
pub use transport::{BodyChunks, BodyError, ClientError, HttpClient, SendError};

/// The engine's error for a non-2xx answer received by another HTTP client
/// (the Python package's transport): the RT-2 class of `status`, the
/// server's retry floor and budget reports from `headers` (RT-3, Q-14) and
/// the provider's message from `body`, exactly as [`HttpProvider`] reads
/// its own answers.
pub fn answer_error(
    status: http::StatusCode,
    headers: &http::HeaderMap,
    body: Option<&[u8]>,
) -> tollgate::lifecycle::ProviderError {
    classify::status_error(status, headers, body, None)
}

/// The usage of a 2xx one-shot `body` of `endpoint` received by another
/// HTTP client (SPEC Q-6), as [`HttpProvider`] reads its own: a body that
/// is not a JSON object is a protocol error, one that declares an `error`
/// a declared failure.
pub fn answer_usage(
    body: &[u8],
    status: u16,
    endpoint: Endpoint,
) -> Result<tollgate::Usage, tollgate::lifecycle::ProviderError> {
    client::one_shot_usage(body, status, None, endpoint)
}

#[cfg(test)]
mod dialect_tests;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod tls_tests;

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
mod h1;
mod request;
mod stream;
mod transport;

pub use client::HttpProvider;
pub use config::{
    ApiKey, BuildError, DEFAULT_CONNECT_TIMEOUT, DEFAULT_MAX_ERROR_BODY, DEFAULT_MAX_RESPONSE_BODY,
    DEFAULT_POOL_IDLE_TIMEOUT, DEFAULT_POOL_MAX_IDLE_PER_HOST, HttpProviderBuilder,
};
pub use h1::pin_to_thread;
pub use request::{Endpoint, UpstreamRequest};
pub use stream::{BodyStream, ChunkItem, ChunkStream, DEFAULT_END_GRACE};
pub use transport::{BodyChunks, BodyError, ClientError, HttpClient, SendError};

#[cfg(test)]
mod dialect_tests;
#[cfg(test)]
mod tests;

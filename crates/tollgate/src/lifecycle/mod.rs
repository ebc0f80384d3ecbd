//! The supervised call lifecycle (SPEC §7, §8, §9): one-shot and streaming
//! calls under one deadline, with retries and a circuit breaker.

mod provider;

pub use provider::{AttemptContext, ErrorKind, Provider, ProviderError, Reply, StreamEvent};

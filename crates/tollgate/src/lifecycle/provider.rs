//! The seam to an upstream: one-shot and streaming attempts, classified
//! errors (SPEC RT-2, RT-3). No HTTP here; the OpenAI layer implements it.

use std::fmt;
use std::future::Future;
use std::time::Duration;

use futures_core::Stream;

use super::accounting::Budgets;
use crate::admission::Lease;
use crate::call::CallId;
use crate::deadline::Deadline;
use crate::usage::Usage;

/// What the supervisor tells a provider about one attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AttemptContext {
    /// The call, if it has an id.
    pub call_id: Option<CallId>,
    /// 1 for the first attempt (SPEC RT-1 counts every attempt).
    pub attempt: u32,
    /// The call's one deadline (SPEC DL-1).
    pub deadline: Deadline,
    /// This attempt's transport timeout: `min(local cap, remaining)`
    /// (SPEC DL-4). The supervisor enforces it too; a provider may pass it
    /// to its HTTP client.
    pub timeout: Option<Duration>,
}

/// A one-shot response and the usage it reported.
#[derive(Debug, Clone, PartialEq)]
pub struct Reply<R> {
    /// The response body.
    pub body: R,
    /// Tokens the provider reported (SPEC Q-6).
    pub usage: Usage,
    /// What the response said about the provider's budget (SPEC Q-14).
    pub budget: Budgets,
    /// The provider's id of the request (`x-request-id`), if it sent one.
    pub request_id: Option<String>,
}

impl<R> Reply<R> {
    /// A reply with `usage` and no budget report.
    pub fn new(body: R, usage: Usage) -> Self {
        Reply {
            body,
            usage,
            budget: Budgets::default(),
            request_id: None,
        }
    }

    /// Adds the provider's id of the request.
    pub fn with_request_id(mut self, request_id: Option<String>) -> Self {
        self.request_id = request_id;
        self
    }

    /// Adds the budget the response reported.
    pub fn with_budget(mut self, budget: Budgets) -> Self {
        self.budget = budget;
        self
    }
}

/// One item of a provider stream.
#[derive(Debug, Clone, PartialEq)]
pub enum StreamEvent<C> {
    /// Output for the consumer.
    Chunk(C),
    /// A usage report (not output): the supervisor settles the attempt
    /// with it (SPEC Q-5, GW-5).
    Usage(Usage),
    /// A provider-declared error chunk: delivered to the consumer once,
    /// then the stream ends with this error (SPEC LC-4).
    Error(C, ProviderError),
}

/// RT-2 classes of provider failures.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorKind {
    /// Could not connect or the connection broke before a response.
    Connect,
    /// One attempt ran past its local timeout.
    Timeout,
    /// HTTP 429.
    RateLimited,
    /// HTTP 5xx.
    Server,
    /// HTTP 401/403.
    Auth,
    /// Any other 4xx: the request itself is wrong.
    Client,
    /// The response broke the protocol (bad JSON, bad SSE).
    Protocol,
    /// The stream broke after it had started.
    StreamBroken,
    /// The provider declared an error inside the stream.
    Declared,
}

impl ErrorKind {
    /// Whether a fresh attempt may succeed (SPEC RT-2). A broken stream is
    /// a connection error; the supervisor still never retries one after
    /// its first chunk reached the consumer (SPEC LC-3).
    pub const fn is_retryable(self) -> bool {
        matches!(
            self,
            ErrorKind::Connect
                | ErrorKind::Timeout
                | ErrorKind::RateLimited
                | ErrorKind::Server
                | ErrorKind::StreamBroken
        )
    }

    /// Whether it says the upstream is unhealthy (SPEC CB-1): connection
    /// failures, timeouts, server errors and broken streams. A 429 is about
    /// quota and a 4xx about the request, so neither trips the circuit.
    pub const fn is_upstream_failure(self) -> bool {
        matches!(
            self,
            ErrorKind::Connect | ErrorKind::Timeout | ErrorKind::Server | ErrorKind::StreamBroken
        )
    }

    /// The stable lower-case name used in telemetry.
    pub const fn as_str(self) -> &'static str {
        match self {
            ErrorKind::Connect => "connect",
            ErrorKind::Timeout => "timeout",
            ErrorKind::RateLimited => "rate_limited",
            ErrorKind::Server => "server",
            ErrorKind::Auth => "auth",
            ErrorKind::Client => "client",
            ErrorKind::Protocol => "protocol",
            ErrorKind::StreamBroken => "stream_broken",
            ErrorKind::Declared => "declared",
        }
    }
}

impl fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A classified provider failure, with what the provider told us about
/// its limits.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("provider {kind} error{}: {message}", status.map(|s| format!(" (HTTP {s})")).unwrap_or_default())]
pub struct ProviderError {
    /// The RT-2 class.
    pub kind: ErrorKind,
    /// The HTTP status, if any.
    pub status: Option<u16>,
    /// The server's floor for the next attempt (`retry-after`,
    /// `x-ratelimit-reset-*`, ...; SPEC RT-3).
    pub retry_after: Option<Duration>,
    /// Usage of the failed attempt, if the provider reported any.
    pub usage: Usage,
    /// What the response said about the provider's budget (SPEC Q-14);
    /// boxed, as most errors carry none.
    pub budget: Option<Box<Budgets>>,
    /// A short description (never the prompt or a key).
    pub message: String,
    /// The request never left: no byte of it reached the provider (a
    /// connection refused at connect, an attempt its caller held back).
    /// The attempt costs nothing anywhere: the supervisor gives its
    /// reservation back in full, as for an attempt never started (SPEC
    ///
    pub unsent: bool,
}

impl ProviderError {
    /// An error of `kind` with `message`.
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        ProviderError {
            kind,
            status: None,
            retry_after: None,
            usage: Usage::UNKNOWN,
            budget: None,
            message: message.into(),
            unsent: false,
        }
    }

    /// The error an HTTP status maps to (SPEC RT-2).
    pub fn from_status(status: u16, message: impl Into<String>) -> Self {
        let kind = match status {
            429 => ErrorKind::RateLimited,
            401 | 403 => ErrorKind::Auth,
            s if s >= 500 => ErrorKind::Server,
            _ => ErrorKind::Client,
        };
        ProviderError {
            status: Some(status),
            ..ProviderError::new(kind, message)
        }
    }

    /// Sets the server's retry floor.
    pub fn with_retry_after(mut self, retry_after: Option<Duration>) -> Self {
        self.retry_after = retry_after;
        self
    }

    /// Adds the budget the response reported.
    pub fn with_budget(mut self, budget: Budgets) -> Self {
        self.budget = (!budget.is_empty()).then(|| Box::new(budget));
        self
    }

    /// Sets the usage of the failed attempt.
    pub fn with_usage(mut self, usage: Usage) -> Self {
        self.usage = usage;
        self
    }

    /// Marks the request as never sent (see [`unsent`](Self::unsent)).
    pub fn never_sent(mut self) -> Self {
        self.unsent = true;
        self
    }

    /// Whether a fresh attempt may succeed (SPEC RT-2).
    pub fn is_retryable(&self) -> bool {
        self.kind.is_retryable()
    }
}

/// An upstream that serves one-shot and streaming attempts.
///
/// Dropping a returned future or stream must abort the attempt (the HTTP
/// request is cancelled): that is how the supervisor enforces deadlines and
/// consumer cancellation without detached work (SPEC DL-6, LC-5).
pub trait Provider: Send + Sync + 'static {
    /// A request.
    type Request: Send + Sync + 'static;
    /// A one-shot response body.
    type Response: Send + 'static;
    /// One chunk of streamed output.
    type Chunk: Send + 'static;
    /// An established stream.
    type Stream: Stream<Item = Result<StreamEvent<Self::Chunk>, ProviderError>>
        + Send
        + Unpin
        + 'static;

    /// One one-shot attempt.
    fn call(
        &self,
        request: &Self::Request,
        attempt: AttemptContext,
    ) -> impl Future<Output = Result<Reply<Self::Response>, ProviderError>> + Send;

    /// Opens a stream: resolves once the upstream accepted the request
    /// (status and headers received).
    fn stream(
        &self,
        request: &Self::Request,
        attempt: AttemptContext,
    ) -> impl Future<Output = Result<Self::Stream, ProviderError>> + Send;

    /// Whether an open stream has yielded its last item and only reads the
    /// end of its transport (after an SSE `[DONE]`, say). The output is
    /// then complete: a deadline or a close reached meanwhile ends the call
    /// normally instead of failing it. `false` by default.
    fn stream_finished(&self, stream: &Self::Stream) -> bool {
        let _ = stream;
        false
    }

    /// What an opened stream's response headers said about the provider's
    /// budget (SPEC Q-14). None by default.
    fn stream_budget(&self, stream: &Self::Stream) -> Budgets {
        let _ = stream;
        Budgets::default()
    }

    /// An attempt of `request` was cut: its future (from [`call`] or
    /// [`stream`]) was dropped before it answered (the call's deadline,
    /// the attempt timeout, `close`, the caller's cancellation). `lease` is
    /// that attempt's, already counted; dropping it returns its
    /// concurrency permit.
    ///
    /// The default drops it at once: dropping the future aborted the
    /// attempt. A provider whose attempt runs work that outlives its
    /// future (work on another event loop, which ends some time after it
    /// is asked to cancel) keeps the lease until that work has ended, so
    /// the permit bounds the work actually in flight (SPEC POOL-1, ADM-7).
    /// It must not block: it parks the lease where the work's end drops
    /// it.
    ///
    /// [`call`]: Provider::call
    /// [`stream`]: Provider::stream
    fn cut(&self, request: &Self::Request, lease: Lease) {
        let _ = request;
        drop(lease);
    }

    /// A stream's upstream is let go with its call's `lease`: the stream
    /// ended, failed (its deadline, a close) or its consumer dropped it.
    /// The default drops both at once: dropping the stream aborted it. A
    /// provider whose stream runs work that outlives it (an item read on
    /// another event loop, which ends some time after it is asked to
    /// cancel) drops `stream` and keeps the lease until that work has
    /// ended, as [`cut`](Provider::cut) does (SPEC POOL-1, LC-5, ADM-7).
    /// It must not block.
    fn stream_cut(&self, stream: Self::Stream, lease: Lease) {
        drop(stream);
        drop(lease);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // proves: RT-2 (retryable: connect, timeout, 429, 5xx; never other 4xx,
    // auth, protocol)
    #[test]
    fn status_classification() {
        let retryable = |s| ProviderError::from_status(s, "x").is_retryable();
        assert!(retryable(429));
        assert!(retryable(500));
        assert!(retryable(503));
        assert!(!retryable(400));
        assert!(!retryable(401));
        assert!(!retryable(404));
        assert!(ProviderError::new(ErrorKind::Connect, "x").is_retryable());
        assert!(ProviderError::new(ErrorKind::Timeout, "x").is_retryable());
        assert!(!ProviderError::new(ErrorKind::Protocol, "x").is_retryable());
        assert!(ProviderError::new(ErrorKind::StreamBroken, "x").is_retryable());
        assert!(!ProviderError::new(ErrorKind::Declared, "x").is_retryable());
        assert_eq!(ProviderError::from_status(403, "x").kind, ErrorKind::Auth);
    }
}

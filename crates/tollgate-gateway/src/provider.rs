//! The gateway's view of an upstream: the HTTP provider, with each
//! request carrying its own token estimate.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use bytes::Bytes;
use http::{HeaderName, HeaderValue};
use tollgate::TokenEstimate;
use tollgate::lifecycle::{AttemptContext, ErrorKind, Provider, ProviderError, Reply};
use tollgate_openai::provider::ChunkStream;
use tollgate_openai::{HttpProvider, UpstreamRequest};

use crate::metrics::DeploymentMetrics;
use crate::telemetry::{AttemptSpan, AttemptTarget, CallTrace};

/// An upstream request and the tokens it is expected to spend.
#[derive(Debug, Clone)]
pub struct GatewayRequest {
    /// What goes upstream.
    pub upstream: UpstreamRequest,
    /// Input plus output allowance, counted with the model's tokenizer.
    pub estimate: TokenEstimate,
    /// Counts the attempts handed to an upstream; share one counter across
    /// the models of a client request's fallback chain.
    pub started: Started,
    /// The client call's trace, when tracing is on (SPEC OBS-5): each
    /// attempt gets a span and sends its `traceparent` upstream.
    pub trace: Option<CallTrace>,
}

/// How many attempts of one client request reached an upstream (the
/// provider was called: admission passed). Clones share the count.
///
/// A request that failed with a count of zero used no upstream tokens, so
/// its tenant's token reservation is refunded in full (SPEC ).
#[derive(Debug, Clone, Default)]
pub struct Started(Arc<[AtomicU32; 2]>);

impl Started {
    /// Attempts started so far.
    pub fn count(&self) -> u32 {
        self.0[0].load(Ordering::Acquire)
    }

    /// Attempts the upstream refused with 429 (billed nothing, SPEC
    /// BUD-5).
    pub fn refused(&self) -> u32 {
        self.0[1].load(Ordering::Acquire)
    }

    /// Counts one more attempt; returns its number (from 1).
    fn bump(&self) -> u32 {
        self.0[0].fetch_add(1, Ordering::AcqRel) + 1
    }

    fn bump_refused(&self) {
        self.0[1].fetch_add(1, Ordering::AcqRel);
    }
}

/// [`HttpProvider`] taking [`GatewayRequest`]s, counting the attempts of
/// one deployment and its upstream's 429s.
#[derive(Debug, Clone)]
pub struct GatewayProvider {
    http: HttpProvider,
    metrics: DeploymentMetrics,
    target: AttemptTarget,
}

impl GatewayProvider {
    /// Wraps `http` for the deployment whose handles are `metrics` and
    /// whose attempt spans name `target`.
    pub fn new(http: HttpProvider, metrics: DeploymentMetrics, target: AttemptTarget) -> Self {
        GatewayProvider {
            http,
            metrics,
            target,
        }
    }

    /// The attempt's span (when the call is traced) and the headers it
    /// adds to the request: its `traceparent`.
    fn traced(
        &self,
        request: &GatewayRequest,
        number: u32,
        attempt: &AttemptContext,
    ) -> (Option<AttemptSpan>, Vec<(HeaderName, HeaderValue)>) {
        let Some(trace) = &request.trace else {
            return (None, Vec::new());
        };
        let left = attempt.deadline.remaining(tollgate::clock::Instant::now());
        let span = trace.attempt(&self.target, number, left);
        let headers = span.headers().collect();
        (Some(span), headers)
    }

    fn count<T>(&self, result: &Result<T, ProviderError>, started: &Started) {
        let limited = matches!(result, Err(e) if e.kind == ErrorKind::RateLimited);
        if limited {
            started.bump_refused();
        }
        self.metrics.attempt(limited);
    }
}

impl Provider for GatewayProvider {
    type Request = GatewayRequest;
    type Response = Bytes;
    type Chunk = Bytes;
    type Stream = ChunkStream;

    fn call(
        &self,
        request: &GatewayRequest,
        attempt: AttemptContext,
    ) -> impl Future<Output = Result<Reply<Bytes>, ProviderError>> + Send {
        let number = request.started.bump();
        let (span, headers) = self.traced(request, number, &attempt);
        let started = request.started.clone();
        async move {
            let result = self
                .http
                .call_with(&request.upstream, &headers, attempt)
                .await;
            self.count(&result, &started);
            match (span, &result) {
                (Some(mut span), Ok(reply)) => span.succeed(Some(reply.usage)),
                (Some(span), Err(e)) => span.failed(e),
                (None, _) => {}
            }
            result
        }
    }

    fn stream(
        &self,
        request: &GatewayRequest,
        attempt: AttemptContext,
    ) -> impl Future<Output = Result<ChunkStream, ProviderError>> + Send {
        let number = request.started.bump();
        let (span, headers) = self.traced(request, number, &attempt);
        let started = request.started.clone();
        async move {
            let result = self
                .http
                .stream_with(&request.upstream, &headers, attempt)
                .await;
            self.count(&result, &started);
            match (span, &result) {
                (Some(span), Ok(_)) => span.streaming(),
                (Some(span), Err(e)) => span.failed(e),
                (None, _) => {}
            }
            result
        }
    }

    fn stream_budget(&self, stream: &ChunkStream) -> tollgate::lifecycle::Budgets {
        self.http.stream_budget(stream)
    }

    fn stream_finished(&self, stream: &ChunkStream) -> bool {
        self.http.stream_finished(stream)
    }
}

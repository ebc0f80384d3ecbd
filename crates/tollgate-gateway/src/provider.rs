//! The gateway's view of an upstream: the HTTP provider, with each
//! request carrying its own token estimate.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use bytes::Bytes;
use http::{HeaderName, HeaderValue};
use parking_lot::Mutex;
use tollgate::TokenEstimate;
use tollgate::lifecycle::{AttemptContext, ErrorKind, Provider, ProviderError, Reply};
use tollgate::price::Price;
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
    /// The price of the deployment's upstream model, if known (SPEC
    /// BUD-1): what an attempt may cost.
    pub price: Option<Price>,
    /// Counts the attempts handed to an upstream; share one counter across
    /// the models of a client request's fallback chain.
    pub started: Started,
    /// The client call's trace, when tracing is on (SPEC OBS-5): each
    /// attempt gets a span and sends its `traceparent` upstream.
    pub trace: Option<CallTrace>,
}

/// How many attempts of one client request reached an upstream (the
/// provider was called: admission passed), and what each may have cost.
/// Clones share the count.
///
/// A request that failed with a count of zero used no upstream tokens and
/// cost nothing, so its tenant's reservation is refunded in full (SPEC
/// Otherwise its tenant is charged every attempt the provider
/// may have billed (BUD-2, BUD-5): each attempt's reported usage, priced,
/// where known, its worst case (its estimate at its deployment's price)
/// where not, nothing for a 429.
#[derive(Debug, Clone, Default)]
pub struct Started(Arc<Attempts>);

#[derive(Debug, Default)]
struct Attempts {
    started: AtomicU32,
    refused: AtomicU32,
    /// What each attempt may have cost, in micro-dollars, in order.
    costs: Mutex<Vec<u64>>,
}

impl Started {
    /// Attempts started so far.
    pub fn count(&self) -> u32 {
        self.0.started.load(Ordering::Acquire)
    }

    /// Attempts the upstream refused with 429 (billed nothing, SPEC
    /// BUD-5).
    pub fn refused(&self) -> u32 {
        self.0.refused.load(Ordering::Acquire)
    }

    /// What every attempt so far may have cost, in micro-dollars.
    pub fn billed(&self) -> u64 {
        self.0
            .costs
            .lock()
            .iter()
            .fold(0u64, |sum, c| sum.saturating_add(*c))
    }

    /// What the attempts before the last one may have cost, in
    /// micro-dollars: the attempts an answer (the last attempt) came after.
    pub fn billed_before_last(&self) -> u64 {
        let costs = self.0.costs.lock();
        let before = costs.len().saturating_sub(1);
        costs[..before]
            .iter()
            .fold(0u64, |sum, c| sum.saturating_add(*c))
    }

    /// Counts one more attempt, which may cost `worst` micro-dollars;
    /// returns its number (from 1).
    fn bump(&self, worst: u64) -> u32 {
        let mut costs = self.0.costs.lock();
        costs.push(worst);
        self.0.started.fetch_add(1, Ordering::AcqRel) + 1
    }

    /// What attempt `number` cost once its failure says so.
    fn settle(&self, number: u32, cost: u64) {
        let index = (number as usize).saturating_sub(1);
        if let Some(c) = self.0.costs.lock().get_mut(index) {
            *c = cost;
        }
    }

    fn bump_refused(&self) {
        self.0.refused.fetch_add(1, Ordering::AcqRel);
    }
}

impl GatewayRequest {
    /// The most one attempt of this request may cost, in micro-dollars
    /// (zero when its deployment has no price).
    fn worst_cost(&self) -> u64 {
        self.price.map_or(0, |p| {
            p.worst_case(self.estimate.input, self.estimate.output)
        })
    }

    /// What a failed attempt cost, if its failure tells: nothing for a 429
    /// (no provider bills a refusal, SPEC BUD-5), its reported usage
    /// priced when known (else its worst case stays, Q-5).
    fn failed_cost(&self, e: &ProviderError) -> Option<u64> {
        if e.kind == ErrorKind::RateLimited {
            return Some(0);
        }
        self.price.and_then(|p| e.usage.priced(&p).cost())
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

    fn count<T>(
        &self,
        request: &GatewayRequest,
        number: u32,
        result: &Result<T, ProviderError>,
        started: &Started,
    ) {
        let limited = matches!(result, Err(e) if e.kind == ErrorKind::RateLimited);
        if limited {
            started.bump_refused();
        }
        if let Err(e) = result
            && let Some(cost) = request.failed_cost(e)
        {
            started.settle(number, cost);
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
        let number = request.started.bump(request.worst_cost());
        let (span, headers) = self.traced(request, number, &attempt);
        let started = request.started.clone();
        async move {
            let result = self
                .http
                .call_with(&request.upstream, &headers, attempt)
                .await;
            self.count(request, number, &result, &started);
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
        let number = request.started.bump(request.worst_cost());
        let (span, headers) = self.traced(request, number, &attempt);
        let started = request.started.clone();
        async move {
            let result = self
                .http
                .stream_with(&request.upstream, &headers, attempt)
                .await;
            self.count(request, number, &result, &started);
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

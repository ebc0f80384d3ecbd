//! The gateway's view of an upstream: the HTTP provider, with each
//! request carrying its own token estimate.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use bytes::Bytes;
use parking_lot::Mutex;
use tollgate::TokenEstimate;
use tollgate::lifecycle::{AttemptContext, ErrorKind, Provider, ProviderError, Reply};
use tollgate::price::Price;
use tollgate_openai::provider::ChunkStream;
use tollgate_openai::{HttpProvider, UpstreamRequest};

use crate::metrics::DeploymentMetrics;
use crate::telemetry::{AttemptSpan, AttemptTarget, CallTrace, TraceHeaders};
use crate::tenants::TenantLeases;

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
    /// The place of the request's model in the call's fallback chain (0:
    /// the model the client asked for).
    pub model: usize,
    /// The call's leases on its tenant's side, which must cover each
    /// attempt before it is sent (SPEC BUD-2); `None` for a call without.
    pub tenant: Option<TenantLeases>,
}

/// How many attempts of one client request reached an upstream (the
/// provider was called: admission passed), on which model of the call's
/// chain, and what each may have cost. Clones share the count.
///
/// A request that failed with no attempt sent used no upstream tokens and
/// cost nothing, so its tenant's reservation is refunded in full (SPEC
/// Otherwise its tenant is charged every attempt the provider
/// may have billed (BUD-2, BUD-5): each attempt's reported usage, priced,
/// where known, its worst case (its estimate at its deployment's price)
/// where not, nothing for a 429 or a request never sent (its connection
/// refused).
#[derive(Debug, Clone, Default)]
pub struct Started(Arc<Attempts>);

#[derive(Debug, Default)]
struct Attempts {
    started: AtomicU32,
    refused: AtomicU32,
    /// Every attempt, in order.
    list: Mutex<Vec<Attempt>>,
}

/// One attempt of a client request.
#[derive(Debug, Clone, Copy)]
struct Attempt {
    /// Its model's place in the call's chain.
    model: usize,
    /// What it may have cost, in micro-dollars.
    cost: u64,
    /// It never left (its connection was refused).
    unsent: bool,
}

/// What the attempts on some models of a call may have cost, in
/// micro-dollars ([`Started::tally`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Tally {
    /// Every one of them.
    pub billed: u64,
    /// All but the call's last attempt (when it is one of them).
    pub before_last: u64,
    /// How many may have reached the provider.
    pub sent: u32,
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
        self.tally(None).billed
    }

    /// What the attempts before the last one may have cost, in
    /// micro-dollars: the attempts an answer (the last attempt) came after.
    pub fn billed_before_last(&self) -> u64 {
        self.tally(None).before_last
    }

    /// What the attempts on model number `model` of the chain (`None`:
    /// on every model) may have cost.
    pub fn tally(&self, model: Option<usize>) -> Tally {
        let list = self.0.list.lock();
        let last = list.len().saturating_sub(1);
        let mut t = Tally::default();
        for (i, a) in list.iter().enumerate() {
            if model.is_some_and(|m| m != a.model) {
                continue;
            }
            t.billed = t.billed.saturating_add(a.cost);
            if i != last {
                t.before_last = t.before_last.saturating_add(a.cost);
            }
            if !a.unsent {
                t.sent += 1;
            }
        }
        t
    }

    /// Counts one more attempt, on model number `model`, which may cost
    /// `worst` micro-dollars; returns its number (from 1).
    fn bump(&self, model: usize, worst: u64) -> u32 {
        let mut list = self.0.list.lock();
        list.push(Attempt {
            model,
            cost: worst,
            unsent: false,
        });
        self.0.started.fetch_add(1, Ordering::AcqRel) + 1
    }

    /// What attempt `number` cost once its failure says so; `unsent`
    /// when it never left.
    fn settle(&self, number: u32, cost: u64, unsent: bool) {
        let index = (number as usize).saturating_sub(1);
        if let Some(a) = self.0.list.lock().get_mut(index) {
            a.cost = cost;
            a.unsent = unsent;
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
    /// (no provider bills a refusal, SPEC BUD-5) or a request that never
    /// left (its connection refused, Q-9), its reported usage priced when
    /// known (else its worst case stays, Q-5).
    fn failed_cost(&self, e: &ProviderError) -> Option<u64> {
        if e.kind == ErrorKind::RateLimited || e.unsent {
            return Some(0);
        }
        self.price.and_then(|p| e.usage.priced(&p).cost())
    }

    /// Counts the next attempt, once its tenant's leases cover it (SPEC
    /// BUD-2): its number, or the error that keeps it from being sent (a
    /// budget cannot take what it may cost beside the attempts before it).
    fn start(&self) -> Result<u32, ProviderError> {
        let worst = self.worst_cost();
        if let Some(tenant) = &self.tenant
            && !tenant.cover(&self.started, self.model, worst)
        {
            return Err(ProviderError::new(
                ErrorKind::Client,
                "the tenant's budget cannot take another attempt",
            )
            .never_sent());
        }
        Ok(self.started.bump(self.model, worst))
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
    ) -> (Option<AttemptSpan>, TraceHeaders) {
        let Some(trace) = &request.trace else {
            return (None, TraceHeaders::default());
        };
        let left = attempt.deadline.remaining(tollgate::clock::Instant::now());
        let span = trace.attempt(&self.target, number, left);
        let headers = span.headers();
        (Some(span), headers)
    }

    fn count<T>(&self, request: &GatewayRequest, number: u32, result: &Result<T, ProviderError>) {
        let started = &request.started;
        let limited = matches!(result, Err(e) if e.kind == ErrorKind::RateLimited);
        if limited {
            started.bump_refused();
        }
        if let Err(e) = result
            && let Some(cost) = request.failed_cost(e)
        {
            started.settle(number, cost, e.unsent);
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
        let number = request.start();
        async move {
            let number = number?;
            let (span, headers) = self.traced(request, number, &attempt);
            let result = self
                .http
                .call_with(&request.upstream, &headers, attempt)
                .await;
            self.count(request, number, &result);
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
        let number = request.start();
        async move {
            let number = number?;
            let (span, headers) = self.traced(request, number, &attempt);
            let result = self
                .http
                .stream_with(&request.upstream, &headers, attempt)
                .await;
            self.count(request, number, &result);
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

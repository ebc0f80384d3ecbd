//! The supervisor: admission → pre-hook → attempts → post-hook → terminal
//! state → cleanup → release → removal, for one-shot and streaming calls
//! alike (SPEC LC-1..LC-8, DL-3..DL-7, RT, CB).
//!
//! Everything runs inside the caller's future (or stream). The one task the
//! supervisor spawns is a stream's watchdog, which ends a stream nobody
//! polls at its deadline or at close and holds only a weak reference to it
//! (see `stream.rs`), so nothing outlives a call. Dropping the future or
//! the stream cancels the attempt in flight, returns every reservation and
//! permit, and reports the call `Cancelled`.

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use super::accounting::{Accounting, ArrivalBound, Budgets, CountedLease};
use super::breaker::{CircuitBreaker, Probe};
use super::hooks::{Hook, HookContext, Hooks};
use super::outcome::{CallError, Completed};
use super::policy::{AttemptPolicy, Decision, GiveUp, NoJitter, SeededJitter, SharedJitter};
use super::provider::{AttemptContext, ErrorKind, Provider, ProviderError, Reply};
use super::registry::{CallGuard, Calls, Observer};
use super::stream::CallStream;
use crate::admission::{AdmissionController, Lease};
use crate::call::{Call, CallId, PoolId, ScopeId};
use crate::clock::Instant;
use crate::config::ConfigError;
use crate::deadline::{Deadline, Phase};
use crate::estimate::{TokenEstimator, validate};
use crate::flow::Flow;
use crate::price::Price;
use crate::quota::RefusalCost;
use crate::usage::Usage;

/// Estimates one attempt's tokens from its request (SPEC Q-3, Q-8): any
/// [`TokenEstimator`] of the request, shared.
pub type RequestEstimator<R> = Arc<dyn TokenEstimator<R>>;

/// Per-call settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CallOptions {
    /// Conflict-checked identity (SPEC ADM-6).
    pub id: Option<CallId>,
    /// The call's one deadline (SPEC DL-1).
    pub deadline: Deadline,
    /// Whether the call may be retried automatically (SPEC RT-5; default
    /// `true`, as for chat completions and embeddings).
    pub idempotent: bool,
}

impl Default for CallOptions {
    fn default() -> Self {
        CallOptions {
            id: None,
            deadline: Deadline::NONE,
            idempotent: true,
        }
    }
}

impl CallOptions {
    /// Options with `deadline`.
    pub fn deadline(deadline: Deadline) -> Self {
        CallOptions {
            deadline,
            ..Self::default()
        }
    }
}

pub(crate) struct Inner<P: Provider> {
    pub(crate) controller: AdmissionController,
    pub(crate) provider: P,
    scope: ScopeId,
    pool: Option<PoolId>,
    policy: AttemptPolicy,
    pub(crate) breaker: Option<CircuitBreaker>,
    transport_timeout: Option<Duration>,
    estimator: Option<RequestEstimator<P::Request>>,
    pub(crate) hooks: Hooks,
    jitter: SharedJitter,
    observer: Option<Observer>,
    pub(crate) calls: Arc<Calls>,
    pub(crate) accounting: Accounting,
    arrival: ArrivalBound,
    pub(crate) price: Option<Price>,
    pricer: Option<Pricer<P::Request>>,
}

/// The price of a request's model, for a provider whose requests name
/// different models (SPEC BUD-1).
pub type Pricer<R> = Arc<dyn Fn(&R) -> Option<Price> + Send + Sync>;

/// Runs calls to one provider under one admission controller.
/// Cloning is cheap and shares the supervisor.
pub struct Supervisor<P: Provider> {
    pub(crate) inner: Arc<Inner<P>>,
}

impl<P: Provider> Clone for Supervisor<P> {
    fn clone(&self) -> Self {
        Supervisor {
            inner: Arc::clone(&self.inner),
        }
    }
}

impl<P: Provider> fmt::Debug for Supervisor<P> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Supervisor")
            .field("scope", &self.inner.scope)
            .field("pool", &self.inner.pool)
            .field("policy", &self.inner.policy)
            .field("active", &self.inner.calls.active())
            .finish_non_exhaustive()
    }
}

/// Builds a [`Supervisor`].
#[must_use]
pub struct SupervisorBuilder<P: Provider> {
    controller: AdmissionController,
    provider: P,
    scope: ScopeId,
    pool: Option<PoolId>,
    policy: AttemptPolicy,
    breaker: Option<CircuitBreaker>,
    transport_timeout: Option<Duration>,
    estimator: Option<RequestEstimator<P::Request>>,
    hooks: Hooks,
    jitter: Option<SharedJitter>,
    observer: Option<Observer>,
    accounting: Accounting,
    price: Option<Price>,
    pricer: Option<Pricer<P::Request>>,
}

impl<P: Provider> SupervisorBuilder<P> {
    /// The price of each request's model, when the provider's requests
    /// name different models (a batch file): it wins over
    /// [`price`](Self::price) for the requests it prices.
    pub fn pricer(
        mut self,
        pricer: impl Fn(&P::Request) -> Option<Price> + Send + Sync + 'static,
    ) -> Self {
        self.pricer = Some(Arc::new(pricer));
        self
    }

    /// The price of the provider's model (SPEC BUD-1): every attempt
    /// reserves its worst case from the scope's cost limits, and its usage
    /// is priced with it at settlement (needed when the scope has a cost
    /// limit).
    pub fn price(mut self, price: Price) -> Self {
        self.price = Some(price);
        self
    }

    /// The quota scope every attempt spends (default: the first scope).
    pub fn scope(mut self, scope: ScopeId) -> Self {
        self.scope = scope;
        self
    }

    /// The concurrency pool every attempt takes a permit from.
    pub fn pool(mut self, pool: PoolId) -> Self {
        self.pool = Some(pool);
        self
    }

    /// Retry settings (default [`AttemptPolicy::default`]).
    pub fn policy(mut self, policy: AttemptPolicy) -> Self {
        self.policy = policy;
        self
    }

    /// Guards the provider with a circuit breaker (share one breaker
    /// between supervisors of the same upstream endpoint).
    pub fn breaker(mut self, breaker: CircuitBreaker) -> Self {
        self.breaker = Some(breaker);
        self
    }

    /// Local cap of one transport attempt (clipped by the deadline, DL-4).
    pub fn transport_timeout(mut self, timeout: Duration) -> Self {
        self.transport_timeout = Some(timeout);
        self
    }

    /// Estimates each attempt's tokens (needed when the scope has a token
    /// limit, SPEC Q-3); it is asked again for every attempt (Q-8).
    ///
    /// Any [`TokenEstimator`] of the request works: a closure
    /// `Fn(&Request) -> Result<TokenEstimate, EstimateError>`, a
    /// [`CharRatioEstimator`](crate::CharRatioEstimator) for text requests,
    /// or an `Arc` of either shared with other supervisors.
    ///
    /// ```
    /// # use tollgate::lifecycle::{AttemptContext, Provider, ProviderError, Reply, StreamEvent};
    /// # struct Echo;
    /// # type Chunks = std::pin::Pin<Box<dyn futures_core::Stream<Item = Result<StreamEvent<String>, ProviderError>> + Send>>;
    /// # impl Provider for Echo {
    /// #     type Request = String; type Response = String; type Chunk = String; type Stream = Chunks;
    /// #     async fn call(&self, r: &String, _: AttemptContext) -> Result<Reply<String>, ProviderError> {
    /// #         Ok(Reply::new(r.clone(), tollgate::Usage::UNKNOWN))
    /// #     }
    /// #     async fn stream(&self, _: &String, _: AttemptContext) -> Result<Chunks, ProviderError> {
    /// #         Err(ProviderError::from_status(501, "no streams"))
    /// #     }
    /// # }
    /// use std::time::Duration;
    /// use tollgate::config::{MINUTE, ScopeConfig};
    /// use tollgate::lifecycle::{CallOptions, Supervisor};
    /// use tollgate::{AdmissionController, CharRatioEstimator, Deadline};
    ///
    /// # // proves: Q-3 (a `TokenEstimator` given to the builder is reserved)
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let controller = AdmissionController::builder()
    ///     .scope(ScopeConfig::new("api").tokens(10_000, MINUTE))
    ///     .build()?;
    /// // ceil(chars / 4) input tokens plus 256 output tokens per attempt.
    /// let supervisor = Supervisor::builder(controller.clone(), Echo)
    ///     .estimator(CharRatioEstimator::new(4.0, 256)?)
    ///     .build()?;
    /// let deadline = Deadline::after(Duration::from_secs(30));
    /// supervisor.invoke(&"hello".to_string(), CallOptions::deadline(deadline)).await?;
    /// assert_eq!(controller.snapshot().scopes[0].counters.tokens_reserved, 2 + 256);
    /// # Ok(()) }
    /// ```
    pub fn estimator(mut self, estimator: impl TokenEstimator<P::Request> + 'static) -> Self {
        self.estimator = Some(Arc::new(estimator));
        self
    }

    /// Hooks around each attempt.
    pub fn hooks(mut self, hooks: Hooks) -> Self {
        self.hooks = hooks;
        self
    }

    /// Jitter samples for retry delays (default: randomly seeded).
    pub fn jitter(mut self, jitter: SharedJitter) -> Self {
        self.jitter = Some(jitter);
        self
    }

    /// No jitter: exact, reproducible delays.
    pub fn without_jitter(self) -> Self {
        self.jitter(Arc::new(NoJitter))
    }

    /// How the provider's own limiter counts (SPEC Q-15, Q-16): what a
    /// refusal costs, whether it settles with actual usage, the least
    /// arrival delay assumed. Default [`Accounting::default`].
    pub fn accounting(mut self, accounting: Accounting) -> Self {
        self.accounting = accounting;
        self
    }

    /// Receives a report of every call once it is terminal.
    pub fn observer(mut self, observer: Observer) -> Self {
        self.observer = Some(observer);
        self
    }

    /// Validates the settings and builds the supervisor.
    pub fn build(self) -> Result<Supervisor<P>, ConfigError> {
        self.policy.validate()?;
        if let Some(t) = self.transport_timeout {
            crate::config::non_zero("transport_timeout", t)?;
        }
        Ok(self.build_validated())
    }

    /// Builds from settings the caller already validated.
    #[cfg_attr(not(feature = "tower"), allow(dead_code))]
    pub(crate) fn build_validated(self) -> Supervisor<P> {
        let calls = Calls::new(self.controller.closing_token());
        Supervisor {
            inner: Arc::new(Inner {
                controller: self.controller,
                provider: self.provider,
                scope: self.scope,
                pool: self.pool,
                policy: self.policy,
                breaker: self.breaker,
                transport_timeout: self.transport_timeout,
                estimator: self.estimator,
                hooks: self.hooks,
                jitter: self
                    .jitter
                    .unwrap_or_else(|| Arc::new(SeededJitter::random())),
                observer: self.observer,
                calls,
                arrival: ArrivalBound::new(self.accounting.arrival_floor),
                accounting: self.accounting,
                price: self.price,
                pricer: self.pricer,
            }),
        }
    }
}

/// When a successful attempt's response began, and where its budget
/// report is.
pub(crate) enum Answer<'a, T> {
    /// A one-shot answer: it arrives once generated, so it does not bound
    /// when the provider counted the request.
    OneShot(&'a (dyn Fn(&T) -> Budgets + Sync)),
    /// A stream: its headers and first chunk came before this.
    Stream(&'a (dyn Fn(&T) -> Budgets + Sync)),
}

/// A successful attempt and the lease it still holds.
pub(crate) struct Attempted<T> {
    pub(crate) value: T,
    pub(crate) lease: Lease,
}

impl<P: Provider> Supervisor<P> {
    /// A builder for calls to `provider` admitted by `controller`.
    pub fn builder(controller: AdmissionController, provider: P) -> SupervisorBuilder<P> {
        SupervisorBuilder {
            controller,
            provider,
            scope: ScopeId::FIRST,
            pool: None,
            policy: AttemptPolicy::default(),
            breaker: None,
            transport_timeout: None,
            estimator: None,
            hooks: Hooks::default(),
            jitter: None,
            observer: None,
            accounting: Accounting::default(),
            price: None,
            pricer: None,
        }
    }

    /// The admission controller.
    pub fn controller(&self) -> &AdmissionController {
        &self.inner.controller
    }

    /// The provider.
    pub fn provider(&self) -> &P {
        &self.inner.provider
    }

    /// The circuit breaker, if any.
    pub fn breaker(&self) -> Option<&CircuitBreaker> {
        self.inner.breaker.as_ref()
    }

    /// Calls owned right now (queued or active).
    pub fn active_calls(&self) -> usize {
        self.inner.calls.active()
    }

    /// Closes the controller (SPEC LC-7): queued calls end `Aborted`,
    /// active ones are cancelled and end `Aborted`; resolves once every
    /// call of this supervisor is terminal and cleaned up. Idempotent.
    ///
    /// A one-shot call is a future: its cancellation and cleanup run when
    /// it is next polled or when it is dropped. A call future kept alive
    /// but no longer polled (pinned before a `select!` that moved on, in
    /// the same task that then awaits `close`) holds its lease and keeps
    /// `close` waiting: drop call futures you stop awaiting. Streams do
    /// not need this (a stream's deadline and the close end it unpolled).
    pub async fn close(&self) {
        self.inner.controller.close().await;
        self.inner.calls.idle().await;
    }

    /// One one-shot call (SPEC LC-2): admitted, attempted and retried under
    /// one deadline.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future aborts the attempt in flight, returns every
    /// reservation and permit, and reports the call `Cancelled`.
    pub async fn invoke(
        &self,
        request: &P::Request,
        options: CallOptions,
    ) -> Result<Completed<P::Response>, CallError> {
        self.invoke_with_flow(request, options, Flow::DEFAULT).await
    }

    /// [`invoke`](Self::invoke) with every attempt admitted in `flow`
    /// (SPEC FAIR-1, FAIR-7: the tenant, class and weight it waits as).
    ///
    /// # Cancel safety
    ///
    /// As [`invoke`](Self::invoke).
    pub async fn invoke_with_flow(
        &self,
        request: &P::Request,
        options: CallOptions,
        flow: Flow,
    ) -> Result<Completed<P::Response>, CallError> {
        let mut guard =
            CallGuard::begin(&self.inner.calls, self.inner.observer.clone(), options.id);
        let span = call_span("invoke", options, self.inner.controller.clock().now());
        let result = tracing::Instrument::instrument(
            self.invoke_owned(request, options, flow, &mut guard),
            span,
        )
        .await;
        guard.finish(result.as_ref().map(|_| ()));
        result
    }

    async fn invoke_owned(
        &self,
        request: &P::Request,
        options: CallOptions,
        flow: Flow,
        guard: &mut CallGuard,
    ) -> Result<Completed<P::Response>, CallError> {
        self.claim_id(options, guard)?;
        let probe = self.open_circuit(options)?;
        let provider = &self.inner.provider;
        let attempted = self
            .attempts(
                request,
                options,
                flow,
                guard,
                probe.as_ref(),
                |ctx| provider.call(request, ctx),
                Answer::OneShot(&|reply: &Reply<P::Response>| reply.budget),
            )
            .await;
        let Attempted {
            value: reply,
            mut lease,
        } = match attempted {
            Ok(a) => a,
            Err(e) => {
                report_failure(probe, &e);
                return Err(e);
            }
        };
        let settlement = lease.reconcile(self.settled(request, reply.usage)).ok();
        self.inner.controller.clear_backoff(self.inner.scope);
        let admission = *lease.admission();
        // The response is stored; the post-hook runs before release.
        let attempt = guard.attempts;
        if let Err(e) = self
            .run_hook(self.inner.hooks.post.as_ref(), options, attempt)
            .await
        {
            drop(lease);
            report_failure(probe, &e);
            return Err(e);
        }
        drop(lease);
        if let Some(p) = probe {
            p.success();
        }
        Ok(Completed {
            response: reply.body,
            attempts: attempt,
            settlement,
            admission,
            request_id: reply.request_id,
        })
    }

    /// One streaming call (SPEC LC-3): resolves once the first chunk is
    /// ready (or the stream ended without one), so setup failures are
    /// retried like one-shot failures; after that the retry window is
    /// closed for good and every failure surfaces as a typed error item.
    pub async fn stream(
        &self,
        request: &P::Request,
        options: CallOptions,
    ) -> Result<CallStream<P>, CallError> {
        self.stream_with_flow(request, options, Flow::DEFAULT).await
    }

    /// [`stream`](Self::stream) with every attempt admitted in `flow`
    /// (SPEC FAIR-1, FAIR-7).
    pub async fn stream_with_flow(
        &self,
        request: &P::Request,
        options: CallOptions,
        flow: Flow,
    ) -> Result<CallStream<P>, CallError> {
        let mut guard =
            CallGuard::begin(&self.inner.calls, self.inner.observer.clone(), options.id);
        let probe = match self
            .claim_id(options, &mut guard)
            .and_then(|()| self.open_circuit(options))
        {
            Ok(p) => p,
            Err(e) => {
                guard.finish(Err(&e));
                return Err(e);
            }
        };
        let provider = &self.inner.provider;
        let span = call_span("stream", options, self.inner.controller.clock().now());
        let attempted = tracing::Instrument::instrument(
            self.attempts(
                request,
                options,
                flow,
                &mut guard,
                probe.as_ref(),
                |ctx| super::stream::open(provider, request, ctx),
                Answer::Stream(&|opened: &super::stream::Opened<P>| {
                    provider.stream_budget(opened.upstream())
                }),
            ),
            span,
        )
        .await;
        match attempted {
            Ok(Attempted {
                value: opened,
                lease,
            }) => Ok(CallStream::new(
                self.clone(),
                opened,
                lease,
                probe,
                guard,
                options,
                self.price_of(request),
            )),
            Err(e) => {
                report_failure(probe, &e);
                guard.finish(Err(&e));
                Err(e)
            }
        }
    }

    /// What an attempt of `request` that reported `usage` settles: priced
    /// at its model's price; a provider that does not settle keeps its
    /// admission charge (Q-16), the bill still being what was used
    /// (BUD-2).
    fn settled(&self, request: &P::Request, usage: Usage) -> Usage {
        let usage = match self.price_of(request) {
            Some(price) => usage.priced(&price),
            None => usage,
        };
        if self.inner.accounting.reconciles {
            usage
        } else {
            Usage::UNKNOWN.with_cost(usage.cost())
        }
    }

    /// The price of `request`'s model, if known.
    pub(crate) fn price_of(&self, request: &P::Request) -> Option<Price> {
        match &self.inner.pricer {
            Some(pricer) => pricer(request).or(self.inner.price),
            None => self.inner.price,
        }
    }

    /// Holds the call's id until it is terminal (SPEC ADM-6); its attempts
    /// are admitted without one.
    fn claim_id(&self, options: CallOptions, guard: &mut CallGuard) -> Result<(), CallError> {
        if let Some(id) = options.id {
            guard.claim = Some(self.inner.controller.claim(id)?);
        }
        Ok(())
    }

    fn open_circuit(&self, options: CallOptions) -> Result<Option<Probe>, CallError> {
        let now = self.inner.controller.clock().now();
        options.deadline.check(now, Phase::Queue)?;
        match &self.inner.breaker {
            None => Ok(None),
            Some(b) => Ok(Some(b.try_acquire()?)),
        }
    }

    fn attempt_call(&self, request: &P::Request, flow: Flow) -> Result<Call, CallError> {
        // The id is claimed for the whole call (see `claim_id`).
        let mut call = Call::new(self.inner.scope).with_flow(flow);
        call.pool = self.inner.pool;
        call.price = self.price_of(request).map(|p| p.reserve_price());
        if let Some(estimator) = &self.inner.estimator {
            let estimate = estimator
                .estimate(request)
                .and_then(validate)
                .map_err(crate::AdmissionError::from)?;
            call.estimate = Some(estimate);
        }
        Ok(call)
    }

    /// Admission, pre-hook and attempts with retries, until one attempt
    /// succeeds (its lease still held) or the call gives up.
    ///
    /// Every started attempt is counted where the provider counts it
    /// (SPEC Q-15), its budget reports reach the controller (Q-14), and a
    /// refusal costs what the provider charges for it (Q-16); see
    /// `accounting.rs`.
    #[allow(clippy::too_many_arguments)]
    async fn attempts<T, Fut>(
        &self,
        request: &P::Request,
        options: CallOptions,
        flow: Flow,
        guard: &mut CallGuard,
        probe: Option<&Probe>,
        mut attempt: impl FnMut(AttemptContext) -> Fut,
        answer: Answer<'_, T>,
    ) -> Result<Attempted<T>, CallError>
    where
        Fut: Future<Output = Result<T, ProviderError>>,
    {
        let inner = &*self.inner;
        let deadline = options.deadline;
        let clock = inner.controller.clock().clone();
        // A cut attempt's lease goes to the provider, which returns its
        // permit once the attempt's work has ended (POOL-1, ADM-7).
        let cut = |lease: Lease| inner.provider.cut(request, lease);
        loop {
            guard.attempts += 1;
            let n = guard.attempts;
            // A fresh estimate and a fresh reservation per attempt (Q-8).
            let call = self.attempt_call(request, flow)?;
            let lease = self
                .closable(inner.controller.acquire(&call, deadline))
                .await??;
            let hooked = self.run_hook(inner.hooks.pre.as_ref(), options, n).await;
            let now = clock.now();
            // The circuit may have opened while this call waited for its
            // quota, or in the delay before this retry (CB-3).
            let circuit = probe.map_or(Ok(()), Probe::check);
            if hooked.is_err() || circuit.is_err() || deadline.is_expired(now) {
                // The pre-hook failed, the circuit opened, or the deadline
                // passed since the admission's own check (a permit or grant
                // collected late never becomes a lease), during the
                // pre-hook or between two clock reads: nothing is sent, and
                // nothing is counted (SPEC LC-2, CB-3, DL-5, Q-9).
                let mut lease = lease;
                let phase = if inner.hooks.pre.is_some() {
                    // Admitted in time: the time ran out in the hook.
                    Phase::Hook
                } else if lease.pool().is_some() {
                    Phase::Concurrency
                } else {
                    Phase::Rate
                };
                let _ = lease.refused(RefusalCost::Free);
                hooked?;
                circuit?;
                return Err(CallError::Deadline {
                    phase,
                    retry_at: None,
                });
            }
            // From here the request may reach the provider: however this
            // attempt ends, it is counted where the provider counts it.
            let counted = CountedLease::new(lease, now, &inner.arrival, &cut);
            let timeout = deadline.cap(inner.transport_timeout, now);
            let ctx = AttemptContext {
                call_id: options.id,
                attempt: n,
                deadline,
                timeout,
            };
            let span = tracing::debug_span!(
                "attempt",
                call = ?options.id,
                attempt = n,
                timeout_ms = timeout.map(|t| t.as_millis() as u64)
            );
            let work = tracing::Instrument::instrument(attempt(ctx), span);
            // Whether the attempt timeout cut it (its future dropped).
            let mut timed_out = false;
            let result = match timeout.and_then(|t| now.checked_add(t)) {
                None => self.closable(work).await?,
                Some(end) => match self.closable(tokio::time::timeout_at(end, work)).await? {
                    Ok(r) => r,
                    Err(_) if deadline.is_expired(clock.now()) => {
                        return Err(CallError::Deadline {
                            phase: Phase::Transport,
                            retry_at: None,
                        });
                    }
                    Err(_) => {
                        timed_out = true;
                        Err(ProviderError::new(ErrorKind::Timeout, "attempt timed out"))
                    }
                },
            };
            let end = clock.now();
            let error = match result {
                Ok(value) => {
                    let (mut lease, budget) = match answer {
                        Answer::OneShot(budget) => (counted.ended(end), budget(&value)),
                        Answer::Stream(budget) => (counted.response_began(end), budget(&value)),
                    };
                    self.observe_budget(&budget, &mut lease, end);
                    inner.controller.provider_answered(inner.scope);
                    return Ok(Attempted { value, lease });
                }
                // The provider enforces the same `min(cap, remaining)` and
                // its timer can fire first: a timeout at the call's deadline
                // is the deadline (DL-6), not a retryable attempt timeout.
                Err(e) if e.kind == ErrorKind::Timeout && deadline.is_expired(clock.now()) => {
                    // The attempt answered: it ended, nothing of it is cut
                    // (its lease goes back here, not through `cut`).
                    drop(counted.ended(end));
                    return Err(CallError::Deadline {
                        phase: Phase::Transport,
                        retry_at: None,
                    });
                }
                Err(e) => e,
            };
            let mut lease = match (error.kind, error.status) {
                _ if error.unsent => counted.unsent(),
                (ErrorKind::RateLimited, _) => counted.refused(end),
                (_, Some(_)) => counted.response_began(end),
                _ => counted.ended(end),
            };
            // Settle what the failed attempt used first: a request that
            // never left costs nothing (Q-9), a 429 costs what the provider
            // charges for it (Q-16), and the provider's remaining budget in
            // the answer already excludes what it did not charge, so it is
            // compared after the settlement (Q-14).
            if error.unsent {
                let _ = lease.refused(RefusalCost::Free);
            } else if error.kind == ErrorKind::RateLimited {
                let _ = lease.refused(inner.accounting.refusal_cost);
            } else {
                let _ = lease.reconcile(self.settled(request, error.usage));
            }
            if let Some(budget) = &error.budget {
                self.observe_budget(budget, &mut lease, end);
            }
            if error.status.is_some() {
                inner.controller.provider_answered(inner.scope);
            }
            // A 429 pauses the scope (CD-1).
            if error.kind == ErrorKind::RateLimited {
                lease.rate_limited(error.retry_after);
            }
            // The attempt's permit is never held during backoff (POOL-1);
            // a cut attempt's goes back once its work has ended.
            if timed_out {
                cut(lease);
            } else {
                drop(lease);
            }
            let now = clock.now();
            let decision = inner.policy.decide(
                n,
                &error,
                options.idempotent,
                now,
                deadline,
                inner.jitter.sample(),
            );
            tracing::debug!(
                call = ?options.id,
                attempt = n,
                class = error.kind.as_str(),
                remaining_ms = deadline.remaining(now).map(|r| r.as_millis() as u64),
                ?decision,
                "attempt failed"
            );
            match decision {
                Decision::GiveUp(gave_up) => {
                    return Err(CallError::Provider {
                        error,
                        attempts: n,
                        gave_up,
                    });
                }
                Decision::Retry(delay) => match now.checked_add(delay) {
                    Some(wake) => self.sleep_until(wake, deadline).await?,
                    // A delay past the clock's range is never over (RT-4).
                    None => {
                        return Err(CallError::Provider {
                            error,
                            attempts: n,
                            gave_up: GiveUp::WaitTooLong,
                        });
                    }
                },
            }
        }
    }

    /// Hands a response's budget reports to the controller (SPEC Q-14).
    /// The answer is to `lease`'s attempt, already recounted (Q-15).
    fn observe_budget(&self, budget: &Budgets, lease: &mut Lease, at: Instant) {
        if budget.is_empty() {
            return;
        }
        let observed = lease.observe(budget.iter(), at);
        if observed.gap > 0 || observed.freed > 0 || observed.adopted.is_some() {
            tracing::debug!(
                gap = observed.gap,
                freed = observed.freed,
                adopted = observed.adopted,
                "provider budget observed"
            );
        }
    }

    /// Sleeps between attempts; a sleep never extends past the deadline
    /// (SPEC RT-6).
    async fn sleep_until(&self, wake: Instant, deadline: Deadline) -> Result<(), CallError> {
        let until = deadline.instant().map_or(wake, |d| d.min(wake));
        self.closable(tokio::time::sleep_until(until)).await?;
        let now = self.inner.controller.clock().now();
        deadline.check(now, Phase::RetryDelay)?;
        Ok(())
    }

    /// Runs a hook under `min(hook cap, remaining)` (SPEC DL-4).
    pub(crate) async fn run_hook(
        &self,
        hook: Option<&Hook>,
        options: CallOptions,
        attempt: u32,
    ) -> Result<(), CallError> {
        let Some(hook) = hook else {
            return Ok(());
        };
        let now = self.inner.controller.clock().now();
        options.deadline.check(now, Phase::Hook)?;
        let work = hook(HookContext {
            call_id: options.id,
            attempt,
        });
        let result = match options.deadline.cap(self.inner.hooks.timeout, now) {
            None => self.closable(work).await?,
            Some(cap) => match self.closable(tokio::time::timeout(cap, work)).await? {
                Ok(r) => r,
                // The call's deadline (DL-4) ...
                Err(_)
                    if options
                        .deadline
                        .is_expired(self.inner.controller.clock().now()) =>
                {
                    return Err(CallError::Deadline {
                        phase: Phase::Hook,
                        retry_at: None,
                    });
                }
                // ... or the hook's own cap: the hook failed (LC-2).
                Err(_) => {
                    return Err(CallError::Hook {
                        message: format!("the hook ran past its cap of {cap:?}"),
                    });
                }
            },
        };
        result.map_err(|e| CallError::Hook { message: e.0 })
    }

    /// Runs `work` unless the supervisor closes first (SPEC LC-7). A result
    /// that is ready wins over a close observed at the same time (LC-6).
    pub(crate) async fn closable<F: Future>(&self, work: F) -> Result<F::Output, CallError> {
        let shutdown = &self.inner.calls.shutdown;
        tokio::select! {
            biased;
            out = work => Ok(out),
            () = shutdown.cancelled() => Err(CallError::Closed),
        }
    }
}

/// The span of one call (SPEC RT-7, OBS-3): its id, shape, idempotency
/// and remaining budget; never payloads, prompts or keys.
fn call_span(
    shape: &'static str,
    options: CallOptions,
    now: crate::clock::Instant,
) -> tracing::Span {
    tracing::debug_span!(
        "call",
        shape,
        call = ?options.id,
        idempotent = options.idempotent,
        budget_ms = options.deadline.remaining(now).map(|r| r.as_millis() as u64)
    )
}

/// Tells the breaker how a call that did not complete ended (SPEC CB-2,
/// GW-16): only a failure the provider caused counts, i.e. a provider error
/// that says the upstream is unhealthy (including an attempt that ran past
/// the supervisor's own transport timeout, reported as a provider
/// `Timeout`). Everything else is neutral: a deadline the caller chose
/// (in any phase, transport and stream included), a close, an admission
/// rejection, a hook failure, a 429 or a 4xx.
pub(crate) fn report_failure(probe: Option<Probe>, error: &CallError) {
    let Some(probe) = probe else {
        return;
    };
    match error {
        CallError::Provider { error, .. } if error.kind.is_upstream_failure() => probe.failure(),
        // A stream that fails mid-way is a failure (CB-4), also when the
        // provider declares the error or breaks the protocol.
        CallError::Stream { error }
            if error.kind.is_upstream_failure()
                || matches!(error.kind, ErrorKind::Declared | ErrorKind::Protocol) =>
        {
            probe.failure()
        }
        _ => probe.neutral(),
    }
}

/// Usage a stream saw, for settlement at its end.
pub(crate) fn settle_stream(lease: &mut Lease, usage: Option<Usage>) {
    let _ = lease.reconcile(usage.unwrap_or(Usage::UNKNOWN));
}

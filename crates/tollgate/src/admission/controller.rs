//! The admission controller (SPEC §3): quota, FIFO, concurrency, deadlines.

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use parking_lot::Mutex;
use tokio_util::sync::CancellationToken;

use super::acquire::{Acquire, Admitted, SlowAcquire};
use super::claim::CallClaim;
use super::lease::{Admission, Lease};
use super::permits::Permits;
use super::pools::{PoolEntry, PoolSet};
use super::scope::{Grant, Outcome, PermitSlot, Scope, Waiter};
use super::snapshot::{PoolSnapshot, ScopeSnapshot, Snapshot};
use crate::call::{Call, CallId, PoolId, ScopeId};
use crate::clock::{Instant, SharedClock, TokioClock};
use crate::config::{ConfigError, ControllerConfig, CooldownConfig, Overflow, ScopeConfig};
use crate::deadline::{Deadline, Phase, far_future};
use crate::error::AdmissionError;
use crate::quota::{
    BudgetReport, Demand, Dimension, Hold, LocalBackend, Observed, Reservation, SharedBackend,
};
use crate::usage::{Settlement, Usage};

/// Admits calls: bounded FIFO per quota scope, atomic request and token
/// reservation, a concurrency limit, one deadline (SPEC ADM-1).
///
/// Cloning is cheap and shares the controller.
///
/// ```
/// use std::time::Duration;
/// use tollgate::config::{ScopeConfig, MINUTE};
/// use tollgate::{AdmissionController, Call, Deadline, ScopeId, TokenEstimate, Usage};
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let controller = AdmissionController::builder()
///     .scope(ScopeConfig::new("openai").requests(500, MINUTE).tokens(200_000, MINUTE))
///     .concurrency(32)
///     .queue_capacity(1_000)
///     .build()?;
/// let call = Call::new(ScopeId::FIRST).with_estimate(TokenEstimate::new(1_200, 400));
/// let deadline = Deadline::from_timeout(Some(Duration::from_secs(30)), tokio::time::Instant::now());
/// let mut lease = controller.acquire(&call, deadline).await?;
/// // ... call the provider ...
/// lease.reconcile(Usage::from_io(1_200, 150))?;
/// drop(lease);
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct AdmissionController {
    inner: Arc<Inner>,
}

#[derive(Debug)]
pub(crate) struct Inner {
    pub(crate) clock: SharedClock,
    pub(crate) scopes: Box<[Scope]>,
    pub(crate) pools: Arc<PoolSet>,
    queue_capacity: usize,
    overflow: Overflow,
    max_wait: Option<Duration>,
    cooldown: CooldownConfig,
    closed: AtomicBool,
    pub(crate) shutdown: CancellationToken,
    ids: Mutex<HashSet<CallId>>,
    backend: &'static str,
}

/// Builds an [`AdmissionController`]; see [`ControllerConfig`] for defaults.
#[derive(Debug, Default)]
#[must_use]
pub struct ControllerBuilder {
    config: ControllerConfig,
    clock: Option<SharedClock>,
    backend: Option<SharedBackend>,
}

impl ControllerBuilder {
    /// Adds a quota scope; scopes get ordinals in the order they are added.
    pub fn scope(mut self, scope: ScopeConfig) -> Self {
        self.config.scopes.push(scope);
        self
    }

    /// Waiting calls per scope (default 1024).
    pub fn queue_capacity(mut self, capacity: usize) -> Self {
        self.config.queue_capacity = capacity;
        self
    }

    /// Full-queue policy (default [`Overflow::Wait`]).
    pub fn overflow(mut self, overflow: Overflow) -> Self {
        self.config.overflow = overflow;
        self
    }

    /// At most `limit` active calls (default unlimited).
    pub fn concurrency(mut self, limit: u64) -> Self {
        self.config.concurrency = Some(limit);
        self
    }

    /// Adds a named concurrency pool (ordinals in the order added, after
    /// the default pool).
    pub fn pool(mut self, pool: crate::config::PoolConfig) -> Self {
        self.config.pools.push(pool);
        self
    }

    /// Fail early with `QuotaWaitTooLong` when quota is further away.
    pub fn max_wait(mut self, max_wait: Duration) -> Self {
        self.config.max_wait = Some(max_wait);
        self
    }

    /// Replaces the whole configuration.
    pub fn config(mut self, config: ControllerConfig) -> Self {
        self.config = config;
        self
    }

    /// Reads time from `clock` (default: tokio's clock).
    pub fn clock(mut self, clock: SharedClock) -> Self {
        self.clock = Some(clock);
        self
    }

    /// Keeps quota in `backend` (default: in-process).
    pub fn backend(mut self, backend: SharedBackend) -> Self {
        self.backend = Some(backend);
        self
    }

    /// Validates the configuration (SPEC CFG-1..3) and builds the controller.
    pub fn build(self) -> Result<AdmissionController, ConfigError> {
        let ControllerBuilder {
            mut config,
            clock,
            backend,
        } = self;
        config.validate()?;
        if config.scopes.is_empty() {
            config.scopes.push(ScopeConfig::new("default"));
        }
        let clock = clock.unwrap_or_else(|| Arc::new(TokioClock));
        let backend = backend.unwrap_or_else(|| Arc::new(LocalBackend));
        let now = clock.now();
        let pools = Arc::new(build_pools(&config));
        let scopes = config
            .scopes
            .iter()
            .enumerate()
            .map(|(i, s)| {
                let id = ScopeId(u32::try_from(i).unwrap_or(u32::MAX));
                let capacity = s.queue_capacity.unwrap_or(config.queue_capacity);
                Scope::new(id, s, capacity, backend.open(s, now), pools.clone())
            })
            .collect();
        Ok(AdmissionController {
            inner: Arc::new(Inner {
                clock,
                scopes,
                pools,
                queue_capacity: config.queue_capacity,
                overflow: config.overflow,
                max_wait: config.max_wait,
                cooldown: config.cooldown,
                closed: AtomicBool::new(false),
                shutdown: CancellationToken::new(),
                ids: Mutex::new(HashSet::new()),
                backend: backend.name(),
            }),
        })
    }
}

fn build_pools(config: &ControllerConfig) -> PoolSet {
    let permits = |limit: u64, waiting: Option<usize>| {
        let limit = usize::try_from(limit).unwrap_or(usize::MAX);
        Arc::new(Permits::bounded(limit, waiting.unwrap_or(usize::MAX)))
    };
    let mut pools = Vec::new();
    let mut default = None;
    if let Some(limit) = config.concurrency {
        default = Some(0);
        pools.push(PoolEntry {
            name: Arc::from("default"),
            permits: permits(limit, None),
            max_wait: None,
        });
    }
    for p in &config.pools {
        pools.push(PoolEntry {
            name: Arc::from(p.name.as_str()),
            permits: permits(p.limit, p.max_waiting),
            max_wait: p.max_wait,
        });
    }
    PoolSet::new(pools.into_boxed_slice(), default)
}

/// What a reported 429 did to its scope's cooldown.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CooldownOutcome {
    /// A new cooldown started (generation bumped).
    Started {
        /// The new generation.
        generation: u64,
        /// When it ends.
        until: Instant,
    },
    /// A running cooldown already lasts at least as long.
    Running {
        /// When it ends.
        until: Instant,
    },
    /// The attempt started before the running cooldown: ignored (CD-2).
    Stale,
}

impl CooldownOutcome {
    /// When the scope's cooldown ends, if one runs.
    pub fn until(&self) -> Option<Instant> {
        match self {
            CooldownOutcome::Started { until, .. } | CooldownOutcome::Running { until } => {
                Some(*until)
            }
            CooldownOutcome::Stale => None,
        }
    }
}

/// How an arrival entered its scope.
pub(crate) enum Entered {
    /// Reserved and permitted in one step: the fast path.
    Leased(Grant),
    /// Reserved; queued for a concurrency permit.
    Granted(Grant, PermitSlot),
    /// Linked into the queue under this key.
    Queued(usize),
}

impl AdmissionController {
    /// A builder with the defaults of [`ControllerConfig`].
    pub fn builder() -> ControllerBuilder {
        ControllerBuilder::default()
    }

    /// A controller for `config` on tokio's clock and the in-process store.
    pub fn new(config: ControllerConfig) -> Result<Self, ConfigError> {
        Self::builder().config(config).build()
    }

    /// The ordinal of the scope called `name`.
    pub fn scope_id(&self, name: &str) -> Option<ScopeId> {
        self.inner
            .scopes
            .iter()
            .find(|s| &*s.name == name)
            .map(|s| s.id)
    }

    /// The controller's clock.
    pub fn clock(&self) -> &SharedClock {
        &self.inner.clock
    }

    /// The ordinal of the pool called `name`.
    pub fn pool_id(&self, name: &str) -> Option<PoolId> {
        let pools = &self.inner.pools.pools;
        pools
            .iter()
            .position(|p| &*p.name == name)
            .and_then(|i| u32::try_from(i).ok())
            .map(PoolId)
    }

    /// Whether `call`'s scope needs a token estimate.
    pub fn needs_estimate(&self, scope: ScopeId) -> bool {
        self.inner
            .scopes
            .get(scope.index())
            .is_some_and(|s| s.needs_estimate)
    }

    /// Admits one attempt of `call` before `deadline` (SPEC ADM-1):
    /// validate → bounded FIFO enqueue → cooldown → atomic request and token
    /// reservation at the head of the queue → concurrency permit → final
    /// cooldown check → lease.
    ///
    /// No concurrency permit is held while waiting for quota (ADM-2). A call
    /// whose earliest admission lies after its deadline, or further away
    /// than `max_wait`, fails at once with the instant as a hint (Q-11).
    ///
    /// # Cancel safety
    ///
    /// Dropping the returned [`Acquire`] future at any point leaves nothing
    /// behind: its queue entry is removed (the next call becomes head if it
    /// was the head), a reservation it had been granted is refunded in full
    /// exactly once (Q-9), and no permit is held.
    pub fn acquire(&self, call: &Call, deadline: Deadline) -> Acquire<'_> {
        Acquire::new(self, *call, deadline)
    }

    /// The first step of an admission: validation and the fast path. When
    /// the call must wait, its waiting state is written to `slow` (in place:
    /// the fast path moves nothing large) and `None` is returned.
    #[inline]
    pub(crate) fn start<'a>(
        &'a self,
        call: &Call,
        deadline: Deadline,
        slow: &mut Option<SlowAcquire<'a>>,
    ) -> Option<Result<Lease, AdmissionError>> {
        match self.try_start(call, deadline, slow) {
            Ok(lease) => lease.map(Ok),
            Err(e) => Some(Err(e)),
        }
    }

    #[inline]
    fn try_start<'a>(
        &'a self,
        call: &Call,
        deadline: Deadline,
        slow: &mut Option<SlowAcquire<'a>>,
    ) -> Result<Option<Lease>, AdmissionError> {
        let inner = &*self.inner;
        let scope = inner
            .scopes
            .get(call.scope.index())
            .ok_or(AdmissionError::UnknownScope(call.scope))?;
        if inner.closed.load(Ordering::Acquire) {
            return Err(AdmissionError::Closed);
        }
        let demand = match call.estimate {
            Some(e) => Demand::new(e.total()),
            None if scope.needs_estimate => {
                return Err(AdmissionError::TokenEstimateRequired { scope: scope.id });
            }
            None => Demand::new(0),
        };
        let pool = inner.pools.resolve(call.pool)?;
        let arrived = inner.clock.now();
        deadline.check(arrived, Phase::Queue)?;
        let mut id = IdGuard::register(inner, call.id)?;
        let mut ticket = 0;
        let entered = inner.enter(scope, &demand, pool, deadline, arrived, &mut ticket)?;
        if let Entered::Leased(grant) = entered {
            // The fast path: no queue, no wait, no timer.
            let admission = Admission {
                ticket,
                ..Admission::default()
            };
            return Ok(Some(inner.lease(
                self,
                scope,
                grant,
                pool,
                admission,
                id.disarm(),
            )));
        }
        let admission = Admission {
            ticket,
            ..Admission::default()
        };
        *slow = Some(SlowAcquire::new(
            inner,
            scope,
            demand,
            pool,
            deadline,
            arrived,
            entered,
            id.disarm(),
            admission,
        ));
        Ok(None)
    }

    /// Holds `id` for a whole call, across its attempts and backoff delays
    /// (SPEC ADM-6): until the returned claim is dropped, admitting or
    /// claiming the same id fails with [`AdmissionError::Conflict`]. The
    /// call's attempts are then admitted without an id.
    pub fn claim(&self, id: CallId) -> Result<CallClaim, AdmissionError> {
        IdGuard::insert(&self.inner, id)?;
        Ok(CallClaim {
            inner: Arc::clone(&self.inner),
            id,
        })
    }

    /// Turns a finished wait into a lease.
    pub(crate) fn admit(&self, slow: &SlowAcquire<'_>, admitted: Admitted) -> Lease {
        self.inner.lease(
            self,
            slow.scope(),
            admitted.grant,
            slow.pool(),
            admitted.admission,
            admitted.id,
        )
    }

    /// Reports a provider 429 to `scope`, seen by an attempt that started
    /// under cooldown `generation` ([`Lease::generation`]), with the
    /// server's hint if any (SPEC CD-1, CD-2).
    ///
    /// A 429 from an attempt older than the running cooldown is stale: it
    /// neither starts nor extends one. Otherwise a cooldown of the hinted
    /// length (capped by the configuration), or of a short exponential
    /// backoff from 1 s without a hint, pauses the whole scope: waiting
    /// calls start no provider work until it ends, and calls granted but
    /// not yet started are preempted (CD-3).
    pub fn rate_limited(
        &self,
        scope: ScopeId,
        generation: u64,
        hint: Option<Duration>,
    ) -> CooldownOutcome {
        self.inner.rate_limited(scope, generation, hint)
    }

    /// Takes in what a provider's response, begun at `at`, said about its
    /// budget for `scope` (SPEC Q-14): a limit the configuration left out
    /// follows the advertised amount (see
    /// [`ScopeConfig::learn_limits`](crate::config::ScopeConfig::learn_limits)),
    /// and when the provider has less left than tollgate's own view at
    /// `at` (another client of the account, another accounting), the
    /// difference is counted in the scope's window until the provider's
    /// reset, so later admissions wait instead of drawing 429s. A report
    /// never raises availability above tollgate's own accounting.
    pub fn observe(&self, scope: ScopeId, report: &BudgetReport, at: Instant) -> Observed {
        self.inner.observe(scope, report, at)
    }

    /// The provider answered an attempt of `scope` (a response began),
    /// after its budget reports went to [`observe`](Self::observe): a scope
    /// still learning its limits drops the stand-in for a limit the
    /// provider did not advertise (SPEC Q-14). Cheap once learned.
    pub fn provider_answered(&self, scope: ScopeId) {
        let Some(scope) = self.inner.scopes.get(scope.index()) else {
            return;
        };
        if !scope.learning.swap(false, Ordering::AcqRel) {
            return;
        }
        let now = self.inner.clock.now();
        let mut st = scope.state.lock();
        if st.store.answered() {
            st.invalidate_projection();
            if !st.queue.is_empty() {
                st.drain(now);
            }
        }
    }

    /// An attempt of `scope` succeeded: the next hintless 429 starts again
    /// from the base cooldown.
    pub fn clear_backoff(&self, scope: ScopeId) {
        if let Some(scope) = self.inner.scopes.get(scope.index()) {
            scope.state.lock().cooldown.strikes = 0;
        }
    }

    /// Starts a cooldown of `scope` lasting `duration` unless one already
    /// runs longer, whatever the generation (an operator's pause).
    pub fn start_cooldown(&self, scope: ScopeId, duration: Duration) -> Option<u64> {
        let inner = &*self.inner;
        let scope = inner.scopes.get(scope.index())?;
        let now = inner.clock.now();
        let mut st = scope.state.lock();
        let until = now.checked_add(duration).unwrap_or_else(|| far_future(now));
        if st.cooldown.active(now).is_some_and(|u| u >= until) {
            return Some(st.cooldown.generation);
        }
        st.cooldown.until = Some(until);
        st.cooldown.generation += 1;
        let generation = st.cooldown.generation;
        st.mark_cooldown();
        st.drain(now);
        Some(generation)
    }

    /// The scope's cooldown generation and the end of the running cooldown.
    pub fn cooldown(&self, scope: ScopeId) -> Option<(u64, Option<Instant>)> {
        let inner = &*self.inner;
        let scope = inner.scopes.get(scope.index())?;
        let now = inner.clock.now();
        let st = scope.state.lock();
        Some((st.cooldown.generation, st.cooldown.active(now)))
    }

    /// Stops admitting without touching active calls (the first step of a
    /// graceful shutdown, SPEC GW-8): new acquisitions fail with `Closed`
    /// and every queued call, or call waiting for a permit, is woken with
    /// `Closed`. Leases already held keep running. Idempotent.
    pub fn stop_admitting(&self) {
        let inner = &*self.inner;
        if inner.closed.swap(true, Ordering::AcqRel) {
            return;
        }
        for scope in inner.scopes.iter() {
            let mut st = scope.state.lock();
            st.closed = true;
            for key in st.queue.keys() {
                st.queue.unlink(key);
                if let Some(w) = st.queue.get_mut(key) {
                    w.outcome = Outcome::Closed;
                    w.wake();
                }
            }
            st.ready_at = None;
            st.invalidate_projection();
        }
        inner.pools.close();
    }

    /// Closes admission (SPEC LC-7): new acquisitions fail with `Closed`,
    /// queued ones are woken with `Closed`, holders of leases are told
    /// through [`Lease::closing`] (supervised calls are cancelled), and this
    /// resolves once every lease is dropped. Idempotent; immediate when
    /// nothing is active.
    pub async fn close(&self) {
        let inner = &*self.inner;
        self.stop_admitting();
        inner.shutdown.cancel();
        self.idle().await;
    }

    /// Resolves once no lease is held.
    ///
    /// Every way capacity comes back wakes it (a lease released, a grant
    /// given back uncollected, a preempted or refused attempt), so it
    /// resolves as soon as the last one is returned, whether or not the
    /// controller is closed.
    pub async fn idle(&self) {
        self.inner.pools.idle().await;
    }

    /// A token cancelled when the controller closes (for supervisors that
    /// must stop their active calls, SPEC LC-7).
    pub(crate) fn closing_token(&self) -> CancellationToken {
        self.inner.shutdown.child_token()
    }

    /// Whether [`close`](Self::close) was called.
    pub fn is_closed(&self) -> bool {
        self.inner.closed.load(Ordering::Acquire)
    }

    /// A redacted view of the controller (SPEC OBS-1): counts and
    /// availability only, never payloads or identities of callers.
    pub fn snapshot(&self) -> Snapshot {
        let inner = &*self.inner;
        let now = inner.clock.now();
        let scopes = inner
            .scopes
            .iter()
            .map(|scope| {
                let mut st = scope.state.lock();
                let mut limits = Vec::new();
                st.store.snapshot(now, &mut limits);
                ScopeSnapshot {
                    id: scope.id,
                    name: scope.name.to_string(),
                    queued: st.queued(scope.capacity),
                    waiting_for_slot: st.queue.len().saturating_sub(scope.capacity),
                    queue_capacity: scope.capacity,
                    pending: st.pending,
                    limits,
                    cooldown_generation: st.cooldown.generation,
                    cooldown_remaining: st.cooldown.active(now).map(|u| u - now),
                    counters: st.counters,
                }
            })
            .collect();
        Snapshot {
            closed: inner.closed.load(Ordering::Acquire),
            active: inner.active(),
            concurrency_limit: inner
                .pools
                .get(inner.pools.default)
                .map(|p| p.permits.limit() as u64),
            concurrency_available: inner
                .pools
                .get(inner.pools.default)
                .map(|p| p.permits.available()),
            pools: inner
                .pools
                .pools
                .iter()
                .enumerate()
                .map(|(i, p)| PoolSnapshot {
                    id: PoolId(u32::try_from(i).unwrap_or(u32::MAX)),
                    name: p.name.to_string(),
                    limit: p.permits.limit(),
                    available: p.permits.available(),
                    waiting: p.permits.waiting(),
                })
                .collect(),
            queue_capacity: inner.queue_capacity,
            overflow: inner.overflow,
            backend: inner.backend,
            scopes,
        }
    }
}

impl Inner {
    /// Checks a wait against the deadline and `max_wait` (SPEC Q-11).
    pub(crate) fn verdict(
        &self,
        at: Instant,
        now: Instant,
        deadline: Deadline,
        cooling: Option<Instant>,
    ) -> Result<(), AdmissionError> {
        if deadline.instant().is_some_and(|d| d <= at) {
            let phase = match cooling {
                Some(u) if deadline.instant().is_some_and(|d| d <= u) => Phase::Cooldown,
                _ => Phase::Rate,
            };
            return Err(AdmissionError::DeadlineExceeded {
                phase,
                retry_at: Some(at),
            });
        }
        if let Some(max_wait) = self.max_wait {
            let wait = at.saturating_duration_since(now);
            if wait > max_wait {
                return Err(AdmissionError::QuotaWaitTooLong {
                    ready_at: at,
                    wait,
                    max_wait,
                });
            }
        }
        Ok(())
    }

    /// Validates the demand and either reserves at once (empty queue) or
    /// links the call at the tail of its scope's queue.
    pub(crate) fn enter(
        &self,
        scope: &Scope,
        demand: &Demand,
        pool: Option<u32>,
        deadline: Deadline,
        now: Instant,
        ticket: &mut u64,
    ) -> Result<Entered, AdmissionError> {
        let mut guard = scope.state.lock();
        let st = &mut *guard;
        if st.closed {
            return Err(AdmissionError::Closed);
        }
        // A demand that can never fit fails now, on every path, whatever
        // the algorithm's state (SPEC Q-3).
        st.store.check(demand)?;
        *ticket = st.tickets;
        st.tickets += 1;
        let cooling = st.cooldown.active(now);
        if st.queue.is_empty() && cooling.is_none() {
            let permit = self.pools.try_acquire(pool)?;
            let hold = if permit { Hold::Leased } else { Hold::Pending };
            let reserved = st.store.try_reserve(demand, now, hold);
            match reserved {
                Some(tick) => {
                    let reservation = Reservation {
                        stamp: now,
                        tick,
                        demand: *demand,
                        hold,
                    };
                    let mut grant = Grant {
                        reservation,
                        generation: st.cooldown.generation,
                        order: st.grants,
                    };
                    st.grants += 1;
                    if permit {
                        st.counters.admitted += 1;
                        st.counters.tokens_reserved += demand.tokens;
                        return Ok(Entered::Leased(grant));
                    }
                    // Take a place in the permit queue under the scope lock,
                    // so permits follow the order of reservations (ADM-4).
                    match self.pools.register(pool) {
                        Ok(Some(key)) => {
                            st.pending += 1;
                            return Ok(Entered::Granted(grant, PermitSlot::queued(key)));
                        }
                        Err(e) => {
                            st.store.refund(&grant.reservation, now);
                            return Err(e);
                        }
                        // A permit freed up meanwhile: start now.
                        Ok(None) => {
                            st.store.lease(&mut grant.reservation, now);
                            st.counters.admitted += 1;
                            st.counters.tokens_reserved += demand.tokens;
                            return Ok(Entered::Leased(grant));
                        }
                    }
                }
                None => {
                    if permit {
                        self.pools.release(pool);
                    }
                    let not_until = st.store.not_until(demand, now);
                    if let Some(at) = not_until.at {
                        self.verdict(at, now, deadline, None)?;
                    }
                    let mut waiter = Waiter::new(*demand, pool);
                    waiter.limited_by = not_until.limited_by;
                    let key = st
                        .queue
                        .push_back(waiter)
                        .map_err(|_| AdmissionError::QueueFull { scope: scope.id })?;
                    st.ready_at = not_until.at;
                    return Ok(Entered::Queued(key));
                }
            }
        }
        if self.overflow == Overflow::Reject && st.queue.len() >= scope.capacity {
            return Err(AdmissionError::QueueFull { scope: scope.id });
        }
        if (deadline.instant().is_some() || self.max_wait.is_some())
            && let Some(at) = st.project(demand, now)
            && let Err(e) = self.verdict(at, now, deadline, cooling)
        {
            // The projection committed this demand; it is not queued.
            st.invalidate_projection();
            return Err(e);
        }
        let mut waiter = Waiter::new(*demand, pool);
        waiter.waited_for_cooldown = cooling.is_some();
        let key = st
            .queue
            .push_back(waiter)
            .map_err(|_| AdmissionError::QueueFull { scope: scope.id })?;
        if st.queue.front() == Some(key) {
            st.drain(now);
        }
        Ok(Entered::Queued(key))
    }

    /// The final start check (SPEC CD-3) and the lease of the reservation.
    /// `Ok(None)`: preempted by a cooldown, the reservation refunded.
    pub(crate) fn finish(
        &self,
        scope: &Scope,
        mut grant: Grant,
        pool: Option<u32>,
        now: Instant,
    ) -> Result<Option<Grant>, AdmissionError> {
        let mut guard = scope.state.lock();
        let st = &mut *guard;
        if st.closed {
            st.refund_pending(&grant, now);
            drop(guard);
            self.pools.release(pool);
            return Err(AdmissionError::Closed);
        }
        if st.cooldown.generation != grant.generation && st.cooldown.active(now).is_some() {
            st.refund_pending(&grant, now);
            st.counters.preempted += 1;
            drop(guard);
            self.pools.release(pool);
            return Ok(None);
        }
        st.store.lease(&mut grant.reservation, now);
        grant.generation = st.cooldown.generation;
        st.pending = st.pending.saturating_sub(1);
        st.counters.admitted += 1;
        st.counters.tokens_reserved += grant.reservation.demand.tokens;
        if st.ready_at.is_none() && !st.queue.is_empty() {
            st.drain(now);
        }
        Ok(Some(grant))
    }

    fn lease(
        &self,
        controller: &AdmissionController,
        scope: &Scope,
        grant: Grant,
        pool: Option<u32>,
        admission: Admission,
        id: Option<CallId>,
    ) -> Lease {
        let mut admission = admission;
        admission.grant_order = grant.order;
        if pool.is_none() {
            self.pools.hold_unpooled();
        }
        Lease {
            inner: Arc::clone(&controller.inner),
            scope: scope.id,
            reservation: grant.reservation,
            generation: grant.generation,
            admission,
            id,
            pool,
            released: false,
            reconciled: false,
        }
    }

    /// Returns a lease's permit (called once per lease).
    #[inline]
    pub(crate) fn release(&self, pool: Option<u32>, id: Option<CallId>) {
        if let Some(id) = id {
            self.forget_id(id);
        }
        match pool {
            Some(_) => self.pools.release(pool),
            None => self.pools.release_unpooled(),
        }
    }

    /// Leases held (a pool's permits in use count as leases: a permit is
    /// only ever held on the way to a lease or by one).
    pub(crate) fn active(&self) -> usize {
        self.pools.active()
    }

    #[cold]
    pub(crate) fn forget_id(&self, id: CallId) {
        self.ids.lock().remove(&id);
    }

    /// See [`AdmissionController::rate_limited`].
    pub(crate) fn rate_limited(
        &self,
        scope: ScopeId,
        generation: u64,
        hint: Option<Duration>,
    ) -> CooldownOutcome {
        let inner = self;
        let Some(scope) = inner.scopes.get(scope.index()) else {
            return CooldownOutcome::Stale;
        };
        let now = inner.clock.now();
        let mut st = scope.state.lock();
        if generation < st.cooldown.generation {
            st.counters.stale_rate_limits += 1;
            return CooldownOutcome::Stale;
        }
        let length = inner.cooldown.length(hint, st.cooldown.strikes);
        if hint.is_none() {
            st.cooldown.strikes = st.cooldown.strikes.saturating_add(1);
        }
        let until = now.checked_add(length).unwrap_or_else(|| far_future(now));
        if let Some(running) = st.cooldown.active(now)
            && running >= until
        {
            return CooldownOutcome::Running { until: running };
        }
        st.cooldown.until = Some(until);
        st.cooldown.generation += 1;
        st.counters.cooldowns += 1;
        let generation = st.cooldown.generation;
        st.mark_cooldown();
        st.drain(now);
        tracing::debug!(scope = %scope.id, generation, cooldown_ms = length.as_millis() as u64, "cooldown started");
        CooldownOutcome::Started { generation, until }
    }

    /// See [`Lease::counted_by`].
    pub(crate) fn recount(&self, scope: ScopeId, reservation: &mut Reservation, at: Instant) {
        let Some(scope) = self.scopes.get(scope.index()) else {
            return;
        };
        let now = self.clock.now();
        let mut st = scope.state.lock();
        st.store.recount(reservation, at, now);
        // Counted longer: earlier projections are too early now.
        st.invalidate_projection();
    }

    /// See [`Lease::refused`].
    pub(crate) fn release_refused(
        &self,
        scope: ScopeId,
        reservation: &Reservation,
        requests: bool,
        tokens: bool,
    ) {
        let Some(scope) = self.scopes.get(scope.index()) else {
            return;
        };
        let now = self.clock.now();
        let mut st = scope.state.lock();
        st.store.release(reservation, requests, tokens);
        st.counters.refusals_released += 1;
        st.invalidate_projection();
        if !st.queue.is_empty() {
            st.drain(now);
        }
    }

    /// See [`AdmissionController::observe`].
    pub(crate) fn observe(&self, scope: ScopeId, report: &BudgetReport, at: Instant) -> Observed {
        let Some(scope) = self.scopes.get(scope.index()) else {
            return Observed::default();
        };
        let now = self.clock.now();
        let mut st = scope.state.lock();
        let observed = st.store.observe(report, at, now);
        match report.dimension {
            Dimension::Requests => st.counters.gap_requests += observed.gap,
            Dimension::Tokens => st.counters.gap_tokens += observed.gap,
        }
        if observed.adopted.is_some() || observed.gap > 0 {
            st.invalidate_projection();
        }
        if observed.adopted.is_some() {
            st.counters.limits_adopted += 1;
            if !st.queue.is_empty() {
                st.drain(now);
            }
        }
        observed
    }

    /// Settles a started attempt's tokens (SPEC Q-5).
    pub(crate) fn reconcile(
        &self,
        scope: ScopeId,
        reservation: &Reservation,
        usage: Usage,
    ) -> Settlement {
        let settlement = Settlement::new(reservation.demand.tokens, usage);
        let Some(scope) = self.scopes.get(scope.index()) else {
            return settlement;
        };
        let mut st = scope.state.lock();
        st.counters.settle(&settlement);
        let Some(actual) = settlement.reported else {
            // Unknown usage keeps the estimate: nothing changes.
            return settlement;
        };
        st.store.reconcile(reservation, actual);
        // Room given back may admit the head right now; debt only moves the
        // head's instant later, which its timer finds out by itself.
        if settlement.refunded > 0 {
            st.invalidate_projection();
            if !st.queue.is_empty() {
                let now = self.clock.now();
                st.drain(now);
            }
        }
        settlement
    }
}

/// Registers a caller-chosen id for the duration of the admission.
struct IdGuard<'a> {
    inner: &'a Inner,
    id: Option<CallId>,
}

impl<'a> IdGuard<'a> {
    #[inline]
    fn register(inner: &'a Inner, id: Option<CallId>) -> Result<Self, AdmissionError> {
        if let Some(id) = id {
            Self::insert(inner, id)?;
        }
        Ok(IdGuard { inner, id })
    }

    #[cold]
    fn insert(inner: &Inner, id: CallId) -> Result<(), AdmissionError> {
        if inner.ids.lock().insert(id) {
            Ok(())
        } else {
            Err(AdmissionError::Conflict(id))
        }
    }

    /// Hands the id over to the lease.
    fn disarm(&mut self) -> Option<CallId> {
        self.id.take()
    }
}

impl Drop for IdGuard<'_> {
    #[inline]
    fn drop(&mut self) {
        if let Some(id) = self.id {
            self.inner.forget_id(id);
        }
    }
}

//! The admission controller (SPEC §3): quota, FIFO, concurrency, deadlines.

use std::collections::HashSet;
use std::future::poll_fn;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use parking_lot::Mutex;
use tokio::sync::Notify;
use tokio::time::Sleep;
use tokio_util::sync::CancellationToken;

use super::lease::{Admission, Lease};
use super::permits::{Permits, TryAcquire};
use super::scope::{Grant, Scope, Waiter};
use super::snapshot::{ScopeSnapshot, Snapshot};
use crate::call::{Call, CallId, ScopeId};
use crate::clock::{Instant, SharedClock, TokioClock};
use crate::config::{ConfigError, ControllerConfig, Overflow, ScopeConfig};
use crate::deadline::{Deadline, Phase, far_future};
use crate::error::AdmissionError;
use crate::quota::{Demand, Hold, LimitedBy, LocalBackend, Reservation, SharedBackend};

/// Admits calls: bounded FIFO per quota scope, atomic request and token
/// reservation, a concurrency limit, one deadline (SPEC ADM-1).
///
/// Cloning is cheap and shares the controller.
///
/// ```
/// use std::time::Duration;
/// use tollgate::config::{ScopeConfig, MINUTE};
/// use tollgate::{AdmissionController, Call, Deadline, ScopeId, TokenEstimate};
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
/// lease.reconcile_tokens(Some(1_350));
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
    concurrency: Option<Permits>,
    concurrency_limit: Option<u64>,
    queue_capacity: usize,
    overflow: Overflow,
    max_wait: Option<Duration>,
    closed: AtomicBool,
    active: AtomicUsize,
    idle: Notify,
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
        let scopes = config
            .scopes
            .iter()
            .enumerate()
            .map(|(i, s)| {
                let id = ScopeId(u32::try_from(i).unwrap_or(u32::MAX));
                let capacity = s.queue_capacity.unwrap_or(config.queue_capacity);
                Scope::new(id, s, capacity, backend.open(s, now))
            })
            .collect();
        let permits = config
            .concurrency
            .map(|c| usize::try_from(c).unwrap_or(usize::MAX).min(Permits::MAX));
        Ok(AdmissionController {
            inner: Arc::new(Inner {
                clock,
                scopes,
                concurrency: permits.map(Permits::new),
                concurrency_limit: config.concurrency,
                queue_capacity: config.queue_capacity,
                overflow: config.overflow,
                max_wait: config.max_wait,
                closed: AtomicBool::new(false),
                active: AtomicUsize::new(0),
                idle: Notify::new(),
                shutdown: CancellationToken::new(),
                ids: Mutex::new(HashSet::new()),
                backend: backend.name(),
            }),
        })
    }
}

/// How an arrival entered its scope.
enum Entered {
    /// Reserved and permitted in one step: the fast path.
    Leased(Grant),
    /// Reserved; still needs a concurrency permit.
    Granted(Grant),
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
        self.inner.scopes.iter().find(|s| &*s.name == name).map(|s| s.id)
    }

    /// The controller's clock.
    pub fn clock(&self) -> &SharedClock {
        &self.inner.clock
    }

    /// Whether `call`'s scope needs a token estimate.
    pub fn needs_estimate(&self, scope: ScopeId) -> bool {
        self.inner.scopes.get(scope.index()).is_some_and(|s| s.needs_estimate)
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
    /// Dropping the returned future at any await point leaves nothing
    /// behind: its queue entry is removed (the next call becomes head if it
    /// was the head), a reservation it had been granted is refunded in full
    /// exactly once (Q-9), and no permit is held.
    pub async fn acquire(&self, call: &Call, deadline: Deadline) -> Result<Lease, AdmissionError> {
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
            None if scope.needs_estimate => return Err(AdmissionError::TokenEstimateRequired { scope: scope.id }),
            None => Demand::new(0),
        };
        let arrived = inner.clock.now();
        deadline.check(arrived, Phase::Queue)?;
        let mut id = IdGuard::register(inner, call.id)?;
        let entered = inner.enter(scope, &demand, deadline, arrived)?;
        if let Entered::Leased(grant) = entered {
            // The fast path: no queue, no wait, no timer.
            return Ok(inner.lease(self, scope, grant, Admission::default(), id.disarm()));
        }
        self.acquire_slow(scope, demand, deadline, arrived, entered, id).await
    }

    /// Everything that may wait: the queue, the concurrency permit, and a
    /// re-entry after a preemption.
    async fn acquire_slow(
        &self,
        scope: &Scope,
        demand: Demand,
        deadline: Deadline,
        arrived: Instant,
        mut entered: Entered,
        mut id: IdGuard<'_>,
    ) -> Result<Lease, AdmissionError> {
        let inner = &*self.inner;
        let mut admission = Admission::default();
        let sleep = tokio::time::sleep_until(far_future(arrived));
        tokio::pin!(sleep);
        loop {
            let grant = match entered {
                Entered::Leased(grant) => {
                    admission.quota_wait = inner.clock.now() - arrived;
                    return Ok(inner.lease(self, scope, grant, admission, id.disarm()));
                }
                Entered::Granted(grant) => grant,
                Entered::Queued(key) => {
                    let queued = QueueWait {
                        inner,
                        scope,
                        key: Some(key),
                        armed: None,
                    };
                    let (grant, limited_by, cooldown) = queued.wait(deadline, sleep.as_mut()).await?;
                    admission.limited_by = admission.limited_by.union(limited_by);
                    admission.cooldown |= cooldown;
                    grant
                }
            };
            let granted_at = inner.clock.now();
            admission.quota_wait = granted_at - arrived;
            let mut pending = PendingGuard {
                inner,
                scope,
                grant: Some(grant),
            };
            let waited = inner.wait_permit(deadline, sleep.as_mut()).await?;
            admission.concurrency |= waited;
            let Some(grant) = pending.grant.take() else {
                return Err(AdmissionError::Closed);
            };
            let leased_at = inner.clock.now();
            admission.concurrency_wait += leased_at - granted_at;
            match inner.finish(scope, grant, leased_at)? {
                Some(grant) => return Ok(inner.lease(self, scope, grant, admission, id.disarm())),
                None => {
                    // Preempted by a cooldown (SPEC CD-3): back to the tail.
                    admission.preemptions += 1;
                    admission.cooldown = true;
                    entered = inner.enter(scope, &demand, deadline, leased_at)?;
                }
            }
        }
    }

    /// Starts a cooldown of `scope` lasting `duration` unless one already
    /// runs longer (SPEC CD-1). Returns the new generation. Waiting calls
    /// do not start provider work until it ends; calls granted but not yet
    /// started are preempted (CD-3).
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

    /// Closes admission (SPEC LC-7): new acquisitions fail with `Closed`,
    /// queued ones are woken with `Closed`, holders of leases are told
    /// through [`Lease::closing`], and this resolves once every lease is
    /// dropped. Idempotent; immediate when nothing is active.
    pub async fn close(&self) {
        let inner = &*self.inner;
        if !inner.closed.swap(true, Ordering::AcqRel) {
            for scope in inner.scopes.iter() {
                let mut st = scope.state.lock();
                st.closed = true;
                for key in st.queue.keys() {
                    st.queue.unlink(key);
                    if let Some(w) = st.queue.get_mut(key) {
                        w.outcome = Some(Err(AdmissionError::Closed));
                        if let Some(waker) = w.waker.take() {
                            waker.wake();
                        }
                    }
                }
                st.ready_at = None;
                st.invalidate_projection();
            }
            if let Some(permits) = &inner.concurrency {
                permits.close();
            }
            inner.shutdown.cancel();
        }
        loop {
            let idle = inner.idle.notified();
            tokio::pin!(idle);
            idle.as_mut().enable();
            if inner.active.load(Ordering::Acquire) == 0 {
                return;
            }
            idle.await;
        }
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
                    admitted: st.counters.admitted,
                    preempted: st.counters.preempted,
                    refunded_reservations: st.counters.refunded_reservations,
                }
            })
            .collect();
        Snapshot {
            closed: inner.closed.load(Ordering::Acquire),
            active: inner.active.load(Ordering::Acquire),
            concurrency_limit: inner.concurrency_limit,
            concurrency_available: inner.concurrency.as_ref().map(Permits::available),
            queue_capacity: inner.queue_capacity,
            overflow: inner.overflow,
            backend: inner.backend,
            scopes,
        }
    }
}

impl Inner {
    /// Takes a concurrency permit if one is free (`true` when unlimited).
    fn try_permit(&self) -> Result<bool, AdmissionError> {
        match &self.concurrency {
            None => Ok(true),
            Some(permits) => match permits.try_acquire() {
                Ok(()) => Ok(true),
                Err(TryAcquire::NoPermits) => Ok(false),
                Err(TryAcquire::Closed) => Err(AdmissionError::Closed),
            },
        }
    }

    fn return_permit(&self) {
        if let Some(permits) = &self.concurrency {
            permits.release();
        }
    }

    /// Checks a wait against the deadline and `max_wait` (SPEC Q-11).
    fn verdict(
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
    fn enter(&self, scope: &Scope, demand: &Demand, deadline: Deadline, now: Instant) -> Result<Entered, AdmissionError> {
        let mut guard = scope.state.lock();
        let st = &mut *guard;
        if st.closed {
            return Err(AdmissionError::Closed);
        }
        let cooling = st.cooldown.active(now);
        if st.queue.is_empty() && cooling.is_none() {
            let permit = self.try_permit()?;
            let hold = if permit { Hold::Leased } else { Hold::Pending };
            match st.store.try_reserve(demand, now, hold) {
                Ok(reservation) => {
                    let grant = Grant {
                        reservation,
                        generation: st.cooldown.generation,
                    };
                    if permit {
                        st.counters.admitted += 1;
                        return Ok(Entered::Leased(grant));
                    }
                    st.pending += 1;
                    return Ok(Entered::Granted(grant));
                }
                Err(not_until) => {
                    if permit {
                        self.return_permit();
                    }
                    // A demand that never fits fails now (SPEC Q-3).
                    st.store.check(demand)?;
                    if let Some(at) = not_until.at {
                        self.verdict(at, now, deadline, None)?;
                    }
                    let mut waiter = Waiter::new(*demand);
                    waiter.limited_by = not_until.limited_by;
                    let key = st.queue.push_back(waiter);
                    st.ready_at = not_until.at;
                    return Ok(Entered::Queued(key));
                }
            }
        }
        st.store.check(demand)?;
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
        let key = st.queue.push_back(Waiter::new(*demand));
        if st.queue.front() == Some(key) {
            st.drain(now);
        }
        Ok(Entered::Queued(key))
    }

    /// Waits for a concurrency permit under the deadline. Returns whether it
    /// had to wait.
    async fn wait_permit(&self, deadline: Deadline, mut sleep: Pin<&mut Sleep>) -> Result<bool, AdmissionError> {
        let Some(permits) = &self.concurrency else {
            return Ok(false);
        };
        match permits.try_acquire() {
            Ok(()) => return Ok(false),
            Err(TryAcquire::Closed) => return Err(AdmissionError::Closed),
            Err(TryAcquire::NoPermits) => {}
        }
        deadline.check(self.clock.now(), Phase::Concurrency)?;
        let acquire = permits.acquire();
        tokio::pin!(acquire);
        if let Some(d) = deadline.instant() {
            sleep.as_mut().reset(d);
        }
        poll_fn(|cx| {
            if let Poll::Ready(r) = acquire.as_mut().poll(cx) {
                return Poll::Ready(r.map(|()| true).map_err(|_| AdmissionError::Closed));
            }
            if deadline.instant().is_some() && sleep.as_mut().poll(cx).is_ready() {
                return Poll::Ready(Err(AdmissionError::DeadlineExceeded {
                    phase: Phase::Concurrency,
                    retry_at: None,
                }));
            }
            Poll::Pending
        })
        .await
    }

    /// The final start check (SPEC CD-3) and the lease of the reservation.
    /// `Ok(None)`: preempted by a cooldown, the reservation refunded.
    fn finish(&self, scope: &Scope, mut grant: Grant, now: Instant) -> Result<Option<Grant>, AdmissionError> {
        let mut guard = scope.state.lock();
        let st = &mut *guard;
        if st.closed {
            st.refund_pending(&grant, now);
            drop(guard);
            self.return_permit();
            return Err(AdmissionError::Closed);
        }
        if st.cooldown.generation != grant.generation && st.cooldown.active(now).is_some() {
            st.refund_pending(&grant, now);
            st.counters.preempted += 1;
            drop(guard);
            self.return_permit();
            return Ok(None);
        }
        st.store.lease(&mut grant.reservation, now);
        grant.generation = st.cooldown.generation;
        st.pending = st.pending.saturating_sub(1);
        st.counters.admitted += 1;
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
        admission: Admission,
        id: Option<CallId>,
    ) -> Lease {
        self.active.fetch_add(1, Ordering::AcqRel);
        Lease {
            inner: Arc::clone(&controller.inner),
            scope: scope.id,
            reservation: grant.reservation,
            generation: grant.generation,
            admission,
            id,
            permit: self.concurrency.is_some(),
            released: false,
            reconciled: false,
        }
    }

    /// Returns a lease's permit (called once per lease).
    pub(crate) fn release(&self, permit: bool, id: Option<CallId>) {
        if permit {
            self.return_permit();
        }
        if let Some(id) = id {
            self.forget_id(id);
        }
        let before = self.active.fetch_sub(1, Ordering::AcqRel);
        if before == 1 && self.closed.load(Ordering::Acquire) {
            self.idle.notify_waiters();
        }
    }

    #[cold]
    fn forget_id(&self, id: CallId) {
        self.ids.lock().remove(&id);
    }

    /// Settles a started attempt's tokens (SPEC Q-5).
    pub(crate) fn reconcile(&self, scope: ScopeId, reservation: &Reservation, actual: u64) {
        let Some(scope) = self.scopes.get(scope.index()) else {
            return;
        };
        let now = self.clock.now();
        let mut st = scope.state.lock();
        if actual == 0 {
            st.store.refund_tokens(reservation, now);
        } else {
            st.store.reconcile(reservation, actual, now);
        }
        if actual < reservation.demand.tokens {
            st.invalidate_projection();
        }
        st.drain(now);
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

/// A granted reservation not yet leased: refunded if dropped (SPEC Q-9).
struct PendingGuard<'a> {
    inner: &'a Inner,
    scope: &'a Scope,
    grant: Option<Grant>,
}

impl Drop for PendingGuard<'_> {
    fn drop(&mut self) {
        if let Some(grant) = self.grant.take() {
            let now = self.inner.clock.now();
            self.scope.state.lock().refund_pending(&grant, now);
        }
    }
}

/// A call waiting in its scope's queue. Dropping it removes the entry.
struct QueueWait<'a> {
    inner: &'a Inner,
    scope: &'a Scope,
    key: Option<usize>,
    /// The instant the shared timer is armed for.
    armed: Option<Instant>,
}

type Granted = (Grant, LimitedBy, bool);

impl QueueWait<'_> {
    async fn wait(mut self, deadline: Deadline, mut sleep: Pin<&mut Sleep>) -> Result<Granted, AdmissionError> {
        poll_fn(|cx| self.poll_grant(cx, deadline, sleep.as_mut())).await
    }

    fn poll_grant(
        &mut self,
        cx: &mut Context<'_>,
        deadline: Deadline,
        mut sleep: Pin<&mut Sleep>,
    ) -> Poll<Result<Granted, AdmissionError>> {
        let Some(key) = self.key else {
            return Poll::Ready(Err(AdmissionError::Closed));
        };
        loop {
            let now = self.inner.clock.now();
            let mut guard = self.scope.state.lock();
            let st = &mut *guard;
            let Some(w) = st.queue.get_mut(key) else {
                self.key = None;
                return Poll::Ready(Err(AdmissionError::Closed));
            };
            if let Some(outcome) = w.outcome.take() {
                let (limited_by, cooldown) = (w.limited_by, w.waited_for_cooldown);
                st.queue.remove(key);
                self.key = None;
                return Poll::Ready(outcome.map(|g| (g, limited_by, cooldown)));
            }
            let is_head = st.queue.front() == Some(key);
            let mut phase = Phase::Queue;
            let mut wake_at = deadline.instant();
            if is_head {
                let cooling = st.cooldown.active(now);
                phase = if cooling.is_some() { Phase::Cooldown } else { Phase::Rate };
                if let Some(t) = st.ready_at {
                    if t <= now {
                        st.drain(now);
                        continue;
                    }
                    if let Err(e) = self.inner.verdict(t, now, deadline, cooling) {
                        st.abandon(key, now);
                        self.key = None;
                        return Poll::Ready(Err(e));
                    }
                    wake_at = Some(wake_at.map_or(t, |d| d.min(t)));
                }
                let ready_at = st.ready_at;
                if let Some(w) = st.queue.get_mut(key) {
                    w.armed = ready_at;
                }
            }
            if let Some(w) = st.queue.get_mut(key) {
                match &w.waker {
                    Some(old) if old.will_wake(cx.waker()) => {}
                    _ => w.waker = Some(cx.waker().clone()),
                }
            }
            drop(guard);
            let Some(at) = wake_at else {
                return Poll::Pending;
            };
            if self.armed != Some(at) {
                sleep.as_mut().reset(at);
                self.armed = Some(at);
            }
            if sleep.as_mut().poll(cx).is_pending() {
                return Poll::Pending;
            }
            self.armed = None;
            let now = self.inner.clock.now();
            if deadline.is_expired(now) {
                let mut st = self.scope.state.lock();
                // A grant that landed first wins over the deadline (LC-6).
                if st.queue.get(key).is_some_and(|w| w.outcome.is_some()) {
                    continue;
                }
                let retry_at = if is_head { st.ready_at } else { None };
                st.abandon(key, now);
                self.key = None;
                return Poll::Ready(Err(AdmissionError::DeadlineExceeded { phase, retry_at }));
            }
        }
    }
}

impl Drop for QueueWait<'_> {
    fn drop(&mut self) {
        if let Some(key) = self.key.take() {
            let now = self.inner.clock.now();
            self.scope.state.lock().abandon(key, now);
        }
    }
}

//! The admission controller (SPEC §3): quota, FIFO, concurrency, deadlines.

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::Poll;

use parking_lot::Mutex;
use tokio_util::sync::CancellationToken;

use super::acquire::{Acquire, Admitted, SlowAcquire, State};
use super::builder::ControllerBuilder;
use super::claim::{CallClaim, IdGuard};
use super::lease::{Admission, Lease};
use super::pool_set::PoolSet;
use super::scope::{Grant, Needs, PermitSlot, Scope, ScopeState, Waiter};
use super::settings::Settings;
use super::shared::{SharedAcquire, SharedScope};
use crate::call::{Call, CallId, PoolId, ScopeId};
use crate::clock::{Instant, SharedClock, WallClock};
use crate::config::{ConfigError, ControllerConfig, Overflow};
use crate::deadline::{Deadline, Phase};
use crate::error::AdmissionError;
use crate::flow::Flow;
use crate::quota::{Demand, Hold, Reservation, SharedBackend, SharedRemote};

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
    pub(crate) inner: Arc<Inner>,
}

#[derive(Debug)]
pub(crate) struct Inner {
    pub(crate) clock: SharedClock,
    /// What the clock's instants are in UTC, read once at build (calendar
    /// windows, SPEC BUD-3; saved quota state, DQ-8).
    pub(crate) wall: WallClock,
    /// Every scope the controller ever had, by ordinal: a reconfiguration
    /// appends new ones and retires removed ones in place, so an ordinal
    /// and a reference to a scope stay valid for the controller's life.
    pub(crate) scopes: boxcar::Vec<Scope>,
    pub(crate) pools: Arc<PoolSet>,
    /// What a reconfiguration changes in place.
    pub(crate) settings: Settings,
    /// Opens the in-process store of a scope a reconfiguration adds.
    pub(crate) quota_backend: SharedBackend,
    /// The shared store, when the scopes' quota is kept in one.
    pub(crate) remote: Option<SharedRemote>,
    /// One reconfiguration at a time.
    pub(crate) reconfiguring: Mutex<()>,
    pub(crate) closed: AtomicBool,
    pub(crate) shutdown: CancellationToken,
    pub(crate) ids: Mutex<HashSet<CallId>>,
    pub(crate) backend: &'static str,
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

    /// Whether `self` and `other` are handles of one controller (clones
    /// share it; a reload that keeps a scope keeps its controller).
    pub fn same(&self, other: &AdmissionController) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }

    /// The ordinal of the scope called `name`.
    pub fn scope_id(&self, name: &str) -> Option<ScopeId> {
        self.inner
            .scopes
            .iter()
            .find(|(_, s)| &*s.name == name && !s.is_retired())
            .map(|(_, s)| s.id)
    }

    /// The controller's clock.
    pub fn clock(&self) -> &SharedClock {
        &self.inner.clock
    }

    /// What the controller's instants are in UTC (read from its clock once,
    /// when it was built): e.g. to tell when a calendar window resets.
    pub fn wall(&self) -> WallClock {
        self.inner.wall
    }

    /// The ordinal of the pool called `name`.
    pub fn pool_id(&self, name: &str) -> Option<PoolId> {
        self.inner.pools.find(name).map(PoolId)
    }

    /// Whether `call`'s scope needs a token estimate.
    pub fn needs_estimate(&self, scope: ScopeId) -> bool {
        self.inner
            .scopes
            .get(scope.index())
            .is_some_and(Scope::needs_estimate)
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
    /// exactly once (Q-9), and no permit is held. On a scope kept in a
    /// shared store ([`ControllerBuilder::shared_store`]) that refund is a
    /// detached round trip bounded by the store's timeout, and a
    /// reservation still in flight is refunded when its answer arrives.
    pub fn acquire(&self, call: &Call, deadline: Deadline) -> Acquire<'_> {
        Acquire::new(self, *call, deadline)
    }

    /// The first step of an admission: validation and the fast path. When
    /// the call must wait, its waiting state is written to `state` (in
    /// place: the fast path moves nothing large) and `Pending` is
    /// returned. The lease is built in the returned value itself (no
    /// `Result<Option<_>>` to convert: that moved the whole lease once
    /// more per admission).
    #[inline]
    pub(crate) fn start<'a>(
        &'a self,
        call: &Call,
        deadline: Deadline,
        state: &mut State<'a>,
    ) -> Poll<Result<Lease, AdmissionError>> {
        let inner = &*self.inner;
        let (scope, demand, pool, arrived) = match self.validate(call, deadline) {
            Ok(v) => v,
            Err(e) => return Poll::Ready(Err(e)),
        };
        if let Some(remote) = &scope.shared {
            return match self
                .start_shared(call, deadline, state, scope, remote, demand, pool, arrived)
            {
                Ok(()) => Poll::Pending,
                Err(e) => Poll::Ready(Err(e)),
            };
        }
        let mut id = match IdGuard::register(inner, call.id) {
            Ok(id) => id,
            Err(e) => return Poll::Ready(Err(e)),
        };
        let mut ticket = 0;
        let lacks = Needs::lacked_by(call);
        let entered = match inner.enter(
            scope,
            &demand,
            pool,
            call.flow,
            lacks,
            deadline,
            arrived,
            &mut ticket,
        ) {
            Ok(entered) => entered,
            Err(e) => return Poll::Ready(Err(e)),
        };
        let admission = Admission {
            ticket,
            ..Admission::default()
        };
        if let Entered::Leased(grant) = entered {
            // The fast path: no queue, no wait, no timer.
            return Poll::Ready(Ok(inner.lease(
                self,
                scope,
                grant,
                pool,
                call.flow,
                admission,
                id.disarm(),
            )));
        }
        *state = State::Slow(SlowAcquire::new(
            inner,
            scope,
            pool,
            call.flow,
            lacks,
            deadline,
            arrived,
            entered,
            id.disarm(),
            admission,
        ));
        Poll::Pending
    }

    /// What every admission checks first: the scope, the call's estimate
    /// and price, its pool, and the deadline at arrival (read once: the
    /// admission's one clock read on the fast path).
    #[inline]
    fn validate(
        &self,
        call: &Call,
        deadline: Deadline,
    ) -> Result<(&Scope, Demand, Option<u32>, Instant), AdmissionError> {
        let inner = &*self.inner;
        let scope = inner
            .scopes
            .get(call.scope.index())
            .ok_or(AdmissionError::UnknownScope(call.scope))?;
        if inner.closed.load(Ordering::Acquire) {
            return Err(AdmissionError::Closed);
        }
        if call.estimate.is_none() && scope.needs_estimate() {
            return Err(AdmissionError::TokenEstimateRequired { scope: scope.id });
        }
        // A budget never counts a call as free for want of a price (BUD-1).
        if call.price.is_none() && scope.needs_price() {
            return Err(AdmissionError::PriceRequired { scope: scope.id });
        }
        let demand = call.demand();
        let pool = inner.pools.resolve(call.pool)?;
        let arrived = inner.clock.now();
        deadline.check(arrived, Phase::Queue)?;
        Ok((scope, demand, pool, arrived))
    }

    /// Quota kept in a shared store: a stage of its own (DQ-1).
    #[allow(clippy::too_many_arguments)]
    #[cold]
    fn start_shared<'a>(
        &'a self,
        call: &Call,
        deadline: Deadline,
        state: &mut State<'a>,
        scope: &'a Scope,
        remote: &'a Arc<SharedScope>,
        demand: Demand,
        pool: Option<u32>,
        arrived: Instant,
    ) -> Result<(), AdmissionError> {
        remote.remote().check(&demand)?;
        let id = IdGuard::register(&self.inner, call.id)?.disarm();
        *state = State::Shared(Box::new(SharedAcquire::new(
            self,
            scope,
            remote,
            demand,
            pool,
            call.flow,
            Needs::lacked_by(call),
            deadline,
            arrived,
            id,
        )));
        Ok(())
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
            slow.flow(),
            admitted.admission,
            admitted.id,
        )
    }
}

impl Inner {
    /// Checks a wait against the deadline and `max_wait` (SPEC Q-11).
    /// `budget` is the scope when one of its cost limits is short: a wait
    /// that cannot end in time then fails as
    /// [`BudgetExceeded`](AdmissionError::BudgetExceeded) (SPEC BUD-4).
    pub(crate) fn verdict(
        &self,
        at: Instant,
        now: Instant,
        deadline: Deadline,
        cooling: Option<Instant>,
        budget: Option<ScopeId>,
    ) -> Result<(), AdmissionError> {
        if let Some(scope) = budget
            && self.late(at, now, deadline)
        {
            return Err(AdmissionError::BudgetExceeded {
                scope,
                retry_at: Some(at),
            });
        }
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
        if let Some(max_wait) = self.settings.max_wait() {
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

    /// Whether an admission at `at` comes after `deadline` or further than
    /// `max_wait` from `now` (SPEC Q-11).
    fn late(&self, at: Instant, now: Instant, deadline: Deadline) -> bool {
        deadline.instant().is_some_and(|d| d <= at)
            || self
                .settings
                .max_wait()
                .is_some_and(|m| at.saturating_duration_since(now) > m)
    }

    /// Whether a cost limit of the scope, and not another of its limits,
    /// is what keeps `demand` out past `deadline` or `max_wait` (SPEC
    /// BUD-4): a budget is short of it and frees room only after every
    /// other short limit, too late. A request or token limit that binds is
    /// a rate wait, whatever the budget's state (OBS-4).
    pub(crate) fn budget_binds(
        &self,
        st: &mut ScopeState,
        demand: &Demand,
        now: Instant,
        deadline: Deadline,
    ) -> bool {
        if demand.cost == 0 {
            return false;
        }
        let all = st.store.not_until(demand, now);
        let Some(at) = all.at.filter(|_| all.limited_by.cost) else {
            return false;
        };
        let rest = st.store.not_until(&demand.with_cost(0), now);
        // Another limit that tells no instant (it waits on a pending lease
        // or a provisional stand-in) frees within a window of an event,
        // not at a known later instant: the known-late budget binds.
        let cost_last = rest.at.is_none_or(|r| r < at);
        cost_last && self.late(at, now, deadline)
    }

    /// Validates the demand and either reserves at once (nobody waits) or
    /// links the call at the tail of its flow's line (SPEC FAIR-1).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn enter(
        &self,
        scope: &Scope,
        demand: &Demand,
        pool: Option<u32>,
        flow: Flow,
        lacks: Needs,
        deadline: Deadline,
        now: Instant,
        ticket: &mut u64,
    ) -> Result<Entered, AdmissionError> {
        let mut guard = scope.state.lock();
        let st = &mut *guard;
        if st.closed {
            return Err(AdmissionError::Closed);
        }
        // Checked before the lock too; a reconfiguration in between is
        // seen here (SPEC Q-3, BUD-1).
        if let Some(missing) = lacks.missing(st.needs) {
            return Err(missing.error(scope.id));
        }
        // A demand that can never fit fails now, on every path, whatever
        // the algorithm's state (SPEC Q-3).
        st.store.check(demand)?;
        *ticket = st.tickets;
        st.tickets += 1;
        let cooling = st.cooldown.active(now);
        let key = flow.key();
        if st.queue.is_empty() && cooling.is_none() {
            let permit = self.pools.try_acquire(pool, key.holder())?;
            let hold = if permit { Hold::Leased } else { Hold::Pending };
            let reserved = st.store.try_reserve(demand, now, hold);
            match reserved {
                Some(tick) => {
                    let reservation = Reservation {
                        stamp: now,
                        tick,
                        demand: *demand,
                        hold,
                        seq: 0,
                    };
                    let mut grant = Grant {
                        reservation,
                        generation: st.cooldown.generation,
                        order: st.grants,
                        flow: key,
                        charged: None,
                    };
                    st.grants += 1;
                    st.record_fast(flow, demand, now);
                    if permit {
                        st.counters.leased(demand);
                        return Ok(Entered::Leased(grant));
                    }
                    // Take a place in the permit queue under the scope lock,
                    // so permits follow the order of reservations (ADM-4).
                    match self.pools.register(pool, key.holder()) {
                        Ok(Some(slot)) => {
                            st.pending += 1;
                            return Ok(Entered::Granted(grant, PermitSlot::queued(slot)));
                        }
                        Err(e) => {
                            st.store.refund(&grant.reservation, now);
                            return Err(e);
                        }
                        // A permit freed up meanwhile: start now.
                        Ok(None) => {
                            st.store.lease(&mut grant.reservation, now);
                            st.counters.leased(demand);
                            return Ok(Entered::Leased(grant));
                        }
                    }
                }
                None => {
                    if permit {
                        self.pools.release(pool, key.holder());
                    }
                    let not_until = st.store.not_until(demand, now);
                    if let Some(at) = not_until.at {
                        let budget = (not_until.limited_by.cost
                            && self.budget_binds(st, demand, now, deadline))
                        .then_some(scope.id);
                        self.verdict(at, now, deadline, None, budget)?;
                    }
                    let mut waiter = Waiter::new(*demand, pool, key, lacks);
                    waiter.limited_by = not_until.limited_by;
                    let slot = st
                        .queue
                        .push(flow, waiter)
                        .map_err(|_| AdmissionError::QueueFull { scope: scope.id })?;
                    // Alone: the head of the line.
                    st.queue.head(now);
                    st.ready_at = not_until.at;
                    st.recheck_at = match not_until.at {
                        None => st.store.recheck_at(demand, now),
                        Some(_) => None,
                    };
                    return Ok(Entered::Queued(slot));
                }
            }
        }
        let mut displace = None;
        if self.settings.overflow() == Overflow::Reject && st.queue.len() >= scope.capacity() {
            // A flow under its share of the full queue still gets in, and
            // the flow holding the most gives up its last call (FAIR-10).
            displace = Some(
                st.room_for(key, scope.capacity())
                    .ok_or(AdmissionError::QueueFull { scope: scope.id })?,
            );
        }
        if (deadline.instant().is_some() || self.settings.max_wait().is_some())
            && let Some(at) = st.project(demand, key, now, displace)
            && let Err(e) = self.verdict(at, now, deadline, cooling, None)
        {
            // The projection committed this demand; it is not queued.
            st.invalidate_projection();
            // A budget that cannot take it in time, even with nobody ahead,
            // is what it waits for (BUD-4); a queue or another limit that
            // makes it late is a rate wait.
            let waited = matches!(
                e,
                AdmissionError::DeadlineExceeded { .. } | AdmissionError::QuotaWaitTooLong { .. }
            );
            if waited && self.budget_binds(st, demand, now, deadline) {
                return Err(AdmissionError::BudgetExceeded {
                    scope: scope.id,
                    retry_at: e.retry_at(),
                });
            }
            return Err(e);
        }
        let mut waiter = Waiter::new(*demand, pool, key, lacks);
        waiter.waited_for_cooldown = cooling.is_some();
        let had_head = st.queue.current_head().is_some();
        let Ok(slot) = st.queue.push(flow, waiter) else {
            // The projection counted this demand; it is not queued.
            st.invalidate_projection();
            return Err(AdmissionError::QueueFull { scope: scope.id });
        };
        if let Some(victim) = displace {
            st.displace(victim, now);
        }
        if st.queue.current_head().is_none() {
            // The first call, or one of a higher class than the head's.
            if had_head {
                st.head_armed = None;
            }
            st.drain(now);
        }
        Ok(Entered::Queued(slot))
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
            self.pools.release(pool, grant.flow.holder());
            return Err(AdmissionError::Closed);
        }
        if st.cooldown.generation != grant.generation && st.cooldown.active(now).is_some() {
            st.refund_pending(&grant, now);
            st.counters.preempted += 1;
            drop(guard);
            self.pools.release(pool, grant.flow.holder());
            return Ok(None);
        }
        st.store.lease(&mut grant.reservation, now);
        grant.generation = st.cooldown.generation;
        st.pending = st.pending.saturating_sub(1);
        st.counters.leased(&grant.reservation.demand);
        if st.ready_at.is_none() && !st.queue.is_empty() {
            st.drain(now);
        }
        Ok(Some(grant))
    }

    #[allow(clippy::too_many_arguments)]
    fn lease(
        &self,
        controller: &AdmissionController,
        scope: &Scope,
        grant: Grant,
        pool: Option<u32>,
        flow: Flow,
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
            flow,
            charged: grant.charged,
            released: false,
            reconciled: false,
            remote: None,
        }
    }

    /// Returns a lease's permit (called once per lease).
    #[inline]
    pub(crate) fn release(&self, pool: Option<u32>, id: Option<CallId>, flow: Flow) {
        if let Some(id) = id {
            self.forget_id(id);
        }
        match pool {
            Some(_) => self.pools.release(pool, flow.key().holder()),
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
}

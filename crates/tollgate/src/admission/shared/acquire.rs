//! Admitting a call on a scope kept in a shared store, as one hand-written
//! future (SPEC ADM-1 over DQ-1..DQ-5).
//!
//! # Stages
//!
//! ```text
//! Turn ──► Start ──► Reserve ──► (Leased) ─────────────────────► lease
//!   ▲        ▲  │        │  └──► (Pending) ► Permit ► Lease op ─► lease
//!   │        │  ▼        ▼                      │         │
//!   │        └─ Sleep ◄──┘ not until `at`       └─────────┴─► preempted (CD-3)
//!   └────────────────────────────────────────────────────────────┘
//! ```
//!
//! * `Turn`: waits for the scope's turn, in arrival order (DQ-4, ADM-4,
//!   ADM-5). The turn is held through `Start`, `Reserve` and `Sleep`, so
//!   one reservation of the scope is in flight at a time.
//! * `Start`: cooldown check (CD-1), a concurrency permit taken only if
//!   one is free (never waited for while holding the turn, ADM-2), then
//!   one `reserve` round trip, `Hold::Leased` with the permit (the fast
//!   path: one round trip per admitted call) or `Hold::Pending` without.
//!   While the store is unavailable: `fail_closed` fails at once,
//!   `fail_open_local` reserves from the local share (DQ-3).
//! * `Sleep`: the store said *not until `at`*; a call that cannot make it
//!   in time fails at once with the instant as a hint (Q-11), the others
//!   sleep until `at`, a notice that quota came back, or their deadline.
//!   No polling, except a short retry when the store knows no instant
//!   (room held by a pending reservation somewhere).
//! * `Permit`: a pending grant waits for its permit like the in-process
//!   path (POOL-3) after giving the turn to the next call; then the final
//!   cooldown check (CD-3) and a `lease` round trip.
//!
//! # Cancel safety
//!
//! Dropping it at any point leaves nothing behind: the turn or the place in
//! its line goes back, a permit or the place in a pool's line goes back, a
//! reservation granted but not leased is refunded exactly once (a detached
//! round trip bounded by the store's timeout, SPEC Q-9; one in flight is
//! refunded when its answer arrives), and the call's id is released.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::sync::futures::Notified;
use tokio::time::Sleep;

use super::scope::{SharedScope, SharedStats};
use super::settle::{self, LeaseOp, RemoteLease, ReserveOp};
use crate::admission::acquire::poll_timer;
use crate::admission::controller::{AdmissionController, Inner};
use crate::admission::fair::{Charged, TurnDone};
use crate::admission::lease::{Admission, Lease};
use crate::admission::permits::Refused;
use crate::admission::pool_set::refused;
use crate::admission::scope::Needs;
use crate::admission::scope::Scope;
use crate::call::CallId;
use crate::clock::Instant;
use crate::deadline::{Deadline, Phase};
use crate::error::AdmissionError;
use crate::flow::Flow;
use crate::quota::{
    Demand, Hold, HoldId, NotUntil, RemoteHold, Reservation, StoreError, Unavailable,
};

/// How long a call waits before asking again when the store knows no
/// instant (only a pending reservation's lease, refund or expiry frees the
/// room).
const PENDING_RETRY: Duration = Duration::from_millis(25);

/// How long the store keeps a pending hold of a call without a deadline
/// unless leased or given back; a call still waiting for its permit then
/// reserves again.
const UNBOUNDED_HOLD: Duration = Duration::from_secs(60);

/// Where a granted reservation lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Origin {
    /// In the shared store.
    Remote,
    /// In this process's fallback share (SPEC DQ-3).
    Fallback,
}

#[derive(Debug, Clone, Copy)]
struct Granted {
    reservation: Reservation,
    origin: Origin,
    /// The scope's cooldown generation when it was reserved.
    generation: u64,
    /// A pending hold's name in the shared store.
    id: Option<HoldId>,
}

enum Stage {
    /// In the turn's line (`None`: not yet joined).
    Turn {
        key: Option<usize>,
    },
    /// Holding the turn: check the cooldown and reserve.
    Start,
    /// Holding the turn: a reservation round trip in flight.
    Reserve {
        op: ReserveOp,
        permit: bool,
        generation: u64,
        /// A pending hold's name (no permit was free).
        id: Option<HoldId>,
        /// Its budget is the deadline's rest, shorter than the timeout.
        clipped: bool,
    },
    /// Holding the turn: waiting until `until` (or a notice).
    Sleep {
        until: Instant,
        phase: Phase,
        retry_at: Option<Instant>,
    },
    /// A pending grant waiting for its permit (`key: None`: held).
    Permit {
        grant: Granted,
        key: Option<usize>,
        granted_at: Instant,
    },
    /// Permit held: the lease round trip in flight.
    Lease {
        grant: Granted,
        op: LeaseOp,
        clipped: bool,
    },
    Done,
}

/// The waiting part of an admission on a shared scope. See the module
/// documentation.
pub(crate) struct SharedAcquire<'a> {
    controller: &'a AdmissionController,
    scope: &'a Scope,
    shared: &'a Arc<SharedScope>,
    demand: Demand,
    pool: Option<u32>,
    flow: Flow,
    /// What the call lacks (judged again when it starts reserving).
    lacks: Needs,
    deadline: Deadline,
    arrived: Instant,
    id: Option<CallId>,
    admission: Admission,
    stage: Stage,
    /// Holds the scope's turn.
    turn: bool,
    /// The turn came from the line: the cost model its flow was charged
    /// under (FAIR-3).
    charged: Option<Charged>,
    timer: Option<Pin<Box<Sleep>>>,
    /// Armed before each reservation, so a refund announced while it is in
    /// flight is not missed.
    notice: Option<Pin<Box<Notified<'a>>>>,
    /// Counted in the scope's holds (see `hold`).
    holding: bool,
    /// A refusal was already asked again or its verdict deferred because
    /// the answer may have been stale (see `wait_for`): once per call, so
    /// the refunds of a busy scope cannot postpone a verdict for long.
    looked_again: bool,
    /// The store's handle of this call's latest reservation: its lease and
    /// settlements go through it (a reconfiguration may have replaced the
    /// scope's handle meanwhile, SPEC GW-15).
    quota: Option<settle::Quota>,
}

impl<'a> SharedAcquire<'a> {
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        controller: &'a AdmissionController,
        scope: &'a Scope,
        shared: &'a Arc<SharedScope>,
        demand: Demand,
        pool: Option<u32>,
        flow: Flow,
        lacks: Needs,
        deadline: Deadline,
        arrived: Instant,
        id: Option<CallId>,
    ) -> Self {
        let ticket = {
            let mut st = scope.state.lock();
            st.tickets += 1;
            st.tickets - 1
        };
        SharedAcquire {
            controller,
            scope,
            shared,
            demand,
            pool,
            flow,
            lacks,
            deadline,
            arrived,
            id,
            admission: Admission {
                ticket,
                ..Admission::default()
            },
            stage: Stage::Turn { key: None },
            turn: false,
            charged: None,
            timer: None,
            notice: None,
            holding: false,
            looked_again: false,
            quota: None,
        }
    }

    /// The handle of this call's latest reservation.
    fn quota(&self) -> settle::Quota {
        self.quota.clone().unwrap_or_else(|| self.shared.remote())
    }

    fn inner(&self) -> &'a Inner {
        &self.controller.inner
    }

    fn now(&self) -> Instant {
        self.inner().clock.now()
    }

    /// The call's permit holder (SPEC FAIR-6).
    fn holder(&self) -> u64 {
        self.flow.key().holder()
    }

    fn poll_timer(&mut self, cx: &mut Context<'_>, at: Instant) -> Poll<()> {
        poll_timer(&mut self.timer, cx, at)
    }

    pub(crate) fn poll(&mut self, cx: &mut Context<'_>) -> Poll<Result<Lease, AdmissionError>> {
        loop {
            let step = match std::mem::replace(&mut self.stage, Stage::Done) {
                Stage::Turn { key } => self.poll_turn(cx, key),
                Stage::Start => self.start(),
                Stage::Reserve {
                    op,
                    permit,
                    generation,
                    id,
                    clipped,
                } => self.poll_reserve(cx, op, (permit, generation, id), clipped),
                Stage::Sleep {
                    until,
                    phase,
                    retry_at,
                } => self.poll_sleep(cx, until, phase, retry_at),
                Stage::Permit {
                    grant,
                    key,
                    granted_at,
                } => self.poll_permit(cx, grant, key, granted_at),
                Stage::Lease { grant, op, clipped } => self.poll_lease(cx, grant, op, clipped),
                Stage::Done => Poll::Ready(Err(AdmissionError::Closed)),
            };
            match step {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Err(e)) => {
                    self.release_all();
                    return Poll::Ready(Err(e));
                }
                Poll::Ready(Ok(Some(lease))) => return Poll::Ready(Ok(lease)),
                Poll::Ready(Ok(None)) => {}
            }
        }
    }

    /// In the turn's line (SPEC DQ-4, ADM-5).
    fn poll_turn(
        &mut self,
        cx: &mut Context<'_>,
        mut key: Option<usize>,
    ) -> Poll<Result<Option<Lease>, AdmissionError>> {
        let (flow, tokens, now) = (self.flow, self.demand.tokens(), self.now());
        match self
            .shared
            .turn
            .poll_acquire(cx, &mut key, flow, tokens, now)
        {
            Poll::Ready(Ok(charged)) => {
                self.turn = true;
                self.charged = charged;
                self.stage = Stage::Start;
                return Poll::Ready(Ok(None));
            }
            Poll::Ready(Err(Refused::Full)) => {
                return Poll::Ready(Err(AdmissionError::QueueFull {
                    scope: self.scope.id,
                }));
            }
            Poll::Ready(Err(Refused::Closed)) => return Poll::Ready(Err(AdmissionError::Closed)),
            Poll::Pending => {}
        }
        self.stage = Stage::Turn { key };
        let Some(at) = self.deadline.instant() else {
            return Poll::Pending;
        };
        if at > self.now() && self.poll_timer(cx, at).is_pending() {
            return Poll::Pending;
        }
        Poll::Ready(Err(AdmissionError::DeadlineExceeded {
            phase: Phase::Queue,
            retry_at: None,
        }))
    }

    /// With the turn: cooldown, a permit if free, then one reservation.
    fn start(&mut self) -> Poll<Result<Option<Lease>, AdmissionError>> {
        let inner = self.inner();
        let now = self.now();
        if inner.closed.load(std::sync::atomic::Ordering::Acquire) {
            return Poll::Ready(Err(AdmissionError::Closed));
        }
        // The handle is read before what the scope needs: a reload sets
        // the needs before it installs the handle of its new limits, so a
        // call that reserves through the new handle is judged by the new
        // needs (read the other way round, a reload in between would let
        // a call without an estimate reserve 0 tokens from a token limit).
        let remote = self.shared.remote();
        let (cooling, generation) = {
            let st = self.scope.state.lock();
            // A reconfiguration since the call's first check may make the
            // scope need what it lacks (SPEC Q-3, BUD-1).
            if let Some(missing) = self.lacks.missing(st.needs) {
                return Poll::Ready(Err(missing.error(self.scope.id)));
            }
            (st.cooldown.active(now), st.cooldown.generation)
        };
        if let Some(until) = cooling {
            self.admission.cooldown = true;
            inner.verdict(until, now, self.deadline, Some(until), None)?;
            self.stage = Stage::Sleep {
                until,
                phase: Phase::Cooldown,
                retry_at: Some(until),
            };
            return Poll::Ready(Ok(None));
        }
        let Some(budget) = self.shared.budget(self.deadline, now) else {
            return Poll::Ready(Err(AdmissionError::DeadlineExceeded {
                phase: Phase::Rate,
                retry_at: None,
            }));
        };
        let permit = inner.pools.try_acquire(self.pool, self.holder())?;
        if !self.shared.usable(now) {
            return self.unavailable(now, permit, generation);
        }
        let (hold, id) = if permit {
            (RemoteHold::Leased, None)
        } else {
            let id = HoldId::new();
            let ttl = self.hold_ttl(now);
            (RemoteHold::Pending { id, ttl }, Some(id))
        };
        let shared: &'a SharedScope = self.shared;
        self.notice = Some(Box::pin(shared.room.notified()));
        let demand = self.demand;
        if id.is_some() {
            self.hold();
        }
        self.quota = Some(Arc::clone(&remote));
        self.stage = Stage::Reserve {
            op: Box::pin(async move { remote.reserve(demand, hold, budget).await }),
            permit,
            generation,
            id,
            clipped: budget < shared.timeout,
        };
        Poll::Ready(Ok(None))
    }

    /// How long the store keeps this call's pending hold: until its
    /// deadline and a lease round trip after it, or [`UNBOUNDED_HOLD`].
    fn hold_ttl(&self, now: Instant) -> Duration {
        match self.deadline.remaining(now) {
            Some(left) => left.saturating_add(self.shared.timeout.saturating_mul(2)),
            None => UNBOUNDED_HOLD,
        }
    }

    fn poll_reserve(
        &mut self,
        cx: &mut Context<'_>,
        mut op: ReserveOp,
        (permit, generation, id): (bool, u64, Option<HoldId>),
        clipped: bool,
    ) -> Poll<Result<Option<Lease>, AdmissionError>> {
        let answer = match op.as_mut().poll(cx) {
            Poll::Ready(answer) => answer,
            Poll::Pending => {
                self.stage = Stage::Reserve {
                    op,
                    permit,
                    generation,
                    id,
                    clipped,
                };
                return Poll::Pending;
            }
        };
        let now = self.now();
        if answer.is_err() {
            // The reservation may have landed: a pending hold is given
            // back by its name (a leased one ages out with its windows).
            if let Some(id) = id {
                settle::forget(self.shared, self.quota(), id);
            }
        }
        if !matches!(answer, Ok(Ok(_))) {
            self.let_go();
        }
        match answer {
            Ok(reserved) => {
                self.shared.answered();
                self.reserved(reserved, Origin::Remote, (permit, generation, id), now)
            }
            // The call's own deadline cut the round trip short: says
            // nothing about the store.
            Err(StoreError::Timeout(_)) if clipped => {
                if permit {
                    self.inner().pools.release(self.pool, self.holder());
                }
                Poll::Ready(Err(AdmissionError::DeadlineExceeded {
                    phase: Phase::Rate,
                    retry_at: None,
                }))
            }
            Err(e) => {
                self.shared.failed(now, &e);
                self.unavailable(now, permit, generation)
            }
        }
    }

    /// The store is unavailable (SPEC DQ-3).
    fn unavailable(
        &mut self,
        now: Instant,
        permit: bool,
        generation: u64,
    ) -> Poll<Result<Option<Lease>, AdmissionError>> {
        let hold = if permit { Hold::Leased } else { Hold::Pending };
        let reserved = match self.shared.on_unavailable {
            Unavailable::FailOpenLocal { .. } => {
                let mut st = self.scope.state.lock();
                // A demand larger than the local share never fits it.
                let fits = st.store.check(&self.demand).is_ok();
                fits.then(|| st.store.reserve(&self.demand, now, hold))
            }
            Unavailable::FailClosed => None,
        };
        let Some(reserved) = reserved else {
            if permit {
                self.inner().pools.release(self.pool, self.holder());
            }
            SharedStats::count(&self.shared.stats.rejected_unavailable);
            return Poll::Ready(Err(AdmissionError::QuotaStoreUnavailable {
                scope: self.scope.id,
            }));
        };
        if reserved.is_ok() {
            SharedStats::count(&self.shared.stats.fallback_admissions);
        }
        self.reserved(reserved, Origin::Fallback, (permit, generation, None), now)
    }

    /// The answer to a reservation, with the turn held.
    fn reserved(
        &mut self,
        reserved: Result<Reservation, NotUntil>,
        origin: Origin,
        (permit, generation, id): (bool, u64, Option<HoldId>),
        now: Instant,
    ) -> Poll<Result<Option<Lease>, AdmissionError>> {
        let reservation = match reserved {
            Ok(reservation) => reservation,
            Err(not_until) => {
                if permit {
                    // No permit is held while waiting for quota (ADM-2).
                    self.inner().pools.release(self.pool, self.holder());
                }
                return self.wait_for(not_until, origin, now);
            }
        };
        self.admission.quota_wait = now - self.arrived;
        let grant = Granted {
            reservation,
            origin,
            generation,
            id,
        };
        if permit {
            self.give_turn(true);
            return self.finish(grant, now);
        }
        self.scope.state.lock().pending += 1;
        // Join the pool's line before the next call reserves, so permits
        // follow the order of reservations (ADM-4).
        let key = match self.inner().pools.register(self.pool, self.holder()) {
            Ok(key) => key,
            Err(e) => {
                self.give_turn(false);
                self.refund(grant);
                return Poll::Ready(Err(e));
            }
        };
        self.give_turn(true);
        self.stage = Stage::Permit {
            grant,
            key,
            granted_at: now,
        };
        Poll::Ready(Ok(None))
    }

    /// Not until `at`: the early verdict (SPEC Q-11) or a sleep.
    fn wait_for(
        &mut self,
        not_until: NotUntil,
        origin: Origin,
        now: Instant,
    ) -> Poll<Result<Option<Lease>, AdmissionError>> {
        self.admission.limited_by = self.admission.limited_by.union(not_until.limited_by);
        // The store's answer may be stale: quota came back while it was on
        // its way (a settlement landed, here or in another process), or a
        // settlement of this replica is still on its way (the store does
        // not count the room it gives back yet). Once per call, such a
        // refusal is asked again at once, or waits for that settlement
        // (whose end wakes it) instead of failing on an early verdict
        // (SPEC Q-11); the next refusal is judged as it stands. The local
        // share's answers (fallback) are never stale that way.
        let first_look = !self.looked_again && matches!(origin, Origin::Remote);
        if first_look && self.room_came_back() {
            self.looked_again = true;
            self.stage = Stage::Start;
            return Poll::Ready(Ok(None));
        }
        let (until, retry_at) = match not_until.at {
            Some(at) => {
                let budget = not_until.limited_by.cost.then_some(self.scope.id);
                if let Err(e) = self.inner().verdict(at, now, self.deadline, None, budget) {
                    if !(first_look && self.shared.detached.busy()) {
                        return Poll::Ready(Err(e));
                    }
                    self.looked_again = true;
                }
                (at, Some(at))
            }
            None => (now + PENDING_RETRY, None),
        };
        self.stage = Stage::Sleep {
            until,
            phase: Phase::Rate,
            retry_at,
        };
        Poll::Ready(Ok(None))
    }

    /// Whether the scope's notice that quota came back fired since the
    /// reservation was sent (taken: the next reservation arms a new one).
    fn room_came_back(&mut self) -> bool {
        let Some(notice) = self.notice.as_mut() else {
            return false;
        };
        let mut cx = Context::from_waker(std::task::Waker::noop());
        let fired = notice.as_mut().poll(&mut cx).is_ready();
        if fired {
            self.notice = None;
        }
        fired
    }

    fn poll_sleep(
        &mut self,
        cx: &mut Context<'_>,
        until: Instant,
        phase: Phase,
        retry_at: Option<Instant>,
    ) -> Poll<Result<Option<Lease>, AdmissionError>> {
        let shared: &'a SharedScope = self.shared;
        let notice = self
            .notice
            .get_or_insert_with(|| Box::pin(shared.room.notified()));
        let noticed = notice.as_mut().poll(cx).is_ready();
        if noticed {
            self.notice = None;
        }
        let now = self.now();
        if self
            .inner()
            .closed
            .load(std::sync::atomic::Ordering::Acquire)
        {
            return Poll::Ready(Err(AdmissionError::Closed));
        }
        if noticed || until <= now {
            self.stage = Stage::Start;
            return Poll::Ready(Ok(None));
        }
        if self.deadline.is_expired(now) {
            return Poll::Ready(Err(AdmissionError::DeadlineExceeded { phase, retry_at }));
        }
        self.stage = Stage::Sleep {
            until,
            phase,
            retry_at,
        };
        let wake = self.deadline.instant().map_or(until, |d| d.min(until));
        if self.poll_timer(cx, wake).is_pending() {
            return Poll::Pending;
        }
        // The timer fired: look again.
        Poll::Ready(Ok(None))
    }

    /// A pending grant waits for its permit (SPEC POOL-3, DL-4).
    fn poll_permit(
        &mut self,
        cx: &mut Context<'_>,
        grant: Granted,
        mut key: Option<usize>,
        granted_at: Instant,
    ) -> Poll<Result<Option<Lease>, AdmissionError>> {
        let inner = self.inner();
        if let (Some(_), Some(entry)) = (key, inner.pools.get(self.pool)) {
            self.admission.concurrency = true;
            match entry.permits.poll_acquire(cx, &mut key) {
                Poll::Ready(Ok(())) => {}
                Poll::Ready(Err(why)) => {
                    self.refund(grant);
                    return Poll::Ready(Err(refused(why, self.pool)));
                }
                Poll::Pending => {
                    self.stage = Stage::Permit {
                        grant,
                        key,
                        granted_at,
                    };
                    let local = entry.max_wait.get().and_then(|w| granted_at.checked_add(w));
                    let until = match (local, self.deadline.instant()) {
                        (Some(l), Some(d)) => Some(l.min(d)),
                        (l, d) => l.or(d),
                    };
                    let Some(at) = until else {
                        return Poll::Pending;
                    };
                    if at > self.now() && self.poll_timer(cx, at).is_pending() {
                        return Poll::Pending;
                    }
                    return Poll::Ready(Err(AdmissionError::DeadlineExceeded {
                        phase: Phase::Concurrency,
                        retry_at: None,
                    }));
                }
            }
        }
        let now = self.now();
        self.admission.concurrency_wait += now - granted_at;
        self.finish(grant, now)
    }

    /// Permit held: the final start check (SPEC CD-3), then the lease.
    fn finish(
        &mut self,
        grant: Granted,
        now: Instant,
    ) -> Poll<Result<Option<Lease>, AdmissionError>> {
        let preempted = {
            let mut st = self.scope.state.lock();
            if st.closed {
                drop(st);
                self.return_grant(grant);
                return Poll::Ready(Err(AdmissionError::Closed));
            }
            let preempted =
                st.cooldown.generation != grant.generation && st.cooldown.active(now).is_some();
            if preempted {
                st.counters.preempted += 1;
                // A new arrival at the tail.
                self.admission.ticket = st.tickets;
                st.tickets += 1;
            }
            preempted
        };
        if preempted {
            // Back to the tail of the line; no attempt spent.
            self.return_grant(grant);
            self.admission.preemptions += 1;
            self.admission.cooldown = true;
            self.stage = Stage::Turn { key: None };
            return Poll::Ready(Ok(None));
        }
        if self.deadline.is_expired(now) {
            // Collected after the deadline: no lease, so no provider work
            // starts late (SPEC DL-5, DL-6); the reservation goes back in
            // full with the permit (Q-9).
            self.return_grant(grant);
            return Poll::Ready(Err(self.admission.collected_late()));
        }
        let mut grant = grant;
        if grant.reservation.hold == Hold::Leased {
            return Poll::Ready(Ok(Some(self.lease(grant))));
        }
        if grant.origin == Origin::Fallback {
            let mut st = self.scope.state.lock();
            st.store.lease(&mut grant.reservation, now);
            st.pending = st.pending.saturating_sub(1);
            drop(st);
            self.shared.wake();
            return Poll::Ready(Ok(Some(self.lease(grant))));
        }
        let Some(budget) = self.shared.budget(self.deadline, now) else {
            self.return_grant(grant);
            return Poll::Ready(Err(AdmissionError::DeadlineExceeded {
                phase: Phase::Concurrency,
                retry_at: None,
            }));
        };
        let Some(id) = grant.id else {
            // Every remote pending grant has a name.
            self.return_grant(grant);
            return Poll::Ready(Err(AdmissionError::Closed));
        };
        let remote = self.quota();
        let pending = grant.reservation;
        self.stage = Stage::Lease {
            grant,
            op: Box::pin(async move { remote.lease(pending, id, budget).await }),
            clipped: budget < self.shared.timeout,
        };
        Poll::Ready(Ok(None))
    }

    fn poll_lease(
        &mut self,
        cx: &mut Context<'_>,
        mut grant: Granted,
        mut op: LeaseOp,
        clipped: bool,
    ) -> Poll<Result<Option<Lease>, AdmissionError>> {
        let Poll::Ready(answer) = op.as_mut().poll(cx) else {
            self.stage = Stage::Lease { grant, op, clipped };
            return Poll::Pending;
        };
        let now = self.now();
        if answer.is_ok() {
            // Leased (the permit now counts the call) or gone: nothing is
            // held on the store any more. On a failure `return_grant`
            // forgets it first.
            self.let_go();
        }
        match answer {
            Ok(Some(reservation)) => {
                self.shared.answered();
                {
                    let mut st = self.scope.state.lock();
                    st.pending = st.pending.saturating_sub(1);
                }
                // The room it holds is now counted from a known instant: a
                // call told "no instant yet" can ask again.
                self.shared.wake();
                grant.reservation = reservation;
                Poll::Ready(Ok(Some(self.lease(grant))))
            }
            Ok(None) => {
                // The store let the hold expire (the call waited for its
                // permit longer than the hold lives): nothing is held, so
                // the permit goes back and the call reserves again.
                self.shared.answered();
                {
                    let mut st = self.scope.state.lock();
                    st.pending = st.pending.saturating_sub(1);
                }
                SharedStats::count(&self.shared.stats.holds_expired);
                // Its next turn charges it again.
                self.uncharge(&grant.reservation.demand);
                self.inner().pools.release(self.pool, self.holder());
                self.stage = Stage::Turn { key: None };
                Poll::Ready(Ok(None))
            }
            Err(StoreError::Timeout(_)) if clipped => {
                self.return_grant(grant);
                Poll::Ready(Err(AdmissionError::DeadlineExceeded {
                    phase: Phase::Concurrency,
                    retry_at: None,
                }))
            }
            Err(e) => {
                self.shared.failed(now, &e);
                self.return_grant(grant);
                if self.shared.on_unavailable == Unavailable::FailClosed {
                    SharedStats::count(&self.shared.stats.rejected_unavailable);
                    return Poll::Ready(Err(AdmissionError::QuotaStoreUnavailable {
                        scope: self.scope.id,
                    }));
                }
                // Start over from the local share.
                self.stage = Stage::Turn { key: None };
                Poll::Ready(Ok(None))
            }
        }
    }

    /// The admitted lease.
    fn lease(&mut self, grant: Granted) -> Lease {
        let inner = self.inner();
        {
            let mut st = self.scope.state.lock();
            st.counters.leased(&grant.reservation.demand);
            self.admission.grant_order = st.grants;
            st.grants += 1;
        }
        if self.pool.is_none() {
            inner.pools.hold_unpooled();
        }
        self.stage = Stage::Done;
        Lease {
            inner: Arc::clone(&self.controller.inner),
            scope: self.scope.id,
            reservation: grant.reservation,
            generation: grant.generation,
            admission: self.admission,
            id: self.id.take(),
            pool: self.pool,
            flow: self.flow,
            charged: self.charged,
            released: false,
            reconciled: false,
            remote: (grant.origin == Origin::Remote).then(|| RemoteLease::new(self.quota())),
        }
    }

    /// Gives the turn to the next call in line, saying whether this call
    /// took a reservation with it.
    fn give_turn(&mut self, reserved: bool) {
        if std::mem::replace(&mut self.turn, false) {
            let done = TurnDone {
                flow: self.flow,
                tokens: self.demand.tokens(),
                charged: self.charged,
                reserved,
            };
            // Without a reservation the charge is taken off here.
            if !reserved {
                self.charged = None;
            }
            self.shared.turn.release(done, self.now());
        }
    }

    /// Refunds a grant that will not be leased (SPEC Q-9), exactly once.
    /// Takes the flow's charge for this call's turn off again (FAIR-3): the
    /// reservation of `demand` it paid for is given back whole. Once per
    /// turn: a call that takes a new turn is charged anew.
    fn uncharge(&mut self, demand: &Demand) {
        if let Some(charged) = self.charged.take() {
            self.shared
                .turn
                .correct(self.flow.key(), charged, demand, None);
        }
    }

    fn refund(&mut self, grant: Granted) {
        self.uncharge(&grant.reservation.demand);
        let now = self.now();
        let mut st = self.scope.state.lock();
        if grant.reservation.hold == Hold::Pending {
            st.pending = st.pending.saturating_sub(1);
        }
        st.counters.refunded_reservations += 1;
        match grant.origin {
            Origin::Fallback => st.store.refund(&grant.reservation, now),
            Origin::Remote => {
                drop(st);
                match grant.id {
                    Some(id) => settle::forget(self.shared, self.quota(), id),
                    None => settle::refund(self.shared, self.quota(), grant.reservation),
                }
            }
        }
        if grant.id.is_some() {
            self.let_go();
        }
    }

    /// Refunds a grant whose permit is held, and returns the permit.
    fn return_grant(&mut self, grant: Granted) {
        self.refund(grant);
        self.inner().pools.release(self.pool, self.holder());
    }

    /// Gives back whatever the current stage holds.
    fn release_all(&mut self) {
        let inner = self.inner();
        match std::mem::replace(&mut self.stage, Stage::Done) {
            Stage::Turn { key: Some(key) } => self.shared.turn.cancel(key, self.now()),
            Stage::Reserve { op, permit, id, .. } => {
                // Counted before the permit goes back, so `idle` cannot
                // resolve in between.
                settle::refund_reserved(self.shared, self.quota(), op, id);
                if permit {
                    inner.pools.release(self.pool, self.holder());
                }
            }
            Stage::Permit { grant, key, .. } => {
                self.refund(grant);
                match key {
                    Some(key) => inner.pools.cancel(self.pool, key),
                    None => inner.pools.release(self.pool, self.holder()),
                }
            }
            Stage::Lease { grant, op, .. } => {
                self.uncharge(&grant.reservation.demand);
                {
                    let mut st = self.scope.state.lock();
                    st.pending = st.pending.saturating_sub(1);
                    st.counters.refunded_reservations += 1;
                }
                match grant.id {
                    Some(id) => settle::refund_leasing(self.shared, self.quota(), op, id),
                    // Not reached: only named holds are leased remotely.
                    None => settle::refund(self.shared, self.quota(), grant.reservation),
                }
                inner.pools.release(self.pool, self.holder());
            }
            Stage::Turn { key: None } | Stage::Start | Stage::Sleep { .. } | Stage::Done => {}
        }
        self.give_turn(false);
        // After any refund above was counted as a detached round trip.
        self.let_go();
        if let Some(id) = self.id.take() {
            inner.forget_id(id);
        }
    }

    /// A pending hold of this call is (or may be) in the store: `idle`
    /// and `close` wait until it is leased or given back.
    fn hold(&mut self) {
        if !std::mem::replace(&mut self.holding, true) {
            self.shared.holds.enter();
        }
    }

    /// Nothing of this call is held on the store any more (or its giving
    /// back is counted as a detached round trip).
    fn let_go(&mut self) {
        if std::mem::replace(&mut self.holding, false) {
            self.shared.holds.leave();
        }
    }
}

impl Drop for SharedAcquire<'_> {
    fn drop(&mut self) {
        self.release_all();
    }
}

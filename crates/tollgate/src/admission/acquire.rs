//! The part of an admission that may wait, as one hand-written future.
//!
//! Keeping every waiting stage in one small struct (rather than nested
//! `async fn`s) keeps a queued call's memory small and puts all of its
//! cleanup in a single `Drop`, whatever stage it is dropped in.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::time::Sleep;

use super::controller::{AdmissionController, Entered, Inner};
use super::lease::{Admission, Lease};
use super::pool_set::refused;
use super::scope::{Grant, Needs, Outcome, PermitSlot, Scope};
use super::shared::SharedAcquire;
use crate::call::{Call, CallId};
use crate::clock::Instant;
use crate::deadline::{Deadline, Phase};
use crate::error::AdmissionError;
use crate::flow::Flow;

enum Stage {
    /// Linked in the scope's queue under `key`.
    Queued { key: usize },
    /// Holding a pending reservation and a place in the permit queue (or
    /// the permit itself).
    Permit {
        grant: Grant,
        granted_at: Instant,
        permit: PermitSlot,
    },
    /// Nothing held.
    Done,
}

/// What a successful wait hands to the lease.
pub(crate) struct Admitted {
    pub(crate) grant: Grant,
    pub(crate) admission: Admission,
    pub(crate) id: Option<CallId>,
}

/// The future returned by [`AdmissionController::acquire`].
///
/// Its first poll validates the call and takes the fast path when nobody
/// waits on the scope and quota and a permit are free; otherwise it waits
/// in the scope's queue and for a permit. See
/// [`AdmissionController::acquire`] for cancel safety.
#[must_use = "futures do nothing unless polled"]
pub struct Acquire<'a> {
    controller: &'a AdmissionController,
    state: State<'a>,
}

/// Where an admission is: the call is only needed until the first poll,
/// so it shares its room with the waiting part (a queued call's memory).
pub(crate) enum State<'a> {
    /// Not polled yet.
    Start { call: Call, deadline: Deadline },
    /// Waiting on an in-process scope.
    Slow(SlowAcquire<'a>),
    /// The waiting part on a scope kept in a shared store.
    Shared(Box<SharedAcquire<'a>>),
    /// Finished.
    Done,
}

impl<'a> Acquire<'a> {
    pub(crate) fn new(controller: &'a AdmissionController, call: Call, deadline: Deadline) -> Self {
        Acquire {
            controller,
            state: State::Start { call, deadline },
        }
    }
}

impl std::fmt::Debug for Acquire<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = match self.state {
            State::Start { .. } => "start",
            State::Slow(_) | State::Shared(_) => "waiting",
            State::Done => "done",
        };
        f.debug_struct("Acquire").field("state", &state).finish()
    }
}

impl Future for Acquire<'_> {
    type Output = Result<Lease, AdmissionError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        if let State::Start { call, deadline } = this.state {
            this.state = State::Done;
            let done = this.controller.start(&call, deadline, &mut this.state);
            if done.is_ready() {
                return done;
            }
        }
        match &mut this.state {
            State::Shared(shared) => {
                let done = std::task::ready!(shared.poll(cx));
                this.state = State::Done;
                Poll::Ready(done)
            }
            State::Slow(slow) => {
                let admitted = std::task::ready!(slow.poll(cx));
                let result = admitted.map(|a| this.controller.admit(slow, a));
                this.state = State::Done;
                Poll::Ready(result)
            }
            State::Start { .. } | State::Done => Poll::Ready(Err(AdmissionError::Closed)),
        }
    }
}

/// The waiting part of an admission.
///
/// # Cancel safety
///
/// Dropping it at any point leaves nothing behind: a queue entry is removed
/// (the next call is armed if it was the head), an uncollected or pending
/// reservation is refunded in full exactly once (SPEC Q-9), a permit handed
/// to it but not yet taken passes on, and its id is released.
pub(crate) struct SlowAcquire<'a> {
    inner: &'a Inner,
    scope: &'a Scope,
    pool: Option<u32>,
    flow: Flow,
    /// What the call lacks (judged again if a cooldown sends it back).
    lacks: Needs,
    deadline: Deadline,
    arrived: Instant,
    stage: Stage,
    admission: Admission,
    id: Option<CallId>,
    /// One timer for the head's refill instant and the deadline, created
    /// only when needed.
    timer: Option<Pin<Box<Sleep>>>,
}

impl<'a> SlowAcquire<'a> {
    pub(crate) fn scope(&self) -> &'a Scope {
        self.scope
    }

    pub(crate) fn pool(&self) -> Option<u32> {
        self.pool
    }

    pub(crate) fn flow(&self) -> Flow {
        self.flow
    }

    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        inner: &'a Inner,
        scope: &'a Scope,
        pool: Option<u32>,
        flow: Flow,
        lacks: Needs,
        deadline: Deadline,
        arrived: Instant,
        entered: Entered,
        id: Option<CallId>,
        admission: Admission,
    ) -> Self {
        let mut this = SlowAcquire {
            inner,
            scope,
            pool,
            flow,
            lacks,
            deadline,
            arrived,
            stage: Stage::Done,
            admission,
            id,
            timer: None,
        };
        this.stage = this.stage_for(entered, arrived);
        this
    }

    /// The stage after entering the scope. `Entered::Leased` never gets
    /// here: the caller turns it into a lease at once.
    fn stage_for(&mut self, entered: Entered, now: Instant) -> Stage {
        match entered {
            Entered::Queued(key) => Stage::Queued { key },
            Entered::Granted(grant, permit) => {
                self.admission.quota_wait = now - self.arrived;
                Stage::Permit {
                    grant,
                    granted_at: now,
                    permit,
                }
            }
            Entered::Leased(grant) => {
                self.admission.quota_wait = now - self.arrived;
                Stage::Permit {
                    grant,
                    granted_at: now,
                    permit: PermitSlot::Held,
                }
            }
        }
    }

    /// Polls the shared timer armed for `at`. `Ready` when it fired.
    fn poll_timer(&mut self, cx: &mut Context<'_>, at: Instant) -> Poll<()> {
        poll_timer(&mut self.timer, cx, at)
    }

    pub(crate) fn poll(&mut self, cx: &mut Context<'_>) -> Poll<Result<Admitted, AdmissionError>> {
        loop {
            let step = match self.stage {
                Stage::Queued { key } => self.poll_queue(cx, key),
                Stage::Permit { .. } => self.poll_permit(cx),
                Stage::Done => return Poll::Ready(Err(AdmissionError::Closed)),
            };
            match step {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Err(e)) => {
                    self.release_all();
                    return Poll::Ready(Err(e));
                }
                Poll::Ready(Ok(Some(grant))) => {
                    self.stage = Stage::Done;
                    return Poll::Ready(Ok(Admitted {
                        grant,
                        admission: self.admission,
                        id: self.id.take(),
                    }));
                }
                // Moved to another stage: go on.
                Poll::Ready(Ok(None)) => {}
            }
        }
    }

    /// Waiting in the queue (SPEC ADM-4, Q-4, Q-11).
    fn poll_queue(
        &mut self,
        cx: &mut Context<'_>,
        key: usize,
    ) -> Poll<Result<Option<Grant>, AdmissionError>> {
        loop {
            let now = self.inner.clock.now();
            let mut guard = self.scope.state.lock();
            let st = &mut *guard;
            let Some(w) = st.queue.get_mut(key) else {
                self.stage = Stage::Done;
                return Poll::Ready(Err(AdmissionError::Closed));
            };
            if !matches!(w.outcome, Outcome::Waiting) {
                self.admission.limited_by = self.admission.limited_by.union(w.limited_by);
                self.admission.cooldown |= w.waited_for_cooldown;
                let grant = w.grant();
                let outcome_kind = w.outcome;
                st.queue.remove(key);
                drop(guard);
                self.stage = Stage::Done;
                let Some((grant, permit)) = grant else {
                    return Poll::Ready(Err(match outcome_kind {
                        Outcome::PoolFull => AdmissionError::PoolFull {
                            pool: crate::call::PoolId(self.pool.unwrap_or(0)),
                        },
                        Outcome::Displaced => AdmissionError::QueueFull {
                            scope: self.scope.id,
                        },
                        Outcome::Unfit(e) => AdmissionError::EstimateExceedsLimit(e),
                        Outcome::Lacking(missing) => missing.error(self.scope.id),
                        _ => AdmissionError::Closed,
                    }));
                };
                self.stage = self.stage_for(Entered::Granted(grant, permit), now);
                return Poll::Ready(Ok(None));
            }
            let is_head = st.queue.is_head(key);
            let mut phase = Phase::Queue;
            let mut wake_at = self.deadline.instant();
            if is_head {
                let cooling = st.cooldown.active(now);
                phase = if cooling.is_some() {
                    Phase::Cooldown
                } else {
                    Phase::Rate
                };
                if let Some(t) = st.ready_at {
                    if t <= now {
                        st.drain(now);
                        continue;
                    }
                    // it cannot be admitted in time; say so now, as
                    // a budget refusal only when a budget is what binds
                    // now (BUD-4), not when one once held it back.
                    let demand = st
                        .queue
                        .get(key)
                        .filter(|w| w.limited_by.cost)
                        .map(|w| w.demand());
                    let budget = demand
                        .is_some_and(|d| self.inner.budget_binds(st, &d, now, self.deadline))
                        .then_some(self.scope.id);
                    if let Err(e) = self.inner.verdict(t, now, self.deadline, cooling, budget) {
                        st.abandon(key, now);
                        self.stage = Stage::Done;
                        return Poll::Ready(Err(e));
                    }
                    wake_at = Some(wake_at.map_or(t, |d| d.min(t)));
                } else if let Some(t) = st.recheck_at {
                    // No instant to judge by, but one to look again
                    // at: a provisional stand-in's unit ages out.
                    if t <= now {
                        st.drain(now);
                        continue;
                    }
                    wake_at = Some(wake_at.map_or(t, |d| d.min(t)));
                }
            }
            if is_head {
                st.head_armed = st.ready_at.or(st.recheck_at);
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
            if self.poll_timer(cx, at).is_pending() {
                return Poll::Pending;
            }
            let now = self.inner.clock.now();
            if self.deadline.is_expired(now) {
                let mut st = self.scope.state.lock();
                // A result that landed first is collected (LC-6); a grant
                // collected now is given back by the permit stage, which
                // starts nothing after the deadline (DL-5).
                if st
                    .queue
                    .get(key)
                    .is_some_and(|w| !matches!(w.outcome, Outcome::Waiting))
                {
                    continue;
                }
                let retry_at = if is_head { st.ready_at } else { None };
                st.abandon(key, now);
                drop(st);
                self.stage = Stage::Done;
                return Poll::Ready(Err(AdmissionError::DeadlineExceeded { phase, retry_at }));
            }
        }
    }

    /// Holding a reservation, waiting for a concurrency permit (ADM-1).
    fn poll_permit(&mut self, cx: &mut Context<'_>) -> Poll<Result<Option<Grant>, AdmissionError>> {
        let Stage::Permit {
            grant,
            granted_at,
            permit,
        } = &mut self.stage
        else {
            return Poll::Ready(Ok(None));
        };
        let (grant, granted_at) = (*grant, *granted_at);
        if let (PermitSlot::Queued(key), Some(entry)) = (*permit, self.inner.pools.get(self.pool)) {
            self.admission.concurrency = true;
            let mut waiter = Some(key as usize);
            let polled = entry.permits.poll_acquire(cx, &mut waiter);
            // Once `poll_acquire` is ready the key is spent either way.
            match polled {
                Poll::Ready(Ok(())) => *permit = PermitSlot::Held,
                Poll::Ready(Err(why)) => {
                    self.stage = Stage::Done;
                    let now = self.inner.clock.now();
                    self.scope.state.lock().refund_pending(&grant, now);
                    return Poll::Ready(Err(refused(why, self.pool)));
                }
                Poll::Pending => {
                    // The pool's own maximum wait is a local cap on this
                    // phase, clipped by the deadline (SPEC POOL-3, DL-4).
                    let local = entry.max_wait.get().and_then(|w| granted_at.checked_add(w));
                    let until = match (local, self.deadline.instant()) {
                        (Some(l), Some(d)) => Some(l.min(d)),
                        (l, d) => l.or(d),
                    };
                    return self.poll_permit_until(cx, until);
                }
            }
        }
        // The permit is ours: from here on it must reach a lease or go back.
        self.stage = Stage::Done;
        let now = self.inner.clock.now();
        self.admission.concurrency_wait += now - granted_at;
        if self.deadline.is_expired(now) {
            // Handed over in time but collected after the deadline: no
            // lease, so no provider work starts late (SPEC DL-5, DL-6);
            // the reservation, never leased, goes back in full with the
            // permit.
            let mut st = self.scope.state.lock();
            st.return_permit(self.pool, PermitSlot::Held, grant.flow);
            st.refund_pending(&grant, now);
            return Poll::Ready(Err(self.admission.collected_late()));
        }
        // The demand travels in its grant (no copy in this future: every
        // queued waiter's task holds one).
        let demand = grant.reservation.demand;
        match self.inner.finish(self.scope, grant, self.pool, now) {
            Err(e) => Poll::Ready(Err(e)),
            Ok(Some(grant)) => Poll::Ready(Ok(Some(grant))),
            Ok(None) => {
                // Preempted by a cooldown (SPEC CD-3): back to the tail.
                self.admission.preemptions += 1;
                self.admission.cooldown = true;
                let ticket = &mut self.admission.ticket;
                match self.inner.enter(
                    self.scope,
                    &demand,
                    self.pool,
                    self.flow,
                    self.lacks,
                    self.deadline,
                    now,
                    ticket,
                )? {
                    // Reserved and permitted at once: the fast path again.
                    Entered::Leased(grant) => Poll::Ready(Ok(Some(grant))),
                    entered => {
                        self.stage = self.stage_for(entered, now);
                        Poll::Ready(Ok(None))
                    }
                }
            }
        }
    }

    fn poll_permit_until(
        &mut self,
        cx: &mut Context<'_>,
        until: Option<Instant>,
    ) -> Poll<Result<Option<Grant>, AdmissionError>> {
        let Some(at) = until else {
            return Poll::Pending;
        };
        if at > self.inner.clock.now() && self.poll_timer(cx, at).is_pending() {
            return Poll::Pending;
        }
        Poll::Ready(Err(AdmissionError::DeadlineExceeded {
            phase: Phase::Concurrency,
            retry_at: None,
        }))
    }

    /// Gives back whatever the current stage holds.
    fn release_all(&mut self) {
        match std::mem::replace(&mut self.stage, Stage::Done) {
            Stage::Queued { key } => {
                let now = self.inner.clock.now();
                self.scope.state.lock().abandon(key, now);
            }
            Stage::Permit { grant, permit, .. } => {
                let now = self.inner.clock.now();
                let mut st = self.scope.state.lock();
                st.return_permit(self.pool, permit, grant.flow);
                st.refund_pending(&grant, now);
            }
            Stage::Done => {}
        }
        if let Some(id) = self.id.take() {
            self.inner.forget_id(id);
        }
    }
}

/// Polls the one timer of a waiting admission, created or moved to `at`
/// as needed. `Ready` when it fired.
pub(crate) fn poll_timer(
    timer: &mut Option<Pin<Box<Sleep>>>,
    cx: &mut Context<'_>,
    at: Instant,
) -> Poll<()> {
    let timer = timer.get_or_insert_with(|| Box::pin(tokio::time::sleep_until(at)));
    if timer.deadline() != at {
        timer.as_mut().reset(at);
    }
    timer.as_mut().poll(cx)
}

impl Drop for SlowAcquire<'_> {
    fn drop(&mut self) {
        self.release_all();
    }
}

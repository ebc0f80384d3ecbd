//! Settling what a shared store holds (SPEC, DQ-5,
//! DQ-6).
//!
//! Settlement methods of a [`Lease`](crate::Lease) are synchronous and the
//! engine never blocks on the network, so every operation on a shared
//! store that settles something runs as a detached task bounded by the
//! store's timeout. Each is named once ([`OpId`]) and tried up to
//! [`ATTEMPTS`] times under that name until the store answers: the store
//! applies a named operation once, so a retry after an attempt that landed
//! but whose answer was lost changes nothing (DQ-6). A pending hold is
//! given back by its own id, which only the first attempt that lands finds.
//! What an operation that never landed would have changed stays as it was:
//! amounts stay counted (never over a quota), debt goes unrecorded (logged),
//! and the failure is counted (`ScopeCounters::settlements_failed`); a
//! recount that never lands leaves the amount counted from the lease
//! instant instead of the provider's (SPEC Q-15 then holds only as well as
//! the lease instant approximates the provider's count).
//!
//! Every task runs through the scope's [`Detached`](super::detached)
//! count, so `close` and `idle` wait for them.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::task::JoinHandle;

use super::scope::{SharedScope, SharedStats};
use crate::admission::controller::Inner;
use crate::admission::fair::Charged;
use crate::call::ScopeId;
use crate::clock::Instant;
use crate::flow::Flow;
use crate::quota::{
    Actual, BudgetReport, Dimension, ForeignSettlement, HoldId, NotUntil, OpId, RemoteQuota,
    Reservation, StoreError, StoreFuture,
};
use crate::usage::{Settlement, Usage};

/// Attempts of one settlement (under one name) before giving up.
const ATTEMPTS: u32 = 3;
/// Pause between two attempts.
const BACKOFF: Duration = Duration::from_millis(5);

/// A reservation round trip in flight.
pub(crate) type ReserveOp = StoreFuture<'static, Result<Result<Reservation, NotUntil>, StoreError>>;
/// A lease round trip in flight.
pub(crate) type LeaseOp = StoreFuture<'static, Result<Option<Reservation>, StoreError>>;

/// The store's handle a reservation was taken with (see
/// [`SharedScope::remote`]).
pub(crate) type Quota = Arc<dyn RemoteQuota>;

/// The settlements of one lease kept in a shared store, applied in the
/// order they were made: each task waits for the one before and starts
/// from the reservation as that one left it (a recount restamps it).
/// Every one goes through the handle the reservation was taken with, and
/// through the later handles whose added limits count it (see
/// [`Settling`]).
#[derive(Debug)]
pub(crate) struct RemoteLease {
    last: Option<JoinHandle<Settling>>,
    quota: Quota,
}

/// A lease's reservation as its settlements so far leave it.
#[derive(Debug, Clone)]
pub(crate) struct Settling {
    /// Where the store counts it (a recount restamps it).
    r: Reservation,
    /// The handles installed by reloads after the lease whose added
    /// limits took the reservation as their own, in the order they did:
    /// it was recounted there to the reload's instant or later (SPEC
    /// Q-15, GW-15). They then settle it as the reservation's own handle
    /// does, each on the limits it added beside the handles before it
    /// (one per reload it was recounted after, so the limits of a reload
    /// that changed none never keep those of a later one from taking it);
    /// the limits of a later handle still count it as one from before
    /// them (debt only).
    adopted: Vec<Quota>,
}

impl Settling {
    /// The names of every limit that counts the reservation as its own:
    /// those of the handle it was taken with (`quota`) and of the handles
    /// that adopted it.
    fn counted_in(&self, quota: &Quota) -> Vec<String> {
        self.counted_before(quota, self.adopted.len())
    }

    /// The names of the limits of `quota` and of the first `n` handles
    /// that adopted the reservation: those an adopting handle's own
    /// settlement leaves out.
    fn counted_before(&self, quota: &Quota, n: usize) -> Vec<String> {
        let mut names = quota.limit_names();
        for adopted in &self.adopted[..n] {
            names.extend(adopted.limit_names());
        }
        names
    }

    /// Whether `handle` counts the reservation as its own: the handle it
    /// was taken with (`quota`) or one that adopted it.
    fn counts(&self, quota: &Quota, handle: &Quota) -> bool {
        Arc::ptr_eq(handle, quota) || self.adopted.iter().any(|a| Arc::ptr_eq(a, handle))
    }
}

impl RemoteLease {
    pub(crate) fn new(quota: Quota) -> Self {
        RemoteLease { last: None, quota }
    }

    fn then<F, Fut>(&mut self, shared: &Arc<SharedScope>, reservation: Reservation, op: F)
    where
        F: FnOnce(Arc<SharedScope>, Quota, Settling) -> Fut + Send + 'static,
        Fut: Future<Output = Settling> + Send + 'static,
    {
        let prev = self.last.take();
        let owned = Arc::clone(shared);
        let quota = Arc::clone(&self.quota);
        let task = async move {
            let fresh = Settling {
                r: reservation,
                adopted: Vec::new(),
            };
            let settling = match prev {
                Some(prev) => prev.await.unwrap_or(fresh),
                None => fresh,
            };
            seed_current(&owned, &quota).await;
            op(owned, quota, settling).await
        };
        self.last = shared.detached.spawn_settlement(&shared.room, task);
        if self.last.is_none() {
            SharedStats::count(&shared.stats.settlements_failed);
        }
    }
}

/// Runs one store operation; `None` when it failed. A failure is counted
/// but does not make the store unavailable: one slow settlement is no
/// outage, and reservations find out by themselves (SPEC DQ-3).
async fn attempt<T>(shared: &SharedScope, op: StoreFuture<'_, Result<T, StoreError>>) -> Option<T> {
    match op.await {
        Ok(value) => {
            shared.answered();
            Some(value)
        }
        Err(e) => {
            shared.detached_failed(&e);
            None
        }
    }
}

/// Runs the operation `op` makes, up to [`ATTEMPTS`] times until the store
/// answers; `None` when no attempt did. `op` must name the operation the
/// same way on every attempt (SPEC DQ-6).
async fn retried<'a, T>(
    shared: &'a SharedScope,
    quota: &'a dyn RemoteQuota,
    op: impl Fn(&'a dyn RemoteQuota) -> StoreFuture<'a, Result<T, StoreError>>,
) -> Option<T> {
    for n in 0..ATTEMPTS {
        if n > 0 {
            tokio::time::sleep(BACKOFF).await;
        }
        if let Some(answer) = attempt(shared, op(quota)).await {
            return Some(answer);
        }
    }
    None
}

/// Before a settlement through `quota`, a handle a reload has replaced
/// since: the limits of the current one seeded from the old ones take
/// their seed first (SPEC GW-15), so it holds what the old ones count of
/// the reservation, as the in-process store seeds at the reload; the
/// settlement then changes the old limits only, as in process (the new
/// one took it as a call from before it). One round trip, until the
/// current handle has seeded. Not landed: counted as a store error, and
/// the settlement goes ahead.
async fn seed_current(shared: &SharedScope, quota: &Quota) {
    let current = shared.remote();
    if !Arc::ptr_eq(&current, quota) {
        attempt(shared, current.seed(shared.timeout)).await;
    }
}

/// Counts a settlement that did not land, or wakes the turn's holder when
/// room came back.
fn landed(shared: &SharedScope, done: bool) {
    if done {
        shared.wake();
    } else {
        SharedStats::count(&shared.stats.settlements_failed);
    }
}

/// Runs `task` detached on `shared`'s count; a task that cannot start
/// (outside a runtime) is a settlement that did not land.
fn detach(shared: &Arc<SharedScope>, task: impl Future<Output = ()> + Send + 'static) {
    if shared
        .detached
        .spawn_settlement(&shared.room, task)
        .is_none()
    {
        SharedStats::count(&shared.stats.settlements_failed);
    }
}

/// Refunds a leased reservation whose attempt never started (SPEC Q-9),
/// detached.
pub(crate) fn refund(shared: &Arc<SharedScope>, quota: Quota, reservation: Reservation) {
    let owned = Arc::clone(shared);
    detach(shared, async move {
        refund_now(&owned, &quota, reservation).await;
    });
}

async fn refund_now(shared: &SharedScope, quota: &Quota, reservation: Reservation) {
    seed_current(shared, quota).await;
    let op = OpId::new();
    let timeout = shared.timeout;
    let done = retried(shared, &**quota, |remote| {
        remote.refund(reservation, op, timeout)
    })
    .await;
    landed(shared, done.is_some());
}

/// Gives back pending hold `id` (SPEC Q-9), detached.
pub(crate) fn forget(shared: &Arc<SharedScope>, quota: Quota, id: HoldId) {
    let owned = Arc::clone(shared);
    detach(shared, async move {
        forget_now(&owned, &quota, id).await;
    });
}

async fn forget_now(shared: &SharedScope, quota: &Quota, id: HoldId) {
    let timeout = shared.timeout;
    // Not landed: the store lets the hold expire.
    let done = retried(shared, &**quota, |remote| remote.forget(id, timeout)).await;
    landed(shared, done.is_some());
}

/// A call gave up while its reservation was in flight: whatever the store
/// grants it is given back once the answer arrives (SPEC Q-9); a pending
/// hold (`id`) is given back by its id even if no answer arrives.
pub(crate) fn refund_reserved(
    shared: &Arc<SharedScope>,
    quota: Quota,
    op: ReserveOp,
    id: Option<HoldId>,
) {
    let owned = Arc::clone(shared);
    detach(shared, async move {
        let answer = op.await;
        match (answer, id) {
            (Ok(Err(_)), _) => {}
            (Ok(Ok(_)), Some(id)) => {
                SharedStats::count(&owned.stats.refunded_in_flight);
                forget_now(&owned, &quota, id).await;
            }
            (Ok(Ok(reservation)), None) => {
                SharedStats::count(&owned.stats.refunded_in_flight);
                refund_now(&owned, &quota, reservation).await;
            }
            (Err(_), Some(id)) => forget_now(&owned, &quota, id).await,
            // A leased reservation whose answer was lost ages out with
            // its windows (counted, never over a quota).
            (Err(_), None) => {}
        }
    });
}

/// A call gave up while its pending hold `id` was being leased: a lease
/// that landed is refunded, an unknown outcome is given back by id (a no-op
/// if the lease did land: then the leased amount ages out).
pub(crate) fn refund_leasing(shared: &Arc<SharedScope>, quota: Quota, op: LeaseOp, id: HoldId) {
    let owned = Arc::clone(shared);
    detach(shared, async move {
        match op.await {
            Ok(Some(leased)) => refund_now(&owned, &quota, leased).await,
            Ok(None) => {}
            Err(_) => forget_now(&owned, &quota, id).await,
        }
    });
}

/// Runs `settlement` of reservation `r` through `through`, a handle a
/// reload installed after `r` was taken, on its limits that `earlier`
/// does not name (SPEC GW-15); whether it landed. A failure is counted
/// and logged.
async fn settle_added(
    shared: &SharedScope,
    through: &Quota,
    earlier: Vec<String>,
    r: Reservation,
    settlement: ForeignSettlement,
) -> bool {
    let (op, timeout) = (OpId::new(), shared.timeout);
    let done = retried(shared, &**through, |remote| {
        remote.settle_foreign(earlier.clone(), r, settlement, op, timeout)
    })
    .await;
    if done.is_none() {
        SharedStats::count(&shared.stats.settlements_failed);
        tracing::warn!(
            ?settlement,
            "settlement of a call in flight at a reload not recorded in the limits it added"
        );
    }
    done.is_some()
}

/// A reservation settled to `actual` through `quota` after a reload
/// installed another handle (SPEC GW-15, Q-5, BUD-2), as the in-process
/// store's limits settle a reservation from before their start: the
/// limits of the handles that adopted it (see [`Settling`]) settle it as
/// their own; those the current handle added besides take what the call
/// used beyond its estimate (`debt`), from the reservation's instant.
/// The kept limits were settled through `quota` already and are not
/// named here. A lease that saw no reload stops at the pointer
/// comparisons.
async fn reconcile_added(
    shared: &SharedScope,
    quota: &Quota,
    settling: &Settling,
    actual: Actual,
    debt: bool,
) {
    if !debt && settling.adopted.is_empty() {
        return;
    }
    let r = settling.r;
    for (n, adopted) in settling.adopted.iter().enumerate() {
        let settlement = ForeignSettlement::Reconcile(actual);
        let earlier = settling.counted_before(quota, n);
        if settle_added(shared, adopted, earlier, r, settlement).await {
            shared.wake();
        }
    }
    let current = shared.remote();
    if debt && !settling.counts(quota, &current) {
        let earlier = settling.counted_in(quota);
        settle_added(
            shared,
            &current,
            earlier,
            r,
            ForeignSettlement::Debt(actual),
        )
        .await;
    }
}

/// The limits reloads added since reservation `s` was taken through
/// `quota`, after its recount there to `moved` (SPEC Q-15, GW-15): those
/// of the handles that adopted it move it as their own; those of the
/// handle current at the recount (`current`), unless they counted it
/// already, count its estimate at `moved` and adopt it when the recount
/// came at the reload's instant or later (`after`).
async fn recount_added(
    shared: &SharedScope,
    quota: &Quota,
    s: Settling,
    moved: Reservation,
    (current, after): (Quota, bool),
) -> Settling {
    for (n, adopted) in s.adopted.iter().enumerate() {
        let settlement = ForeignSettlement::Move { from: s.r.tick };
        let earlier = s.counted_before(quota, n);
        settle_added(shared, adopted, earlier, moved, settlement).await;
    }
    if s.counts(quota, &current) {
        return Settling { r: moved, ..s };
    }
    let earlier = s.counted_in(quota);
    let settlement = ForeignSettlement::Recount { adopts: after };
    let recounted = settle_added(shared, &current, earlier, moved, settlement);
    // Adopted only where the estimate is counted: a later settlement
    // there finds it at `moved`.
    let adopt = recounted.await && after;
    let mut adopted = s.adopted;
    if adopt {
        adopted.push(current);
    }
    Settling { r: moved, adopted }
}

impl Inner {
    fn shared_scope(&self, scope: ScopeId) -> Option<&Arc<SharedScope>> {
        self.scopes.get(scope.index())?.shared.as_ref()
    }

    /// [`Lease::reconcile`](crate::Lease::reconcile) of a reservation kept
    /// in a shared store (SPEC Q-5).
    pub(crate) fn reconcile_shared(
        &self,
        scope: ScopeId,
        reservation: &Reservation,
        usage: Usage,
        charged: Option<(Flow, Charged)>,
        remote: &mut RemoteLease,
    ) -> Settlement {
        let settlement = Settlement::new(&reservation.demand, usage);
        let (Some(s), Some(shared)) = (self.scopes.get(scope.index()), self.shared_scope(scope))
        else {
            return settlement;
        };
        s.state.lock().counters.settle(&settlement);
        let Some(actual) = Actual::settling(&usage, &reservation.demand) else {
            return settlement;
        };
        if let Some((flow, charged)) = charged {
            shared
                .turn
                .correct(flow.key(), charged, &reservation.demand, Some(&actual));
        }
        let debt = actual.debt(&reservation.demand);
        if !debt && !actual.refunds(&reservation.demand) {
            return settlement;
        }
        remote.then(shared, *reservation, move |shared, quota, s| async move {
            let (op, timeout, r) = (OpId::new(), shared.timeout, s.r);
            let done = retried(&shared, &*quota, |remote| {
                remote.reconcile(r, actual, op, timeout)
            })
            .await;
            landed(&shared, done.is_some());
            if done.is_none() && debt {
                tracing::warn!(
                    debt = actual.tokens.saturating_sub(r.demand.tokens()),
                    "token debt not recorded in the quota store"
                );
            }
            reconcile_added(&shared, &quota, &s, actual, debt).await;
            s
        });
        settlement
    }

    /// [`Lease::refused`](crate::Lease::refused) of a reservation kept in a
    /// shared store (SPEC Q-16).
    pub(crate) fn release_refused_shared(
        &self,
        scope: ScopeId,
        reservation: &Reservation,
        requests: bool,
        tokens: bool,
        remote: &mut RemoteLease,
    ) {
        let (Some(s), Some(shared)) = (self.scopes.get(scope.index()), self.shared_scope(scope))
        else {
            return;
        };
        s.state
            .lock()
            .counters
            .refused(&reservation.demand, requests || tokens);
        remote.then(shared, *reservation, move |shared, quota, s| async move {
            let (op, timeout, r) = (OpId::new(), shared.timeout, s.r);
            let done = retried(&shared, &*quota, |remote| {
                remote.release(r, requests, tokens, op, timeout)
            })
            .await;
            landed(&shared, done.is_some());
            // A limit a reload added gives back only a reservation it
            // took as its own (SPEC GW-15, Q-16).
            for (n, adopted) in s.adopted.iter().enumerate() {
                let settlement = ForeignSettlement::Release { requests, tokens };
                let earlier = s.counted_before(&quota, n);
                if settle_added(&shared, adopted, earlier, r, settlement).await {
                    shared.wake();
                }
            }
            s
        });
    }

    /// [`Lease::counted_by`](crate::Lease::counted_by) of a reservation
    /// kept in a shared store (SPEC Q-15): the store counts it until one
    /// window after `at`, measured back from the store's own now.
    ///
    /// After a reload, the limits it added count it too, as the
    /// in-process store's limits count a reservation from before their
    /// start (SPEC GW-15): the estimate from `at` on, and, `at` being the
    /// reload's instant or later, as their own from then on (a later
    /// settlement moves it there as where it was counted). Whether the
    /// recount follows the reload is judged now, as in process.
    pub(crate) fn recount_shared(
        &self,
        scope: ScopeId,
        reservation: &Reservation,
        at: Instant,
        remote: &mut RemoteLease,
    ) {
        let Some(shared) = self.shared_scope(scope) else {
            return;
        };
        let (current, since) = shared.current();
        remote.then(shared, *reservation, move |shared, quota, s| async move {
            // An instant still ahead (an attempt cancelled before its
            // arrival bound, SPEC Q-15): the store counts from its own
            // now, so the recount waits for it (a bound is a fraction of
            // a second; the lease's later settlements wait behind it).
            let ahead = at.saturating_duration_since(shared.clock.now());
            if !ahead.is_zero() {
                tokio::time::sleep(ahead).await;
            }
            let (op, timeout, r) = (OpId::new(), shared.timeout, s.r);
            let moved = retried(&shared, &*quota, |remote| {
                let ago = shared.clock.now().saturating_duration_since(at);
                remote.recount(r, ago, op, timeout)
            });
            let Some(moved) = moved.await else {
                SharedStats::count(&shared.stats.settlements_failed);
                return s;
            };
            // Not moved: nothing moves anywhere, as in process.
            if moved.tick == r.tick {
                return Settling { r: moved, ..s };
            }
            recount_added(&shared, &quota, s, moved, (current, at >= since)).await
        });
    }

    /// A provider's budget reports in the answer to a reservation kept in
    /// a shared store (SPEC Q-14, DQ-9): the store compares them with its
    /// log of every process's sends and counts what others hold in the
    /// shared window, after the reservation's recount (the store then
    /// counts it where the provider did). The units taken show in the
    /// scope's counters when the store answers.
    pub(crate) fn observe_shared(
        &self,
        scope: ScopeId,
        reports: Vec<BudgetReport>,
        reservation: &Reservation,
        at: Instant,
        remote: &mut RemoteLease,
    ) {
        let Some(shared) = self.shared_scope(scope) else {
            return;
        };
        if reports.iter().all(|r| r.remaining.is_none()) {
            return;
        }
        let leased = *reservation;
        remote.then(shared, *reservation, move |shared, quota, s| async move {
            let (op, timeout, r) = (OpId::new(), shared.timeout, s.r);
            // `r` as the recount left it: where the store counts it now.
            let observed = retried(&shared, &*quota, |remote| {
                let ago = shared.clock.now().saturating_duration_since(at);
                remote.observe(reports.clone(), (leased, r), ago, op, timeout)
            })
            .await;
            let Some(observed) = observed else {
                SharedStats::count(&shared.stats.settlements_failed);
                return s;
            };
            let mut freed = false;
            for (report, o) in reports.iter().zip(&observed) {
                let counter = match report.dimension {
                    Dimension::Requests => &shared.stats.gap_requests,
                    _ => &shared.stats.gap_tokens,
                };
                counter.fetch_add(o.gap, Ordering::Relaxed);
                freed |= o.freed > 0;
            }
            if freed {
                shared.wake();
            }
            s
        });
    }
}

/// A provider 429 answered a reservation kept in a shared store, and this
/// process started its cooldown `generation`, `length` long (SPEC CD-1,
/// DQ-9): the store pauses every process's reservations as long, unless a
/// cooldown that began after the attempt was leased runs there (CD-2:
/// another process's, which this one did not know of). This process's
/// cooldown then follows the store's answer: shortened (and the waiter
/// woken) when the store held the 429 stale, lengthened when a longer one
/// runs there. Detached; a failure leaves the other processes to meet the
/// 429 for themselves.
pub(crate) fn cool_down(
    inner: &Arc<Inner>,
    scope: ScopeId,
    reservation: &Reservation,
    (generation, length): (u64, Duration),
) {
    let Some(shared) = inner.shared_scope(scope) else {
        return;
    };
    let quota = shared.remote();
    let (owned, engine, answered) = (Arc::clone(shared), Arc::clone(inner), *reservation);
    detach(shared, async move {
        let (op, timeout) = (OpId::new(), owned.timeout);
        let left = retried(&owned, &*quota, |remote| {
            remote.cool_down(answered, length, op, timeout)
        })
        .await;
        let Some(left) = left else {
            SharedStats::count(&owned.stats.settlements_failed);
            return;
        };
        let Some(s) = engine.scopes.get(scope.index()) else {
            return;
        };
        let now = engine.clock.now();
        let mut st = s.state.lock();
        if st.cooldown.generation != generation {
            return;
        }
        let until = left.and_then(|l| now.checked_add(l));
        let shorter = match (until, st.cooldown.until) {
            (Some(u), Some(running)) => u < running,
            (None, running) => running.is_some(),
            (Some(_), None) => false,
        };
        st.cooldown.until = until;
        drop(st);
        if shorter {
            owned.wake();
        }
    });
}

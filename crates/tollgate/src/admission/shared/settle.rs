//! Settling what a shared store holds (SPEC, DQ-5).
//!
//! Settlement methods of a [`Lease`](crate::Lease) are synchronous and the
//! engine never blocks on the network, so every operation on a shared
//! store that settles something runs as a detached task bounded by the
//! store's timeout. What a failed operation would have changed stays as it
//! was: amounts stay counted (never over a quota), and the failure is
//! counted (`ScopeCounters::settlements_failed`). Two exceptions are
//! written down where they happen: debt (usage above the estimate) is
//! retried, because losing it would let the scope admit more than its
//! limit; and a recount that fails leaves the amount counted from the
//! lease instant instead of the provider's (SPEC Q-15 then holds only as
//! well as the lease instant approximates the provider's count).

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinHandle;

use super::scope::{SharedScope, SharedStats};
use crate::admission::controller::Inner;
use crate::call::ScopeId;
use crate::clock::Instant;
use crate::quota::{NotUntil, Reservation, StoreError, StoreFuture};
use crate::usage::{Settlement, Usage};

/// Attempts to record debt (usage above the estimate) before giving up.
const DEBT_ATTEMPTS: u32 = 3;
/// Pause between two attempts to record debt.
const DEBT_BACKOFF: Duration = Duration::from_millis(5);

/// A reservation round trip in flight.
pub(crate) type ReserveOp = StoreFuture<'static, Result<Result<Reservation, NotUntil>, StoreError>>;
/// A lease round trip in flight.
pub(crate) type LeaseOp = StoreFuture<'static, Result<Reservation, StoreError>>;

/// The settlements of one lease kept in a shared store, applied in the
/// order they were made: each task waits for the one before and starts
/// from the reservation as that one left it (a recount restamps it).
#[derive(Debug, Default)]
pub(crate) struct RemoteLease {
    last: Option<JoinHandle<Reservation>>,
}

impl RemoteLease {
    fn then<F, Fut>(&mut self, shared: &Arc<SharedScope>, reservation: Reservation, op: F)
    where
        F: FnOnce(Arc<SharedScope>, Reservation) -> Fut + Send + 'static,
        Fut: Future<Output = Reservation> + Send + 'static,
    {
        let prev = self.last.take();
        let owned = Arc::clone(shared);
        let task = async move {
            let reservation = match prev {
                Some(prev) => prev.await.unwrap_or(reservation),
                None => reservation,
            };
            op(owned, reservation).await
        };
        match tokio::runtime::Handle::try_current() {
            Ok(handle) => self.last = Some(handle.spawn(task)),
            Err(_) => SharedStats::count(&shared.stats.settlements_failed),
        }
    }
}

/// Runs one store operation: counts a failure and marks the store
/// unavailable; `None` when it failed.
async fn attempt<T>(shared: &SharedScope, op: StoreFuture<'_, Result<T, StoreError>>) -> Option<T> {
    match op.await {
        Ok(value) => {
            shared.answered();
            Some(value)
        }
        Err(e) => {
            shared.failed(shared.clock.now(), &e);
            None
        }
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

/// Refunds a reservation whose attempt never started (SPEC Q-9), detached.
pub(crate) fn refund(shared: &Arc<SharedScope>, reservation: Reservation) {
    let owned = Arc::clone(shared);
    let started = super::scope::spawn(async move {
        let op = owned.remote.refund(reservation, owned.timeout);
        let done = attempt(&owned, op).await.is_some();
        landed(&owned, done);
    });
    if !started {
        SharedStats::count(&shared.stats.settlements_failed);
    }
}

/// A call gave up while its reservation was in flight: whatever the store
/// grants it is refunded once the answer arrives (SPEC Q-9).
pub(crate) fn refund_reserved(shared: &Arc<SharedScope>, op: ReserveOp) {
    let owned = Arc::clone(shared);
    let started = super::scope::spawn(async move {
        if let Ok(Ok(reservation)) = op.await {
            SharedStats::count(&owned.stats.refunded_in_flight);
            let op = owned.remote.refund(reservation, owned.timeout);
            let done = attempt(&owned, op).await.is_some();
            landed(&owned, done);
        }
    });
    if !started {
        SharedStats::count(&shared.stats.settlements_failed);
    }
}

/// A call gave up while its pending reservation was being leased: the
/// reservation is refunded as the store has it once the answer arrives.
pub(crate) fn refund_leasing(shared: &Arc<SharedScope>, op: LeaseOp, pending: Reservation) {
    let owned = Arc::clone(shared);
    let started = super::scope::spawn(async move {
        let reservation = op.await.unwrap_or(pending);
        let op = owned.remote.refund(reservation, owned.timeout);
        let done = attempt(&owned, op).await.is_some();
        landed(&owned, done);
    });
    if !started {
        SharedStats::count(&shared.stats.settlements_failed);
    }
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
        remote: &mut RemoteLease,
    ) -> Settlement {
        let settlement = Settlement::new(reservation.demand.tokens, usage);
        let (Some(s), Some(shared)) = (self.scopes.get(scope.index()), self.shared_scope(scope))
        else {
            return settlement;
        };
        s.state.lock().counters.settle(&settlement);
        let Some(actual) = settlement.reported else {
            return settlement;
        };
        if actual == reservation.demand.tokens {
            return settlement;
        }
        let debt = settlement.debt > 0;
        remote.then(shared, *reservation, move |shared, r| async move {
            // Debt that does not land lets the scope admit more than its
            // limit: retry it. A retry after an attempt that did land but
            // whose answer was lost counts the debt twice, which only
            // admits less.
            let attempts = if debt { DEBT_ATTEMPTS } else { 1 };
            for n in 0..attempts {
                if n > 0 {
                    tokio::time::sleep(DEBT_BACKOFF).await;
                }
                let op = shared.remote.reconcile(r, actual, shared.timeout);
                if attempt(&shared, op).await.is_some() {
                    landed(&shared, true);
                    return r;
                }
            }
            landed(&shared, false);
            if debt {
                tracing::warn!(
                    debt = actual.saturating_sub(r.demand.tokens),
                    "token debt not recorded in the quota store"
                );
            }
            r
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
        s.state.lock().counters.refusals_released += 1;
        remote.then(shared, *reservation, move |shared, r| async move {
            let op = shared.remote.release(r, requests, tokens, shared.timeout);
            let done = attempt(&shared, op).await.is_some();
            landed(&shared, done);
            r
        });
    }

    /// [`Lease::counted_by`](crate::Lease::counted_by) of a reservation
    /// kept in a shared store (SPEC Q-15): the store counts it until one
    /// window after `at`, measured back from the store's own now.
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
        remote.then(shared, *reservation, move |shared, r| async move {
            let ago = shared.clock.now().saturating_duration_since(at);
            let op = shared.remote.recount(r, ago, shared.timeout);
            match attempt(&shared, op).await {
                Some(moved) => moved,
                None => {
                    SharedStats::count(&shared.stats.settlements_failed);
                    r
                }
            }
        });
    }
}

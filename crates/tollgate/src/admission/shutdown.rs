//! Stopping a controller (SPEC LC-7, GW-8): stop admitting, close, and
//! wait until everything it handed out has come back.

use std::sync::atomic::Ordering;

use tokio_util::sync::CancellationToken;

use super::controller::AdmissionController;
use super::scope::Outcome;

impl AdmissionController {
    /// Stops admitting without touching active calls (the first step of a
    /// graceful shutdown, SPEC GW-8): new acquisitions fail with `Closed`
    /// and every queued call, or call waiting for a permit, is woken with
    /// `Closed`. Leases already held keep running. Idempotent.
    pub fn stop_admitting(&self) {
        let inner = &*self.inner;
        if inner.closed.swap(true, Ordering::AcqRel) {
            return;
        }
        for (_, scope) in inner.scopes.iter() {
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
            st.recheck_at = None;
            st.invalidate_projection();
            drop(st);
            if let Some(shared) = &scope.shared {
                shared.turn.close();
                shared.wake();
            }
        }
        inner.pools.close();
    }

    /// Closes admission (SPEC LC-7): new acquisitions fail with `Closed`,
    /// queued ones are woken with `Closed`, holders of leases are told
    /// through [`Lease::closing`](crate::Lease::closing) (supervised calls are cancelled), and this
    /// resolves once every lease is dropped. Idempotent; immediate when
    /// nothing is active.
    pub async fn close(&self) {
        let inner = &*self.inner;
        self.stop_admitting();
        inner.shutdown.cancel();
        self.idle().await;
    }

    /// Resolves once no lease is held, and no pending hold, refund or
    /// settlement of a shared store is still outstanding.
    ///
    /// Every way capacity comes back wakes it (a lease released, a grant
    /// given back uncollected, a preempted or refused attempt), so it
    /// resolves as soon as the last one is returned, whether or not the
    /// controller is closed. On a shared store it also waits for calls
    /// whose pending hold is in the store (or on its way there) until it is
    /// leased or given back, and for refunds and settlements, which run
    /// after their call has gone, each bounded by the store's timeout (a
    /// few attempts at most): so a process that exits after `close` leaves
    /// nothing held in the store.
    pub async fn idle(&self) {
        self.inner.pools.idle().await;
        for (_, scope) in self.inner.scopes.iter() {
            if let Some(shared) = &scope.shared {
                // Holds first: giving one back starts a detached round trip.
                shared.holds.idle().await;
                shared.detached.idle().await;
            }
        }
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
}

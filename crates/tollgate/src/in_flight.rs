//! A count of things in flight, and a wait for it to reach zero (what
//! `idle` and `close` of a supervisor or a shared scope wait on).

use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::sync::Notify;

/// How many are in flight; [`idle`](Self::idle) resolves at zero.
#[derive(Debug, Default)]
pub(crate) struct InFlight {
    n: AtomicUsize,
    zero: Notify,
}

impl InFlight {
    /// One more.
    pub(crate) fn enter(&self) {
        self.n.fetch_add(1, Ordering::AcqRel);
    }

    /// One fewer; wakes every `idle` waiter when none is left.
    pub(crate) fn leave(&self) {
        if self.n.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.zero.notify_waiters();
        }
    }

    /// How many now.
    pub(crate) fn get(&self) -> usize {
        self.n.load(Ordering::Acquire)
    }

    /// Resolves once none is in flight.
    pub(crate) async fn idle(&self) {
        loop {
            let zero = self.zero.notified();
            tokio::pin!(zero);
            zero.as_mut().enable();
            if self.get() == 0 {
                return;
            }
            zero.await;
        }
    }
}

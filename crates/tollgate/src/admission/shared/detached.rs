//! Round trips that outlive their call (refunds, settlements, probes),
//! counted so that [`AdmissionController::idle`](crate::AdmissionController::idle)
//! and `close` wait for them (SPEC LC-7, Q-13: everything idle at the end).
//!
//! Each is bounded by the store's timeout (a few attempts at most), so the
//! wait is bounded too.

use std::future::Future;
use std::sync::Arc;

use tokio::sync::Notify;
use tokio::task::JoinHandle;

use crate::in_flight::InFlight;

/// The detached tasks of one shared scope.
#[derive(Debug, Default)]
pub(crate) struct Detached {
    /// Every task (what `idle` waits for).
    all: InFlight,
    /// The settlements among them: round trips that may give room back
    /// which the store does not count yet (see [`busy`](Self::busy)).
    settling: InFlight,
}

/// Counts one task until dropped (when the task ends, or when the runtime
/// drops it unfinished); a settlement's end also notifies `room`, after it
/// stopped counting as busy, however it ended.
struct Running {
    detached: Arc<Detached>,
    room: Option<Arc<Notify>>,
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Some(room) = self.room.take() {
            self.detached.settling.leave();
            room.notify_waiters();
        }
        self.detached.all.leave();
    }
}

impl Detached {
    /// Runs `task` detached on the current runtime; `None` outside one
    /// (nothing runs then).
    pub(crate) fn spawn<F>(self: &Arc<Self>, task: F) -> Option<JoinHandle<F::Output>>
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        self.run(task, None)
    }

    /// Runs the settlement `task` detached, as [`spawn`](Self::spawn):
    /// [`busy`](Self::busy) until it ends, and `room` notified when it
    /// ends (landed, failed or dropped), so a call that waits because of
    /// it is always woken to ask again.
    pub(crate) fn spawn_settlement<F>(
        self: &Arc<Self>,
        room: &Arc<Notify>,
        task: F,
    ) -> Option<JoinHandle<F::Output>>
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        self.run(task, Some(Arc::clone(room)))
    }

    fn run<F>(self: &Arc<Self>, task: F, room: Option<Arc<Notify>>) -> Option<JoinHandle<F::Output>>
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        let handle = tokio::runtime::Handle::try_current().ok()?;
        self.all.enter();
        if room.is_some() {
            self.settling.enter();
        }
        let running = Running {
            detached: Arc::clone(self),
            room,
        };
        Some(handle.spawn(async move {
            let _running = running;
            task.await
        }))
    }

    /// How many are running.
    #[cfg(test)]
    pub(crate) fn running(&self) -> usize {
        self.all.get()
    }

    /// Whether a settlement is on its way: room it gives back is not yet
    /// counted by the store, so an answer given meanwhile may be stale.
    pub(crate) fn busy(&self) -> bool {
        self.settling.get() > 0
    }

    /// Resolves once none is running.
    pub(crate) async fn idle(&self) {
        self.all.idle().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // proves: LC-7 (idle waits for a detached round trip to end)
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn idle_waits_for_every_task() {
        let d = Arc::new(Detached::default());
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let task = d.spawn(async move {
            let _ = rx.await;
        });
        assert!(task.is_some());
        assert_eq!(d.running(), 1);
        let idle = tokio::spawn({
            let d = Arc::clone(&d);
            async move { d.idle().await }
        });
        tokio::task::yield_now().await;
        assert!(!idle.is_finished());
        tx.send(()).expect("task waits");
        idle.await.expect("idle");
        assert_eq!(d.running(), 0);
    }

    // proves: Q-11 (a settlement counts as busy until it ends, and its end
    // notifies the scope's room after it stopped counting, also when it
    // failed or was dropped unfinished)
    #[tokio::test]
    async fn a_settlement_is_busy_until_it_ends_and_then_wakes() {
        let d = Arc::new(Detached::default());
        let room = Arc::new(Notify::new());
        let woken = room.notified();
        tokio::pin!(woken);
        woken.as_mut().enable();
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let task = d
            .spawn_settlement(&room, async move {
                let _ = rx.await;
            })
            .expect("in a runtime");
        assert!(d.busy());
        let probe = d.spawn(std::future::pending::<()>()).expect("in a runtime");
        drop(tx);
        task.await.expect("ends");
        woken.await;
        assert!(!d.busy(), "a probe is not a settlement");
        probe.abort();
        // Dropped unfinished: still a wake.
        let woken = room.notified();
        tokio::pin!(woken);
        woken.as_mut().enable();
        let task = d
            .spawn_settlement(&room, std::future::pending::<()>())
            .expect("in a runtime");
        task.abort();
        woken.await;
        assert!(!d.busy());
    }

    // proves: LC-7 (nothing is counted outside a runtime)
    #[test]
    fn outside_a_runtime_nothing_runs() {
        let d = Arc::new(Detached::default());
        assert!(d.spawn(async {}).is_none());
        assert_eq!(d.running(), 0);
    }
}

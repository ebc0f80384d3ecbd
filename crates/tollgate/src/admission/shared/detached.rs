//! Round trips that outlive their call (refunds, settlements, probes),
//! counted so that [`AdmissionController::idle`](crate::AdmissionController::idle)
//! and `close` wait for them (SPEC LC-7, Q-13: everything idle at the end).
//!
//! Each is bounded by the store's timeout (a few attempts at most), so the
//! wait is bounded too.

use std::future::Future;
use std::sync::Arc;

use tokio::task::JoinHandle;

use crate::in_flight::InFlight;

/// The detached tasks of one shared scope.
#[derive(Debug, Default)]
pub(crate) struct Detached(InFlight);

/// Counts one task until dropped (when the task ends, or when the runtime
/// drops it unfinished).
struct Running(Arc<Detached>);

impl Drop for Running {
    fn drop(&mut self) {
        self.0.0.leave();
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
        let handle = tokio::runtime::Handle::try_current().ok()?;
        self.0.enter();
        let running = Running(Arc::clone(self));
        Some(handle.spawn(async move {
            let _running = running;
            task.await
        }))
    }

    /// How many are running.
    #[cfg(test)]
    pub(crate) fn running(&self) -> usize {
        self.0.get()
    }

    /// Whether any is running (a settlement on its way may give room
    /// back that the store does not count yet).
    pub(crate) fn busy(&self) -> bool {
        self.0.get() > 0
    }

    /// Resolves once none is running.
    pub(crate) async fn idle(&self) {
        self.0.idle().await;
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

    // proves: LC-7 (nothing is counted outside a runtime)
    #[test]
    fn outside_a_runtime_nothing_runs() {
        let d = Arc::new(Detached::default());
        assert!(d.spawn(async {}).is_none());
        assert_eq!(d.running(), 0);
    }
}

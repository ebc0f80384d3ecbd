//! Token counting of large requests away from the async workers (SPEC
//! GW-17).
//!
//! Counting a request's tokens runs the model family's tokenizer over its
//! text: about 25 ms for 1 MiB of prose, and up to about 90 ms for one
//! long run of letters, once per distinct estimator of the request's
//! fallback chain. Done on an async worker, that time would hold up every
//! other connection the worker serves, so one tenant sending large
//! prompts would slow every other tenant. A count of at least
//! [`OFF_WORKER_BYTES`] (the body's length times the estimators that
//! count it) runs on the blocking thread pool instead, through a lane of
//! a few permits (half the cores, at least one): large requests wait for
//! each other, small ones never wait for them, and the CPU large counts
//! take at once stays bounded. A request whose client leaves while it is
//! counted keeps its permit until the count ends, so leaving and sending
//! again does not let more counts run at once.

use std::sync::{Arc, OnceLock};

use tokio::sync::Semaphore;

/// The smallest count (body bytes times estimators) done off the async
/// workers: below it a count takes at most about 1.4 ms (a run of
/// letters; prose about 0.4 ms).
pub const OFF_WORKER_BYTES: usize = 16 * 1024;

/// Why a count moved off the worker gave no result.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum NotCounted {
    /// The count panicked (a defect: the tokenizers catch their own).
    Panicked,
    /// The runtime is shutting down.
    ShuttingDown,
}

/// The lane: half the cores, at least one.
fn lane() -> &'static Arc<Semaphore> {
    static LANE: OnceLock<Arc<Semaphore>> = OnceLock::new();
    LANE.get_or_init(|| {
        let cores = std::thread::available_parallelism().map_or(1, usize::from);
        Arc::new(Semaphore::new((cores / 2).max(1)))
    })
}

/// Runs `count` on the blocking thread pool once the lane has room, and
/// returns what it returned.
pub(crate) async fn off_worker<T, F>(count: F) -> Result<T, NotCounted>
where
    T: Send + 'static,
    F: FnOnce() -> T + Send + 'static,
{
    through(lane(), count).await
}

/// [`off_worker`] through `lane`. The permit goes with the count: dropping
/// this future once the count started leaves the permit taken until the
/// count ends.
async fn through<T, F>(lane: &Arc<Semaphore>, count: F) -> Result<T, NotCounted>
where
    T: Send + 'static,
    F: FnOnce() -> T + Send + 'static,
{
    let permit = Arc::clone(lane)
        .acquire_owned()
        .await
        .map_err(|_| NotCounted::ShuttingDown)?;
    tokio::task::spawn_blocking(move || {
        let _permit = permit;
        count()
    })
    .await
    .map_err(|e| {
        if e.is_panic() {
            NotCounted::Panicked
        } else {
            NotCounted::ShuttingDown
        }
    })
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::mpsc;
    use std::time::Duration;

    use tokio::sync::{Semaphore, oneshot};

    use super::{NotCounted, through};

    /// proves: GW-17 (a large request's count runs off the async worker:
    /// while it runs, other work on the same single-threaded runtime goes
    /// on. The count below can only end early if another task of that
    /// runtime signals it; counted on the worker itself, it would wait
    /// the full 30 s and report that no signal came)
    #[tokio::test(flavor = "current_thread")]
    async fn a_count_does_not_hold_up_its_worker() {
        let lane = Arc::new(Semaphore::new(1));
        let (tx, rx) = mpsc::channel::<()>();
        let (started_tx, started_rx) = oneshot::channel::<()>();
        let other = tokio::spawn(async move {
            // Another connection's work on the same worker.
            let _ = started_rx.await;
            let _ = tx.send(());
        });
        let signalled = through(&lane, move || {
            let _ = started_tx.send(());
            rx.recv_timeout(Duration::from_secs(30)).is_ok()
        })
        .await;
        assert_eq!(signalled, Ok(true), "the worker was held by the count");
        other.await.expect("the other task");
        assert_eq!(lane.available_permits(), 1);
    }

    /// proves: GW-17 (a count whose waiter is dropped mid-count, as when
    /// its client leaves, keeps its lane permit until the count ends, so
    /// the lane still bounds the counts running; then gives it back; a
    /// waiter dropped before its turn takes nothing)
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_dropped_count_keeps_its_permit_until_it_ends() {
        let lane = Arc::new(Semaphore::new(1));
        let (release, held) = mpsc::channel::<()>();
        let (started_tx, started) = oneshot::channel::<()>();
        let running = tokio::spawn({
            let lane = Arc::clone(&lane);
            async move {
                through(&lane, move || {
                    let _ = started_tx.send(());
                    let _ = held.recv_timeout(Duration::from_secs(30));
                })
                .await
            }
        });
        started.await.expect("the count started");
        // A second count waits for the lane; dropped before its turn.
        let waiting = tokio::spawn({
            let lane = Arc::clone(&lane);
            async move { through(&lane, || ()).await }
        });
        tokio::task::yield_now().await;
        waiting.abort();
        assert!(waiting.await.is_err_and(|e| e.is_cancelled()));
        running.abort();
        assert!(running.await.is_err_and(|e| e.is_cancelled()));
        assert_eq!(lane.available_permits(), 0, "the running count keeps it");
        release.send(()).expect("the count is still running");
        tokio::time::timeout(Duration::from_secs(30), async {
            while lane.available_permits() < 1 {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        })
        .await
        .expect("the permit comes back when the count ends");
        assert_eq!(through(&lane, || 7).await, Ok(7));
    }

    /// proves: GW-17 (a count that panics is reported as such, not as a
    /// shutdown, and gives its permit back)
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_panicking_count_is_reported() {
        let lane = Arc::new(Semaphore::new(1));
        let r: Result<(), NotCounted> = through(&lane, || panic!("a defect")).await;
        assert_eq!(r, Err(NotCounted::Panicked));
        assert_eq!(lane.available_permits(), 1);
    }
}

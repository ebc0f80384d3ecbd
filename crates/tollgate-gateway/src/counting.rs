//! Token counting of large requests away from the async workers (SPEC
//! GW-17).
//!
//! Counting a request's tokens runs the model family's tokenizer over its
//! text: about 25 ms for a body of 1 MiB of prose, and up to about 100 ms
//! for a long unbroken run of letters. Done on an async worker, that time
//! would hold up every other connection the worker serves, so one tenant
//! sending large prompts would slow every other tenant. A body of at least
//! [`OFF_WORKER_BYTES`] is counted on the blocking thread pool instead,
//! through a lane of a few permits (half the cores, at least one): large
//! requests wait for each other, small ones never wait for them, and the
//! CPU large counts take at once stays bounded. A request whose client
//! leaves while it is counted keeps its permit until the count ends, so
//! leaving does not let more counts run at once.

use std::sync::OnceLock;

use tokio::sync::Semaphore;

/// The smallest body counted off the async workers: below it a count
/// takes about a millisecond or less and moving it would cost more than
/// it saves.
pub const OFF_WORKER_BYTES: usize = 64 * 1024;

/// The lane: half the cores, at least one.
fn lane() -> &'static Semaphore {
    static LANE: OnceLock<Semaphore> = OnceLock::new();
    LANE.get_or_init(|| {
        let cores = std::thread::available_parallelism().map_or(1, usize::from);
        Semaphore::new((cores / 2).max(1))
    })
}

/// Runs `count` on the blocking thread pool once the lane has room, and
/// returns what it returned; `None` if it could not run (the runtime is
/// shutting down) or panicked.
pub(crate) async fn off_worker<T, F>(count: F) -> Option<T>
where
    T: Send + 'static,
    F: FnOnce() -> T + Send + 'static,
{
    let permit = lane().acquire().await.ok()?;
    tokio::task::spawn_blocking(move || {
        let _permit = permit;
        count()
    })
    .await
    .ok()
}

#[cfg(test)]
mod tests {
    use std::sync::mpsc;
    use std::time::Duration;

    use super::off_worker;

    /// proves: GW-17 (a large request's count runs off the async worker:
    /// while it runs, other work on the same single-threaded runtime goes
    /// on. The count below can only end early if another task of that
    /// runtime signals it; counted on the worker itself, it would wait
    /// the full 30 s and report that no signal came)
    #[tokio::test(flavor = "current_thread")]
    async fn a_count_does_not_hold_up_its_worker() {
        let (tx, rx) = mpsc::channel::<()>();
        let (started_tx, started_rx) = tokio::sync::oneshot::channel::<()>();
        let other = tokio::spawn(async move {
            // Another connection's work on the same worker.
            let _ = started_rx.await;
            let _ = tx.send(());
        });
        let signalled = off_worker(move || {
            let _ = started_tx.send(());
            rx.recv_timeout(Duration::from_secs(30)).is_ok()
        })
        .await;
        assert_eq!(signalled, Some(true), "the worker was held by the count");
        other.await.expect("the other task");
    }

    /// proves: GW-17 (a count whose waiter is dropped, as when its client
    /// leaves, still ends and gives its lane permit back: later counts run)
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_dropped_count_gives_its_permit_back() {
        for _ in 0..16 {
            let (tx, rx) = mpsc::channel::<()>();
            let dropped = tokio::spawn(off_worker(move || {
                let _ = rx.recv_timeout(Duration::from_secs(30));
            }));
            tokio::task::yield_now().await;
            dropped.abort();
            let _ = dropped.await;
            let _ = tx.send(());
        }
        let n = tokio::time::timeout(Duration::from_secs(60), off_worker(|| 7))
            .await
            .expect("the lane has room again");
        assert_eq!(n, Some(7));
        let lane = super::lane();
        let cores = std::thread::available_parallelism().map_or(1, usize::from);
        // Every permit is back once the counts ended.
        let all = (cores / 2).max(1);
        tokio::time::timeout(Duration::from_secs(60), async {
            while lane.available_permits() < all {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
        .await
        .expect("every permit returned");
    }
}

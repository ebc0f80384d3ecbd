//! Token counting and parsing of large requests away from the async
//! workers (SPEC GW-17).
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
//! take at once stays bounded. The lane serves tenants in weighted fair
//! order (see `counting/lane.rs`), so one tenant's burst of large prompts
//! does not make another's wait behind all of it. A request whose client
//! leaves while it is counted keeps its permit until the count ends, so
//! leaving and sending again does not let more counts run at once. A body
//! of at least [`PARSE_OFF_WORKER_BYTES`] is parsed as JSON through the
//! same lane first.

mod lane;

use std::sync::{Arc, OnceLock};

use tollgate::Flow;

use self::lane::Lane;

/// The smallest count (body bytes times estimators) done off the async
/// workers: below it a count takes at most about 1.4 ms (a run of
/// letters; prose about 0.4 ms).
pub const OFF_WORKER_BYTES: usize = 16 * 1024;

/// The smallest body parsed as JSON off the async workers, through the
/// same lane: parsing takes about 3 ms per MiB, so below it at most
/// about 0.4 ms.
pub const PARSE_OFF_WORKER_BYTES: usize = 128 * 1024;

/// Parsing a body takes about a sixteenth of the time counting its
/// tokens does (3 ms per MiB against 25 to 90): a parse's job size on the
/// lane is the body's length divided by this.
pub const PARSE_SHARE: usize = 16;

/// Why a count moved off the worker gave no result.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum NotCounted {
    /// The count panicked (a defect: the tokenizers catch their own).
    Panicked,
    /// The runtime is shutting down.
    ShuttingDown,
}

/// The process's lane: half the cores, at least one.
fn lane() -> &'static Arc<Lane> {
    static LANE: OnceLock<Arc<Lane>> = OnceLock::new();
    LANE.get_or_init(|| {
        let cores = std::thread::available_parallelism().map_or(1, usize::from);
        Lane::new(cores / 2)
    })
}

/// A request's turn on the lane: its jobs (a large body's parse, then
/// its count) run one after another under one permit, so a request queues
/// once. Dropping it gives the permit back once the job running, if any,
/// has ended.
#[derive(Debug)]
pub(crate) struct Turn {
    permit: Arc<lane::Permit>,
    flow: Flow,
}

/// Waits for a turn on the process's lane for a job of `bytes` (body
/// length, or body length times estimators for a count) of `flow`'s
/// tenant.
pub(crate) async fn turn(flow: Flow, bytes: usize) -> Result<Turn, NotCounted> {
    Turn::on(lane(), flow, bytes).await
}

impl Turn {
    async fn on(lane: &Arc<Lane>, flow: Flow, bytes: usize) -> Result<Turn, NotCounted> {
        let permit = lane
            .acquire(flow, bytes)
            .await
            .ok_or(NotCounted::ShuttingDown)?;
        Ok(Turn {
            permit: Arc::new(permit),
            flow,
        })
    }

    /// Counts `bytes` more work to the tenant: a second job of the turn.
    pub(crate) fn charge(&self, bytes: usize) {
        self.permit.charge(self.flow, bytes);
    }

    /// Runs `job` on the blocking thread pool and returns what it
    /// returned. The permit goes with the job: dropping this future (and
    /// the turn) once the job started leaves the permit taken until the
    /// job ends.
    pub(crate) async fn run<T, F>(&self, job: F) -> Result<T, NotCounted>
    where
        T: Send + 'static,
        F: FnOnce() -> T + Send + 'static,
    {
        let permit = Arc::clone(&self.permit);
        tokio::task::spawn_blocking(move || {
            let _permit = permit;
            job()
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
}

/// One job in a turn of its own on `lane`.
#[cfg(test)]
async fn through<T, F>(lane: &Arc<Lane>, flow: Flow, bytes: usize, job: F) -> Result<T, NotCounted>
where
    T: Send + 'static,
    F: FnOnce() -> T + Send + 'static,
{
    Turn::on(lane, flow, bytes).await?.run(job).await
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::mpsc;
    use std::time::Duration;

    use tokio::sync::oneshot;
    use tollgate::{Flow, Priority};

    use super::{Lane, NotCounted, Turn, through};

    /// A count's size well over the lane's threshold.
    const BIG: usize = 1 << 20;

    /// proves: GW-17 (a large request's count runs off the async worker:
    /// while it runs, other work on the same single-threaded runtime goes
    /// on. The count below can only end early if another task of that
    /// runtime signals it; counted on the worker itself, it would wait
    /// the full 30 s and report that no signal came)
    #[tokio::test(flavor = "current_thread")]
    async fn a_count_does_not_hold_up_its_worker() {
        let lane = Lane::new(1);
        let (tx, rx) = mpsc::channel::<()>();
        let (started_tx, started_rx) = oneshot::channel::<()>();
        let other = tokio::spawn(async move {
            // Another connection's work on the same worker.
            let _ = started_rx.await;
            let _ = tx.send(());
        });
        let signalled = through(&lane, Flow::DEFAULT, BIG, move || {
            let _ = started_tx.send(());
            rx.recv_timeout(Duration::from_secs(30)).is_ok()
        })
        .await;
        assert_eq!(signalled, Ok(true), "the worker was held by the count");
        other.await.expect("the other task");
        assert_eq!(lane.free(), 1);
    }

    /// proves: GW-17 (a count whose waiter is dropped mid-count, as when
    /// its client leaves, keeps its lane permit until the count ends, so
    /// the lane still bounds the counts running; then gives it back; a
    /// waiter dropped before its turn takes nothing)
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_dropped_count_keeps_its_permit_until_it_ends() {
        let lane = Lane::new(1);
        let (release, held) = mpsc::channel::<()>();
        let (started_tx, started) = oneshot::channel::<()>();
        let running = tokio::spawn({
            let lane = Arc::clone(&lane);
            async move {
                through(&lane, Flow::DEFAULT, BIG, move || {
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
            async move { through(&lane, Flow::DEFAULT, BIG, || ()).await }
        });
        tokio::task::yield_now().await;
        waiting.abort();
        assert!(waiting.await.is_err_and(|e| e.is_cancelled()));
        running.abort();
        assert!(running.await.is_err_and(|e| e.is_cancelled()));
        assert_eq!(lane.free(), 0, "the running count keeps it");
        release.send(()).expect("the count is still running");
        tokio::time::timeout(Duration::from_secs(30), async {
            while lane.free() < 1 {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        })
        .await
        .expect("the permit comes back when the count ends");
        assert_eq!(through(&lane, Flow::DEFAULT, BIG, || 7).await, Ok(7));
    }

    /// proves: GW-17 (a count that panics is reported as such, not as a
    /// shutdown, and gives its permit back)
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_panicking_count_is_reported() {
        let lane = Lane::new(1);
        let r: Result<(), NotCounted> =
            through(&lane, Flow::DEFAULT, BIG, || panic!("a defect")).await;
        assert_eq!(r, Err(NotCounted::Panicked));
        assert_eq!(lane.free(), 1);
    }

    /// proves: GW-17 (a request's parse and count run in one turn of the
    /// lane: its second job does not queue again behind another tenant's
    /// waiting one, and what the second job adds counts toward its
    /// tenant's share: the other tenant's next job goes before this
    /// tenant's next request)
    #[tokio::test(flavor = "current_thread")]
    async fn a_turn_runs_two_jobs_and_counts_both() {
        let lane = Lane::new(1);
        let log = Arc::new(parking_lot::Mutex::new(Vec::new()));
        let held = Turn::on(&lane, Flow::new(3, Priority::Standard), 10).await;
        let a = Flow::new(1, Priority::Standard);
        let b = Flow::new(2, Priority::Standard);
        let first = tokio::spawn({
            let (lane, log) = (Arc::clone(&lane), Arc::clone(&log));
            async move {
                let turn = Turn::on(&lane, a, 100).await.expect("a turn");
                log.lock().push("a parses");
                assert_eq!(turn.run(|| 1).await, Ok(1));
                turn.charge(1000);
                for _ in 0..8 {
                    tokio::task::yield_now().await;
                }
                log.lock().push("a counts");
                assert_eq!(turn.run(|| 2).await, Ok(2));
            }
        });
        let others: Vec<_> = [(b, "b"), (b, "b"), (a, "a again")]
            .into_iter()
            .map(|(f, name)| {
                let (lane, log) = (Arc::clone(&lane), Arc::clone(&log));
                tokio::spawn(async move {
                    let r = through(&lane, f, 300, || ()).await;
                    log.lock().push(name);
                    r
                })
            })
            .collect();
        for _ in 0..8 {
            tokio::task::yield_now().await;
        }
        drop(held);
        first.await.expect("the first request");
        for task in others {
            assert_eq!(task.await.expect("a request"), Ok(()));
        }
        assert_eq!(
            *log.lock(),
            ["a parses", "a counts", "b", "b", "a again"],
            "without the charge, a's next request would go before b's second"
        );
        assert!(lane.idle());
    }
}

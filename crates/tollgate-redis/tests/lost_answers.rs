//! Round trips whose answer never reaches the call (SPEC Q-9, DQ-5): a
//! deadline or the store's timeout cuts them short, or the call goes away
//! while they are in flight, and Redis runs them anyway once it can. Each
//! test stalls a real `redis-server` with `CLIENT PAUSE` (a failover, a
//! slow fsync), so the commands already sent run after the caller gave up,
//! and checks that nothing stays held: no pending hold left in Redis, every
//! unit back once its windows pass, and nothing given back twice.

mod common;

use std::sync::Arc;
use std::time::Duration;

use tollgate::config::ScopeConfig;
use tollgate::quota::{RemoteBackend, RemoteQuota};
use tollgate::{
    AdmissionController, AdmissionError, Call, Deadline, Lease, ScopeId, StoreMode, TokenEstimate,
    Usage,
};
use tollgate_redis::{RedisBackend, RedisServer, RedisSettings};

/// The window of most scopes here.
const WINDOW: Duration = Duration::from_millis(500);

/// Stalls every client of `server` for `ms` milliseconds.
async fn pause(server: &RedisServer, ms: u64) {
    let mut raw = common::raw(server).await;
    let () = redis::cmd("CLIENT")
        .arg("PAUSE")
        .arg(ms)
        .arg("ALL")
        .query_async(&mut raw)
        .await
        .expect("CLIENT PAUSE");
}

/// Waits until the backend's subscriber is connected: it loads every script
/// first, so an operation stalled from now on runs once Redis resumes.
async fn ready(server: &RedisServer) {
    let mut raw = common::raw(server).await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let patterns: u64 = redis::cmd("PUBSUB")
            .arg("NUMPAT")
            .query_async(&mut raw)
            .await
            .expect("PUBSUB NUMPAT");
        if patterns > 0 {
            return;
        }
        assert!(tokio::time::Instant::now() < deadline, "no subscriber");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// A backend whose operations may take `timeout`, and a controller of one
/// scope (`requests` a `window`, one concurrency permit) on it, once the
/// backend's scripts are loaded (see `ready`).
async fn replica(
    server: &RedisServer,
    name: &str,
    timeout: Duration,
    (requests, window): (u64, Duration),
) -> (Arc<RedisBackend>, ScopeConfig, AdmissionController) {
    let backend = Arc::new(
        RedisBackend::new(
            RedisSettings::new(server.url())
                .prefix(common::unique(name))
                .timeout(timeout),
        )
        .expect("backend"),
    );
    let scope = ScopeConfig::new(name).requests(requests, window);
    let c = AdmissionController::builder()
        .scope(scope.clone())
        .concurrency(1)
        .shared_store(Arc::clone(&backend) as Arc<dyn RemoteBackend>)
        .build()
        .expect("controller");
    ready(server).await;
    (backend, scope, c)
}

/// Takes the scope's one concurrency permit, then stalls Redis for `ms`:
/// the next call must reserve a pending hold, which Redis runs only once
/// the stall ends.
async fn permit_taken_then_stall(server: &RedisServer, c: &AdmissionController, ms: u64) -> Lease {
    let held = c
        .acquire(&Call::new(ScopeId::FIRST), Deadline::NONE)
        .await
        .expect("first call");
    pause(server, ms).await;
    held
}

/// Closes `c` and checks that every giving back landed, that no hold is
/// left in Redis and that all three units of `scope` come back.
async fn closed_with_nothing_left(
    c: &AdmissionController,
    backend: &RedisBackend,
    server: &RedisServer,
    scope: &ScopeConfig,
) {
    c.close().await;
    assert_eq!(c.snapshot().scopes[0].counters.settlements_failed, 0);
    assert_eq!(
        left_behind(backend, server, scope).await,
        (0, 3),
        "no hold left, every unit back"
    );
}

/// Pending holds left in Redis for `scope`, and its available units once
/// every window has passed.
async fn left_behind(
    backend: &RedisBackend,
    server: &RedisServer,
    scope: &ScopeConfig,
) -> (u64, i64) {
    let store = backend.open_scope(scope);
    let mut raw = common::raw(server).await;
    let mut holds = 0;
    for key in store.keys().iter().filter(|k| k.ends_with(":pend")) {
        let n: u64 = redis::cmd("HLEN")
            .arg(key)
            .query_async(&mut raw)
            .await
            .expect("HLEN");
        holds += n;
    }
    let longest = scope.limits().iter().map(|l| l.window).max();
    tokio::time::sleep(2 * longest.unwrap_or(WINDOW)).await;
    let available = store
        .snapshot(Duration::from_secs(5))
        .await
        .expect("snapshot")[0]
        .available;
    (holds, available)
}

// proves: DQ-5 (an operation is bounded by the store's own timeout, not
// by a shorter one of the Redis client's: an answer that comes after a
// one-second stall, within a three-second timeout, is an answer, not a
// store failure)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_within_the_timeout_is_not_a_failure() {
    let Some(server) = common::server("an_answer_within_the_timeout_is_not_a_failure") else {
        return;
    };
    let (backend, scope, c) = replica(&server, "slow", Duration::from_secs(3), (3, WINDOW)).await;
    pause(&server, 1_000).await;
    let lease = c
        .acquire(&Call::new(ScopeId::FIRST), Deadline::NONE)
        .await
        .expect("admitted once Redis answers");
    let counters = c.snapshot().scopes[0].counters;
    assert_eq!(counters.store_errors, 0, "{counters:?}");
    drop(lease);
    closed_with_nothing_left(&c, &backend, &server, &scope).await;
}

// proves: Q-9, DQ-5 (a pending reservation whose round trip the call's
// deadline cut short, with no concurrency permit free, is given back by its
// name once Redis runs it: nothing stays counted)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pending_reservation_cut_short_by_its_deadline_is_not_lost() {
    let Some(server) =
        common::server("a_pending_reservation_cut_short_by_its_deadline_is_not_lost")
    else {
        return;
    };
    // A store timeout longer than the stall: only the call's own deadline
    // cuts the reservation's round trip short.
    let (backend, scope, c) =
        replica(&server, "clipped", Duration::from_secs(1), (3, WINDOW)).await;
    let call = Call::new(ScopeId::FIRST);
    let held = permit_taken_then_stall(&server, &c, 300).await;
    let e = c
        .acquire(&call, Deadline::after(Duration::from_millis(100)))
        .await
        .expect_err("deadline first");
    assert!(
        matches!(e, AdmissionError::DeadlineExceeded { .. }),
        "{e:?}"
    );
    drop(held);
    closed_with_nothing_left(&c, &backend, &server, &scope).await;
}

// proves: Q-9, DQ-5 (a call dropped while its pending reservation is in
// flight: the reservation Redis grants after the stall is given back)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_dropped_during_its_reservation_leaves_nothing() {
    let Some(server) = common::server("a_call_dropped_during_its_reservation_leaves_nothing")
    else {
        return;
    };
    let (backend, scope, c) =
        replica(&server, "dropped", Duration::from_secs(1), (3, WINDOW)).await;
    let call = Call::new(ScopeId::FIRST);
    let held = permit_taken_then_stall(&server, &c, 300).await;
    // The caller gives up (a client hung up) with no deadline of its own.
    let gone =
        tokio::time::timeout(Duration::from_millis(100), c.acquire(&call, Deadline::NONE)).await;
    assert!(gone.is_err(), "still in flight when dropped");
    drop(held);
    closed_with_nothing_left(&c, &backend, &server, &scope).await;
}

// proves, DQ-5 (a lease round trip that the store's timeout cut
// short but Redis ran after the stall: the hold is given back by its name,
// which finds nothing once the lease has run, so the leased unit stays
// counted for its window (never over the limit) and nothing else is taken
// back; then every unit returns)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_whose_answer_is_lost_is_counted_once() {
    let Some(server) = common::server("a_lease_whose_answer_is_lost_is_counted_once") else {
        return;
    };
    // A window long enough that the leased unit surely still counts when
    // it is looked at.
    let window = Duration::from_secs(3);
    let (backend, scope, c) =
        replica(&server, "leasing", Duration::from_millis(100), (3, window)).await;
    let call = Call::new(ScopeId::FIRST);
    let held = c.acquire(&call, Deadline::NONE).await.expect("first call");
    // The second call's quota is reserved at once (pending): it waits for
    // the permit.
    let waiter = {
        let c = c.clone();
        tokio::spawn(async move {
            c.acquire(&Call::new(ScopeId::FIRST), Deadline::NONE)
                .await
                .map(drop)
        })
    };
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while c.snapshot().scopes[0].pending == 0 {
        assert!(tokio::time::Instant::now() < deadline, "never granted");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // Redis stalls; the permit comes free and the lease goes out, to run
    // only after the store's timeout has given up on it.
    pause(&server, 400).await;
    drop(held);
    let e = waiter.await.expect("task").expect_err("store timed out");
    assert!(
        matches!(e, AdmissionError::QuotaStoreUnavailable { .. }),
        "{e:?}"
    );
    // Once Redis runs what it held, both units count: the first call's and
    // the lease that ran (the hold given back by name found nothing).
    tokio::time::sleep(Duration::from_millis(500)).await;
    let store = backend.open_scope(&scope);
    let limits = store
        .snapshot(Duration::from_secs(5))
        .await
        .expect("snapshot");
    assert_eq!(limits[0].available, 1, "the lease that ran is counted once");
    c.close().await;
    assert_eq!(left_behind(&backend, &server, &scope).await, (0, 3));
}

// proves: LC-7, Q-9 (close resolves only once the pending hold of a call
// whose reservation was stalled in Redis is given back: a process that
// exits right after `close` leaves no hold behind)
#[test]
fn close_waits_for_a_pending_hold_in_flight() {
    let Some(server) = common::server("close_waits_for_a_pending_hold_in_flight") else {
        return;
    };
    let process = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let (backend, scope, keys) = process.block_on(async {
        let (backend, scope, c) =
            replica(&server, "closing", Duration::from_secs(2), (3, WINDOW)).await;
        let held = permit_taken_then_stall(&server, &c, 400).await;
        // No permit free: a pending reservation, stalled in Redis.
        let waiter = {
            let c = c.clone();
            tokio::spawn(async move {
                c.acquire(&Call::new(ScopeId::FIRST), Deadline::NONE)
                    .await
                    .map(drop)
            })
        };
        tokio::time::sleep(Duration::from_millis(50)).await;
        drop(held);
        tokio::time::timeout(Duration::from_secs(10), c.close())
            .await
            .expect("close is bounded by the store's timeout");
        let e = waiter.await.expect("task").expect_err("closed");
        assert!(matches!(e, AdmissionError::Closed), "{e:?}");
        let keys = backend.open_scope(&scope).keys().to_vec();
        (backend, scope, keys)
    });
    // The process exits right after `close`.
    drop(backend);
    process.shutdown_background();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let mut raw = common::raw(&server).await;
        for key in keys.iter().filter(|k| k.ends_with(":pend")) {
            let holds: u64 = redis::cmd("HLEN")
                .arg(key)
                .query_async(&mut raw)
                .await
                .expect("HLEN");
            assert_eq!(holds, 0, "{key}: a hold outlived close");
        }
    });
    drop(scope);
}

// proves: DQ-6, Q-5, DQ-3 (a reconciliation whose answer is lost, and
// which the engine therefore retries, gives back exactly once: with Redis
// stalled every attempt times out and then runs once Redis resumes, and
// the scope counts the reported usage, no less; those late settlements do
// not make the store unavailable, and a later call whose own answer is
// lost takes nothing back from the settled reservation)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reconcile_whose_answer_is_lost_gives_back_once() {
    let Some(server) = common::server("a_reconcile_whose_answer_is_lost_gives_back_once") else {
        return;
    };
    let backend = Arc::new(
        RedisBackend::new(
            RedisSettings::new(server.url())
                .prefix(common::unique("reconciling"))
                .timeout(Duration::from_millis(50)),
        )
        .expect("backend"),
    );
    // A long window: nothing ages out while the test looks.
    let scope = ScopeConfig::new("reconciling").tokens(10_000, Duration::from_secs(60));
    let c = AdmissionController::builder()
        .scope(scope.clone())
        .shared_store(Arc::clone(&backend) as Arc<dyn RemoteBackend>)
        .build()
        .expect("controller");
    ready(&server).await;
    let call = Call::new(ScopeId::FIRST).with_estimate(TokenEstimate::new(4_000, 1_000));
    let mut lease = c.acquire(&call, Deadline::NONE).await.expect("admitted");
    // Input a little over its estimate, the total far under it: the
    // engine retries (debt on a dimension the scope does not limit).
    pause(&server, 400).await;
    lease
        .reconcile(Usage::from_io(4_100, 100))
        .expect("first settlement");
    drop(lease);
    // Every attempt timed out; Redis then runs each of them.
    tokio::time::sleep(Duration::from_millis(700)).await;
    c.idle().await;
    // Settlements that ran late are no outage (SPEC DQ-3).
    assert_eq!(c.snapshot().scopes[0].store, Some(StoreMode::Shared));
    let available = || async {
        backend
            .open_scope(&scope)
            .snapshot(Duration::from_secs(5))
            .await
            .expect("snapshot")[0]
            .available
    };
    // Read before any other call reserves: the 5,000 held, less the 800
    // given back once.
    assert_eq!(
        available().await,
        10_000 - 4_200,
        "the reported usage stays counted, given back once"
    );
    // The next call is admitted from the store. Its round trip has the
    // same 50 ms budget: a stall cuts its first try short (an outage,
    // DQ-3), and Redis runs that try once it resumes. A reservation whose
    // answer was lost stays counted for its window (docs/redis.md,
    // "Failure modes"), so the next call is small: a large one would wait
    // for the first call's window to pass (the flake hunt's 63 s run, in
    // which the first call's usage had aged out by the final snapshot).
    // Load may cut later tries short too; each is tried again.
    let small = Call::new(ScopeId::FIRST).with_estimate(TokenEstimate::new(50, 50));
    pause(&server, 150).await;
    let mut lost = 0;
    let next = loop {
        match c.acquire(&small, Deadline::NONE).await {
            Err(AdmissionError::QuotaStoreUnavailable { .. }) if lost < 20 => {
                lost += 1;
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            other => break other.expect("shared store"),
        }
    };
    assert!(lost >= 1, "the stall cut the first try short");
    drop(next);
    c.close().await;
    // Each try Redis ran holds its 100 for the window (the admitted one,
    // dropped unreconciled, and each lost one it ran); the first call's
    // 4,200 stay counted, nothing more given back.
    let taken = 10_000 - 4_200 - available().await;
    assert!(
        taken % 100 == 0 && (1..=lost as i64 + 1).contains(&(taken / 100)),
        "{taken} taken by the next call's {} tries",
        lost + 1
    );
}

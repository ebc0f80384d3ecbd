//! Redis killed and restarted (SPEC DQ-3, DQ-5): every operation fails
//! with a `StoreError` within its budget, never hangs; once Redis is back
//! on the same port the same backend answers again by itself, and its
//! change notices resume.

mod common;

use std::time::{Duration, Instant};

use tollgate::config::ScopeConfig;
use tollgate::quota::{
    Actual, Demand, Hold, HoldId, OpId, RemoteBackend, RemoteHold, RemoteQuota, Reservation,
    StoreError,
};
use tollgate_redis::{RedisBackend, RedisQuota, RedisSettings};

use common::BUDGET;

/// Slack over the budget for a loaded CI machine: still far from a hang.
const SLACK: Duration = Duration::from_secs(1);

/// Runs every operation once against `store`, each within `budget`, and
/// returns their results with how long each took.
async fn every_op(
    store: &RedisQuota,
    r: Reservation,
    budget: Duration,
) -> Vec<(&'static str, Result<(), StoreError>, Duration)> {
    let mut out = Vec::new();
    macro_rules! time {
        ($name:literal, $e:expr) => {{
            let start = Instant::now();
            let result = $e.await.map(drop);
            out.push(($name, result, start.elapsed()));
        }};
    }
    let pending = Reservation {
        hold: Hold::Pending,
        seq: 0,
        ..r
    };
    time!(
        "reserve",
        store.reserve(Demand::new(1, 0), RemoteHold::Leased, budget)
    );
    time!("lease", store.lease(pending, HoldId::new(), budget));
    time!("forget", store.forget(HoldId::new(), budget));
    time!("refund", store.refund(r, OpId::new(), budget));
    time!(
        "reconcile",
        store.reconcile(r, Actual::total(0), OpId::new(), budget)
    );
    time!("release", store.release(r, true, true, OpId::new(), budget));
    time!(
        "recount",
        store.recount(r, Duration::from_millis(1), OpId::new(), budget)
    );
    time!("snapshot", store.snapshot(budget));
    out
}

// proves: DQ-3, DQ-5 (Redis gone: every operation returns a StoreError
// within its budget, none hangs; Redis back: the same backend succeeds
// again without being rebuilt)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operations_fail_fast_while_redis_is_down_and_recover() {
    let Some(mut server) = common::server("operations_fail_fast_while_redis_is_down_and_recover")
    else {
        return;
    };
    let backend = RedisBackend::new(
        RedisSettings::new(server.url())
            .prefix("outage")
            .timeout(Duration::from_millis(50)),
    )
    .unwrap();
    let budget = backend.timeout();
    let config = ScopeConfig::new("outage")
        .requests(1_000, Duration::from_secs(60))
        .tokens(100_000, Duration::from_secs(60));
    let store = backend.open_scope(&config);
    let r = store
        .reserve(Demand::new(10, 0), RemoteHold::Leased, BUDGET)
        .await
        .unwrap()
        .unwrap();
    for (name, result, _) in every_op(&store, r, BUDGET).await {
        assert_eq!(result, Ok(()), "{name} before the outage");
    }

    server.kill();
    // Several rounds: the first meets the broken connection, later ones
    // the background reconnection.
    let mut slowest = Duration::ZERO;
    for round in 0..4 {
        for (name, result, took) in every_op(&store, r, budget).await {
            assert!(result.is_err(), "{name} succeeded with Redis down");
            assert!(
                took <= budget + SLACK,
                "round {round}: {name} took {took:?}"
            );
            slowest = slowest.max(took);
        }
    }
    eprintln!("slowest failure with Redis down: {slowest:?} (budget {budget:?})");
    // A zero budget answers at once.
    let start = Instant::now();
    let zero = store.snapshot(Duration::ZERO).await;
    assert_eq!(zero, Err(StoreError::Timeout(Duration::ZERO)));
    assert!(start.elapsed() < SLACK);

    server.restart().unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match store.snapshot(budget).await {
            Ok(_) => break,
            Err(e) => assert!(Instant::now() < deadline, "not back after 10 s: {e}"),
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    for (name, result, _) in every_op(&store, r, BUDGET).await {
        assert_eq!(result, Ok(()), "{name} after the restart");
    }
    // The change subscriber reconnected too: a refund by another replica
    // wakes this one's waiters.
    let changes = store.changes().unwrap();
    let other = common::backend(&server, "outage").open_scope(&config);
    common::a_refund_notifies(&changes, &other).await;
}

// proves: DQ-5 (an operation has the whole budget it is given: a Redis
// that answers after a second still answers an operation whose budget is
// two seconds, and fails one whose budget is a quarter of a second)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operation_has_its_whole_budget() {
    let Some(server) = common::server("an_operation_has_its_whole_budget") else {
        return;
    };
    let backend = common::backend(&server, "budget");
    let store = backend.open_scope(
        &ScopeConfig::new(common::unique("slow")).requests(10, Duration::from_secs(60)),
    );
    // Connected, scripts loaded.
    store.snapshot(BUDGET).await.expect("answers");
    let mut raw = common::raw(&server).await;
    let pause = || async {
        let _: () = redis::cmd("CLIENT")
            .arg("PAUSE")
            .arg(1_000)
            .arg("ALL")
            .query_async(&mut common::raw(&server).await)
            .await
            .expect("paused");
    };
    pause().await;
    let start = Instant::now();
    let answer = store.snapshot(Duration::from_secs(2)).await;
    assert!(answer.is_ok(), "{answer:?} after {:?}", start.elapsed());
    assert!(
        start.elapsed() >= Duration::from_millis(600),
        "{:?}",
        start.elapsed()
    );
    let _: () = redis::cmd("CLIENT")
        .arg("UNPAUSE")
        .query_async(&mut raw)
        .await
        .expect("unpaused");
    pause().await;
    let start = Instant::now();
    let answer = store.snapshot(Duration::from_millis(250)).await;
    assert!(matches!(answer, Err(StoreError::Timeout(_))), "{answer:?}");
    assert!(start.elapsed() < Duration::from_millis(250) + SLACK);
}

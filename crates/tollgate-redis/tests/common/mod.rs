//! Shared by the integration tests: a server per test, backends on it.
#![allow(dead_code)]

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use proptest::test_runner::{Config, FileFailurePersistence, TestCaseError, TestRunner};
use tokio::sync::Notify;
use tollgate::quota::{Demand, OpId, RemoteHold, RemoteQuota, StoreError};
use tollgate_redis::{RedisBackend, RedisCluster, RedisQuota, RedisServer, RedisSettings};

/// Generous: the tests run on loaded 2-core CI machines. Outage tests use
/// their own, short budgets.
pub const BUDGET: Duration = Duration::from_secs(5);

/// A server for `test`, or `None` (skipped with a note) when redis-server
/// is missing and `TOLLGATE_REQUIRE_REDIS` is not `1`.
pub fn server(test: &str) -> Option<RedisServer> {
    RedisServer::start_or_skip(test)
}

/// A fresh backend (its own connection) on `server`, under `prefix`, with
/// a 2 s timeout: the default 50 ms is meant for a production host, and on
/// two loaded cores a round trip sometimes takes longer, which the engine
/// rightly treats as an outage (SPEC DQ-3; the flake hunt saw a fairness
/// run fail 7 times in 35 so). Tests of outages and timeouts set their own.
pub fn backend(server: &RedisServer, prefix: &str) -> RedisBackend {
    RedisBackend::new(
        RedisSettings::new(server.url())
            .prefix(prefix)
            .timeout(Duration::from_secs(2)),
    )
    .expect("backend")
}

/// A cluster for `test`, or `None` (skipped with a note) as [`server`].
pub fn cluster(test: &str) -> Option<RedisCluster> {
    RedisCluster::start_or_skip(test)
}

/// A fresh backend (its own connections) on `cluster`, under `prefix`.
pub fn cluster_backend(cluster: &RedisCluster, prefix: &str) -> RedisBackend {
    let settings = RedisSettings::new(cluster.urls())
        .cluster(true)
        .prefix(prefix);
    RedisBackend::new(settings).expect("backend")
}

/// A scope name not used before in this process.
pub fn unique(name: &str) -> String {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    format!("{name}-{}", NEXT.fetch_add(1, Ordering::Relaxed))
}

/// A raw client for inspecting the server (TTLs, SCRIPT FLUSH, INFO).
pub async fn raw(server: &RedisServer) -> redis::aio::MultiplexedConnection {
    redis::Client::open(server.url())
        .expect("url")
        .get_multiplexed_async_connection()
        .await
        .expect("connect")
}

/// A property-test runner of `cases` cases (`PROPTEST_CASES` overrides),
/// keeping failures in a file beside `source` (the test's `file!()`).
pub fn runner(source: &'static str, cases: u32) -> TestRunner {
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|c| c.parse().ok())
        .unwrap_or(cases);
    TestRunner::new(Config {
        cases,
        failure_persistence: Some(Box::new(FileFailurePersistence::WithSource("regressions"))),
        source_file: Some(source),
        ..Config::default()
    })
}

/// The index of the `i`-th (modulo their number) item matching `want`.
pub fn pick<T>(items: &[T], i: usize, want: impl Fn(&T) -> bool) -> Option<usize> {
    let matching: Vec<usize> = (0..items.len()).filter(|&k| want(&items[k])).collect();
    (!matching.is_empty()).then(|| matching[i % matching.len()])
}

/// A store error as a property's failure.
pub fn fail(e: StoreError) -> TestCaseError {
    TestCaseError::fail(format!("store error: {e}"))
}

/// Waits (at most 10 s) until a refund by `other` (another replica) wakes
/// the waiters of `changes`; refunds again every 200 ms (a notice sent
/// before the subscriber listens is lost).
pub async fn a_refund_notifies(changes: &Notify, other: &RedisQuota) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let notified = changes.notified();
        let r = other
            .reserve(Demand::new(1, 0), RemoteHold::Leased, BUDGET)
            .await
            .expect("answered")
            .expect("granted");
        other.refund(r, OpId::new(), BUDGET).await.expect("refund");
        if tokio::time::timeout(Duration::from_millis(200), notified)
            .await
            .is_ok()
        {
            return;
        }
        assert!(Instant::now() < deadline, "no notice");
    }
}

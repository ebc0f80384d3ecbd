//! Shared by the integration tests: a server per test, backends on it.
#![allow(dead_code)]

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use tollgate_redis::{RedisBackend, RedisCluster, RedisServer, RedisSettings};

/// Generous: the tests run on loaded 2-core CI machines. Outage tests use
/// their own, short budgets.
pub const BUDGET: Duration = Duration::from_secs(5);

/// A server for `test`, or `None` (skipped with a note) when redis-server
/// is missing and `TOLLGATE_REQUIRE_REDIS` is not `1`.
pub fn server(test: &str) -> Option<RedisServer> {
    RedisServer::start_or_skip(test)
}

/// A fresh backend (its own connection) on `server`, under `prefix`.
pub fn backend(server: &RedisServer, prefix: &str) -> RedisBackend {
    RedisBackend::new(RedisSettings::new(server.url()).prefix(prefix)).expect("backend")
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

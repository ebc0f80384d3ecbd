//! Throwaway Redis deployments for tests (feature `testing`), each on free
//! loopback ports, without persistence, stopped when dropped:
//!
//! - [`RedisServer`]: one `redis-server` (`redis://`), or a TLS-only one
//!   ([`RedisServer::start_tls_or_skip`], `rediss://`, with a certificate
//!   authority and a server certificate made by `openssl` for the test);
//! - [`RedisCluster`]: a Redis Cluster of three primaries, created with
//!   `CLUSTER ADDSLOTSRANGE`, `CLUSTER SET-CONFIG-EPOCH` and `CLUSTER MEET`,
//!   whose slots move as `redis-cli --cluster reshard` moves them.
//!
//! ```no_run
//! # async fn demo() {
//! let Some(server) = tollgate_redis::RedisServer::start_or_skip("my_test") else {
//!     return; // redis-server is missing and not required: skipped
//! };
//! let url = server.url();
//! # let _ = url; }
//! ```
//!
//! When `redis-server` (or, for TLS, `openssl`) is not installed, the
//! `*_or_skip` starters print a note and return `None`, unless
//! `TOLLGATE_REQUIRE_REDIS=1` is set (CI sets it), which turns the missing
//! binary into a test failure. `REDIS_SERVER` names another binary than
//! `redis-server` on `PATH`.

mod certs;
mod cluster;
mod cluster_view;
mod server;

use std::io::{self, Write};

pub use cluster::RedisCluster;
pub use server::RedisServer;

/// Whether tests must fail rather than skip without `redis-server`
/// (`TOLLGATE_REQUIRE_REDIS=1`).
pub fn require_redis() -> bool {
    std::env::var("TOLLGATE_REQUIRE_REDIS").is_ok_and(|v| v == "1")
}

/// The `redis-server` binary.
fn binary() -> String {
    std::env::var("REDIS_SERVER").unwrap_or_else(|_| "redis-server".to_owned())
}

/// `started`, or `None` after a note when what it needs is not installed
/// and not required.
///
/// # Panics
///
/// When the deployment could not be started otherwise: that is the test's
/// failure.
fn or_skip<T>(test: &str, what: &str, started: io::Result<T>) -> Option<T> {
    match started {
        Ok(t) => Some(t),
        Err(e) if e.kind() == io::ErrorKind::NotFound && !require_redis() => {
            // Straight to stderr: the test harness captures `eprintln!`.
            let _ = writeln!(
                io::stderr(),
                "note: {test} skipped: {what}: {e} (set TOLLGATE_REQUIRE_REDIS=1 to fail instead)"
            );
            None
        }
        Err(e) => panic!("{test}: cannot start {what}: {e}"),
    }
}

/// A directory of its own under the system's temporary directory, removed
/// when dropped.
#[derive(Debug)]
struct TempDir(std::path::PathBuf);

impl TempDir {
    fn new(what: &str) -> io::Result<TempDir> {
        use std::sync::atomic::{AtomicU32, Ordering};
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        let dir = std::env::temp_dir().join(format!(
            "tollgate-{what}-{}-{n}-{nanos}",
            std::process::id()
        ));
        std::fs::create_dir_all(&dir)?;
        Ok(TempDir(dir))
    }

    fn path(&self) -> &std::path::Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

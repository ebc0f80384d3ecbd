//! Admissions against the Redis store, for `benches/redis/run.sh`
//! (BENCHMARKS.md, "Shared quota store (Redis)").
//!
//! ```text
//! redis_bench local                      # in-process store, sequential
//! redis_bench latency URL                # one connection, one call at a time
//! redis_bench load URL SECS CONCURRENCY  # one replica (backend) under load
//! redis_bench engine URL SECS CONCURRENCY # the same through the engine
//! ```
//!
//! `engine` admits calls through an `AdmissionController` on the store
//! (`acquire`, then the lease is dropped), so it includes the FIFO turn of
//! the scope (one reservation in flight per replica, SPEC DQ-4) and the
//! concurrency permits (far more than the calls in flight).
//!
//! Every mode admits `reserve(Hold::Leased)` demands of one request and 100
//! tokens from a scope with four limits (requests and tokens over 1 s and
//! 60 s, amounts far above what a run admits, so every call is the fast
//! path) and prints one `key=value` line: admissions, seconds, admissions
//! per second, p50 and p99 latency of an admission in microseconds.
//! Windows of 1 s fill the sliding log to its 513-slot bound within a
//! second: the figures include the largest state a limit can have.

use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use tollgate::config::ScopeConfig;
use tollgate::quota::{Demand, Hold, LocalQuota, QuotaStore, RemoteHold, RemoteQuota};
use tollgate_redis::{RedisBackend, RedisSettings};

const BUDGET: Duration = Duration::from_secs(2);

fn scope() -> ScopeConfig {
    let (second, minute) = (Duration::from_secs(1), Duration::from_secs(60));
    ScopeConfig::new("bench")
        .requests(1_000_000_000, second)
        .requests(1_000_000_000, minute)
        .tokens(1_000_000_000_000, second)
        .tokens(1_000_000_000_000, minute)
}

fn percentile(sorted: &[Duration], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() - 1) as f64 * p).round() as usize;
    sorted[i].as_secs_f64() * 1e6
}

fn report(mode: &str, mut latencies: Vec<Duration>, took: Duration) {
    latencies.sort_unstable();
    let n = latencies.len();
    println!(
        "mode={mode} admitted={n} secs={:.3} per_sec={:.0} p50_us={:.1} p99_us={:.1}",
        took.as_secs_f64(),
        n as f64 / took.as_secs_f64(),
        percentile(&latencies, 0.50),
        percentile(&latencies, 0.99),
    );
}

fn local() {
    let store = Mutex::new(LocalQuota::new(&scope(), tollgate::clock::Instant::now()));
    let demand = Demand::new(100, 0);
    let start = Instant::now();
    let mut latencies = Vec::with_capacity(1_000_000);
    while start.elapsed() < Duration::from_secs(2) {
        let t = Instant::now();
        let now = tollgate::clock::Instant::now();
        let granted = store.lock().reserve(&demand, now, Hold::Leased).is_ok();
        latencies.push(t.elapsed());
        assert!(granted, "the bench scope never refuses");
    }
    report("local", latencies, start.elapsed());
}

async fn run(url: &str, secs: u64, concurrency: usize, mode: &str) {
    let backend = RedisBackend::new(RedisSettings::new(url).prefix("bench")).expect("backend");
    let store = Arc::new(backend.open_scope(&scope()));
    // Warm up: the connection, the script cache and the slot log.
    for _ in 0..100 {
        let _ = store
            .reserve(Demand::new(100, 0), RemoteHold::Leased, BUDGET)
            .await;
    }
    let start = Instant::now();
    let end = start + Duration::from_secs(secs);
    let tasks: Vec<_> = (0..concurrency)
        .map(|_| {
            let store = store.clone();
            tokio::spawn(async move {
                let mut latencies = Vec::new();
                while Instant::now() < end {
                    let t = Instant::now();
                    let r = store
                        .reserve(Demand::new(100, 0), RemoteHold::Leased, BUDGET)
                        .await;
                    let took = t.elapsed();
                    match r {
                        Ok(Ok(_)) => latencies.push(took),
                        other => panic!("the bench scope never refuses: {other:?}"),
                    }
                }
                latencies
            })
        })
        .collect();
    let mut latencies = Vec::new();
    for t in tasks {
        latencies.extend(t.await.expect("task"));
    }
    report(mode, latencies, start.elapsed());
}

async fn engine(url: &str, secs: u64, concurrency: usize) {
    use tollgate::{AdmissionController, Call, Deadline, ScopeId, TokenEstimate};
    let backend = RedisBackend::new(RedisSettings::new(url).prefix("bench")).expect("backend");
    let c = AdmissionController::builder()
        .scope(scope())
        .concurrency(100_000)
        .shared_store(Arc::new(backend))
        .build()
        .expect("controller");
    let call = Call::new(ScopeId::FIRST).with_estimate(TokenEstimate::new(100, 0));
    for _ in 0..100 {
        drop(c.acquire(&call, Deadline::NONE).await.expect("admitted"));
    }
    let start = Instant::now();
    let end = start + Duration::from_secs(secs);
    let tasks: Vec<_> = (0..concurrency)
        .map(|_| {
            let c = c.clone();
            tokio::spawn(async move {
                let mut latencies = Vec::new();
                while Instant::now() < end {
                    let t = Instant::now();
                    let lease = c.acquire(&call, Deadline::NONE).await;
                    latencies.push(t.elapsed());
                    drop(lease.expect("the bench scope never refuses"));
                }
                latencies
            })
        })
        .collect();
    let mut latencies = Vec::new();
    for t in tasks {
        latencies.extend(t.await.expect("task"));
    }
    report("engine", latencies, start.elapsed());
    c.close().await;
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let arg = |i: usize, default: &str| args.get(i).cloned().unwrap_or_else(|| default.into());
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    match arg(0, "local").as_str() {
        "local" => local(),
        "latency" => rt.block_on(run(&arg(1, "redis://127.0.0.1:6379"), 2, 1, "latency")),
        "load" => {
            let secs = arg(2, "5").parse().expect("SECS");
            let concurrency = arg(3, "16").parse().expect("CONCURRENCY");
            rt.block_on(run(
                &arg(1, "redis://127.0.0.1:6379"),
                secs,
                concurrency,
                "load",
            ));
        }
        "engine" => {
            let secs = arg(2, "5").parse().expect("SECS");
            let concurrency = arg(3, "16").parse().expect("CONCURRENCY");
            rt.block_on(engine(&arg(1, "redis://127.0.0.1:6379"), secs, concurrency));
        }
        other => panic!("unknown mode {other}: local, latency, load or engine"),
    }
}

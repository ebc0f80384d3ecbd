//! Real concurrency (SPEC Q-13, DQ-2, DQ-7): three replicas (each its own
//! backend and connection) hammer one scope from a multi-threaded runtime
//! on the real clock, on a single node and on a Redis Cluster. An
//! independent recorder of what started, at the store's instants, finds
//! no window over the limit, and once the windows have passed everything
//! is available again (nothing lost, nothing counted twice).

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use parking_lot::Mutex;
use tollgate::config::{Algorithm, ScopeConfig};
use tollgate::quota::{Actual, Demand, HoldId, OpId, RemoteHold, RemoteQuota};
use tollgate_redis::{RedisBackend, RedisCluster, RedisServer};

use common::BUDGET;

const REPLICAS: usize = 3;
const TASKS: usize = 4;
/// How long the replicas hammer at least; then until enough attempts
/// started (a busy machine runs fewer in the same time), at most [`CAP`].
const RUN: Duration = Duration::from_millis(1_500);
/// The longest a run lasts, whatever it reached.
const CAP: Duration = Duration::from_secs(30);
const WINDOW: Duration = Duration::from_millis(400);
const REQUESTS: u64 = 40;
const TOKENS: u64 = 300;

/// One started attempt: store instant (µs) and what it counts.
#[derive(Debug, Clone, Copy)]
struct Started {
    tick: u64,
    tokens: u64,
}

/// Where the replicas keep the scope.
enum Target {
    Single(RedisServer),
    Cluster(RedisCluster),
}

impl Target {
    /// A replica's backend (its own connections).
    fn backend(&self) -> RedisBackend {
        match self {
            Target::Single(server) => common::backend(server, "stress"),
            Target::Cluster(cluster) => common::cluster_backend(cluster, "stress"),
        }
    }
}

/// A single node for test `name` (`None`: skipped).
fn single(name: &str) -> Option<Target> {
    common::server(name).map(Target::Single)
}

async fn hammer(algorithm: Algorithm, name: &str, target: &Target) {
    let config = ScopeConfig::new(common::unique(name))
        .algorithm(algorithm)
        .requests(REQUESTS, WINDOW)
        .tokens(TOKENS, WINDOW);
    let bucket = matches!(algorithm, Algorithm::TokenBucket { .. });
    let log: Arc<Mutex<Vec<Started>>> = Arc::default();
    let total = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for r in 0..REPLICAS {
        let store = Arc::new(target.backend().open_scope(&config));
        for t in 0..TASKS {
            let (store, log, total) = (store.clone(), log.clone(), total.clone());
            tasks.push(tokio::spawn(async move {
                let mut rng = fastrand::Rng::with_seed((r * TASKS + t) as u64);
                let begun = tokio::time::Instant::now();
                let (end, cap) = (begun + RUN, begun + CAP);
                let mut started = 0u32;
                loop {
                    let now = tokio::time::Instant::now();
                    let enough = total.load(Ordering::Relaxed) > 2 * REQUESTS;
                    if now >= cap || (now >= end && enough) {
                        break;
                    }
                    let demand = Demand::new(rng.u64(1..=20), 0);
                    let id = rng.bool().then(HoldId::new);
                    let hold = match id {
                        Some(id) => RemoteHold::Pending {
                            id,
                            ttl: Duration::from_secs(60),
                        },
                        None => RemoteHold::Leased,
                    };
                    let reservation = match store.reserve(demand, hold, BUDGET).await.unwrap() {
                        Ok(r) => r,
                        Err(not_until) => {
                            // Sleep until the instant the script returned (a
                            // few ms at most here), or briefly when only a
                            // lease can free room.
                            let now = tokio::time::Instant::now();
                            let until = not_until.at.unwrap_or(now + Duration::from_millis(5));
                            tokio::time::sleep_until(until.min(now + Duration::from_millis(50)))
                                .await;
                            continue;
                        }
                    };
                    let reservation = if let Some(id) = id {
                        tokio::time::sleep(Duration::from_micros(rng.u64(0..500))).await;
                        if rng.u8(0..4) == 0 {
                            assert!(store.forget(id, BUDGET).await.unwrap());
                            continue;
                        }
                        let leased = store.lease(reservation, id, BUDGET).await.unwrap();
                        leased.expect("the hold lives a minute")
                    } else {
                        reservation
                    };
                    started += 1;
                    total.fetch_add(1, Ordering::Relaxed);
                    let index = {
                        let mut log = log.lock();
                        log.push(Started {
                            tick: reservation.tick,
                            tokens: demand.tokens(),
                        });
                        log.len() - 1
                    };
                    // Reported usage below the estimate gives tokens back
                    // (not for the bucket, whose bound is without refunds).
                    if !bucket && rng.bool() {
                        let actual = rng.u64(0..=demand.tokens());
                        store
                            .reconcile(reservation, Actual::total(actual), OpId::new(), BUDGET)
                            .await
                            .unwrap();
                        log.lock()[index].tokens = actual;
                    }
                }
                started
            }));
        }
    }
    let mut started = 0;
    for t in tasks {
        started += t.await.unwrap();
    }
    let mut log = log.lock().clone();
    log.sort_by_key(|s| s.tick);
    assert_eq!(log.len(), started as usize);
    let w = WINDOW.as_micros() as u64;
    // Enough contention that the limits were reached many times over.
    assert!(
        log.len() as u64 > 2 * REQUESTS,
        "only {} attempts started",
        log.len()
    );
    let (requests_bound, tokens_bound) = match algorithm {
        // C + limit per rolling window (C = limit with the default burst).
        Algorithm::TokenBucket { .. } => (2 * REQUESTS, 2 * TOKENS),
        _ => (REQUESTS, TOKENS),
    };
    let mut fullest = 0;
    for (i, s) in log.iter().enumerate() {
        let inside = log[..=i].iter().filter(|o| match algorithm {
            Algorithm::FixedWindow => o.tick / w == s.tick / w,
            _ => o.tick + w > s.tick,
        });
        let (requests, tokens) = inside.fold((0, 0), |(r, t), o| (r + 1, t + o.tokens));
        fullest = fullest.max(tokens.max(requests * TOKENS / REQUESTS));
        assert!(
            requests <= requests_bound && tokens <= tokens_bound,
            "window ending at {} µs holds {requests} requests, {tokens} tokens",
            s.tick
        );
    }
    // The replicas did reach the limit: the bound was tested, not idle.
    assert!(
        fullest >= TOKENS * 3 / 4,
        "the fullest window held only {fullest} tokens"
    );
    // Nothing lost: once the windows have passed, every limit is whole.
    tokio::time::sleep(WINDOW * 2).await;
    let store = target.backend().open_scope(&config);
    for limit in store.snapshot(BUDGET).await.unwrap() {
        assert_eq!(
            limit.available as u64, limit.capacity,
            "{limit:?} not whole again"
        );
    }
    eprintln!("{name}: {} attempts started", log.len());
}

// proves: Q-13, DQ-2 (sliding window: Q-7 holds across replicas under real
// concurrency; nothing lost)
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn replicas_never_exceed_a_sliding_window() {
    let Some(target) = single("stress_sliding") else {
        return;
    };
    hammer(Algorithm::SlidingWindow, "stress_sliding", &target).await;
}

// proves: Q-13, DQ-2 (fixed window: at most the limit per window across
// replicas; nothing lost)
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn replicas_never_exceed_a_fixed_window() {
    let Some(target) = single("stress_fixed") else {
        return;
    };
    hammer(Algorithm::FixedWindow, "stress_fixed", &target).await;
}

// proves: Q-13, DQ-2 (token bucket: at most C + limit per rolling window
// across replicas; nothing lost)
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn replicas_never_exceed_a_token_bucket() {
    let Some(target) = single("stress_bucket") else {
        return;
    };
    hammer(
        Algorithm::TokenBucket { burst: None },
        "stress_bucket",
        &target,
    )
    .await;
}

// proves: Q-13, DQ-2, DQ-7 (the same on a Redis Cluster of three
// primaries: no window over its limit across replicas, for each
// algorithm; nothing lost)
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn replicas_on_a_cluster_never_exceed_a_limit() {
    let Some(cluster) = common::cluster("replicas_on_a_cluster_never_exceed_a_limit") else {
        return;
    };
    let target = Target::Cluster(cluster);
    for (algorithm, name) in [
        (Algorithm::SlidingWindow, "cluster_sliding"),
        (Algorithm::FixedWindow, "cluster_fixed"),
        (Algorithm::TokenBucket { burst: None }, "cluster_bucket"),
    ] {
        hammer(algorithm, name, &target).await;
    }
}

//! The quota and permit promises under real concurrency (SPEC Q-13): many
//! worker threads, a real clock read by each at its own moment, waits,
//! cancellations, refunds, debts and cooldowns, all at once. These tests
//! assert invariants (nothing lost, no window over its limit, idle at the
//! end), never timings.
//!
//! Plus deterministic reproductions of the races they guard against: a
//! clock read that reaches the store after a later one, and a permit that
//! comes back without a lease while `close` waits.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use parking_lot::Mutex;
use tokio::time::Instant;
use tollgate::clock::Clock;
use tollgate::config::Overflow;
use tollgate::config::{Algorithm, MINUTE, ScopeConfig};
use tollgate::quota::Dimension;
use tollgate::{
    AdmissionController, AdmissionError, Call, CallId, Deadline, Flow, Priority, ScopeId,
    TokenEstimate, Usage,
};

use common::{assert_idle, available, settle};

/// A short window: with 512 slots per window a slot boundary passes every
/// 20 µs, so clock reads and lock acquisitions interleave across slot
/// boundaries thousands of times per run.
const WINDOW: Duration = Duration::from_millis(10);
const REQUESTS: u64 = 40;
const TOKENS: u64 = 1_200;
const CONCURRENCY: usize = 4;
const TASKS: u64 = 64;
const ROUNDS: u64 = 300;
const MAX_ESTIMATE: u64 = 100;

/// A small deterministic generator per task (xorshift64*).
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Self {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// Uniform in `0..n`.
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// One admission as seen from outside: the real instant at which tollgate
/// counted it lies between `before` (read before `acquire` was called) and
/// `after` (read once the lease was in hand).
#[derive(Debug, Clone, Copy)]
struct Seen {
    before: Instant,
    after: Instant,
    /// Tokens finally charged (the reported usage, or the estimate when
    /// unknown).
    tokens: u64,
    /// Tokens charged beyond the estimate.
    debt: u64,
}

/// Records admissions independently of the controller's bookkeeping.
#[derive(Default)]
struct Recorder {
    seen: Mutex<Vec<Seen>>,
    /// Admissions given up at the await (cancelled) and at the deadline.
    cancelled: AtomicUsize,
    expired: AtomicUsize,
    /// Calls refused by a full queue (overflow `reject`).
    refused: AtomicUsize,
    /// Admissions per flow (fair runs).
    per_flow: Mutex<std::collections::HashMap<u32, usize>>,
}

/// How the stress shares its scope (SPEC §15).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Sharing {
    /// Every call in the default flow: plain FIFO.
    Fifo,
    /// Six flows over three classes with weights 1 to 3, a queue of 16
    /// shared under `reject` (FAIR-10 displacements at every instant).
    Flows,
}

/// The flow of a task in a fair run: tenants 0..6, classes and weights
/// mixed.
fn flow_for(task: u64) -> Flow {
    let tenant = (task % 6) as u32;
    let class = Priority::ALL[(task % 3) as usize];
    Flow::new(tenant, class).with_weight(1 + (task % 3) as u32)
}

/// What a rolling window may hold for `algorithm`: (requests, tokens)
/// bounds before debt (SPEC Q-7).
fn bounds(algorithm: Algorithm) -> (u64, u64) {
    match algorithm {
        Algorithm::SlidingWindow | Algorithm::FixedWindow => (REQUESTS, TOKENS),
        // Capacity C = limit (burst of one window): C + limit per window,
        // tokens max(C, E_max) + limit.
        Algorithm::TokenBucket { .. } => (2 * REQUESTS, TOKENS.max(MAX_ESTIMATE) + TOKENS),
    }
}

/// Checks every set of admissions that certainly fell inside one window.
///
/// For the sliding window and the token bucket the windows are rolling:
/// admissions whose brackets all lie within `[before_i, before_i + W)` were
/// certainly counted less than `W` apart. For the fixed window they are the
/// controller's aligned windows, located through the bracket of its epoch:
/// only admissions certainly inside one aligned window are summed. Both
/// checks can miss a violation but never report a false one.
fn check_windows(seen: &mut [Seen], algorithm: Algorithm, epoch: (Instant, Instant)) {
    seen.sort_by_key(|s| s.before);
    let (max_requests, max_tokens) = bounds(algorithm);
    if algorithm == Algorithm::FixedWindow {
        let (early, late) = epoch;
        let mut windows: std::collections::HashMap<u128, (u64, u64, u64)> = Default::default();
        for s in seen.iter() {
            // Window index bounds: lowest from the earliest instant against
            // the latest epoch, highest from the latest against the earliest.
            let lo = s.before.saturating_duration_since(late).as_nanos() / WINDOW.as_nanos();
            let hi = s.after.saturating_duration_since(early).as_nanos() / WINDOW.as_nanos();
            if lo == hi {
                let w = windows.entry(lo).or_default();
                w.0 += 1;
                w.1 += s.tokens;
                w.2 += s.debt;
            }
        }
        for (index, (requests, tokens, debt)) in windows {
            assert!(
                requests <= max_requests,
                "fixed window {index}: {requests} requests > {max_requests}"
            );
            assert!(
                tokens <= max_tokens + debt,
                "fixed window {index}: {tokens} tokens > {max_tokens} + debt {debt}"
            );
        }
        return;
    }
    for i in 0..seen.len() {
        let start = seen[i].before;
        let end = start + WINDOW;
        let (mut requests, mut tokens, mut debt) = (0u64, 0u64, 0u64);
        for s in seen[i..].iter().take_while(|s| s.before < end) {
            if s.after < end {
                requests += 1;
                tokens += s.tokens;
                debt += s.debt;
            }
        }
        assert!(
            requests <= max_requests,
            "{algorithm:?}: {requests} requests within one window > {max_requests}"
        );
        assert!(
            tokens <= max_tokens + debt,
            "{algorithm:?}: {tokens} tokens within one window > {max_tokens} + debt {debt}"
        );
    }
}

/// The usage an attempt reports: below, equal, above (debt), unknown or
/// known zero.
fn usage_for(rng: &mut Rng, estimate: u64) -> (Usage, u64) {
    match rng.below(10) {
        0..=2 => {
            let used = rng.below(estimate + 1);
            (Usage::known(used), used)
        }
        3..=5 => (Usage::known(estimate), estimate),
        6 | 7 => {
            let used = estimate + rng.below(estimate + 1);
            (Usage::known(used), used)
        }
        8 => (Usage::UNKNOWN, estimate),
        _ => (Usage::known(0), 0),
    }
}

/// One task's life: admissions with tight deadlines, cancellations at the
/// await, leases held across yields, settlements of every kind and, now
/// and then, a 429 that pauses the scope and preempts granted attempts.
async fn worker(
    controller: AdmissionController,
    task: u64,
    recorder: Arc<Recorder>,
    active: Arc<AtomicUsize>,
    max_active: Arc<AtomicUsize>,
    sharing: Sharing,
) {
    let mut rng = Rng::new(task + 1);
    for round in 0..ROUNDS {
        let estimate = 1 + rng.below(MAX_ESTIMATE);
        let mut call = Call::new(ScopeId::FIRST).with_estimate(TokenEstimate::new(estimate, 0));
        if sharing == Sharing::Flows {
            call = call.with_flow(flow_for(task));
        }
        if rng.below(4) == 0 {
            call = call.with_id(CallId(task * 1_000_000 + round));
        }
        let kind = rng.below(10);
        let deadline = if kind == 0 {
            // Often too short: the wait is abandoned at the deadline.
            Deadline::from_timeout(
                Some(Duration::from_micros(rng.below(3_000))),
                Instant::now(),
            )
        } else {
            Deadline::from_timeout(Some(Duration::from_secs(30)), Instant::now())
        };
        let before = Instant::now();
        let acquired = if kind == 1 {
            // Cancelled at the await, wherever the admission is by then.
            let cut = Duration::from_micros(rng.below(2_000));
            match tokio::time::timeout(cut, controller.acquire(&call, deadline)).await {
                Ok(r) => r,
                Err(_) => {
                    recorder.cancelled.fetch_add(1, Ordering::Relaxed);
                    continue;
                }
            }
        } else {
            controller.acquire(&call, deadline).await
        };
        let mut lease = match acquired {
            Ok(lease) => lease,
            Err(AdmissionError::DeadlineExceeded { .. }) => {
                recorder.expired.fetch_add(1, Ordering::Relaxed);
                continue;
            }
            Err(AdmissionError::QueueFull { .. }) if sharing == Sharing::Flows => {
                recorder.refused.fetch_add(1, Ordering::Relaxed);
                continue;
            }
            Err(e) => panic!("unexpected admission error: {e}"),
        };
        let after = Instant::now();
        let now_active = active.fetch_add(1, Ordering::SeqCst) + 1;
        max_active.fetch_max(now_active, Ordering::SeqCst);
        if rng.below(2) == 0 {
            tokio::task::yield_now().await;
        } else {
            tokio::time::sleep(Duration::from_micros(rng.below(500))).await;
        }
        if rng.below(100) == 0 {
            let _ = lease.rate_limited(Some(Duration::from_millis(2)));
        }
        let (usage, charged) = if rng.below(10) == 0 {
            // Dropped without settlement: the estimate stays spent.
            (None, estimate)
        } else {
            let (u, c) = usage_for(&mut rng, estimate);
            (Some(u), c)
        };
        if let Some(u) = usage {
            lease.reconcile(u).expect("settled once");
        }
        active.fetch_sub(1, Ordering::SeqCst);
        drop(lease);
        recorder.seen.lock().push(Seen {
            before,
            after,
            tokens: charged,
            debt: charged.saturating_sub(estimate),
        });
        *recorder
            .per_flow
            .lock()
            .entry(call.flow.tenant())
            .or_default() += 1;
    }
}

fn stress(algorithm: Algorithm) {
    stress_with(algorithm, Sharing::Fifo);
}

fn stress_with(algorithm: Algorithm, sharing: Sharing) {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(16)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async move {
        let early = Instant::now();
        let mut builder = AdmissionController::builder()
            .scope(
                ScopeConfig::new("stress")
                    .requests(REQUESTS, WINDOW)
                    .tokens(TOKENS, WINDOW)
                    .algorithm(algorithm),
            )
            .concurrency(CONCURRENCY as u64);
        if sharing == Sharing::Flows {
            builder = builder.queue_capacity(16).overflow(Overflow::Reject);
        }
        let controller = builder.build().unwrap();
        let late = Instant::now();
        let recorder = Arc::new(Recorder::default());
        let active = Arc::new(AtomicUsize::new(0));
        let max_active = Arc::new(AtomicUsize::new(0));
        let tasks: Vec<_> = (0..TASKS)
            .map(|t| {
                tokio::spawn(worker(
                    controller.clone(),
                    t,
                    recorder.clone(),
                    active.clone(),
                    max_active.clone(),
                    sharing,
                ))
            })
            .collect();
        // A lost reservation can also leave the queue's head waiting for an
        // event that never comes: a stall is a failure, not a slow run.
        let joined = tokio::time::timeout(Duration::from_secs(120), async {
            for t in tasks {
                t.await.expect("worker panicked");
            }
        })
        .await;
        assert!(joined.is_ok(), "{algorithm:?}: admissions stalled");

        // POOL / ADM-7: the concurrency limit held at every instant.
        assert!(max_active.load(Ordering::SeqCst) <= CONCURRENCY);
        // Q-7 under concurrency, by the independent recorder.
        let mut seen = std::mem::take(&mut *recorder.seen.lock());
        println!(
            "{algorithm:?} {sharing:?}: {} admitted, {} cancelled at the await, {} past their \
             deadline, {} refused by a full queue, per flow {:?}",
            seen.len(),
            recorder.cancelled.load(Ordering::Relaxed),
            recorder.expired.load(Ordering::Relaxed),
            recorder.refused.load(Ordering::Relaxed),
            recorder.per_flow.lock(),
        );
        assert!(!seen.is_empty());
        if sharing == Sharing::Flows {
            // FAIR-2, FAIR-3: every flow, every class, was served.
            let per_flow = recorder.per_flow.lock();
            for tenant in 0..6 {
                assert!(
                    per_flow.get(&tenant).is_some_and(|n| *n > 0),
                    "tenant {tenant} starved: {per_flow:?}"
                );
            }
        }
        check_windows(&mut seen, algorithm, (early, late));

        // Nothing lost: after three quiet windows every unit is back and
        // nothing is queued, pending or held.
        tokio::time::sleep(3 * WINDOW).await;
        assert_idle(&controller);
        let snapshot = controller.snapshot();
        for limit in &snapshot.scopes[0].limits {
            assert_eq!(
                limit.available, limit.capacity as i64,
                "{algorithm:?}: {:?} not fully available after the run: {snapshot:#?}",
                limit.dimension
            );
        }
        // And the controller still admits a full limit at once.
        let lease = controller
            .acquire(
                &Call::new(ScopeId::FIRST).with_estimate(TokenEstimate::new(MAX_ESTIMATE, 0)),
                Deadline::from_timeout(Some(Duration::from_secs(5)), Instant::now()),
            )
            .await
            .expect("admits after the run");
        drop(lease);
        tokio::time::timeout(Duration::from_secs(10), controller.close())
            .await
            .expect("close resolves once every lease is back");
    });
}

// proves, Q-9 (sliding window: many threads, real clock; no
// rolling window over its limit plus debt, every unit back at the end)
#[test]
fn sliding_window_under_real_threads() {
    stress(Algorithm::SlidingWindow);
}

// proves: Q-13, FAIR-1, FAIR-3, FAIR-6, FAIR-10 (six flows over three
// classes and weights sharing the scope, its pool and a small queue under
// `reject`, on many threads with a real clock, cancellations at every
// await and settlements of every kind: no window over its limit, nothing
// lost, every flow served, idle at the end)
#[test]
fn flows_share_a_scope_under_real_threads() {
    stress_with(Algorithm::SlidingWindow, Sharing::Flows);
}

// proves, Q-9 (token bucket under real threads)
#[test]
fn token_bucket_under_real_threads() {
    stress(Algorithm::TokenBucket { burst: None });
}

// proves, Q-9 (fixed window under real threads)
#[test]
fn fixed_window_under_real_threads() {
    stress(Algorithm::FixedWindow);
}

/// A clock the test sets to any instant, earlier ones included: what two
/// threads see when they read a real clock in one order and take the
/// scope's lock in the other.
#[derive(Debug, Clone)]
struct SkewedClock {
    now: Arc<Mutex<Instant>>,
}

impl SkewedClock {
    fn set(&self, at: Instant) {
        *self.now.lock() = at;
    }
}

impl Clock for SkewedClock {
    fn now(&self) -> Instant {
        *self.now.lock()
    }
}

// proves: Q-13 (an instant older than one the store has seen is treated as
// that one: a reservation stamped "in the past" is found again when it is
// leased, and no capacity is lost)
#[tokio::test(flavor = "current_thread")]
async fn a_clock_read_that_arrives_late_loses_nothing() {
    for algorithm in [
        Algorithm::SlidingWindow,
        Algorithm::TokenBucket { burst: None },
        Algorithm::FixedWindow,
    ] {
        let base = Instant::now();
        let clock = SkewedClock {
            now: Arc::new(Mutex::new(base)),
        };
        let at = |ms: u64| base + Duration::from_millis(ms);
        let controller = AdmissionController::builder()
            .scope(
                ScopeConfig::new("main")
                    .requests(10, MINUTE)
                    .tokens(1_000, MINUTE)
                    .algorithm(algorithm),
            )
            .concurrency(1)
            .clock(Arc::new(clock.clone()))
            .build()
            .unwrap();
        let call = Call::new(ScopeId::FIRST).with_estimate(TokenEstimate::new(100, 0));

        // A holds the only permit; B reserves at 200 ms and waits for it.
        let a = controller.acquire(&call, Deadline::NONE).await.unwrap();
        clock.set(at(200));
        let b = tokio::spawn({
            let c = controller.clone();
            async move { c.acquire(&call, Deadline::NONE).await }
        });
        settle().await;
        // C read the clock at 150 ms but reaches the store after B.
        clock.set(at(150));
        let c = tokio::spawn({
            let c = controller.clone();
            async move { c.acquire(&call, Deadline::NONE).await }
        });
        settle().await;

        // Both start in turn, then everything ages out.
        clock.set(at(300));
        drop(a);
        let b = b.await.unwrap().unwrap();
        drop(b);
        let c = c.await.unwrap().unwrap();
        drop(c);
        clock.set(at(200_000));
        assert_eq!(
            available(&controller, Dimension::Requests),
            10,
            "{algorithm:?}"
        );
        assert_eq!(
            available(&controller, Dimension::Tokens),
            1_000,
            "{algorithm:?}"
        );
        assert_idle(&controller);
    }
}

// proves: Q-3 (an estimate larger than the whole token limit fails at once
// on every path, the token bucket's fast path with a full bucket included)
#[tokio::test(start_paused = true)]
async fn oversized_estimate_fails_even_on_a_full_bucket() {
    for algorithm in [
        Algorithm::SlidingWindow,
        Algorithm::TokenBucket { burst: None },
        Algorithm::FixedWindow,
    ] {
        let controller = AdmissionController::builder()
            .scope(
                ScopeConfig::new("main")
                    .tokens(1_000, MINUTE)
                    .algorithm(algorithm),
            )
            .build()
            .unwrap();
        let call = Call::new(ScopeId::FIRST).with_estimate(TokenEstimate::new(1_001, 0));
        let err = controller.acquire(&call, Deadline::NONE).await.unwrap_err();
        assert!(
            matches!(err, AdmissionError::EstimateExceedsLimit(_)),
            "{algorithm:?}: {err:?}"
        );
        assert_eq!(available(&controller, Dimension::Tokens), 1_000);
        assert_idle(&controller);
    }
}

// proves: LC-7 (close resolves when the last permit comes back without a
// lease: a permit handed to a waiter that then finds the controller closed)
#[tokio::test(start_paused = true)]
async fn close_wakes_when_an_uncollected_permit_comes_back() {
    let controller = AdmissionController::builder()
        .scope(ScopeConfig::new("main").requests(10, MINUTE))
        .concurrency(1)
        .build()
        .unwrap();
    let call = Call::new(ScopeId::FIRST);
    let a = controller.acquire(&call, Deadline::NONE).await.unwrap();
    let b = tokio::spawn({
        let c = controller.clone();
        async move { c.acquire(&call, Deadline::NONE).await }
    });
    settle().await;
    // A's permit is handed to B, which has not run yet; then close.
    drop(a);
    tokio::time::timeout(Duration::from_secs(60), controller.close())
        .await
        .expect("close must not wait forever");
    assert!(matches!(b.await.unwrap(), Err(AdmissionError::Closed)));
    assert_idle(&controller);
    // A's request unit is spent; B's reservation came back in full.
    assert_eq!(available(&controller, Dimension::Requests), 9);
}

// proves: LC-7 (`idle` resolves on its own when the last lease is
// released, without a close)
#[tokio::test(start_paused = true)]
async fn idle_resolves_when_the_last_lease_goes() {
    let controller = AdmissionController::builder()
        .scope(ScopeConfig::new("main").requests(10, MINUTE))
        .build()
        .unwrap();
    let lease = controller
        .acquire(&Call::new(ScopeId::FIRST), Deadline::NONE)
        .await
        .unwrap();
    let idle = tokio::spawn({
        let c = controller.clone();
        async move { c.idle().await }
    });
    settle().await;
    assert!(!idle.is_finished());
    drop(lease);
    tokio::time::timeout(Duration::from_secs(60), idle)
        .await
        .expect("idle must resolve")
        .unwrap();
}

// proves: FAIR-6, POOL-1, Q-9 (flows of every class and several weights
// share a pool of 2 permits and a refilling quota on 2 worker threads;
// callers give up at random instants, by deadline and by cancellation, so
// a permit is often handed to a waiter as it leaves: the pool never lends
// more than its permits, and nothing is left held, pending or queued)
#[test]
fn pool_permits_survive_cancellations_between_flows() {
    use tollgate::config::PoolConfig;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let c = AdmissionController::builder()
            .scope(
                ScopeConfig::new("s")
                    .requests(200, Duration::from_millis(100))
                    .tokens(20_000, Duration::from_millis(100)),
            )
            .pool(PoolConfig::new("model", 2))
            .build()
            .unwrap();
        let pool = c.pool_id("model").unwrap();
        let in_use = Arc::new(AtomicUsize::new(0));
        let most = Arc::new(AtomicUsize::new(0));
        let mut tasks = Vec::new();
        for t in 0..24u64 {
            let (c, in_use, most) = (c.clone(), in_use.clone(), most.clone());
            tasks.push(tokio::spawn(async move {
                let mut rng = fastrand::Rng::with_seed(t * 7919);
                for _ in 0..150 {
                    let class = Priority::ALL[rng.usize(0..3)];
                    let flow = Flow::new(rng.u32(0..4), class).with_weight(rng.u32(1..4));
                    let call = Call::new(ScopeId::FIRST)
                        .with_flow(flow)
                        .with_estimate(TokenEstimate::new(rng.u64(1..300), 0))
                        .with_pool(pool);
                    let deadline = Deadline::after(Duration::from_micros(rng.u64(0..60_000)));
                    let cancel = Duration::from_micros(rng.u64(0..40_000));
                    let got = tokio::time::timeout(cancel, c.acquire(&call, deadline)).await;
                    if let Ok(Ok(mut lease)) = got {
                        let n = in_use.fetch_add(1, Ordering::SeqCst) + 1;
                        most.fetch_max(n, Ordering::SeqCst);
                        if rng.bool() {
                            tokio::time::sleep(Duration::from_micros(rng.u64(0..2_000))).await;
                        }
                        in_use.fetch_sub(1, Ordering::SeqCst);
                        if rng.bool() {
                            let _ = lease.reconcile(Usage::known(rng.u64(0..300)));
                        }
                    }
                }
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
        assert!(most.load(Ordering::SeqCst) <= 2, "more leases than permits");
        assert_idle(&c);
    });
}

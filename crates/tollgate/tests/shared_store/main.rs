//! The admission controller on a quota store shared by several processes
//! (SPEC §13 DQ-1..DQ-5), against the in-process test store of
//! `test_store.rs` (test support only; the Redis store is tested in its own
//! crate).

mod test_store;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use tokio::task::JoinHandle;
use tokio::time::Instant;
use tollgate::config::{PoolConfig, ScopeConfig};
use tollgate::quota::Unavailable;
use tollgate::{
    AdmissionController, AdmissionError, Call, Deadline, Dimension, Lease, Phase, PoolId,
    RefusalCost, ScopeId, StoreMode, TokenEstimate, Usage,
};

use test_store::{Calls, Outage, TestBackend, TestStore, assert_windows, window_maxima};

const SCOPE: &str = "acct";
const SECOND: Duration = Duration::from_secs(1);
const TIMEOUT: Duration = Duration::from_millis(50);

/// A replica: a controller on `store`, built from `scope` and `build`.
fn replica(
    store: &Arc<TestStore>,
    on_unavailable: Unavailable,
    scope: ScopeConfig,
    build: impl FnOnce(tollgate::ControllerBuilder) -> tollgate::ControllerBuilder,
) -> (AdmissionController, TestBackend) {
    let backend = store.backend(TIMEOUT, on_unavailable);
    let controller = build(
        AdmissionController::builder()
            .scope(scope)
            .shared_store(Arc::new(backend.clone())),
    )
    .build()
    .expect("valid configuration");
    (controller, backend)
}

/// Whether an admission of `call` still waited after `d` (it is then
/// dropped: cancelled at whatever stage it was in).
async fn gave_up(c: &AdmissionController, call: Call, d: Duration) -> bool {
    tokio::time::timeout(d, c.acquire(&call, Deadline::NONE))
        .await
        .is_err()
}

/// Admits `call` without a deadline on a task of its own.
fn spawn_acquire(c: &AdmissionController, call: Call) -> JoinHandle<Result<Lease, AdmissionError>> {
    let c = c.clone();
    tokio::spawn(async move { c.acquire(&call, Deadline::NONE).await })
}

fn call(tokens: u64) -> Call {
    Call::new(ScopeId::FIRST).with_estimate(TokenEstimate::new(tokens, 0))
}

fn within(d: Duration) -> Deadline {
    Deadline::from_timeout(Some(d), Instant::now())
}

/// Lets detached settlements run (paused clock: they finish at once).
async fn settle() {
    for _ in 0..50 {
        tokio::task::yield_now().await;
    }
    tokio::time::sleep(Duration::from_millis(1)).await;
}

fn available(store: &TestStore, dimension: Dimension) -> i64 {
    store
        .limits(SCOPE)
        .iter()
        .find(|l| l.dimension == dimension)
        .map(|l| l.available)
        .expect("a limit of that dimension")
}

fn mode(c: &AdmissionController) -> Option<StoreMode> {
    c.snapshot().scopes[0].store
}

/// A sum over the first scope's counters of every replica, as of now.
fn counter_sum(
    replicas: &[AdmissionController],
) -> impl Fn(fn(&tollgate::ScopeCounters) -> u64) -> u64 {
    let counters: Vec<_> = replicas
        .iter()
        .map(|c| c.snapshot().scopes[0].counters)
        .collect();
    move |f| counters.iter().map(f).sum()
}

// proves: DQ-2, Q-7, Q-13, Q-9 (several replicas, real threads and clock:
// no rolling window over the limit, every unit and permit back at the end)
#[test]
fn replicas_sharing_a_store_never_exceed_the_limit_under_stress() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(12)
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(async {
        const WINDOW: Duration = Duration::from_millis(400);
        const REQUESTS: u64 = 30;
        const TOKENS: u64 = 3_000;
        let store = TestStore::new(Duration::from_secs(3_600));
        store.set_latency(Duration::from_micros(300));
        let scope = ScopeConfig::new(SCOPE)
            .requests(REQUESTS, WINDOW)
            .tokens(TOKENS, WINDOW);
        let replicas: Vec<_> = (0..3)
            .map(|_| {
                replica(&store, Unavailable::FailClosed, scope.clone(), |b| {
                    b.concurrency(3).queue_capacity(64)
                })
                .0
            })
            .collect();
        let admitted = Arc::new(AtomicU64::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let mut tasks = Vec::new();
        for (r, controller) in replicas.iter().enumerate() {
            for w in 0..12u64 {
                let controller = controller.clone();
                let admitted = Arc::clone(&admitted);
                let stop = Arc::clone(&stop);
                tasks.push(tokio::spawn(async move {
                    let mut rng = fastrand::Rng::with_seed(r as u64 * 100 + w);
                    while !stop.load(Ordering::Relaxed) {
                        let estimate = rng.u64(20..200);
                        let deadline = within(Duration::from_millis(rng.u64(1..300)));
                        // Cancel at a random moment: any await of the
                        // admission (turn, round trips, sleeps, permit).
                        let cancel_after = Duration::from_micros(rng.u64(0..4_000));
                        let acquire = controller.acquire(&call(estimate), deadline);
                        let lease = match tokio::time::timeout(cancel_after, acquire).await {
                            Ok(Ok(lease)) => lease,
                            Ok(Err(_)) | Err(_) => continue,
                        };
                        admitted.fetch_add(1, Ordering::Relaxed);
                        let mut lease = lease;
                        tokio::time::sleep(Duration::from_micros(rng.u64(0..2_000))).await;
                        match rng.u8(0..10) {
                            0 => {
                                let _ = lease.refused(RefusalCost::Free);
                            }
                            1 => {
                                // Debt: more than estimated.
                                let _ = lease.reconcile(Usage::known(estimate + 50));
                            }
                            2 => lease.counted_by(Instant::now()),
                            3 => {
                                let _ = controller
                                    .start_cooldown(ScopeId::FIRST, Duration::from_millis(3));
                            }
                            4 => {}
                            _ => {
                                let _ = lease.reconcile(Usage::known(rng.u64(0..=estimate)));
                            }
                        }
                        drop(lease);
                    }
                }));
            }
        }
        // The run lasts 1.6 s, and longer while a path the assertions
        // below count on (a refunded or preempted grant, a debt, a full
        // window) has not been taken yet, which on a busy machine takes
        // longer: what a run covers depends on scheduling, what it asserts
        // must not (SPEC Q-13: invariants, never timings).
        let started = Instant::now();
        loop {
            tokio::time::sleep(Duration::from_millis(20)).await;
            let elapsed = started.elapsed();
            let covered = || {
                let sum = counter_sum(&replicas);
                let (requests, _) = window_maxima(&store.records(SCOPE), WINDOW);
                sum(|c| c.refunded_reservations) > 0
                    && sum(|c| c.preempted) > 0
                    && sum(|c| c.tokens_debt) > 0
                    && admitted.load(Ordering::Relaxed) > 2 * REQUESTS
                    && requests >= REQUESTS
            };
            if elapsed >= Duration::from_secs(30)
                || (elapsed >= Duration::from_millis(1_600) && covered())
            {
                break;
            }
        }
        stop.store(true, Ordering::Relaxed);
        for t in tasks {
            t.await.expect("worker");
        }
        // Detached settlements and refunds: `idle` waits for them.
        for c in &replicas {
            c.idle().await;
            assert!(c.snapshot().is_idle(), "{:?}", c.snapshot());
            assert_eq!(c.snapshot().active, 0);
        }
        let records = store.records(SCOPE);
        let sum = counter_sum(&replicas);
        // Each lease is in the store exactly once; every refunded grant is not.
        assert_eq!(records.len() as u64, admitted.load(Ordering::Relaxed));
        assert_eq!(sum(|c| c.admitted), admitted.load(Ordering::Relaxed));
        assert!(
            sum(|c| c.refunded_reservations) > 0,
            "cancellations refunded grants"
        );
        assert!(
            sum(|c| c.preempted) > 0,
            "cooldowns preempted grants (CD-3)"
        );
        assert!(sum(|c| c.tokens_debt) > 0, "debt was recorded");
        assert_eq!(
            sum(|c| c.store_errors),
            0,
            "deadlines are not store failures"
        );
        assert_eq!(sum(|c| c.settlements_failed), 0);
        // The recorder's instants are the quota's own (see test_store.rs):
        // a window over the limit here is one in the quota's own view.
        assert_eq!(store.clock_mismatches(SCOPE), 0);
        let (max_requests, max_tokens) = assert_windows(&records, WINDOW, REQUESTS, TOKENS);
        assert!(
            admitted.load(Ordering::Relaxed) > 2 * REQUESTS,
            "the run was oversubscribed"
        );
        // Whether a window reached the limit depends on how much CPU the
        // run got (on two loaded cores one run in about 200 peaked at 24 of
        // 30): a speed figure, not a rule here. Exact wake-ups that
        // reach the limit are proven on the paused clock.
        if max_requests < REQUESTS {
            eprintln!("note: the busiest window held {max_requests} of {REQUESTS}");
        }
        assert!(max_tokens <= TOKENS);
        assert_eq!(store.pending(SCOPE), 0, "no pending reservation leaked");
        // Every unit comes back once the window has passed.
        tokio::time::sleep(WINDOW + Duration::from_millis(50)).await;
        assert_eq!(available(&store, Dimension::Requests), REQUESTS as i64);
        assert_eq!(available(&store, Dimension::Tokens), TOKENS as i64);
    });
}

// proves: Q-13 for the test store itself (two reservations counted at one
// instant are told apart: settling each changes its own record, so the
// recorder the stress test trusts agrees with the quota)
#[tokio::test(start_paused = true)]
async fn the_recorder_tells_apart_two_reservations_of_one_instant() {
    let store = TestStore::new(Duration::from_secs(29));
    let scope = ScopeConfig::new(SCOPE).requests(10, SECOND);
    let (c, _) = replica(&store, Unavailable::FailClosed, scope, |b| b);
    // The clock is paused: both reach the store at the same instant.
    let mut first = c.acquire(&call(1), Deadline::NONE).await.expect("room");
    let mut second = c.acquire(&call(1), Deadline::NONE).await.expect("room");
    let _ = first.refused(RefusalCost::Free);
    let _ = second.refused(RefusalCost::Free);
    drop((first, second));
    settle().await;
    assert_eq!(
        available(&store, Dimension::Requests),
        10,
        "both given back"
    );
    let counted: u64 = store.records(SCOPE).iter().map(|r| r.requests).sum();
    assert_eq!(counted, 0, "{:?}", store.records(SCOPE));
}

// proves: DQ-3, DQ-5 under load (outages that refuse or hang, on real
// threads: every round trip an admission waits for is clipped by its
// deadline, no admission hangs, every permit comes back, and the replicas
// return to the shared store)
#[test]
fn outages_under_load_never_hang_and_leave_nothing_held() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(8)
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(async {
        /// The store's timeout, longer than any deadline below.
        const STORE_TIMEOUT: Duration = Duration::from_millis(200);
        const LONGEST_DEADLINE: Duration = Duration::from_millis(99);
        let store = TestStore::new(Duration::from_secs(600));
        store.set_latency(Duration::from_micros(200));
        let scope = ScopeConfig::new(SCOPE)
            .requests(40, Duration::from_millis(300))
            .tokens(4_000, Duration::from_millis(300));
        let policies = [
            Unavailable::FailOpenLocal { replicas: 2 },
            Unavailable::FailClosed,
        ];
        let (replicas, backends): (Vec<_>, Vec<_>) = policies
            .into_iter()
            .map(|p| {
                let backend = store.backend(STORE_TIMEOUT, p);
                let controller = AdmissionController::builder()
                    .scope(scope.clone())
                    .concurrency(4)
                    .shared_store(Arc::new(backend.clone()))
                    .build()
                    .expect("valid configuration");
                (controller, backend)
            })
            .unzip();
        let stop = Arc::new(AtomicBool::new(false));
        let faults = {
            let (store, stop) = (Arc::clone(&store), Arc::clone(&stop));
            tokio::spawn(async move {
                let cycle = [Outage::Refuse, Outage::Up, Outage::Hang, Outage::Up];
                for outage in cycle.iter().cycle() {
                    if stop.load(Ordering::Relaxed) {
                        break;
                    }
                    store.set_outage(*outage);
                    tokio::time::sleep(Duration::from_millis(120)).await;
                }
                store.set_outage(Outage::Up);
            })
        };
        let mut tasks = Vec::new();
        for (r, controller) in replicas.iter().enumerate() {
            for w in 0..8u64 {
                let controller = controller.clone();
                let stop = Arc::clone(&stop);
                tasks.push(tokio::spawn(async move {
                    let mut rng = fastrand::Rng::with_seed(7 + r as u64 * 10 + w);
                    while !stop.load(Ordering::Relaxed) {
                        let budget =
                            Duration::from_millis(rng.u64(1..=LONGEST_DEADLINE.as_millis() as u64));
                        let estimate = rng.u64(10..100);
                        let acquire = controller.acquire(&call(estimate), within(budget));
                        // Never a hang (DQ-3). The bound is not a timing
                        // claim: what the design guarantees is that nothing
                        // the call waits for outlives its deadline (checked
                        // exactly below); the 10 s beyond it only tell a
                        // call that never returns from a busy machine's
                        // scheduling delays (up to 0.2 s measured on two
                        // shared cores, in every phase alike).
                        let admitted = tokio::time::timeout(budget + 10 * SECOND, acquire)
                            .await
                            .expect("an admission returns (DQ-3: never a hang)");
                        if let Ok(mut lease) = admitted {
                            tokio::time::sleep(Duration::from_micros(rng.u64(0..1_000))).await;
                            let _ = lease.reconcile(Usage::known(rng.u64(0..=2 * estimate)));
                        }
                    }
                }));
            }
        }
        // 1.2 s (ten fault phases), and longer while neither policy has
        // been seen at work yet (a busy machine may leave an outage
        // unvisited): coverage depends on scheduling, the assertions not.
        let started = Instant::now();
        loop {
            tokio::time::sleep(Duration::from_millis(20)).await;
            let sum = counter_sum(&replicas);
            let covered = sum(|c| c.fallback_admissions) > 0 && sum(|c| c.store_unavailable) > 0;
            let elapsed = started.elapsed();
            if elapsed >= 30 * SECOND || (elapsed >= Duration::from_millis(1_200) && covered) {
                break;
            }
        }
        stop.store(true, Ordering::Relaxed);
        for t in tasks {
            t.await.expect("worker");
        }
        faults.await.expect("faults");
        // DQ-5: every reservation and lease round trip had the call's
        // deadline for its budget, never the store's timeout, so a store
        // that hangs holds no admission past its deadline (before this
        // check, the test bounded the overrun at 100 ms, and a busy machine
        // overran that by scheduling alone).
        for backend in &backends {
            let longest = backend.calls.longest_admission_budget();
            assert!(
                longest <= LONGEST_DEADLINE && longest < STORE_TIMEOUT,
                "an admission's round trip had {longest:?}"
            );
        }
        let sum = counter_sum(&replicas);
        assert!(
            sum(|c| c.fallback_admissions) > 0,
            "fail_open_local served during outages"
        );
        assert!(
            sum(|c| c.store_unavailable) > 0,
            "fail_closed refused during outages"
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
        for c in &replicas {
            c.idle().await;
            let snapshot = c.snapshot();
            assert!(snapshot.is_idle(), "{snapshot:?}");
            let _ = c.shared_limits(ScopeId::FIRST).await;
            assert_eq!(mode(c), Some(StoreMode::Shared), "back to the shared store");
        }
    });
}

// proves: DQ-4, ADM-4 (FIFO within one replica: a later small demand never
// overtakes an earlier large one)
#[tokio::test(start_paused = true)]
async fn admissions_follow_arrival_order_within_a_replica() {
    let store = TestStore::new(Duration::from_secs(7));
    let scope = ScopeConfig::new(SCOPE).tokens(100, SECOND);
    let (c, _) = replica(&store, Unavailable::FailClosed, scope, |b| b);
    let first = c.acquire(&call(60), Deadline::NONE).await.expect("room");
    drop(first);
    let order = Arc::new(parking_lot::Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    // 60 does not fit until the first one ages out; 10 would fit now.
    for (i, tokens) in [60u64, 10, 30, 10, 90, 5].into_iter().enumerate() {
        let (c, order) = (c.clone(), Arc::clone(&order));
        tasks.push(tokio::spawn(async move {
            let lease = c
                .acquire(&call(tokens), Deadline::NONE)
                .await
                .expect("admitted");
            order.lock().push((i, lease.admission().ticket));
        }));
        tokio::task::yield_now().await;
    }
    for t in tasks {
        t.await.expect("task");
    }
    let order = order.lock().clone();
    let arrivals: Vec<usize> = order.iter().map(|o| o.0).collect();
    assert_eq!(arrivals, vec![0, 1, 2, 3, 4, 5]);
    let tickets: Vec<u64> = order.iter().map(|o| o.1).collect();
    assert!(tickets.windows(2).all(|w| w[0] < w[1]), "{tickets:?}");
}

// proves: DQ-3 (fail_closed answers at once with a typed error, never a
// wait; the state is in the snapshot; shared again by itself)
#[tokio::test(start_paused = true)]
async fn fail_closed_refuses_at_once_and_recovers() {
    let store = TestStore::new(Duration::from_secs(11));
    let scope = ScopeConfig::new(SCOPE).requests(100, SECOND);
    let (c, backend) = replica(&store, Unavailable::FailClosed, scope, |b| b);
    assert_eq!(mode(&c), Some(StoreMode::Shared));
    store.set_outage(Outage::Hang);
    // The first call finds out within the operation's timeout...
    let started = Instant::now();
    let e = c
        .acquire(&call(1), within(SECOND))
        .await
        .expect_err("store down");
    assert_eq!(
        e,
        AdmissionError::QuotaStoreUnavailable {
            scope: ScopeId::FIRST
        }
    );
    assert_eq!(e.kind(), "quota_store_unavailable");
    assert!(started.elapsed() <= TIMEOUT);
    assert_eq!(mode(&c), Some(StoreMode::Unavailable));
    // ...later ones do not wait at all, and do not touch the store.
    let reserves = Calls::get(&backend.calls.reserve);
    let started = Instant::now();
    for _ in 0..5 {
        let e = c
            .acquire(&call(1), within(SECOND))
            .await
            .expect_err("still down");
        assert!(matches!(e, AdmissionError::QuotaStoreUnavailable { .. }));
    }
    assert_eq!(started.elapsed(), Duration::ZERO);
    assert_eq!(Calls::get(&backend.calls.reserve), reserves);
    let snapshot = c.snapshot();
    assert_eq!(snapshot.scopes[0].counters.store_unavailable, 6);
    assert!(snapshot.scopes[0].counters.store_errors >= 1);
    assert!(snapshot.is_idle());
    // The store comes back: a probe finds out, no restart needed.
    store.set_outage(Outage::Up);
    tokio::time::sleep(Duration::from_millis(250)).await;
    let _ = c.snapshot();
    settle().await;
    assert_eq!(mode(&c), Some(StoreMode::Shared));
    let lease = c
        .acquire(&call(1), within(SECOND))
        .await
        .expect("shared again");
    assert_eq!(Calls::get(&backend.calls.reserve), reserves + 1);
    drop(lease);
}

// proves: DQ-3 (fail_open_local admits within limit / replicas, visibly,
// and returns to the shared store when it answers)
#[tokio::test(start_paused = true)]
async fn fail_open_local_admits_the_local_share_and_returns() {
    let store = TestStore::new(Duration::from_secs(13));
    let scope = ScopeConfig::new(SCOPE)
        .requests(10, 60 * SECOND)
        .tokens(1_000, 60 * SECOND);
    let policy = Unavailable::FailOpenLocal { replicas: 4 };
    let (c, backend) = replica(&store, policy, scope, |b| b);
    store.set_outage(Outage::Refuse);
    // More than the local share (1000 / 4) can ever hold: refused at once.
    let e = c
        .acquire(&call(300), within(SECOND))
        .await
        .expect_err("larger than the share");
    assert!(matches!(e, AdmissionError::QuotaStoreUnavailable { .. }));
    let mut leases = Vec::new();
    for _ in 0..2 {
        leases.push(
            c.acquire(&call(1), within(SECOND))
                .await
                .expect("local share"),
        );
    }
    // 10 / 4 = 2: the third waits for the share's window, beyond its deadline.
    let e = c
        .acquire(&call(1), within(SECOND))
        .await
        .expect_err("share spent");
    assert_eq!(e.phase(), Some(Phase::Rate));
    assert!(
        e.retry_at().is_some(),
        "the early verdict carries the instant (Q-11)"
    );
    let snapshot = c.snapshot();
    let s = &snapshot.scopes[0];
    assert_eq!(s.store, Some(StoreMode::LocalFallback));
    assert_eq!(s.counters.fallback_admissions, 2);
    assert_eq!(
        s.limit(Dimension::Requests, 60 * SECOND).map(|l| l.limit),
        Some(2)
    );
    assert_eq!(s.available(Dimension::Requests, 60 * SECOND), Some(0));
    drop(leases);
    // Back: the next reservation goes to the shared store again.
    store.set_outage(Outage::Up);
    tokio::time::sleep(Duration::from_millis(250)).await;
    let _ = c.snapshot();
    settle().await;
    assert_eq!(mode(&c), Some(StoreMode::Shared));
    let reserves = Calls::get(&backend.calls.reserve);
    let lease = c.acquire(&call(1), within(SECOND)).await.expect("shared");
    assert_eq!(Calls::get(&backend.calls.reserve), reserves + 1);
    assert_eq!(
        store.records(SCOPE).len(),
        1,
        "admitted by the shared store"
    );
    drop(lease);
    assert!(
        c.snapshot().scopes[0].limits.is_empty(),
        "shared amounts live in the store"
    );
    let limits = c
        .shared_limits(ScopeId::FIRST)
        .await
        .expect("shared scope")
        .expect("store up");
    assert_eq!(limits[0].available, 9);
}

// proves: Q-11 on a shared scope (the store's instant gives the early
// verdict at once, with the instant as a hint)
#[tokio::test(start_paused = true)]
async fn early_verdict_on_a_shared_scope() {
    let store = TestStore::new(Duration::from_secs(17));
    let scope = ScopeConfig::new(SCOPE).requests(2, 60 * SECOND);
    let (c, _) = replica(&store, Unavailable::FailClosed, scope, |b| {
        b.max_wait(10 * SECOND)
    });
    let a = c.acquire(&call(1), Deadline::NONE).await.expect("room");
    let b = c.acquire(&call(1), Deadline::NONE).await.expect("room");
    let started = Instant::now();
    let e = c
        .acquire(&call(1), within(5 * SECOND))
        .await
        .expect_err("spent");
    assert_eq!(started.elapsed(), Duration::ZERO, "no wait");
    let AdmissionError::DeadlineExceeded { phase, retry_at } = e else {
        panic!("unexpected {e:?}");
    };
    assert_eq!(phase, Phase::Rate);
    let hint = retry_at.expect("hint") - started;
    assert!(hint > 59 * SECOND && hint <= 60 * SECOND, "{hint:?}");
    let e = c
        .acquire(&call(1), Deadline::NONE)
        .await
        .expect_err("too far");
    assert!(
        matches!(e, AdmissionError::QuotaWaitTooLong { .. }),
        "{e:?}"
    );
    assert_eq!(started.elapsed(), Duration::ZERO);
    drop((a, b));
    assert!(c.snapshot().is_idle());
}

// proves, DQ-4 (no early verdict while a settlement of the same
// replica is on its way to the store: the store's answer does not count
// the room that settlement gives back, so the call waits for it instead
// of failing at once; it used to be refused with a hint a window away)
#[tokio::test(start_paused = true)]
async fn a_refund_on_its_way_defers_the_early_verdict() {
    let store = TestStore::new(Duration::from_secs(17));
    let scope = ScopeConfig::new(SCOPE).tokens(100, 60 * SECOND);
    let (c, _) = replica(&store, Unavailable::FailClosed, scope, |b| b);
    let mut lease = c.acquire(&call(100), Deadline::NONE).await.expect("room");
    // Every store operation now takes 10 ms: the next reservation, sent
    // first, is answered before the refund lands.
    store.set_latency(Duration::from_millis(10));
    lease.reconcile(Usage::known(0)).expect("first settlement");
    drop(lease);
    let started = Instant::now();
    let again = c
        .acquire(&call(100), within(5 * SECOND))
        .await
        .expect("the refund gives the room back within the deadline");
    assert!(started.elapsed() < SECOND, "{:?}", started.elapsed());
    assert_eq!(available(&store, Dimension::Tokens), 0);
    drop(again);
    settle().await;
    assert_eq!(available(&store, Dimension::Tokens), 0, "kept: unsettled");
    assert!(c.snapshot().is_idle());
}

// proves: Q-11, DQ-3 (the local share's refusal gets its early verdict at
// once, not after the deadline, while the store does not answer: neither
// a probe nor a settlement stuck on its way to the store can give the
// local share room back)
#[tokio::test(start_paused = true)]
async fn a_probe_in_flight_leaves_the_early_verdict_alone() {
    let store = TestStore::new(Duration::from_secs(13));
    let scope = ScopeConfig::new(SCOPE).requests(4, 60 * SECOND);
    let policy = Unavailable::FailOpenLocal { replicas: 2 };
    let (c, _) = replica(&store, policy, scope, |b| b);
    let mut before = c.acquire(&call(1), Deadline::NONE).await.expect("room");
    store.set_outage(Outage::Hang);
    // Its settlement hangs on its way to the store meanwhile.
    before.reconcile(Usage::known(0)).expect("first settlement");
    let mut leases = Vec::new();
    while leases.len() < 2 {
        if let Ok(lease) = c.acquire(&call(1), within(SECOND)).await {
            leases.push(lease);
        }
    }
    assert_eq!(mode(&c), Some(StoreMode::LocalFallback));
    let started = Instant::now();
    let e = c
        .acquire(&call(1), within(5 * SECOND))
        .await
        .expect_err("share spent");
    assert_eq!(started.elapsed(), Duration::ZERO, "{e:?}");
    assert!(e.retry_at().is_some(), "{e:?}");
    drop((leases, before));
}

// proves: DQ-1 fast path (one store round trip per admitted call; a call
// that waits for concurrency takes two)
#[tokio::test(start_paused = true)]
async fn one_round_trip_per_admitted_call_on_the_fast_path() {
    let store = TestStore::new(Duration::from_secs(19));
    let scope = ScopeConfig::new(SCOPE)
        .requests(1_000, SECOND)
        .tokens(100_000, SECOND);
    let (c, backend) = replica(&store, Unavailable::FailClosed, scope, |b| b.concurrency(1));
    for _ in 0..50 {
        let mut lease = c.acquire(&call(100), Deadline::NONE).await.expect("room");
        // Usage equal to the estimate changes nothing: no round trip.
        lease
            .reconcile(Usage::known(100))
            .expect("first settlement");
    }
    settle().await;
    assert_eq!(backend.calls.round_trips(), 50);
    assert_eq!(Calls::get(&backend.calls.reserve), 50);
    // Waiting for the one permit: reserve (pending), then lease.
    let held = c.acquire(&call(100), Deadline::NONE).await.expect("room");
    let waiter = spawn_acquire(&c, call(100));
    settle().await;
    drop(held);
    let lease = waiter.await.expect("task").expect("admitted");
    assert!(lease.admission().concurrency);
    assert_eq!(Calls::get(&backend.calls.reserve), 52);
    assert_eq!(Calls::get(&backend.calls.lease), 1);
}

/// Asserts that every unit is back in the store and nothing is held.
#[track_caller]
fn assert_all_back(store: &TestStore, c: &AdmissionController, requests: i64) {
    assert_eq!(
        available(store, Dimension::Requests),
        requests,
        "{:?}",
        store.records(SCOPE)
    );
    assert_eq!(store.pending(SCOPE), 0);
    assert!(c.snapshot().is_idle(), "{:?}", c.snapshot());
}

// proves: Q-9 on a shared scope (cancelled at each stage: a granted
// reservation refunded exactly once, nothing else held)
#[tokio::test(start_paused = true)]
async fn cancellation_at_each_stage_refunds_exactly_once() {
    let store = TestStore::new(Duration::from_secs(23));
    store.set_latency(Duration::from_millis(10));
    let scope = ScopeConfig::new(SCOPE).requests(3, 60 * SECOND);
    let (c, backend) = replica(&store, Unavailable::FailClosed, scope, |b| {
        b.pool(PoolConfig::new("p", 1))
    });
    let refunds = || Calls::get(&backend.calls.refund);
    let pooled = |tokens| call(tokens).with_pool(PoolId::new(0));

    // 1. In flight: the reservation lands after the call is gone.
    let id = tollgate::CallId(7);
    assert!(gave_up(&c, pooled(1).with_id(id), Duration::from_millis(5)).await);
    settle().await;
    tokio::time::sleep(Duration::from_millis(30)).await;
    assert_eq!(refunds(), 1);
    assert_all_back(&store, &c, 3);
    drop(c.claim(id).expect("the id was released (ADM-6)"));

    // 2. Waiting for the turn behind a call in flight: nothing to refund.
    let holder = c.acquire(&pooled(1), Deadline::NONE);
    let waiter = c.acquire(&pooled(1), Deadline::NONE);
    let (held, gone) = tokio::join!(
        holder,
        tokio::time::timeout(Duration::from_millis(1), waiter)
    );
    assert!(gone.is_err());
    let held = held.expect("admitted");

    // 3. Granted, waiting for the permit (pending): refunded once.
    assert!(gave_up(&c, pooled(1), Duration::from_millis(15)).await);
    tokio::time::sleep(Duration::from_millis(30)).await;
    assert_eq!(refunds(), 2);
    assert_eq!(
        available(&store, Dimension::Requests),
        2,
        "only the held lease counts"
    );

    // 4. The lease round trip in flight: refunded once, as leased.
    let waiter = {
        let c = c.clone();
        tokio::spawn(async move {
            tokio::time::timeout(
                Duration::from_millis(25),
                c.acquire(&pooled(1), Deadline::NONE),
            )
            .await
        })
    };
    tokio::time::sleep(Duration::from_millis(20)).await;
    drop(held);
    let gone = waiter.await.expect("task");
    assert!(gone.is_err(), "cancelled while leasing");
    tokio::time::sleep(Duration::from_millis(30)).await;
    assert_eq!(refunds(), 3);
    assert_eq!(Calls::get(&backend.calls.lease), 1);
    assert_eq!(
        available(&store, Dimension::Requests),
        2,
        "the first lease stays spent"
    );

    // 5. Sleeping for quota: nothing granted, nothing to refund.
    let spent = c.acquire(&pooled(1), Deadline::NONE).await.expect("room");
    let spent2 = {
        drop(spent);
        c.acquire(&pooled(1), Deadline::NONE).await.expect("room")
    };
    drop(spent2);
    assert!(gave_up(&c, pooled(1), Duration::from_secs(1)).await);
    settle().await;
    assert_eq!(refunds(), 3);
    assert_eq!(store.pending(SCOPE), 0);
    assert!(c.snapshot().is_idle());
    let counters = c.snapshot().scopes[0].counters;
    assert_eq!(counters.refunded_reservations, 3);
    assert_eq!(counters.settlements_failed, 0);
}

// proves: CD-3 on a shared scope (a grant waiting for its permit when a
// cooldown starts is refunded once and goes back to the tail)
#[tokio::test(start_paused = true)]
async fn cooldown_preempts_a_pending_grant() {
    let store = TestStore::new(Duration::from_secs(29));
    let scope = ScopeConfig::new(SCOPE).requests(10, 60 * SECOND);
    let (c, backend) = replica(&store, Unavailable::FailClosed, scope, |b| b.concurrency(1));
    let held = c.acquire(&call(1), Deadline::NONE).await.expect("room");
    let waiter = spawn_acquire(&c, call(1));
    settle().await;
    c.start_cooldown(ScopeId::FIRST, SECOND).expect("scope");
    drop(held);
    let started = Instant::now();
    let lease = waiter
        .await
        .expect("task")
        .expect("admitted after the cooldown");
    assert!(started.elapsed() >= SECOND - Duration::from_millis(2));
    assert_eq!(lease.admission().preemptions, 1);
    assert_eq!(Calls::get(&backend.calls.refund), 1);
    assert_eq!(c.snapshot().scopes[0].counters.preempted, 1);
    drop(lease);
    settle().await;
    assert_eq!(available(&store, Dimension::Requests), 8);
}

// proves: DQ-9, CD-1 (a provider 429 reported to replica A's lease
// pauses replica B too: B's call, arriving after it, is admitted no
// earlier than the cooldown's end, though B never saw a 429 and the
// quota has room; a 429 B then reports for an attempt leased before that
// cooldown began changes nothing, CD-2)
#[tokio::test(start_paused = true)]
async fn a_rate_limit_seen_by_one_replica_pauses_every_replica() {
    let store = TestStore::new(Duration::from_secs(17));
    let scope = || ScopeConfig::new(SCOPE).requests(10, 60 * SECOND);
    let (a, _) = replica(&store, Unavailable::FailClosed, scope(), |b| b);
    let (b, backend_b) = replica(&store, Unavailable::FailClosed, scope(), |b| b);
    let older = b.acquire(&call(1), Deadline::NONE).await.expect("room");
    // Instants tell generations apart (CD-2): a later one.
    tokio::time::sleep(Duration::from_millis(10)).await;
    let lease = a.acquire(&call(1), Deadline::NONE).await.expect("room");
    let started = Instant::now();
    assert!(matches!(
        lease.rate_limited(Some(2 * SECOND)),
        tollgate::CooldownOutcome::Started { .. }
    ));
    settle().await;
    let paused = b.acquire(&call(1), Deadline::NONE).await.expect("admitted");
    assert!(
        started.elapsed() >= 2 * SECOND - Duration::from_millis(2),
        "admitted {:?} after the 429",
        started.elapsed()
    );
    assert!(paused.admission().quota_wait >= 2 * SECOND - Duration::from_millis(30));
    // A late 429 of an attempt leased before that cooldown: stale.
    older.rate_limited(Some(30 * SECOND));
    settle().await;
    assert_eq!(Calls::get(&backend_b.calls.cool_down), 1);
    let next = Instant::now();
    drop(b.acquire(&call(1), Deadline::NONE).await.expect("admitted"));
    assert!(next.elapsed() < SECOND, "the stale 429 paused the scope");
}

// proves: on a shared scope (settlements reach the store; debt
// is retried; a failed settlement is counted and leaves amounts counted)
#[tokio::test(start_paused = true)]
async fn settlements_reach_the_store() {
    let store = TestStore::new(Duration::from_secs(31));
    let scope = ScopeConfig::new(SCOPE)
        .requests(10, 60 * SECOND)
        .tokens(1_000, 60 * SECOND);
    let (c, backend) = replica(&store, Unavailable::FailClosed, scope, |b| b);
    let mut lease = c.acquire(&call(100), Deadline::NONE).await.expect("room");
    lease.counted_by(Instant::now() + Duration::from_millis(5));
    let settlement = lease.reconcile(Usage::known(250)).expect("first");
    assert_eq!(settlement.debt, 150);
    drop(lease);
    // The recount to an instant ahead waits for it; the
    // reconciliation lands after it.
    tokio::time::sleep(Duration::from_millis(5)).await;
    settle().await;
    assert_eq!(available(&store, Dimension::Tokens), 750);
    let mut refused = c.acquire(&call(100), Deadline::NONE).await.expect("room");
    refused.refused(RefusalCost::Free).expect("first");
    drop(refused);
    settle().await;
    assert_eq!(available(&store, Dimension::Requests), 9);
    assert_eq!(available(&store, Dimension::Tokens), 750);
    // The store goes away before a settlement: it does not land, is
    // retried (debt), counted, and the amounts stay as they were.
    let mut lease = c.acquire(&call(100), Deadline::NONE).await.expect("room");
    store.set_outage(Outage::Refuse);
    lease.reconcile(Usage::known(400)).expect("first");
    drop(lease);
    tokio::time::sleep(SECOND).await;
    store.set_outage(Outage::Up);
    assert_eq!(Calls::get(&backend.calls.reconcile), 1 + 3);
    assert_eq!(c.snapshot().scopes[0].counters.settlements_failed, 1);
    assert_eq!(available(&store, Dimension::Tokens), 650);
}

// proves: CFG-3 for a shared store (located errors before any work:
// learned limits are per process, two limits sharing one count, a zero
// timeout, zero replicas, two quota stores)
#[test]
fn invalid_shared_store_settings_are_refused() {
    let store = TestStore::new(Duration::ZERO);
    let build = |scope: ScopeConfig, timeout, policy| {
        AdmissionController::builder()
            .scope(scope)
            .shared_store(Arc::new(store.backend(timeout, policy)))
            .build()
            .map(|_| ())
    };
    let learner = ScopeConfig::new("learner").learn_limits(60 * SECOND);
    let e = build(learner, TIMEOUT, Unavailable::FailClosed).expect_err("learned limits");
    assert_eq!(e.field, "scopes.learner.learn_limits");
    // Two limits of one dimension and window would share the store's
    // count (and corrupt it): refused, naming the second.
    let twice = ScopeConfig::new("twice")
        .requests(10, 10 * SECOND)
        .tokens(100, 10 * SECOND)
        .requests(2, 10 * SECOND);
    let e = build(twice, TIMEOUT, Unavailable::FailClosed).expect_err("same window twice");
    assert_eq!(e.field, "scopes.twice.limits[2]");
    let plain = || ScopeConfig::new(SCOPE).requests(1, SECOND);
    let e = build(plain(), Duration::ZERO, Unavailable::FailClosed).expect_err("no timeout");
    assert_eq!(e.field, "quota_store.timeout");
    let zero = Unavailable::FailOpenLocal { replicas: 0 };
    let e = build(plain(), TIMEOUT, zero).expect_err("no replicas");
    assert_eq!(e.field, "quota_store.replicas");
    let e = AdmissionController::builder()
        .scope(plain())
        .backend(Arc::new(tollgate::quota::LocalBackend))
        .shared_store(Arc::new(store.backend(TIMEOUT, Unavailable::FailClosed)))
        .build()
        .expect_err("two stores");
    assert_eq!(e.field, "quota_store");
    assert!(build(plain(), TIMEOUT, Unavailable::FailClosed).is_ok());
}

// proves: ADM-5 on a shared scope (the turn's line is bounded by the queue
// capacity; `reject` refuses past it at once)
#[tokio::test(start_paused = true)]
async fn the_line_is_bounded_by_the_queue_capacity() {
    let store = TestStore::new(Duration::from_secs(37));
    let scope = ScopeConfig::new(SCOPE).requests(1, 60 * SECOND);
    let (c, _) = replica(&store, Unavailable::FailClosed, scope, |b| {
        b.queue_capacity(2)
            .overflow(tollgate::config::Overflow::Reject)
    });
    let spent = c.acquire(&call(1), Deadline::NONE).await.expect("room");
    let mut waiting = Vec::new();
    // One holds the turn (sleeping for quota), one waits in line.
    for _ in 0..2 {
        waiting.push(spawn_acquire(&c, call(1)));
        settle().await;
    }
    let snapshot = c.snapshot();
    assert_eq!(snapshot.scopes[0].queued, 2);
    assert_eq!(snapshot.scopes[0].waiting_for_slot, 0);
    let e = c.acquire(&call(1), Deadline::NONE).await.expect_err("full");
    assert_eq!(
        e,
        AdmissionError::QueueFull {
            scope: ScopeId::FIRST
        }
    );
    for w in waiting {
        w.abort();
    }
    drop(spent);
    settle().await;
    assert!(c.snapshot().is_idle());
}

fn flow_call(tenant: u32, priority: tollgate::Priority, weight: u32) -> Call {
    call(1).with_flow(tollgate::Flow::new(tenant, priority).with_weight(weight))
}

// proves: FAIR-9, FAIR-3, FAIR-2 on a shared scope (the replica hands its
// turn out by the fair scheduler: 3:1 by weight within a class, a higher
// class next)
#[tokio::test(start_paused = true)]
async fn the_turn_goes_by_weight_and_class() {
    use tollgate::Priority;
    let store = TestStore::new(Duration::from_secs(11));
    let scope = ScopeConfig::new(SCOPE).requests(1, SECOND);
    let (c, _) = replica(&store, Unavailable::FailClosed, scope, |b| b);
    let spent = c.acquire(&call(1), Deadline::NONE).await.expect("room");
    let order = Arc::new(parking_lot::Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    let mut push = |call: Call, label: &'static str| {
        let (c, order) = (c.clone(), Arc::clone(&order));
        tasks.push(tokio::spawn(async move {
            drop(c.acquire(&call, Deadline::NONE).await.expect("admitted"));
            order.lock().push(label);
        }));
    };
    for _ in 0..6 {
        push(flow_call(1, Priority::Standard, 3), "a");
        push(flow_call(2, Priority::Standard, 1), "b");
    }
    settle().await;
    drop(spent);
    tokio::time::sleep(SECOND * 4 + SECOND / 2).await;
    settle().await;
    push(flow_call(3, Priority::Interactive, 1), "i");
    settle().await;
    for t in tasks {
        t.await.expect("task");
    }
    let order = order.lock().clone();
    // The interactive call came at 4.5 s, while the call granted at 5 s
    // held the turn: it is next, at 6 s.
    let i = order.iter().position(|l| *l == "i").expect("served");
    assert_eq!(i, 5, "{order:?}");
    let standard: Vec<_> = order.iter().filter(|l| **l != "i").collect();
    assert_eq!(
        standard[..8].iter().filter(|l| ***l == "a").count(),
        6,
        "{order:?}"
    );
    assert!(c.snapshot().is_idle());
}

// proves: FAIR-10 on a shared scope (the turn's full line still takes a
// tenant under its share; the tenant holding the most is refused instead)
#[tokio::test(start_paused = true)]
async fn the_turns_line_is_shared_between_flows() {
    use tollgate::Priority;
    let store = TestStore::new(Duration::from_secs(13));
    let scope = ScopeConfig::new(SCOPE).requests(1, 60 * SECOND);
    let (c, _) = replica(&store, Unavailable::FailClosed, scope, |b| {
        b.queue_capacity(4)
            .overflow(tollgate::config::Overflow::Reject)
    });
    let spent = c.acquire(&call(1), Deadline::NONE).await.expect("room");
    let mut bulk = Vec::new();
    // One holds the turn, three wait: the queue is full.
    for _ in 0..4 {
        bulk.push(spawn_acquire(&c, flow_call(1, Priority::Standard, 1)));
        settle().await;
    }
    assert_eq!(c.snapshot().scopes[0].queued, 4);
    let e = c
        .acquire(&flow_call(1, Priority::Standard, 1), Deadline::NONE)
        .await;
    assert_eq!(
        e.expect_err("full"),
        AdmissionError::QueueFull {
            scope: ScopeId::FIRST
        }
    );
    let chat = spawn_acquire(&c, flow_call(2, Priority::Standard, 1));
    settle().await;
    let last = bulk.pop().expect("four").await.expect("task");
    assert_eq!(
        last.expect_err("displaced"),
        AdmissionError::QueueFull {
            scope: ScopeId::FIRST
        }
    );
    assert_eq!(c.snapshot().scopes[0].queued, 4);
    for t in bulk.into_iter().chain([chat]) {
        t.abort();
    }
    drop(spent);
    settle().await;
    assert!(c.snapshot().is_idle());
}

// proves: LC-7 on a shared scope (closing wakes the call holding the turn
// and the calls in line with `Closed`; nothing is left held)
#[tokio::test(start_paused = true)]
async fn close_wakes_every_waiter() {
    let store = TestStore::new(Duration::from_secs(41));
    let scope = ScopeConfig::new(SCOPE).requests(1, 60 * SECOND);
    let (c, _) = replica(&store, Unavailable::FailClosed, scope, |b| b);
    let spent = c.acquire(&call(1), Deadline::NONE).await.expect("room");
    let waiting: Vec<_> = (0..3).map(|_| spawn_acquire(&c, call(1))).collect();
    settle().await;
    c.stop_admitting();
    for w in waiting {
        let e = w.await.expect("task").expect_err("closed");
        assert_eq!(e, AdmissionError::Closed);
    }
    drop(spent);
    c.close().await;
    assert!(c.snapshot().is_idle());
    assert_eq!(store.pending(SCOPE), 0);
}

// proves: DQ-5 (every round trip is bounded by the timeout clipped by the
// deadline; a deadline cutting a round trip short is a deadline, not a
// store failure)
#[tokio::test(start_paused = true)]
async fn a_round_trip_cut_short_by_the_deadline_is_a_deadline() {
    let store = TestStore::new(Duration::from_secs(43));
    store.set_latency(Duration::from_millis(20));
    let scope = ScopeConfig::new(SCOPE).requests(10, SECOND);
    let (c, _) = replica(&store, Unavailable::FailClosed, scope, |b| b);
    let started = Instant::now();
    let e = c
        .acquire(&call(1), within(Duration::from_millis(5)))
        .await
        .expect_err("too slow for the deadline");
    assert_eq!(e.phase(), Some(Phase::Rate));
    assert_eq!(started.elapsed(), Duration::from_millis(5));
    let snapshot = c.snapshot();
    assert_eq!(snapshot.scopes[0].store, Some(StoreMode::Shared));
    assert_eq!(snapshot.scopes[0].counters.store_errors, 0);
    // A store slower than the whole timeout is unavailable.
    store.set_latency(2 * TIMEOUT);
    let started = Instant::now();
    let e = c
        .acquire(&call(1), within(SECOND))
        .await
        .expect_err("timed out");
    assert!(
        matches!(e, AdmissionError::QuotaStoreUnavailable { .. }),
        "{e:?}"
    );
    assert_eq!(started.elapsed(), TIMEOUT);
}

// proves: DQ-3 (a store lost between the reservation and the lease of a
// call that waited for concurrency: fail_open_local starts it over on the
// local share, nothing held twice)
#[tokio::test(start_paused = true)]
async fn a_lost_lease_round_trip_starts_over_on_the_local_share() {
    let store = TestStore::new(Duration::from_secs(47));
    let scope = ScopeConfig::new(SCOPE).requests(10, 60 * SECOND);
    let policy = Unavailable::FailOpenLocal { replicas: 2 };
    let (c, _) = replica(&store, policy, scope, |b| b.concurrency(1));
    let held = c.acquire(&call(1), Deadline::NONE).await.expect("room");
    let waiter = spawn_acquire(&c, call(1));
    settle().await;
    assert_eq!(store.pending(SCOPE), 1, "granted, waiting for the permit");
    store.set_outage(Outage::Refuse);
    drop(held);
    let lease = waiter
        .await
        .expect("task")
        .expect("admitted from the local share");
    assert_eq!(c.snapshot().scopes[0].store, Some(StoreMode::LocalFallback));
    assert_eq!(c.snapshot().scopes[0].counters.fallback_admissions, 1);
    drop(lease);
    // Giving the lost grant back failed too (three attempts, waited for by
    // `idle`): counted, and the pending hold stays in the store (the safe
    // direction) until it expires.
    c.idle().await;
    assert_eq!(c.snapshot().scopes[0].counters.settlements_failed, 1);
    assert!(c.snapshot().is_idle());
}

// proves: Q-4 across replicas (a waiter sleeps until the store's instant,
// no polling; a refund announced by the store wakes it earlier), DQ-5 (the
// instant is the store's wait added to the local clock: the test store's
// clock runs 53 s ahead of the replicas')
#[tokio::test(start_paused = true)]
async fn a_waiter_sleeps_until_the_instant_or_a_notice() {
    let store = TestStore::new(Duration::from_secs(53));
    let scope = ScopeConfig::new(SCOPE).requests(1, 10 * SECOND);
    let (a, _) = replica(&store, Unavailable::FailClosed, scope.clone(), |b| b);
    let (b, b_backend) = replica(&store, Unavailable::FailClosed, scope, |b| b);
    let reserves = || Calls::get(&b_backend.calls.reserve);
    // The instant: one ask, one sleep, one ask.
    let spent = a.acquire(&call(1), Deadline::NONE).await.expect("room");
    let started = Instant::now();
    let lease = b
        .acquire(&call(1), Deadline::NONE)
        .await
        .expect("after the window");
    assert_eq!(started.elapsed(), 10 * SECOND);
    assert_eq!(reserves(), 2, "no polling while it waits");
    assert!(lease.admission().limited_by.requests);
    drop((spent, lease));
    // A notice: the holder of the room is refused and charged nothing
    // the waiter on the other replica is admitted at once.
    tokio::time::sleep(10 * SECOND).await;
    let mut refused = a.acquire(&call(1), Deadline::NONE).await.expect("room");
    let waiter = spawn_acquire(&b, call(1));
    tokio::time::sleep(SECOND).await;
    let woken_at = Instant::now();
    refused
        .refused(RefusalCost::Free)
        .expect("first settlement");
    let lease = waiter.await.expect("task").expect("admitted on the notice");
    assert_eq!(woken_at.elapsed(), Duration::ZERO);
    assert_eq!(reserves(), 4);
    drop((refused, lease));
}

// proves: LC-7, Q-9 (close resolves only once the refunds of calls that
// went away have reached the store: a process that exits right after
// `close` leaves no pending hold behind)
#[tokio::test(start_paused = true)]
async fn close_waits_for_detached_refunds() {
    let store = TestStore::new(Duration::from_secs(59));
    store.set_latency(Duration::from_millis(20));
    let scope = ScopeConfig::new(SCOPE).requests(10, 60 * SECOND);
    let (c, _) = replica(&store, Unavailable::FailClosed, scope, |b| b.concurrency(1));
    let held = c.acquire(&call(1), Deadline::NONE).await.expect("room");
    let waiter = spawn_acquire(&c, call(1));
    tokio::time::sleep(Duration::from_millis(25)).await;
    assert_eq!(store.pending(SCOPE), 1, "granted, waiting for the permit");
    // The waiting call goes away: its hold is given back by a detached
    // round trip that takes the store's latency.
    waiter.abort();
    assert!(waiter.await.is_err_and(|e| e.is_cancelled()));
    drop(held);
    let started = Instant::now();
    c.close().await;
    assert!(started.elapsed() >= Duration::from_millis(20), "waited");
    assert_eq!(store.pending(SCOPE), 0, "the hold is back");
    assert_eq!(available(&store, Dimension::Requests), 9);
}

// proves: Q-9, DQ-5 (a pending hold the store let expire before its call
// came to lease it: the call gives its permit back and reserves again, so
// it is admitted with exactly one unit counted)
#[tokio::test(start_paused = true)]
async fn an_expired_hold_is_reserved_again() {
    let store = TestStore::new(Duration::from_secs(61));
    let scope = ScopeConfig::new(SCOPE).requests(10, 600 * SECOND);
    let (c, _) = replica(&store, Unavailable::FailClosed, scope, |b| b.concurrency(1));
    let held = c.acquire(&call(1), Deadline::NONE).await.expect("room");
    let waiter = spawn_acquire(&c, call(1));
    settle().await;
    assert_eq!(store.pending(SCOPE), 1);
    // Without a deadline the hold lives a minute; the permit comes later.
    tokio::time::sleep(61 * SECOND).await;
    drop(held);
    let lease = waiter.await.expect("task").expect("admitted");
    assert_eq!(c.snapshot().scopes[0].counters.holds_expired, 1);
    assert_eq!(store.pending(SCOPE), 0);
    assert_eq!(
        available(&store, Dimension::Requests),
        8,
        "two leased, nothing else"
    );
    drop(lease);
    c.close().await;
}

// proves: DQ-3 (one slow settlement, a detached reconciliation over the
// store's timeout, does not make the store unavailable: under fail_closed
// the next call is admitted from the shared store, not refused with 503)
#[tokio::test(start_paused = true)]
async fn a_slow_settlement_leaves_the_store_shared() {
    let store = TestStore::new(Duration::from_secs(13));
    let scope = ScopeConfig::new(SCOPE).tokens(1_000, 60 * SECOND);
    let (c, backend) = replica(&store, Unavailable::FailClosed, scope, |b| b);
    let mut lease = c.acquire(&call(100), Deadline::NONE).await.expect("room");
    store.set_latency(2 * TIMEOUT);
    lease.reconcile(Usage::known(10)).expect("first");
    drop(lease);
    // Every attempt of the settlement runs out of time.
    tokio::time::sleep(SECOND).await;
    store.set_latency(Duration::ZERO);
    let counters = c.snapshot().scopes[0].counters;
    assert!(counters.store_errors >= 1);
    assert_eq!(counters.settlements_failed, 1);
    assert_eq!(mode(&c), Some(StoreMode::Shared));
    let reserves = Calls::get(&backend.calls.reserve);
    let lease = c
        .acquire(&call(100), Deadline::NONE)
        .await
        .expect("admitted from the shared store");
    assert_eq!(Calls::get(&backend.calls.reserve), reserves + 1);
    drop(lease);
}

// proves: FAIR-3, FAIR-4, GW-15 on a shared scope (a reload that switches
// what a turn costs from its tokens to one request starts the replica's
// counters again in the new unit: the two flows then share the turns,
// neither waits a thousand turns to pay back one call's tokens)
#[tokio::test(start_paused = true)]
async fn a_reload_to_request_costs_keeps_the_turns_level() {
    use tollgate::Priority;
    let store = TestStore::new(Duration::from_secs(11));
    let with_tokens = |tokens: bool| {
        let scope = ScopeConfig::new(SCOPE).requests(1, SECOND);
        if tokens {
            scope.tokens(1_000_000, Duration::from_secs(60))
        } else {
            scope
        }
    };
    let (c, _) = replica(&store, Unavailable::FailClosed, with_tokens(true), |b| b);
    let spent = c.acquire(&call(1), Deadline::NONE).await.expect("room");
    let flow_call = |tenant| call(1_000).with_flow(tollgate::Flow::new(tenant, Priority::Standard));
    let order: Arc<parking_lot::Mutex<Vec<u32>>> = Arc::default();
    let mut tasks = Vec::new();
    for _ in 0..10 {
        for tenant in [1, 2] {
            let (c, order, call) = (c.clone(), Arc::clone(&order), flow_call(tenant));
            tasks.push(tokio::spawn(async move {
                drop(c.acquire(&call, Deadline::NONE).await.expect("admitted"));
                order.lock().push(tenant);
            }));
        }
    }
    settle().await;
    drop(spent);
    // One turn a second: three of them by 1000 tokens each.
    tokio::time::sleep(SECOND * 3 + SECOND / 2).await;
    settle().await;
    let before = order.lock().clone();
    assert_eq!(before.len(), 3, "{before:?}");
    let config = tollgate::config::ControllerConfig {
        scopes: vec![with_tokens(false)],
        ..tollgate::config::ControllerConfig::default()
    };
    c.reconfigure(config).expect("reload");
    tokio::time::sleep(SECOND * 10).await;
    settle().await;
    let after: Vec<u32> = order.lock()[3..13].to_vec();
    let ones = after.iter().filter(|t| **t == 1).count();
    assert!(
        (4..=6).contains(&ones),
        "flow 1 got {ones} of the 10 turns after the reload: {after:?}"
    );
    for t in tasks {
        t.abort();
    }
}

// proves: DL-5, DL-6, Q-9 on a shared scope in its local fallback (a permit
// handed over just before the deadline but collected just after gives no
// lease: the call fails in the concurrency phase, the permit goes back and
// the local share's reservation is refunded in full)
#[tokio::test(start_paused = true)]
async fn a_fallback_grant_collected_after_the_deadline_gives_no_lease() {
    let store = TestStore::new(Duration::from_secs(17));
    let scope = ScopeConfig::new(SCOPE).requests(40, 60 * SECOND);
    let policy = Unavailable::FailOpenLocal { replicas: 4 };
    let (c, _) = replica(&store, policy, scope, |b| {
        b.pool(tollgate::config::PoolConfig::new("p", 1))
    });
    store.set_outage(Outage::Refuse);
    let p = c.pool_id("p").expect("pool");
    let pooled = || call(1).with_pool(p);
    let t0 = Instant::now();
    let holder = c.acquire(&pooled(), Deadline::NONE).await.expect("share");
    let late = tokio::spawn({
        let (c, call) = (c.clone(), pooled());
        async move { c.acquire(&call, Deadline::at(t0 + SECOND)).await.map(drop) }
    });
    settle().await;
    tokio::time::advance(Duration::from_millis(999)).await;
    drop(holder); // the permit goes to the waiting call at t0 + 999 ms
    tokio::time::advance(Duration::from_millis(2)).await; // it runs at t0 + 1001 ms
    settle().await;
    assert_eq!(
        late.await.expect("task"),
        Err(AdmissionError::DeadlineExceeded {
            phase: Phase::Concurrency,
            retry_at: None
        })
    );
    // The share is 40 / 4 = 10: the holder's unit stays spent, the late
    // call's came back.
    let s = c.snapshot();
    assert_eq!(s.scopes[0].store, Some(StoreMode::LocalFallback));
    assert_eq!(
        s.scopes[0].available(Dimension::Requests, 60 * SECOND),
        Some(9)
    );
    drop(
        c.acquire(&pooled(), within(Duration::from_millis(1)))
            .await
            .expect("permit free"),
    );
}

// proves: Q-15 on a shared scope (an attempt counted by an instant still
// ahead, as one cancelled before its arrival bound is, stays counted until
// one window after that instant, not after the moment it was reported)
#[tokio::test(start_paused = true)]
async fn a_recount_to_an_instant_ahead_counts_from_that_instant() {
    let store = TestStore::new(Duration::from_secs(19));
    let scope = ScopeConfig::new(SCOPE).requests(1, 60 * SECOND);
    let (c, _) = replica(&store, Unavailable::FailClosed, scope, |b| b);
    let t0 = Instant::now();
    let mut lease = c.acquire(&call(1), Deadline::NONE).await.expect("room");
    tokio::time::advance(Duration::from_millis(100)).await;
    // Reported at t0 + 100 ms: it may reach the provider until t0 + 500 ms.
    lease.counted_by(t0 + Duration::from_millis(500));
    drop(lease);
    drop(c.acquire(&call(1), Deadline::NONE).await.expect("admitted"));
    assert_eq!(
        Instant::now() - t0,
        60 * SECOND + Duration::from_millis(500)
    );
}

/// A call of `n` tokens of tenant `tenant`'s standard flow.
fn of_tenant(tenant: u32, n: u64) -> tollgate::Call {
    call(n).with_flow(tollgate::Flow::new(tenant, tollgate::Priority::Standard))
}

type Log = Arc<parking_lot::Mutex<Vec<&'static str>>>;

/// `n` calls of one token of `tenant`, each logging `label` once it is
/// answered.
fn logged(
    c: &AdmissionController,
    tenant: u32,
    n: usize,
    label: &'static str,
    log: &Log,
) -> Vec<tokio::task::JoinHandle<()>> {
    (0..n)
        .map(|_| {
            let (c, log) = (c.clone(), Arc::clone(log));
            tokio::spawn(async move {
                let l = c.acquire(&of_tenant(tenant, 1), Deadline::NONE).await;
                log.lock().push(label);
                drop(l);
            })
        })
        .collect()
}

/// On a shared scope of 3 requests a second and one permit: a blocker
/// holding the permit and the first second's request, tenant 3's call
/// taking the free turn (not charged), then tenant 1's call of 1,000
/// tokens (`a`, charged when its turn comes from the line) behind it.
async fn turn_charged_to_tenant_1(
    store: &Arc<TestStore>,
    tokens_window: Duration,
    a: impl FnOnce(AdmissionController) -> tokio::task::JoinHandle<()>,
) -> (
    AdmissionController,
    TestBackend,
    tollgate::Lease,
    tokio::task::JoinHandle<()>,
    tokio::task::JoinHandle<()>,
) {
    store.set_latency(Duration::from_millis(10));
    let scope = ScopeConfig::new(SCOPE)
        .requests(3, SECOND)
        .tokens(1_000_000, tokens_window);
    let (c, backend) = replica(store, Unavailable::FailClosed, scope, |b| b.concurrency(1));
    let blocker = c
        .acquire(&of_tenant(9, 1), Deadline::NONE)
        .await
        .expect("room");
    let cc = c.clone();
    let c_task = tokio::spawn(async move {
        drop(cc.acquire(&of_tenant(3, 1), Deadline::NONE).await);
    });
    settle().await;
    let a_task = a(c.clone());
    settle().await;
    (c, backend, blocker, c_task, a_task)
}

/// Tenant 1's calls of one token beside the backlog: the labels granted in
/// the next 20 s.
async fn next_grants(
    c: &AdmissionController,
    log: &Log,
    mut tasks: Vec<tokio::task::JoinHandle<()>>,
) -> Vec<&'static str> {
    tasks.extend(logged(c, 1, 10, "a", log));
    settle().await;
    let before = log.lock().len();
    tokio::time::sleep(Duration::from_secs(20)).await;
    let after: Vec<_> = log.lock()[before..].to_vec();
    for t in tasks {
        t.abort();
    }
    after
}

/// Tenant 1's call of 1,000 tokens takes the turn from the line (its flow
/// charged 1,000) and is cancelled while it waits for the pool's permit
/// or, with `cancel_in_lease`, while its lease round trip is in flight;
/// then tenant 1 comes back with calls of one token beside tenant 2's
/// backlog: the grants that follow, by label.
async fn lease_cancel_scenario(cancel_in_lease: bool) -> Vec<&'static str> {
    let store = TestStore::new(Duration::from_secs(5));
    let (c, backend, blocker, c_task, a_task) =
        turn_charged_to_tenant_1(&store, 60 * SECOND, |c| {
            tokio::spawn(async move {
                drop(c.acquire(&of_tenant(1, 1000), Deadline::NONE).await);
            })
        })
        .await;
    let log = Log::default();
    let tasks = logged(&c, 2, 100, "b", &log);
    settle().await;
    // By 2.5 s: C and A hold pending grants waiting for the permit.
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    if cancel_in_lease {
        drop(blocker);
        // C leases (10 ms) and drops; A gets the permit and starts its
        // lease round trip (10 ms): cancel A in the middle of it.
        let t0 = Instant::now();
        while Calls::get(&backend.calls.lease) < 2 && t0.elapsed() < SECOND {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        // A's lease round trip (10 ms) is in flight: cancel it there.
        assert_eq!(Calls::get(&backend.calls.lease), 2);
        tokio::time::sleep(Duration::from_millis(3)).await;
        a_task.abort();
    } else {
        // Cancel A while it waits for the permit.
        a_task.abort();
        drop(blocker);
    }
    let _ = c_task.await;
    settle().await;
    next_grants(&c, &log, tasks).await
}

// proves: FAIR-3, FAIR-9 on a shared scope (a call cancelled after its
// turn charged its flow gives the charge back with its reservation while
// its lease round trip is in flight, as it already did while it waited
// for its permit (the control case): its flow's next small calls
// alternate with the other flow's backlog instead of waiting behind a
// thousand of them)
#[tokio::test(start_paused = true)]
async fn a_call_cancelled_after_its_turn_gives_its_flows_charge_back() {
    for in_lease in [false, true] {
        let after = lease_cancel_scenario(in_lease).await;
        let a = after.iter().filter(|l| **l == "a").count();
        assert!(a >= 8, "cancelled in its lease: {in_lease}: {after:?}");
    }
}

// proves: FAIR-3, FAIR-9 on a shared scope (a pending hold that expires
// while its call waits for a permit sends the call back to the turn's
// line, and the charge of its first turn is taken off: its flow is
// charged once for the call, not once per turn)
#[tokio::test(start_paused = true)]
async fn an_expired_hold_charges_its_flow_once() {
    let store = TestStore::new(Duration::from_secs(5));
    let (c, _backend, blocker, c_task, a_task) =
        turn_charged_to_tenant_1(&store, 600 * SECOND, |c| {
            tokio::spawn(async move {
                let mut l = c
                    .acquire(&of_tenant(1, 1000), Deadline::NONE)
                    .await
                    .expect("a");
                // The provider used nothing: the flow ends up charged nothing.
                l.reconcile(Usage::known(0)).unwrap();
            })
        })
        .await;
    let log = Log::default();
    let tasks = logged(&c, 2, 300, "b", &log);
    settle().await;
    // The holds (a minute without a deadline) expire meanwhile.
    tokio::time::sleep(Duration::from_secs(61)).await;
    drop(blocker);
    let _ = c_task.await;
    a_task.await.expect("a admitted");
    assert_eq!(c.snapshot().scopes[0].counters.holds_expired, 3);
    // With the first turn's charge taken off at the expiry, a is served
    // after a handful of b's (5 with the fix); with it kept, all 300.
    let b_first = log.lock().len();
    assert!(b_first < 50, "a waited behind {b_first} grants of b");
    let after = next_grants(&c, &log, tasks).await;
    let a = after.iter().filter(|l| **l == "a").count();
    assert!(a >= 8, "{after:?}");
}

//! Property tests of quota arithmetic, refunds and admission bounds
//! (SPEC ). Failing cases are kept under
//! `proptest-regressions/` when proptest finds any.

mod common;

use std::time::Duration;

use common::settle;
use proptest::prelude::*;
use tokio::time::Instant;
use tollgate::config::{Algorithm, ScopeConfig};
use tollgate::quota::{Actual, Demand, Dimension, Hold, LocalQuota, QuotaStore, Reservation};
use tollgate::{AdmissionController, Call, Deadline, ScopeId, TokenEstimate};

const W: Duration = Duration::from_secs(60);

fn algorithms() -> impl Strategy<Value = Algorithm> {
    prop_oneof![
        Just(Algorithm::SlidingWindow),
        (1u64..=60).prop_map(|b| Algorithm::TokenBucket {
            burst: Some(Duration::from_secs(b))
        }),
        Just(Algorithm::FixedWindow),
    ]
}

/// The largest amount stamped inside any half-open window `(t - W, t]`.
fn max_in_window(events: &[(Instant, u64)], window: Duration) -> u64 {
    let mut sorted = events.to_vec();
    sorted.sort_by_key(|e| e.0);
    let mut best = 0;
    for (i, &(t, _)) in sorted.iter().enumerate() {
        let sum: u64 = sorted[..=i]
            .iter()
            .rev()
            .take_while(|(s, _)| t.duration_since(*s) < window)
            .map(|(_, a)| a)
            .sum();
        best = best.max(sum);
    }
    best
}

/// The most admitted per aligned window starting at `epoch`.
fn max_per_fixed_window(events: &[(Instant, u64)], epoch: Instant, window: Duration) -> u64 {
    let mut per = std::collections::BTreeMap::new();
    for &(t, a) in events {
        let idx = t.duration_since(epoch).as_nanos() / window.as_nanos();
        *per.entry(idx).or_insert(0u64) += a;
    }
    per.values().copied().max().unwrap_or(0)
}

/// The Q-7 bound of `algorithm` for a limit of `limit` per `W`, given the
/// largest single demand `e_max`.
fn bound(algorithm: Algorithm, limit: u64, e_max: u64) -> u64 {
    match algorithm {
        Algorithm::SlidingWindow | Algorithm::FixedWindow => limit,
        Algorithm::TokenBucket { burst } => {
            let b = burst.unwrap_or(W);
            let c = (u128::from(limit) * b.as_nanos() / W.as_nanos()).max(1) as u64;
            c.max(e_max) + limit
        }
    }
}

fn check_bounds(
    algorithm: Algorithm,
    epoch: Instant,
    rpm: u64,
    tpm: u64,
    requests: &[(Instant, u64)],
    tokens: &[(Instant, u64)],
) -> Result<(), TestCaseError> {
    let e_max = tokens.iter().map(|t| t.1).max().unwrap_or(0);
    let (got_r, got_t) = match algorithm {
        Algorithm::FixedWindow => (
            max_per_fixed_window(requests, epoch, W),
            max_per_fixed_window(tokens, epoch, W),
        ),
        _ => (max_in_window(requests, W), max_in_window(tokens, W)),
    };
    prop_assert!(
        got_r <= bound(algorithm, rpm, 1),
        "requests {got_r} > bound for {algorithm:?} rpm {rpm}"
    );
    prop_assert!(
        got_t <= bound(algorithm, tpm, e_max),
        "tokens {got_t} > bound for {algorithm:?} tpm {tpm}"
    );
    Ok(())
}

#[derive(Debug, Clone)]
enum Op {
    /// Reserve (pending) after `dt` ms.
    Arrive { dt: u64, tokens: u64 },
    /// Lease the oldest pending reservation after `dt` ms.
    Lease { dt: u64 },
    /// Refund the newest pending reservation.
    Cancel,
    /// Report usage below the estimate for the oldest leased attempt.
    Refund { pct: u64 },
}

fn ops() -> impl Strategy<Value = Vec<Op>> {
    prop::collection::vec(
        prop_oneof![
            4 => (0u64..20_000, 0u64..60).prop_map(|(dt, tokens)| Op::Arrive { dt, tokens }),
            3 => (0u64..20_000).prop_map(|dt| Op::Lease { dt }),
            1 => Just(Op::Cancel),
            1 => (0u64..100).prop_map(|pct| Op::Refund { pct }),
        ],
        1..120,
    )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    // proves: Q-7, Q-9 (every algorithm keeps its bound at the instants
    // attempts start, with reservations that wait, are cancelled or leased
    // later; the sliding window also after refunds below the estimate)
    #[test]
    fn bounds_hold_at_start_instants(algorithm in algorithms(), rpm in 1u64..8, tpm in 60u64..200, ops in ops()) {
        let t0 = Instant::now();
        let scope = ScopeConfig::new("p").requests(rpm, W).tokens(tpm, W).algorithm(algorithm);
        let mut store = LocalQuota::new(&scope, t0);
        let mut now = t0;
        let mut pending: Vec<Reservation> = Vec::new();
        let mut leased: Vec<Reservation> = Vec::new();
        let (mut requests, mut tokens) = (Vec::new(), Vec::new());
        for op in ops {
            match op {
                Op::Arrive { dt, tokens: n } => {
                    now += Duration::from_millis(dt);
                    if let Ok(r) = store.reserve(&Demand::new(n, 0), now, Hold::Pending) {
                        pending.push(r);
                    }
                }
                Op::Lease { dt } => {
                    now += Duration::from_millis(dt);
                    if !pending.is_empty() {
                        let mut r = pending.remove(0);
                        store.lease(&mut r, now);
                        requests.push((now, 1));
                        tokens.push((now, r.demand.tokens()));
                        leased.push(r);
                    }
                }
                Op::Cancel => {
                    if let Some(r) = pending.pop() {
                        store.refund(&r, now);
                    }
                }
                Op::Refund { pct } => {
                    // Q-7 bounds the token bucket and fixed window without
                    // refunds only.
                    if algorithm == Algorithm::SlidingWindow && !leased.is_empty() {
                        let r = leased.remove(0);
                        let actual = r.demand.tokens() * pct / 100;
                        store.reconcile(&r, &Actual::total(actual));
                        // The reconciled amount replaces the estimate where it was counted.
                        if let Some(e) = tokens.iter_mut().find(|e| e.0 == r.stamp && e.1 == r.demand.tokens()) {
                            e.1 = actual;
                        }
                    }
                }
            }
        }
        check_bounds(algorithm, t0, rpm, tpm, &requests, &tokens)?;
        // Nothing leaks: once every pending reservation is refunded and the
        // windows have passed, every limit is whole again.
        for r in pending.drain(..) {
            store.refund(&r, now);
        }
        let mut limits = Vec::new();
        store.snapshot(now + W * 3, &mut limits);
        for l in limits {
            prop_assert_eq!(l.available, l.capacity as i64);
        }
    }

    // proves: Q-7 (each algorithm's bound for attempts admitted at once)
    #[test]
    fn every_algorithm_keeps_its_bound(
        algorithm in algorithms(),
        rpm in 1u64..10,
        tpm in 50u64..300,
        arrivals in prop::collection::vec((0u64..15_000, 1u64..50), 1..150),
    ) {
        let t0 = Instant::now();
        let scope = ScopeConfig::new("p").requests(rpm, W).tokens(tpm, W).algorithm(algorithm);
        let mut store = LocalQuota::new(&scope, t0);
        let mut now = t0;
        let (mut requests, mut tokens) = (Vec::new(), Vec::new());
        for (dt, n) in arrivals {
            now += Duration::from_millis(dt);
            if store.try_reserve(&Demand::new(n, 0), now, Hold::Leased).is_some() {
                requests.push((now, 1));
                tokens.push((now, n));
            }
        }
        check_bounds(algorithm, t0, rpm, tpm, &requests, &tokens)?;
    }

    // proves: Q-9 (a reservation refunded before its lease is restored in
    // full exactly once, whatever happened in between)
    #[test]
    fn refunds_restore_exactly(
        algorithm in algorithms(),
        demands in prop::collection::vec((0u64..5_000, 0u64..40), 1..40),
    ) {
        let t0 = Instant::now();
        let scope = ScopeConfig::new("p").requests(20, W).tokens(400, W).algorithm(algorithm);
        let mut store = LocalQuota::new(&scope, t0);
        let mut now = t0;
        let mut held = Vec::new();
        let available = |store: &mut LocalQuota, at: Instant| {
            let mut v = Vec::new();
            store.snapshot(at, &mut v);
            v.iter().map(|l| l.available).collect::<Vec<_>>()
        };
        let before = available(&mut store, now);
        for (dt, n) in demands {
            now += Duration::from_millis(dt % 50);
            if let Ok(r) = store.reserve(&Demand::new(n, 0), now, Hold::Pending) {
                held.push(r);
            }
        }
        for r in held.iter().rev() {
            store.refund(r, now);
        }
        // Within the same instant budget nothing refilled for fixed and
        // sliding windows; a bucket may only have refilled up to capacity.
        let after = available(&mut store, now);
        match algorithm {
            Algorithm::TokenBucket { .. } => {
                for (a, b) in after.iter().zip(&before) {
                    prop_assert!(a >= b);
                }
            }
            _ => prop_assert_eq!(after, before),
        }
    }
}

/// (arrival ms, tokens, hold ms, cancel after ms)
type CallPlan = (u64, u64, u64, Option<u64>);

fn controller_cases() -> impl Strategy<Value = (Algorithm, u64, u64, u64, Vec<CallPlan>)> {
    (
        algorithms(),
        1u64..6,
        40u64..200,
        1u64..3,
        prop::collection::vec(
            (
                0u64..20_000,
                1u64..40,
                0u64..60_000,
                prop::option::of(0u64..90_000),
            ),
            1..40,
        ),
    )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    // proves, DL-7 (through the controller, with concurrency waits
    // and cancellations: every algorithm keeps its bound at the instants
    // attempts start, and once everything is dropped and the windows have
    // passed, every limit is whole again)
    #[test]
    fn controller_keeps_bounds_and_leaks_nothing(case in controller_cases()) {
        let (algorithm, rpm, tpm, concurrency, calls) = case;
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .start_paused(true)
            .build()
            .unwrap();
        rt.block_on(async move {
            let t0 = Instant::now();
            let controller = AdmissionController::builder()
                .scope(ScopeConfig::new("p").requests(rpm, W).tokens(tpm, W).algorithm(algorithm))
                .concurrency(concurrency)
                .build()
                .unwrap();
            let mut tasks = Vec::new();
            for (arrive, n, hold, cancel) in calls {
                let c = controller.clone();
                tasks.push(tokio::spawn(async move {
                    tokio::time::sleep(Duration::from_millis(arrive)).await;
                    let arrived = Instant::now();
                    let call = Call::new(ScopeId::FIRST).with_estimate(TokenEstimate::new(n, 0));
                    let acquire = c.acquire(&call, Deadline::NONE);
                    let lease = match cancel {
                        Some(ms) => match tokio::time::timeout(Duration::from_millis(ms), acquire).await {
                            Ok(r) => r,
                            Err(_) => return None,
                        },
                        None => acquire.await,
                    };
                    let lease = lease.ok()?;
                    let started = Instant::now();
                    assert_eq!(started, arrived + lease.admission().total_wait());
                    tokio::time::sleep(Duration::from_millis(hold)).await;
                    drop(lease);
                    Some((started, n))
                }));
            }
            let mut admitted = Vec::new();
            for t in tasks {
                if let Some(a) = t.await.unwrap() {
                    admitted.push(a);
                }
            }
            let requests: Vec<_> = admitted.iter().map(|a| (a.0, 1)).collect();
            let tokens: Vec<_> = admitted.to_vec();
            check_bounds(algorithm, t0, rpm, tpm, &requests, &tokens)?;
            settle().await;
            tokio::time::advance(W * 3).await;
            let s = controller.snapshot();
            prop_assert!(s.is_idle(), "not idle: {s:#?}");
            for l in &s.scopes[0].limits {
                prop_assert_eq!(l.available, l.capacity as i64, "{:?} leaked", l.dimension);
            }
            Ok(())
        })?;
    }
}

/// Which limits a Q-12 case configures, per minute-long window `W`:
/// requests, tokens, input tokens, output tokens (`None`: not limited).
type IoLimits = (u64, Option<u64>, Option<u64>, Option<u64>);

fn io_limits() -> impl Strategy<Value = IoLimits> {
    (
        1u64..8,
        prop::option::of(60u64..200),
        prop::option::of(40u64..150),
        prop::option::of(20u64..80),
    )
        .prop_filter("at least one token dimension", |(_, t, i, o)| {
            t.is_some() || i.is_some() || o.is_some()
        })
}

#[derive(Debug, Clone)]
enum IoOp {
    /// Reserve (pending) after `dt` ms.
    Arrive { dt: u64, input: u64, output: u64 },
    /// Lease the oldest pending reservation after `dt` ms.
    Lease { dt: u64 },
    /// Refund the newest pending reservation.
    Cancel,
    /// Report usage for the oldest leased attempt: input and output as
    /// percentages of the estimates, split or as a total only.
    Settle {
        input_pct: u64,
        output_pct: u64,
        split: bool,
    },
}

fn io_ops() -> impl Strategy<Value = Vec<IoOp>> {
    prop::collection::vec(
        prop_oneof![
            4 => (0u64..20_000, 0u64..40, 0u64..20)
                .prop_map(|(dt, input, output)| IoOp::Arrive { dt, input, output }),
            3 => (0u64..20_000).prop_map(|dt| IoOp::Lease { dt }),
            1 => Just(IoOp::Cancel),
            1 => (0u64..100, 0u64..100, any::<bool>())
                .prop_map(|(input_pct, output_pct, split)| IoOp::Settle { input_pct, output_pct, split }),
        ],
        1..120,
    )
}

/// The largest amount admitted in any window of one dimension, against its
/// Q-7 bound.
fn check_dimension(
    algorithm: Algorithm,
    epoch: Instant,
    dimension: Dimension,
    limit: Option<u64>,
    events: &[(Instant, u64)],
) -> Result<(), TestCaseError> {
    let Some(limit) = limit else {
        return Ok(());
    };
    let e_max = events.iter().map(|e| e.1).max().unwrap_or(0);
    let got = match algorithm {
        Algorithm::FixedWindow => max_per_fixed_window(events, epoch, W),
        _ => max_in_window(events, W),
    };
    prop_assert!(
        got <= bound(algorithm, limit, e_max),
        "{} {got} > bound for {algorithm:?} limit {limit}",
        dimension.as_str()
    );
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    // proves, Q-1 (with input-token and output-token limits
    // beside or instead of a token limit, random demands of input and
    // output never exceed the bound of any limit in any window: requests,
    // tokens, input tokens and output tokens each keep their algorithm's
    // bound, with reservations that wait, are cancelled or leased later,
    // and, for the sliding window, settled per dimension from split or
    // total-only reports; nothing leaks)
    #[test]
    fn io_limits_keep_their_bounds(algorithm in algorithms(), limits in io_limits(), ops in io_ops()) {
        let (rpm, tpm, itpm, otpm) = limits;
        let t0 = Instant::now();
        let mut scope = ScopeConfig::new("io").requests(rpm, W).algorithm(algorithm);
        if let Some(n) = tpm {
            scope = scope.tokens(n, W);
        }
        if let Some(n) = itpm {
            scope = scope.input_tokens(n, W);
        }
        if let Some(n) = otpm {
            scope = scope.output_tokens(n, W);
        }
        let mut store = LocalQuota::new(&scope, t0);
        let mut now = t0;
        let mut pending: Vec<Reservation> = Vec::new();
        let mut leased: Vec<Reservation> = Vec::new();
        // Per dimension, in the order of `Dimension::ALL`: what started when.
        let mut log: [Vec<(Instant, u64)>; 4] = Default::default();
        for op in ops {
            match op {
                IoOp::Arrive { dt, input, output } => {
                    now += Duration::from_millis(dt);
                    if let Ok(r) = store.reserve(&Demand::new(input, output), now, Hold::Pending) {
                        pending.push(r);
                    }
                }
                IoOp::Lease { dt } => {
                    now += Duration::from_millis(dt);
                    if !pending.is_empty() {
                        let mut r = pending.remove(0);
                        store.lease(&mut r, now);
                        for (events, d) in log.iter_mut().zip(Dimension::ALL) {
                            events.push((now, r.demand.amount(d)));
                        }
                        leased.push(r);
                    }
                }
                IoOp::Cancel => {
                    if let Some(r) = pending.pop() {
                        store.refund(&r, now);
                    }
                }
                IoOp::Settle { input_pct, output_pct, split } => {
                    // Q-7 bounds the token bucket and fixed window without
                    // refunds only.
                    if algorithm == Algorithm::SlidingWindow && !leased.is_empty() {
                        let r = leased.remove(0);
                        let (input, output) =
                            (r.demand.input * input_pct / 100, r.demand.output * output_pct / 100);
                        let actual = if split {
                            Actual::split(input, output)
                        } else {
                            Actual::total(input + output)
                        };
                        store.reconcile(&r, &actual);
                        // Each settled amount replaces its estimate where
                        // it was counted.
                        for (events, d) in log.iter_mut().zip(Dimension::ALL) {
                            let Some(used) = actual.amount(d, &r.demand) else {
                                continue;
                            };
                            let estimate = r.demand.amount(d);
                            if let Some(e) = events.iter_mut().find(|e| e.0 == r.stamp && e.1 == estimate) {
                                e.1 = used;
                            }
                        }
                    }
                }
            }
        }
        let configured = [Some(rpm), tpm, itpm, otpm];
        for ((d, limit), events) in Dimension::ALL.into_iter().zip(configured).zip(&log) {
            check_dimension(algorithm, t0, d, limit, events)?;
        }
        for r in pending.drain(..) {
            store.refund(&r, now);
        }
        let mut snapshot = Vec::new();
        store.snapshot(now + W * 3, &mut snapshot);
        for l in snapshot {
            prop_assert_eq!(l.available, l.capacity as i64, "{} leaked", l.dimension);
        }
    }
}

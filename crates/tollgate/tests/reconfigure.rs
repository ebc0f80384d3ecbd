//! Reconfiguring a running controller (SPEC GW-15 with, CD-1,
//! POOL-1, ADM-4): the quota state, cooldown, queue and calls in flight
//! carry into the new configuration. All on paused time: exact instants.

mod common;

use std::time::Duration;

use common::*;
use tokio::time::Instant;
use tollgate::config::{
    Algorithm, ControllerConfig, CooldownConfig, MINUTE, PoolConfig, ScopeConfig,
};
use tollgate::quota::Dimension;
use tollgate::{
    AdmissionController, AdmissionError, Call, Deadline, Flow, Lease, Priority, ScopeId,
};

fn config(scopes: Vec<ScopeConfig>) -> ControllerConfig {
    ControllerConfig {
        scopes,
        ..ControllerConfig::default()
    }
}

fn rpm(n: u64) -> ScopeConfig {
    ScopeConfig::new("main").requests(n, MINUTE)
}

/// Spawns `n` calls of `call` now (in this order), each reporting the
/// instant it was admitted and keeping its lease.
async fn queue(
    c: &AdmissionController,
    n: usize,
    call: Call,
) -> Vec<tokio::task::JoinHandle<(Duration, Lease)>> {
    let t0 = Instant::now();
    let mut out = Vec::new();
    for _ in 0..n {
        let c = c.clone();
        out.push(tokio::spawn(async move {
            let lease = c.acquire(&call, Deadline::NONE).await.expect("admitted");
            (Instant::now() - t0, lease)
        }));
        settle().await;
    }
    out
}

/// The instants (from `queue`'s start) at which the calls were admitted.
async fn admitted(calls: Vec<tokio::task::JoinHandle<(Duration, Lease)>>) -> Vec<Duration> {
    let mut at = Vec::new();
    for c in calls {
        at.push(c.await.expect("no panic").0);
    }
    at
}

// proves: GW-15, Q-7 (a lowered limit applies to the window in progress:
// the admissions made before the reconfiguration count, so the window
// never holds more than the new limit; the queued calls keep their order)
#[tokio::test(start_paused = true)]
async fn a_lowered_limit_never_admits_past_it_in_the_carried_window() {
    let c = AdmissionController::new(config(vec![rpm(10)])).unwrap();
    let t0 = Instant::now();
    let mut held = Vec::new();
    for _ in 0..6 {
        held.push(c.acquire(&plain(), Deadline::NONE).await.unwrap());
    }
    tokio::time::advance(secs(10)).await;
    // 6 of 10 used; the new limit is 8: 2 more in this window, then the
    // rest as the first 6 age out at t0 + 60 s.
    c.reconfigure(config(vec![rpm(8)])).unwrap();
    assert_eq!(available(&c, Dimension::Requests), 2);
    let calls = queue(&c, 5, plain()).await;
    let at = admitted(calls).await;
    let from_t0: Vec<u64> = at.iter().map(|d| (*d + secs(10)).as_secs()).collect();
    assert_eq!(
        from_t0,
        vec![10, 10, 60, 60, 60],
        "admitted at (s after t0)"
    );
    assert_eq!(Instant::now() - t0, secs(60));
    drop(held);

    // Lowered below what the window holds: nothing until enough ages out.
    let c = AdmissionController::new(config(vec![rpm(10)])).unwrap();
    let mut held = Vec::new();
    for _ in 0..6 {
        held.push(c.acquire(&plain(), Deadline::NONE).await.unwrap());
    }
    c.reconfigure(config(vec![rpm(4)])).unwrap();
    assert_eq!(available(&c, Dimension::Requests), -2);
    let at = admitted(queue(&c, 4, plain()).await).await;
    assert_eq!(at, vec![secs(60); 4], "the 6 leave the window at 60 s");
    drop(held);
}

// proves: GW-15, Q-7 (a raised limit admits the difference at once: the
// queued calls it makes room for are granted at the reconfiguration)
#[tokio::test(start_paused = true)]
async fn a_raised_limit_admits_the_difference_at_once() {
    let c = AdmissionController::new(config(vec![rpm(5)])).unwrap();
    let mut held = Vec::new();
    for _ in 0..5 {
        held.push(c.acquire(&plain(), Deadline::NONE).await.unwrap());
    }
    let calls = queue(&c, 4, plain()).await;
    tokio::time::advance(secs(5)).await;
    c.reconfigure(config(vec![rpm(8)])).unwrap();
    let at = admitted(calls).await;
    assert_eq!(at[..3], [secs(5); 3], "3 more at once");
    assert_eq!(at[3], secs(60), "the fourth when the first 5 age out");
    drop(held);
}

// proves: GW-15, Q-7 (token bucket: what was taken stays taken; a lowered
// capacity leaves debt the refill pays back, a raised one is available)
#[tokio::test(start_paused = true)]
async fn a_bucket_keeps_what_was_taken() {
    let bucket = |n| rpm(n).algorithm(Algorithm::TokenBucket { burst: None });
    let c = AdmissionController::new(config(vec![bucket(6)])).unwrap();
    let mut held = Vec::new();
    for _ in 0..4 {
        held.push(c.acquire(&plain(), Deadline::NONE).await.unwrap());
    }
    c.reconfigure(config(vec![bucket(12)])).unwrap();
    assert_eq!(available(&c, Dimension::Requests), 8, "12 - 4 taken");
    c.reconfigure(config(vec![bucket(3)])).unwrap();
    assert_eq!(available(&c, Dimension::Requests), -1, "3 - 4 taken");
    // 3 per minute: one unit every 20 s; two to be back at one available.
    let at = admitted(queue(&c, 1, plain()).await).await;
    assert_eq!(at, vec![secs(40)]);
    drop(held);
}

// proves: GW-15, CD-1, POOL-1, ADM-4 (a reconfiguration that changes the
// cooldown settings and the pool keeps the running cooldown, the calls in
// flight (counted against the new pool size) and the queue's order)
#[tokio::test(start_paused = true)]
async fn cooldown_in_flight_calls_and_queue_order_survive() {
    let pool = |limit| PoolConfig::new("p", limit);
    let make = |limit, max: u64| ControllerConfig {
        scopes: vec![rpm(100)],
        pools: vec![pool(limit)],
        cooldown: CooldownConfig {
            max: secs(max),
            ..CooldownConfig::default()
        },
        ..ControllerConfig::default()
    };
    let c = AdmissionController::new(make(3, 60)).unwrap();
    let p = c.pool_id("p").unwrap();
    let call = Call {
        pool: Some(p),
        ..plain()
    };
    let t0 = Instant::now();
    let a = c.acquire(&call, Deadline::NONE).await.unwrap();
    let b = c.acquire(&call, Deadline::NONE).await.unwrap();
    let outcome = a.rate_limited(Some(secs(30)));
    let until = outcome.until().unwrap();
    let waiting = queue(&c, 3, call).await;
    // Only `[cooldown] max` and the pool's size change.
    c.reconfigure(make(1, 10)).unwrap();
    assert_eq!(
        c.cooldown(ScopeId::FIRST),
        Some((1, Some(until))),
        "the cooldown runs on"
    );
    let s = c.snapshot();
    assert_eq!(s.pool(p).map(|p| (p.limit, p.available)), Some((1, 0)));
    assert_eq!(s.active, 2, "in flight");
    tokio::time::advance(secs(31)).await;
    settle().await;
    assert!(
        waiting.iter().all(|w| !w.is_finished()),
        "two held of one permit"
    );
    drop(a);
    settle().await;
    assert!(waiting.iter().all(|w| !w.is_finished()), "still one held");
    drop(b);
    let mut order = Vec::new();
    for w in waiting {
        let (at, lease) = w.await.unwrap();
        order.push((at, lease.admission().ticket));
        drop(lease);
    }
    assert!(order.windows(2).all(|w| w[0].1 < w[1].1), "FIFO: {order:?}");
    assert!(order[0].0 >= until - t0);
    assert_idle(&c);
}

// proves: GW-15, Q-3 (a queued call whose demand no longer fits a whole
// limit fails at once with its typed error, and the calls behind it go on)
#[tokio::test(start_paused = true)]
async fn a_queued_demand_above_a_lowered_limit_fails_at_once() {
    let scope = |tokens| {
        ScopeConfig::new("main")
            .requests(100, MINUTE)
            .tokens(tokens, MINUTE)
    };
    let c = AdmissionController::new(config(vec![scope(1_000)])).unwrap();
    let first = c.acquire(&tokens(900), Deadline::NONE).await.unwrap();
    let big = {
        let c = c.clone();
        tokio::spawn(async move { c.acquire(&tokens(600), Deadline::NONE).await.map(drop) })
    };
    settle().await;
    let small = queue(&c, 1, tokens(100)).await;
    c.reconfigure(config(vec![scope(500)])).unwrap();
    let refused = big.await.unwrap();
    assert!(
        matches!(refused, Err(AdmissionError::EstimateExceedsLimit(e)) if e.limit == 500),
        "{refused:?}"
    );
    // 900 + 100 > 500: the small one waits for the 900 to age out.
    assert_eq!(admitted(small).await, vec![secs(60)]);
    drop(first);
}

// proves: GW-15, Q-3, FAIR-1 (with several flows waiting, a lowered limit
// fails the unfit calls of every flow's line, the head the scheduler had
// chosen and calls behind other flows' heads alike, and the head it picks
// next is armed for its exact instant under the new limit)
#[tokio::test(start_paused = true)]
async fn a_lowered_limit_fails_the_unfit_calls_of_every_flow() {
    let scope = |tokens| {
        ScopeConfig::new("main")
            .requests(100, MINUTE)
            .tokens(tokens, MINUTE)
    };
    let c = AdmissionController::new(config(vec![scope(1_000)])).unwrap();
    let first = c.acquire(&tokens(900), Deadline::NONE).await.unwrap();
    let on = |tenant, n| tokens(n).with_flow(Flow::new(tenant, Priority::Standard));
    let spawn = |call: Call| {
        let c = c.clone();
        tokio::spawn(async move { c.acquire(&call, Deadline::NONE).await.map(drop) })
    };
    // The head (flow 1, too large for the new limit), then flow 2's line
    // with an unfit call behind a fitting one, then flow 1's fitting one.
    let head = spawn(on(1, 600));
    settle().await;
    let fits_2 = queue(&c, 1, on(2, 100)).await;
    let unfit_2 = spawn(on(2, 700));
    settle().await;
    let fits_1 = queue(&c, 1, on(1, 200)).await;
    c.reconfigure(config(vec![scope(500)])).unwrap();
    for refused in [head.await.unwrap(), unfit_2.await.unwrap()] {
        assert!(
            matches!(refused, Err(AdmissionError::EstimateExceedsLimit(e)) if e.limit == 500),
            "{refused:?}"
        );
    }
    // 900 + 100 > 500: both fitting calls wait for the 900 to age out, and
    // both fit then (100 + 200 <= 500).
    assert_eq!(admitted(fits_2).await, vec![secs(60)]);
    assert_eq!(admitted(fits_1).await, vec![secs(60)]);
    drop(first);
}

// proves: GW-15, Q-7 (another algorithm: the new limit is seeded with what
// the old one counted, and the old one bounds its window until it drains:
// never more than either configuration allows)
#[tokio::test(start_paused = true)]
async fn another_algorithm_starts_from_what_was_counted() {
    let c = AdmissionController::new(config(vec![rpm(10)])).unwrap();
    let mut held = Vec::new();
    for _ in 0..6 {
        held.push(c.acquire(&plain(), Deadline::NONE).await.unwrap());
    }
    tokio::time::advance(secs(1)).await;
    let bucket = rpm(5).algorithm(Algorithm::TokenBucket { burst: None });
    c.reconfigure(config(vec![bucket])).unwrap();
    // A bucket of 5 with 6 taken: -1, one unit every 12 s. A fresh bucket
    // would have admitted 5 at once (4 under the old window).
    assert_eq!(available(&c, Dimension::Requests), -1);
    let at = admitted(queue(&c, 3, plain()).await).await;
    assert_eq!(at, vec![secs(24), secs(36), secs(48)]);
    drop(held);
}

// proves: GW-15, Q-7 (another window: the old window in progress still
// bounds admissions until it drains, and the new one counts what came
// before)
#[tokio::test(start_paused = true)]
async fn another_window_never_admits_more_than_either() {
    let c = AdmissionController::new(config(vec![rpm(10)])).unwrap();
    let mut held = Vec::new();
    for _ in 0..6 {
        held.push(c.acquire(&plain(), Deadline::NONE).await.unwrap());
    }
    tokio::time::advance(secs(1)).await;
    let short = ScopeConfig::new("main").requests(10, secs(10));
    c.reconfigure(config(vec![short])).unwrap();
    assert_eq!(available(&c, Dimension::Requests), 4);
    let at = admitted(queue(&c, 6, plain()).await).await;
    // 4 at once (both allow 4); the old minute holds 10 until its first 6
    // leave it at t0 + 60 s.
    assert_eq!(at, [vec![Duration::ZERO; 4], vec![secs(59); 2]].concat());
    // The old minute bounds admissions until t0 + 61 s (one of its windows
    // after the reconfiguration): it holds 6, so 4 now; then the new
    // window alone, 10 per 10 s, which holds 6.
    let at = admitted(queue(&c, 8, plain()).await).await;
    assert_eq!(at, [vec![Duration::ZERO; 4], vec![secs(1); 4]].concat());
    drop(held);
}

// proves: GW-15 (scopes and pools come and go: a removed scope's lease
// settles where it was taken, and a scope that comes back is the same one)
#[tokio::test(start_paused = true)]
async fn scopes_and_pools_come_and_go() {
    let tenant = ScopeConfig::new("tenant").requests(10, MINUTE);
    let model = ScopeConfig::new("tenant/model").requests(2, MINUTE);
    let c = AdmissionController::new(config(vec![tenant.clone()])).unwrap();
    assert!(c.scope_id("tenant/model").is_none());
    c.reconfigure(ControllerConfig {
        scopes: vec![tenant.clone(), model.clone()],
        pools: vec![PoolConfig::new("p", 1)],
        ..ControllerConfig::default()
    })
    .unwrap();
    let m = c.scope_id("tenant/model").expect("added");
    let p = c.pool_id("p").expect("added");
    let mut lease = c
        .acquire(
            &Call {
                pool: Some(p),
                ..Call::new(m)
            },
            Deadline::NONE,
        )
        .await
        .unwrap();
    c.reconfigure(config(vec![tenant.clone()])).unwrap();
    assert!(c.scope_id("tenant/model").is_none(), "retired");
    assert!(c.pool_id("p").is_none(), "retired");
    assert!(c.snapshot().scope_named("tenant/model").is_none());
    assert_eq!(c.snapshot().active, 1, "its lease still counts");
    lease.reconcile(tollgate::Usage::from_io(0, 0)).unwrap();
    drop(lease);
    assert_idle(&c);
    c.reconfigure(config(vec![tenant, model])).unwrap();
    assert_eq!(c.scope_id("tenant/model"), Some(m), "the same scope again");
    let s = c.snapshot();
    let back = s.scope_named("tenant/model").unwrap();
    assert_eq!(back.counters.admitted, 1, "with its state");
    assert_eq!(available_at(&s, m.index(), Dimension::Requests), 1);
}

// proves: GW-15, Q-14 (what the provider taught survives a reconfiguration
// of other settings: a learned limit keeps its amount and its window's
// admissions, and budget another client spent stays counted)
#[tokio::test(start_paused = true)]
async fn learned_limits_and_debts_survive() {
    use tollgate::quota::BudgetReport;
    let learning = || ControllerConfig {
        scopes: vec![
            ScopeConfig::new("main")
                .tokens(1_000, MINUTE)
                .learn_limits(MINUTE),
        ],
        ..ControllerConfig::default()
    };
    let c = AdmissionController::new(learning()).unwrap();
    let lease = c.acquire(&tokens(100), Deadline::NONE).await.unwrap();
    let now = Instant::now();
    // The provider advertises 4 requests per window and has 1 left: 2
    // spent by another client.
    c.observe_answer(
        &lease,
        &BudgetReport {
            dimension: Dimension::Requests,
            limit: Some(4),
            remaining: Some(1),
            reset: Some(MINUTE),
        },
        now,
    );
    c.provider_answered(ScopeId::FIRST);
    // Tokens: another client spent 500.
    c.observe(
        ScopeId::FIRST,
        &BudgetReport {
            dimension: Dimension::Tokens,
            limit: None,
            remaining: Some(400),
            reset: Some(MINUTE),
        },
        now,
    );
    let before = c.snapshot().scopes[0].limits.clone();
    assert_eq!(available(&c, Dimension::Requests), 1);
    assert_eq!(available(&c, Dimension::Tokens), 400);
    let mut changed = learning();
    changed.cooldown.max = secs(5);
    changed.max_wait = Some(secs(30));
    c.reconfigure(changed).unwrap();
    assert_eq!(
        c.snapshot().scopes[0].limits,
        before,
        "learned and spent: kept"
    );
    // A configured token limit raised: the other client's 500 and ours
    // still count.
    let mut raised = learning();
    raised.scopes = vec![
        ScopeConfig::new("main")
            .tokens(2_000, MINUTE)
            .learn_limits(MINUTE),
    ];
    c.reconfigure(raised).unwrap();
    assert_eq!(available(&c, Dimension::Tokens), 1_400);
    assert_eq!(available(&c, Dimension::Requests), 1, "still learned: 4");
    drop(lease);
}

// proves: GW-15, Q-14 (a configured request limit replacing the
// provisional stand-in of a learning scope counts what was sent, and the
// stand-in (one request per window until the provider answers) does not
// linger to throttle it)
#[tokio::test(start_paused = true)]
async fn a_configured_limit_replaces_the_provisional_one() {
    let scope = ScopeConfig::new("main").learn_limits(MINUTE);
    let c = AdmissionController::new(config(vec![scope.clone()])).unwrap();
    let first = c.acquire(&tokens(1), Deadline::NONE).await.unwrap();
    let configured = scope.requests(5, secs(10));
    c.reconfigure(config(vec![configured])).unwrap();
    assert_eq!(available(&c, Dimension::Requests), 4, "the first counts");
    let at = admitted(queue(&c, 4, tokens(1)).await).await;
    assert_eq!(at, vec![Duration::ZERO; 4]);
    drop(first);
}

// proves: GW-15, Q-5, Q-7 (a call leased before a reload to a longer
// window settles its debt after it: 1,000 tokens estimated, 10,000 used
// under 10,000 a day, reloaded as 15,000 per two days; the two days count
// all 10,000, also once the old day has gone, so the next day admits
// 5,000 and no more)
#[tokio::test(start_paused = true)]
async fn debt_settled_after_a_reload_reaches_the_longer_window() {
    let day = Duration::from_secs(86_400);
    for algorithm in [Algorithm::SlidingWindow, Algorithm::FixedWindow] {
        let scope = |amount, window| {
            ScopeConfig::new("main")
                .tokens(amount, window)
                .algorithm(algorithm)
        };
        let c = AdmissionController::new(config(vec![scope(10_000, day)])).unwrap();
        let mut lease = c.acquire(&tokens(1_000), Deadline::NONE).await.unwrap();
        tokio::time::advance(secs(1)).await;
        c.reconfigure(config(vec![scope(15_000, 2 * day)])).unwrap();
        lease.reconcile(tollgate::Usage::known(10_000)).unwrap();
        drop(lease);
        assert_eq!(
            available(&c, Dimension::Tokens),
            5_000,
            "{algorithm:?}: the two days count the debt"
        );
        tokio::time::advance(day + secs(60)).await;
        assert_eq!(
            available(&c, Dimension::Tokens),
            5_000,
            "{algorithm:?}: 10,000 of the two days' 15,000 are used"
        );
    }
}

// proves: GW-15, Q-7, Q-15 (an attempt the provider may count as late as
// an instant after a reload to another window is counted, by the new
// limit, in the window holding that instant: the old window, gone by
// then, no longer bounds it)
#[tokio::test(start_paused = true)]
async fn an_amount_counted_ahead_reaches_the_changed_window() {
    for algorithm in [Algorithm::SlidingWindow, Algorithm::FixedWindow] {
        let scope = |window| {
            ScopeConfig::new("main")
                .requests(2, window)
                .algorithm(algorithm)
        };
        let c = AdmissionController::new(config(vec![scope(MINUTE)])).unwrap();
        let t0 = Instant::now();
        let mut lease = c.acquire(&plain(), Deadline::NONE).await.unwrap();
        // The provider may count it as late as 70 s.
        lease.counted_by(t0 + secs(70));
        drop(lease);
        tokio::time::advance(secs(1)).await;
        c.reconfigure(config(vec![scope(secs(30))])).unwrap();
        // The old minute bounds admissions until 61 s; at 65 s the new
        // 30 s window holding 70 s counts the attempt.
        tokio::time::advance(secs(64)).await;
        assert_eq!(
            available(&c, Dimension::Requests),
            1,
            "{algorithm:?}, at 65 s"
        );
        tokio::time::advance(secs(40)).await;
        assert_eq!(
            available(&c, Dimension::Requests),
            2,
            "{algorithm:?}, at 105 s"
        );
    }
}

// proves: Q-3, BUD-1, GW-15 (a reload that makes a scope need a token
// estimate or a price fails the queued calls that lack one, instead of
// admitting them with nothing reserved; a call with one keeps its place).
// Found in review: a call queued without an estimate before a token limit
// was added was admitted with a reservation of 0 tokens.
#[tokio::test(start_paused = true)]
async fn a_reload_that_needs_an_estimate_or_a_price_fails_the_calls_without() {
    let price = tollgate::Price::new(1_000_000, 1_000_000);
    let estimated = Call::new(ScopeId::FIRST).with_estimate(tollgate::TokenEstimate::new(1, 0));
    for (added, lacking, expected) in [
        (
            rpm(1).tokens(100, MINUTE),
            Call::new(ScopeId::FIRST),
            AdmissionError::TokenEstimateRequired {
                scope: ScopeId::FIRST,
            },
        ),
        (
            rpm(1).cost(100, MINUTE),
            estimated,
            AdmissionError::PriceRequired {
                scope: ScopeId::FIRST,
            },
        ),
    ] {
        let c = AdmissionController::new(config(vec![rpm(1)])).unwrap();
        let _full = c
            .acquire(&estimated.with_price(price), Deadline::NONE)
            .await
            .unwrap();
        let without = spawn_acquire(&c, lacking, Deadline::NONE);
        let with = spawn_acquire(&c, estimated.with_price(price), Deadline::NONE);
        settle().await;
        c.reconfigure(config(vec![added])).unwrap();
        settle().await;
        assert_eq!(without.await.unwrap().err(), Some(expected.clone()));
        tokio::time::sleep(MINUTE).await;
        assert!(
            with.await.unwrap().is_ok(),
            "the call with both is admitted"
        );
        // A call that arrives now lacking it is refused on arrival, as before.
        assert_eq!(
            c.acquire(&lacking, Deadline::NONE).await.err(),
            Some(expected)
        );
    }
}

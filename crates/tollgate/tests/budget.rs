//! Spend budgets in the engine (SPEC BUD-2, BUD-4, BUD-5, Q-11, GW-15):
//! cost limits reserved at the worst case, refused at once when their
//! window cannot free room in time, settled from priced usage, refunded
//! for refusals, and carried across a reconfiguration. Paused time: exact
//! instants.

mod common;

use std::time::Duration;

use common::*;
use tokio::time::Instant;
use tollgate::config::{ControllerConfig, DAY, MINUTE, ScopeConfig};
use tollgate::quota::Dimension;
use tollgate::{
    AdmissionController, AdmissionError, Call, Deadline, Parts, Phase, Price, RefusalCost, ScopeId,
    TokenEstimate, Usage,
};

/// gpt-4o-mini's list price: $0.15 input, $0.075 cached, $0.60 output per
/// million tokens.
fn mini() -> Price {
    Price {
        cached_input: Some(75_000),
        ..Price::new(150_000, 600_000)
    }
}

/// A call of `input` tokens and an `output` allowance at `price`.
fn priced(input: u64, output: u64, price: Price) -> Call {
    Call::new(ScopeId::FIRST)
        .with_estimate(TokenEstimate::new(input, output))
        .with_price(price)
}

fn budget(micros: u64, window: Duration) -> ControllerConfig {
    ControllerConfig {
        scopes: vec![ScopeConfig::new("team").cost(micros, window)],
        ..ControllerConfig::default()
    }
}

// proves: BUD-4, Q-11 (a call that a day budget cannot take before its
// deadline fails at once, without waiting, as BudgetExceeded carrying the
// instant the window frees room; nothing is reserved for it)
#[tokio::test(start_paused = true)]
async fn a_spent_budget_refuses_at_once_with_its_reset() {
    // $0.001 a day; each call's worst case is 1000 * 0.15 + 1000 * 0.6 =
    // 750 µ$.
    let c = AdmissionController::new(budget(1_000, DAY)).unwrap();
    let t0 = Instant::now();
    let first = c
        .acquire(&priced(1_000, 1_000, mini()), within(secs(30)))
        .await
        .unwrap();
    assert_eq!(first.reservation().demand.cost, 750);
    assert_eq!(available(&c, Dimension::Cost), 250);
    let e = c
        .acquire(&priced(1_000, 1_000, mini()), within(secs(30)))
        .await
        .unwrap_err();
    assert_eq!(Instant::now(), t0, "refused at once");
    match e {
        AdmissionError::BudgetExceeded { scope, retry_at } => {
            assert_eq!(scope, ScopeId::FIRST);
            assert_eq!(retry_at, Some(t0 + DAY));
        }
        other => panic!("expected BudgetExceeded, got {other:?}"),
    }
    assert_eq!(e.kind(), "budget_exceeded");
    assert_eq!(available(&c, Dimension::Cost), 250, "nothing reserved");
    // A smaller call still fits: 200 output tokens = 120 µ$.
    let small = c
        .acquire(&priced(0, 200, mini()), within(secs(30)))
        .await
        .unwrap();
    assert_eq!(available(&c, Dimension::Cost), 130);
    drop((first, small));
}

// proves: BUD-4, Q-11 (with max_wait and no deadline, a budget that frees
// room only later than max_wait refuses at once too; one that frees it
// within max_wait lets the call wait and admits it then)
#[tokio::test(start_paused = true)]
async fn max_wait_bounds_a_budget_wait() {
    let config = ControllerConfig {
        max_wait: Some(secs(10)),
        ..budget(1_000, secs(5))
    };
    let c = AdmissionController::new(config).unwrap();
    let t0 = Instant::now();
    let _a = c
        .acquire(&priced(1_000, 1_000, mini()), Deadline::NONE)
        .await
        .unwrap();
    // The window is 5 s: the call waits 5 s and is admitted.
    let _b = c
        .acquire(&priced(1_000, 1_000, mini()), Deadline::NONE)
        .await
        .unwrap();
    assert_eq!(Instant::now(), t0 + secs(5));
    let day = AdmissionController::new(ControllerConfig {
        max_wait: Some(secs(10)),
        ..budget(1_000, DAY)
    })
    .unwrap();
    let _c = day
        .acquire(&priced(1_000, 1_000, mini()), Deadline::NONE)
        .await
        .unwrap();
    let e = day
        .acquire(&priced(1_000, 1_000, mini()), Deadline::NONE)
        .await
        .unwrap_err();
    assert!(matches!(e, AdmissionError::BudgetExceeded { .. }), "{e:?}");
    assert_eq!(Instant::now(), t0 + secs(5), "refused at once");
}

// proves: BUD-2, Q-5 (settlement prices the reported usage per kind:
// cached input at its price; the difference to the worst case comes back
// at once and admits the next call)
#[tokio::test(start_paused = true)]
async fn settlement_gives_back_the_unused_worst_case() {
    let c = AdmissionController::new(budget(1_000, DAY)).unwrap();
    let mut a = c
        .acquire(&priced(1_000, 1_000, mini()), Deadline::NONE)
        .await
        .unwrap();
    // 1000 input of which 800 cached, 100 output:
    // 200 * 0.15 + 800 * 0.075 + 100 * 0.6 = 30 + 60 + 60 = 150 µ$.
    let usage = Usage::from_counters(
        tollgate::Counter::Absent,
        tollgate::Counter::Value(1_000),
        tollgate::Counter::Value(100),
        tollgate::Counter::Value(800),
    );
    let s = a.reconcile(usage.priced(&mini())).unwrap();
    assert_eq!(s.cost.reported, Some(150));
    assert_eq!(s.cost.refunded, 600);
    assert_eq!(available(&c, Dimension::Cost), 850);
    // A waiting call fits now.
    let _b = c
        .acquire(&priced(1_000, 1_000, mini()), within(secs(1)))
        .await
        .unwrap();
    assert_eq!(available(&c, Dimension::Cost), 100);
    let counters = c.snapshot().scopes[0].counters;
    assert_eq!(counters.cost_reserved, 1_500);
    assert_eq!(counters.cost_reported, 150);
    assert_eq!(counters.cost_refunded, 600);
}

// proves: BUD-2, Q-5 (usage above the estimate is debt: the budget goes
// negative and later calls are refused until the debt ages out; unknown
// usage keeps the worst case)
#[tokio::test(start_paused = true)]
async fn debt_and_unknown_usage() {
    let c = AdmissionController::new(budget(1_000, secs(60))).unwrap();
    let t0 = Instant::now();
    let mut a = c
        .acquire(&priced(1_000, 0, mini()), Deadline::NONE)
        .await
        .unwrap();
    assert_eq!(available(&c, Dimension::Cost), 850);
    // The provider counted 8000 input tokens: 1200 µ$, 1050 of debt.
    let s = a
        .reconcile(Usage::from_io(8_000, 0).priced(&mini()))
        .unwrap();
    assert_eq!((s.cost.reported, s.cost.debt), (Some(1_200), 1_050));
    assert_eq!(available(&c, Dimension::Cost), -200);
    let e = c
        .acquire(&priced(1, 0, mini()), within(secs(10)))
        .await
        .unwrap_err();
    assert!(
        matches!(e, AdmissionError::BudgetExceeded { retry_at: Some(at), .. } if at == t0 + secs(60))
    );
    tokio::time::advance(secs(60)).await;
    let mut b = c
        .acquire(&priced(1_000, 0, mini()), Deadline::NONE)
        .await
        .unwrap();
    let s = b.reconcile(Usage::UNKNOWN.priced(&mini())).unwrap();
    assert_eq!((s.cost.reported, s.cost.charged()), (None, 150));
    assert_eq!(available(&c, Dimension::Cost), 850);
}

// proves: BUD-5, Q-16 (a refused attempt costs nothing in money, whatever
// its provider's limiter charges: the request unit and tokens follow the
// refusal policy, the cost always comes back)
#[tokio::test(start_paused = true)]
async fn a_refusal_gives_the_cost_back() {
    let c = AdmissionController::new(ControllerConfig {
        scopes: vec![
            ScopeConfig::new("team")
                .requests(10, DAY)
                .tokens(10_000, DAY)
                .cost(1_000, DAY),
        ],
        ..ControllerConfig::default()
    })
    .unwrap();
    let mut a = c
        .acquire(&priced(1_000, 1_000, mini()), Deadline::NONE)
        .await
        .unwrap();
    a.refused(RefusalCost::Full).unwrap();
    assert_eq!(available(&c, Dimension::Cost), 1_000);
    assert_eq!(available(&c, Dimension::Tokens), 8_000, "full: tokens kept");
    assert_eq!(available(&c, Dimension::Requests), 9);
    assert_eq!(c.snapshot().scopes[0].counters.cost_refunded, 750);
}

// proves: BUD-2 (a provider whose answer carries usage split into kinds is
// charged each kind at its price; one that reports only a total, or a
// usage nobody priced, keeps the worst case)
#[tokio::test(start_paused = true)]
async fn parts_set_by_the_wire_are_priced() {
    let c = AdmissionController::new(budget(1_000_000, DAY)).unwrap();
    let sonnet = Price {
        cached_input: Some(300_000),
        cache_write: Some(3_750_000),
        cache_write_1h: Some(6_000_000),
        ..Price::new(3_000_000, 15_000_000)
    };
    let mut a = c
        .acquire(&priced(2_000, 100, sonnet), Deadline::NONE)
        .await
        .unwrap();
    // Worst case: 2000 at the 1-hour write price + 100 output.
    assert_eq!(a.reservation().demand.cost, 12_000 + 1_500);
    let parts = Parts {
        cached_input: 1_000,
        cache_write: 500,
        ..Parts::plain(10, 40)
    };
    let usage = Usage::from_io(1_510, 40).with_parts(Some(parts));
    // 10 * 3 + 1000 * 0.3 + 500 * 3.75 + 40 * 15 = 30 + 300 + 1875 + 600.
    assert_eq!(
        a.reconcile(usage.priced(&sonnet)).unwrap().cost.reported,
        Some(2_805)
    );
    // Unpriced, a usage keeps the worst case.
    let mut b = c
        .acquire(&priced(2_000, 100, sonnet), Deadline::NONE)
        .await
        .unwrap();
    assert_eq!(
        b.reconcile(Usage::from_io(400, 100))
            .unwrap()
            .cost
            .charged(),
        13_500
    );
    let mut d = c
        .acquire(&priced(2_000, 100, sonnet), Deadline::NONE)
        .await
        .unwrap();
    // A total without a split keeps it too, priced or not.
    assert_eq!(
        d.reconcile(Usage::known(500).priced(&sonnet))
            .unwrap()
            .cost
            .charged(),
        13_500
    );
}

// proves: GW-15, BUD-2 (a reload keeps what a budget has spent: a lowered
// budget applies to the spend so far, a budget over another window starts
// from it)
#[tokio::test(start_paused = true)]
async fn a_reload_keeps_the_spend() {
    let c = AdmissionController::new(budget(1_000, DAY)).unwrap();
    let mut a = c
        .acquire(&priced(0, 1_000, mini()), Deadline::NONE)
        .await
        .unwrap();
    a.reconcile(Usage::from_io(0, 1_000).priced(&mini()))
        .unwrap();
    assert_eq!(available(&c, Dimension::Cost), 400);
    c.reconfigure(budget(800, DAY)).unwrap();
    assert_eq!(available(&c, Dimension::Cost), 200);
    c.reconfigure(budget(2_000, 7 * DAY)).unwrap();
    assert_eq!(available(&c, Dimension::Cost), 1_400);
    // A budget added by the reload needs a price from then on.
    let plain = ControllerConfig {
        scopes: vec![ScopeConfig::new("team").requests(10, DAY)],
        ..ControllerConfig::default()
    };
    let c = AdmissionController::new(plain).unwrap();
    let _free = c.acquire(&plain_call(), Deadline::NONE).await.unwrap();
    c.reconfigure(budget(1_000, DAY)).unwrap();
    let e = c.acquire(&plain_call(), Deadline::NONE).await.unwrap_err();
    assert_eq!(e.kind(), "token_estimate_required");
    let e = c
        .acquire(
            &Call::new(ScopeId::FIRST).with_estimate(TokenEstimate::new(1, 1)),
            Deadline::NONE,
        )
        .await
        .unwrap_err();
    assert_eq!(e.kind(), "price_required");
}

fn plain_call() -> Call {
    Call::new(ScopeId::FIRST)
}

// proves: BUD-4, Q-11 (a call kept past its deadline by a request limit,
// while its budget would free room in time, fails as a rate wait with the
// request limit's instant, not as budget_exceeded; both when it would wait
// at the head and when it would wait behind queued calls)
#[tokio::test(start_paused = true)]
async fn a_request_limit_that_binds_is_not_reported_as_the_budget() {
    let hour = secs(3_600);
    let c = AdmissionController::new(ControllerConfig {
        scopes: vec![
            ScopeConfig::new("team")
                .requests(1, hour)
                .cost(1_000, MINUTE),
        ],
        ..ControllerConfig::default()
    })
    .unwrap();
    let t0 = Instant::now();
    // One request for the hour and 750 of the minute's 1000 µ$.
    let first = c
        .acquire(&priced(1_000, 1_000, mini()), within(secs(30)))
        .await
        .unwrap();
    // The budget frees room at t0 + 60 s, inside the 10 minute deadline;
    // the request limit only at t0 + 1 h.
    let e = c
        .acquire(&priced(1_000, 1_000, mini()), within(secs(600)))
        .await
        .unwrap_err();
    assert_eq!(
        e,
        AdmissionError::DeadlineExceeded {
            phase: Phase::Rate,
            retry_at: Some(t0 + hour),
        }
    );
    assert_eq!(e.kind(), "deadline_exceeded");
    // Behind a queued call: it would go at t0 + 2 h, for the same reason.
    let c2 = c.clone();
    let queued = tokio::spawn(async move {
        c2.acquire(&priced(1_000, 1_000, mini()), Deadline::NONE)
            .await
            .map(drop)
    });
    settle().await;
    assert_eq!(c.snapshot().scopes[0].queued, 1);
    let e = c
        .acquire(&priced(1_000, 1_000, mini()), within(secs(600)))
        .await
        .unwrap_err();
    assert_eq!(
        e,
        AdmissionError::DeadlineExceeded {
            phase: Phase::Rate,
            retry_at: Some(t0 + hour + hour),
        }
    );
    assert_eq!(Instant::now(), t0, "refused at once");
    drop(first);
    queued.abort();
}

// proves: BUD-4, Q-11 (a head that waited for its budget, then is kept
// past its deadline by a request limit a reload lowered, fails as a rate
// wait with the request limit's instant: what binds now, not what once
// held it back)
#[tokio::test(start_paused = true)]
async fn a_head_once_held_by_its_budget_fails_by_the_limit_that_binds() {
    let hour = secs(3_600);
    let config = |requests| ControllerConfig {
        scopes: vec![
            ScopeConfig::new("team")
                .requests(requests, hour)
                .cost(1_000, MINUTE),
        ],
        ..ControllerConfig::default()
    };
    let c = AdmissionController::new(config(2)).unwrap();
    let t0 = Instant::now();
    // One request of two for the hour, and the minute's budget.
    let first = c
        .acquire(&priced(1_000, 1_000, mini()), within(secs(30)))
        .await
        .unwrap();
    // Waits for the budget (t0 + 60 s), inside its 30 minute deadline.
    let c2 = c.clone();
    let head = tokio::spawn(async move {
        c2.acquire(&priced(1_000, 1_000, mini()), within(secs(1_800)))
            .await
            .map(drop)
    });
    settle().await;
    assert_eq!(c.snapshot().scopes[0].queued, 1);
    // A reload leaves one request an hour: the head can go at t0 + 1 h,
    // after its deadline.
    tokio::time::sleep(secs(30)).await;
    c.reconfigure(config(1)).unwrap();
    let e = head.await.unwrap().unwrap_err();
    assert_eq!(
        e,
        AdmissionError::DeadlineExceeded {
            phase: Phase::Rate,
            retry_at: Some(t0 + hour),
        }
    );
    assert_eq!(Instant::now(), t0 + secs(30), "refused at the reload");
    drop(first);
}

// proves: BUD-4, Q-11 (a spent day budget that keeps a call past its
// deadline is a budget refusal even when a token limit only waits on a
// granted call's permit and so tells no instant of its own)
#[tokio::test(start_paused = true)]
async fn a_spent_budget_binds_beside_a_limit_waiting_on_a_pending_grant() {
    let c = AdmissionController::builder()
        .scope(
            ScopeConfig::new("team")
                .tokens(100, MINUTE)
                .cost(1_000, DAY),
        )
        .pool(tollgate::config::PoolConfig::new("p", 1))
        .build()
        .unwrap();
    let pool = c.pool_id("p").unwrap();
    let call = |tokens: u64, price: u64| {
        Call::new(ScopeId::FIRST)
            .with_pool(pool)
            .with_estimate(TokenEstimate::new(tokens, 0))
            .with_price(Price::new(price, 0))
    };
    let t0 = Instant::now();
    // A: one token priced at the whole day's budget; it holds the permit.
    let a = c
        .acquire(&call(1, 1_000_000_000), Deadline::NONE)
        .await
        .unwrap();
    assert_eq!(a.reservation().demand.cost, 1_000);
    // B: 99 free tokens, granted and waiting for the permit.
    let b = spawn_acquire(&c, call(99, 0), Deadline::NONE);
    settle().await;
    // C: the budget frees room only at t0 + 1 day, past its deadline.
    let e = c
        .acquire(&call(10, 10_000_000), within(secs(30)))
        .await
        .unwrap_err();
    assert_eq!(
        e,
        AdmissionError::BudgetExceeded {
            scope: ScopeId::FIRST,
            retry_at: Some(t0 + DAY),
        }
    );
    drop(a);
    drop(b.await.unwrap().unwrap());
    assert_idle(&c);
}

// proves: BUD-2, Q-3, Q-7 (a worst case above 2^53 µ$, more than a window
// counts exactly, is refused at once as larger than the limit, however
// large the budget; below it, each worst case is counted in full: eight
// calls of 2^52 µ$ fill a 2^55 µ$ budget, a ninth is refused)
#[tokio::test(start_paused = true)]
async fn a_budget_counts_every_worst_case_in_full() {
    for algorithm in [
        tollgate::config::Algorithm::SlidingWindow,
        tollgate::config::Algorithm::FixedWindow,
    ] {
        let c = AdmissionController::new(ControllerConfig {
            scopes: vec![
                ScopeConfig::new("team")
                    .cost(1 << 55, DAY)
                    .algorithm(algorithm),
            ],
            ..ControllerConfig::default()
        })
        .unwrap();
        // A 2^54 µ$ worst case: 2^20 tokens at 2^34 µ$ a token.
        let call = priced(1 << 20, 0, Price::new((1 << 34) * 1_000_000, 0));
        let got = c.acquire(&call, within(secs(1))).await;
        assert!(
            matches!(&got, Err(AdmissionError::EstimateExceedsLimit(e)) if e.dimension == Dimension::Cost),
            "{algorithm:?}: {got:?}"
        );
        // 2^52 µ$ each.
        let eighth = priced(1 << 20, 0, Price::new((1 << 32) * 1_000_000, 0));
        let mut held = Vec::new();
        for _ in 0..8 {
            held.push(c.acquire(&eighth, within(secs(1))).await.unwrap());
        }
        let ninth = c.acquire(&eighth, within(secs(1))).await;
        assert!(
            matches!(ninth, Err(AdmissionError::BudgetExceeded { .. })),
            "{algorithm:?}: a ninth 2^52 µ$ call admitted on a 2^55 µ$ budget: {ninth:?}"
        );
    }
}

// proves: BUD-2, BUD-3 (a rolling "1d" budget admits at most its amount in
// any 24 hours whatever the scope's algorithm: in a token bucket scope it
// is not a bucket that refills as it is spent, and in a fixed-window scope
// it is not admitted again when the scope's window turns, here a minute
// after the whole budget was spent just before it)
#[tokio::test(start_paused = true)]
async fn a_rolling_day_budget_spends_at_most_its_amount_in_any_day() {
    use tollgate::config::Algorithm;
    for algorithm in [
        Algorithm::TokenBucket { burst: None },
        Algorithm::FixedWindow,
        Algorithm::SlidingWindow,
    ] {
        let c = AdmissionController::new(ControllerConfig {
            scopes: vec![
                ScopeConfig::new("team")
                    .cost(1_000, DAY)
                    .algorithm(algorithm),
            ],
            ..ControllerConfig::default()
        })
        .unwrap();
        // 1 µ$ a token.
        let price = Price::new(1_000_000, 0);
        // The whole budget, a minute before the scope's first day ends.
        tokio::time::advance(DAY - secs(60)).await;
        let spent = Instant::now();
        drop(
            c.acquire(&priced(1_000, 0, price), Deadline::NONE)
                .await
                .unwrap(),
        );
        for later in [secs(61), secs(12 * 3_600)] {
            tokio::time::advance(spent + later - Instant::now()).await;
            let again = c.acquire(&priced(1, 0, price), within(secs(1))).await;
            assert!(
                matches!(again, Err(AdmissionError::BudgetExceeded { .. })),
                "{algorithm:?}: 1,001 µ$ admitted within {later:?} on a 1,000 µ$ per 1d \
                 budget: {again:?}"
            );
        }
        // A day after the spend it is whole again.
        tokio::time::advance(spent + DAY + secs(1) - Instant::now()).await;
        drop(
            c.acquire(&priced(1_000, 0, price), Deadline::NONE)
                .await
                .unwrap(),
        );
    }
}

/// A day budget beside request and token limits: what a top-up must not
/// touch.
fn budget_with_limits(micros: u64) -> AdmissionController {
    AdmissionController::new(ControllerConfig {
        scopes: vec![
            ScopeConfig::new("team")
                .requests(10, DAY)
                .tokens(10_000, DAY)
                .cost(micros, DAY),
        ],
        ..ControllerConfig::default()
    })
    .unwrap()
}

// proves: BUD-2, BUD-4 (a top-up takes money only, now or never: with
// room it is taken at once and nothing else is (no request unit, no
// tokens); without room it is refused at once with BudgetExceeded and the
// instant room frees, even though the scope's budget would free it later,
// and nothing is taken)
#[tokio::test(start_paused = true)]
async fn a_top_up_takes_money_now_or_never() {
    let c = budget_with_limits(2_000);
    let t0 = Instant::now();
    let call = c
        .acquire(&priced(1_000, 1_000, mini()), Deadline::NONE)
        .await
        .unwrap();
    assert_eq!(available(&c, Dimension::Cost), 1_250);
    let more = call.top_up(1_000).unwrap();
    assert_eq!(more.reservation().demand.cost, 1_000);
    assert_eq!(available(&c, Dimension::Cost), 250);
    assert_eq!(available(&c, Dimension::Requests), 9, "no request unit");
    assert_eq!(available(&c, Dimension::Tokens), 8_000, "no tokens");
    match call.top_up(251).unwrap_err() {
        AdmissionError::BudgetExceeded { scope, retry_at } => {
            assert_eq!(scope, ScopeId::FIRST);
            assert_eq!(retry_at, Some(t0 + DAY));
        }
        other => panic!("expected BudgetExceeded, got {other:?}"),
    }
    assert_eq!(Instant::now(), t0, "refused at once");
    assert_eq!(
        available(&c, Dimension::Cost),
        250,
        "a refusal takes nothing"
    );
    // What is left can still be topped up to the last micro-dollar.
    let last = call.top_up(250).unwrap();
    assert_eq!(available(&c, Dimension::Cost), 0);
    drop((call, more, last));
}

// proves: BUD-2, Q-5, Q-9 (a top-up settles like any lease of its call:
// reconciled to its share of what was billed it keeps exactly that,
// refused it gives everything back, and once every lease of the call is
// gone the controller is idle)
#[tokio::test(start_paused = true)]
async fn a_top_up_settles_to_what_it_is_charged() {
    let c = budget_with_limits(10_000);
    let mut call = c
        .acquire(&priced(1_000, 1_000, mini()), Deadline::NONE)
        .await
        .unwrap();
    let mut billed = call.top_up(750).unwrap();
    let mut unused = call.top_up(750).unwrap();
    assert_eq!(available(&c, Dimension::Cost), 10_000 - 3 * 750);
    // An earlier attempt billed 600 µ$ (no tokens on this lease: they were
    // counted on the call's own); the last one was never needed.
    billed
        .reconcile(Usage::known(0).with_cost(Some(600)))
        .unwrap();
    unused.refused(RefusalCost::Free).unwrap();
    // The answer: 1,000 input and 200 output tokens, 270 µ$.
    call.reconcile(Usage::from_io(1_000, 200).priced(&mini()))
        .unwrap();
    assert_eq!(available(&c, Dimension::Cost), 10_000 - 600 - 270);
    assert_eq!(available(&c, Dimension::Tokens), 10_000 - 1_200);
    assert_eq!(available(&c, Dimension::Requests), 9, "one request unit");
    drop((call, billed, unused));
    assert_idle(&c);
}

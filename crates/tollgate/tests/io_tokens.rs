//! Input-token and output-token limits (SPEC Q-12): each takes its own part
//! of a demand, all or none with the others, names itself when it
//! binds, and is settled from its own reported figure, given back by
//! a refusal and moved by a recount. All on paused time.

use std::time::Duration;

use tokio::time::Instant;
use tollgate::config::{Algorithm, MINUTE, ScopeConfig};
use tollgate::quota::{Demand, Dimension, Hold, LocalQuota, QuotaStore};
use tollgate::{
    AdmissionController, AdmissionError, Call, Deadline, LimitedBy, RefusalCost, ScopeId,
    TokenEstimate, Usage,
};

fn controller(scope: ScopeConfig) -> AdmissionController {
    AdmissionController::builder().scope(scope).build().unwrap()
}

fn call(input: u64, output: u64) -> Call {
    Call::new(ScopeId::FIRST).with_estimate(TokenEstimate::new(input, output))
}

/// Availability of every limit of the first scope, in configuration order.
fn availability(c: &AdmissionController) -> Vec<(Dimension, i64)> {
    c.snapshot().scopes[0]
        .limits
        .iter()
        .map(|l| (l.dimension, l.available))
        .collect()
}

fn io_scope() -> ScopeConfig {
    ScopeConfig::new("io")
        .requests(100, MINUTE)
        .tokens(1_000, MINUTE)
        .input_tokens(500, MINUTE)
        .output_tokens(200, MINUTE)
}

// proves: Q-12, Q-1 (each limit takes its own dimension's amount: the
// request unit, input plus output, the input estimate, the output
// allowance; snapshots name the dimension)
#[tokio::test(start_paused = true)]
async fn each_limit_takes_its_own_amount() {
    let c = controller(io_scope());
    let _lease = c.acquire(&call(120, 30), Deadline::NONE).await.unwrap();
    assert_eq!(
        availability(&c),
        [
            (Dimension::Requests, 99),
            (Dimension::Tokens, 850),
            (Dimension::InputTokens, 380),
            (Dimension::OutputTokens, 170),
        ]
    );
    let names: Vec<_> = c.snapshot().scopes[0]
        .limits
        .iter()
        .map(|l| l.dimension.as_str())
        .collect();
    assert_eq!(
        names,
        ["requests", "tokens", "input_tokens", "output_tokens"]
    );
}

// proves: Q-1, Q-12 (a demand that does not fit its output limit takes
// nothing from any limit, input included)
#[test]
fn a_demand_is_all_or_none_across_input_and_output() {
    let t0 = Instant::now();
    let scope = ScopeConfig::new("io")
        .input_tokens(100, MINUTE)
        .output_tokens(50, MINUTE);
    let mut store = LocalQuota::new(&scope, t0);
    assert!(
        store
            .try_reserve(&Demand::new(90, 10), t0, Hold::Leased)
            .is_some()
    );
    let before = {
        let mut v = Vec::new();
        store.snapshot(t0, &mut v);
        v
    };
    assert!(
        store
            .try_reserve(&Demand::new(5, 45), t0, Hold::Leased)
            .is_none()
    );
    let after = {
        let mut v = Vec::new();
        store.snapshot(t0, &mut v);
        v
    };
    assert_eq!(before, after);
    assert_eq!(after[0].available, 10);
    assert_eq!(after[1].available, 40);
}

// proves: Q-12, OBS-4 (the refusal names the short dimension: output only,
// input only, or both)
#[test]
fn not_until_names_input_and_output_tokens() {
    let t0 = Instant::now();
    let scope = ScopeConfig::new("io")
        .requests(10, MINUTE)
        .input_tokens(100, MINUTE)
        .output_tokens(50, MINUTE);
    let mut store = LocalQuota::new(&scope, t0);
    store
        .reserve(&Demand::new(80, 40), t0, Hold::Leased)
        .unwrap();
    let output = store
        .reserve(&Demand::new(10, 20), t0, Hold::Leased)
        .unwrap_err();
    assert_eq!(output.limited_by, LimitedBy::only(Dimension::OutputTokens));
    assert_eq!(output.at, Some(t0 + MINUTE));
    let input = store
        .reserve(&Demand::new(30, 0), t0, Hold::Leased)
        .unwrap_err();
    assert_eq!(input.limited_by.as_str(), "input_tokens");
    let both = store
        .reserve(&Demand::new(30, 20), t0, Hold::Leased)
        .unwrap_err();
    assert_eq!(both.limited_by.as_str(), "input_tokens+output_tokens");
}

// proves: Q-12, OBS-4 (an admission that waited for an output limit says
// so in `limited_by`)
#[tokio::test(start_paused = true)]
async fn admission_waiting_for_output_tokens_is_limited_by_them() {
    let c = controller(
        ScopeConfig::new("io")
            .requests(100, MINUTE)
            .tokens(10_000, MINUTE)
            .output_tokens(100, MINUTE),
    );
    let first = c.acquire(&call(10, 80), Deadline::NONE).await.unwrap();
    assert!(first.admission().limited_by.is_none());
    let t0 = Instant::now();
    let second = c
        .acquire(&call(10, 80), Deadline::after(2 * MINUTE))
        .await
        .unwrap();
    assert_eq!(
        second.admission().limited_by,
        LimitedBy::only(Dimension::OutputTokens)
    );
    assert_eq!(Instant::now() - t0, MINUTE);
}

// proves: Q-3, Q-12 (an input estimate larger than the whole input limit
// fails at once, and the error names the input dimension)
#[tokio::test(start_paused = true)]
async fn an_estimate_over_the_whole_input_limit_names_it() {
    let c = controller(io_scope());
    let e = c.acquire(&call(600, 10), Deadline::NONE).await.unwrap_err();
    let AdmissionError::EstimateExceedsLimit(exceeds) = &e else {
        panic!("expected EstimateExceedsLimit, got {e:?}");
    };
    assert_eq!(exceeds.dimension, Dimension::InputTokens);
    assert_eq!((exceeds.demand, exceeds.limit), (600, 500));
    assert!(e.to_string().contains("600 input_tokens"), "{e}");
    let e = c.acquire(&call(10, 201), Deadline::NONE).await.unwrap_err();
    assert!(e.to_string().contains("201 output_tokens"), "{e}");
}

// proves: Q-12 (a scope with only an input or output token limit needs an
// estimate, like one with a token limit: Q-3)
#[tokio::test(start_paused = true)]
async fn input_or_output_limits_need_an_estimate() {
    let c = controller(ScopeConfig::new("io").output_tokens(100, MINUTE));
    let e = c
        .acquire(&Call::new(ScopeId::FIRST), Deadline::NONE)
        .await
        .unwrap_err();
    assert!(
        matches!(e, AdmissionError::TokenEstimateRequired { .. }),
        "{e:?}"
    );
}

// proves: Q-5, Q-12 (settlement reconciles each token limit from its own
// reported figure: tokens from the total, input from the input, output
// from the output; refunds and debt per dimension)
#[tokio::test(start_paused = true)]
async fn settlement_reconciles_each_dimension() {
    let c = controller(io_scope());
    let mut lease = c.acquire(&call(100, 100), Deadline::NONE).await.unwrap();
    let settled = lease.reconcile(Usage::from_io(60, 30)).unwrap();
    assert_eq!((settled.estimate, settled.reported), (200, Some(90)));
    assert_eq!(
        availability(&c),
        [
            (Dimension::Requests, 99),
            (Dimension::Tokens, 910),
            (Dimension::InputTokens, 440),
            (Dimension::OutputTokens, 170),
        ]
    );
    // More input than estimated is debt on the input limit, while less
    // output is refunded on the output limit.
    let mut lease = c.acquire(&call(100, 100), Deadline::NONE).await.unwrap();
    lease.reconcile(Usage::from_io(150, 10)).unwrap();
    assert_eq!(
        availability(&c),
        [
            (Dimension::Requests, 98),
            (Dimension::Tokens, 750),
            (Dimension::InputTokens, 290),
            (Dimension::OutputTokens, 160),
        ]
    );
}

// proves: Q-5, Q-12 (a total-only report reconciles the token limit and
// keeps the input and output estimates, capped at the total; unknown usage
// keeps every estimate; a known zero gives every token dimension back)
#[tokio::test(start_paused = true)]
async fn a_total_only_report_keeps_the_split_estimates() {
    let c = controller(io_scope());
    let mut lease = c.acquire(&call(100, 50), Deadline::NONE).await.unwrap();
    lease.reconcile(Usage::known(120)).unwrap();
    assert_eq!(
        availability(&c)[1..],
        [
            (Dimension::Tokens, 880),
            (Dimension::InputTokens, 400),
            (Dimension::OutputTokens, 150),
        ]
    );
    let mut lease = c.acquire(&call(100, 50), Deadline::NONE).await.unwrap();
    lease.reconcile(Usage::UNKNOWN).unwrap();
    assert_eq!(
        availability(&c)[1..],
        [
            (Dimension::Tokens, 730),
            (Dimension::InputTokens, 300),
            (Dimension::OutputTokens, 100),
        ]
    );
    let mut lease = c.acquire(&call(100, 50), Deadline::NONE).await.unwrap();
    lease.reconcile(Usage::known(0)).unwrap();
    assert_eq!(
        availability(&c),
        [
            (Dimension::Requests, 97),
            (Dimension::Tokens, 730),
            (Dimension::InputTokens, 300),
            (Dimension::OutputTokens, 100),
        ]
    );
}

// proves: Q-16, Q-12 (a refusal that costs the request unit only gives
// back every token dimension: tokens, input and output)
#[tokio::test(start_paused = true)]
async fn a_refusal_gives_back_every_token_dimension() {
    let c = controller(io_scope());
    let mut lease = c.acquire(&call(100, 50), Deadline::NONE).await.unwrap();
    lease.refused(RefusalCost::Request).unwrap();
    assert_eq!(
        availability(&c),
        [
            (Dimension::Requests, 99),
            (Dimension::Tokens, 1_000),
            (Dimension::InputTokens, 500),
            (Dimension::OutputTokens, 200),
        ]
    );
}

// proves: Q-15, Q-12 (a recount keeps the input and output amounts counted
// until one window after the instant the provider counted them)
#[test]
fn a_recount_moves_input_and_output_limits() {
    let t0 = Instant::now();
    let scope = ScopeConfig::new("io")
        .input_tokens(10, MINUTE)
        .output_tokens(5, MINUTE)
        .algorithm(Algorithm::SlidingWindow);
    let mut store = LocalQuota::new(&scope, t0);
    let mut r = store
        .reserve(&Demand::new(10, 5), t0, Hold::Leased)
        .unwrap();
    let later = t0 + Duration::from_secs(30);
    store.recount(&mut r, later, later);
    let available = |store: &mut LocalQuota, at: Instant| {
        let mut v = Vec::new();
        store.snapshot(at, &mut v);
        v.iter().map(|l| l.available).collect::<Vec<_>>()
    };
    assert_eq!(
        available(&mut store, t0 + MINUTE + Duration::from_secs(1)),
        [0, 0]
    );
    assert_eq!(
        available(&mut store, later + MINUTE + Duration::from_secs(1)),
        [10, 5]
    );
}

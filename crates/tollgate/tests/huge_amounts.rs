//! Absurd amounts (a provider reporting `u64::MAX` tokens) neither panic
//! the sliding window nor let it admit past its limit (SPEC Q-7): every
//! entry is clamped to 2⁵³ before it is counted.

mod common;

use common::*;
use tokio::time::Instant;
use tollgate::config::ScopeConfig;
use tollgate::{AdmissionController, Call, Deadline, ScopeId, TokenEstimate, Usage};

fn tokens(limit: u64) -> AdmissionController {
    AdmissionController::builder()
        .scope(ScopeConfig::new("t").tokens(limit, secs(60)))
        .build()
        .unwrap()
}

fn call(tokens: u64) -> Call {
    Call::new(ScopeId::FIRST).with_estimate(TokenEstimate::new(tokens, 0))
}

// proves: Q-7 (a reported usage of u64::MAX on a zero estimate is
// counted without overflow (clamped to 2⁵³), and the window is usable
// again once it has passed)
#[tokio::test(start_paused = true)]
async fn a_huge_report_is_counted_then_ages_out() {
    let c = tokens(100);
    let held = c.acquire(&call(10), Deadline::NONE).await.unwrap();
    let mut huge = c.acquire(&call(0), Deadline::NONE).await.unwrap();
    let _ = huge.reconcile(Usage::known(u64::MAX));
    drop(huge);
    drop(held);
    // Within the window the report blocks the scope...
    let early = c.acquire(&call(10), within(secs(1))).await;
    assert!(
        early.is_err(),
        "admitted under a report of u64::MAX tokens: {early:?}"
    );
    // ...and once the window has passed it is usable again.
    tokio::time::advance(secs(61)).await;
    let later = c.acquire(&call(10), within(secs(1))).await;
    assert!(later.is_ok(), "scope stuck after a huge report: {later:?}");
}

// proves: Q-7 (after a huge debt ages out, a younger lease still counts:
// no second lease of the window's limit while 50 tokens of it are held)
#[tokio::test(start_paused = true)]
async fn a_huge_debt_ageing_out_keeps_younger_amounts() {
    let c = tokens(100);
    let t0 = Instant::now();
    let mut first = c.acquire(&call(10), Deadline::NONE).await.unwrap();
    tokio::time::advance(secs(1)).await;
    let second = c.acquire(&call(50), Deadline::NONE).await.unwrap();
    let _ = first.reconcile(Usage::known(u64::MAX));
    drop(first);
    drop(second);
    // t0 + 60 s: the huge slot leaves, the 50 tokens of t0 + 1 s stay
    // until t0 + 61 s.
    tokio::time::advance(secs(59)).await;
    let got = c
        .acquire(&call(100), Deadline::at(t0 + secs(60) + ms(500)))
        .await;
    assert!(
        got.is_err(),
        "100 tokens admitted while 50 of the same window are still counted (limit 100): {got:?}"
    );
    // Once those have aged out too, the whole limit is free.
    tokio::time::advance(secs(2)).await;
    assert!(c.acquire(&call(100), within(secs(1))).await.is_ok());
}

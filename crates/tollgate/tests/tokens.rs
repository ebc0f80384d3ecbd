//! Token-aware admission: estimates, reconciliation, shared scopes
//! (SPEC ). All on paused time.

mod common;

use std::sync::Arc;

use common::*;
use parking_lot::Mutex;
use tokio::time::Instant;
use tollgate::config::{Algorithm, MINUTE, ScopeConfig};
use tollgate::estimate::{AsyncTokenEstimator, EstimateError};
use tollgate::quota::Dimension;
use tollgate::{
    AdmissionController, AdmissionError, AlreadySettled, Call, CharRatioEstimator, Deadline,
    ScopeId, TokenEstimate, Usage,
};

fn tpm(n: u64, algorithm: Algorithm) -> AdmissionController {
    AdmissionController::builder()
        .scope(
            ScopeConfig::new("main")
                .tokens(n, MINUTE)
                .algorithm(algorithm),
        )
        .build()
        .unwrap()
}

// proves: Q-5, Q-4 (a refund admits the waiting head at that very instant)
#[tokio::test(start_paused = true)]
async fn refund_admits_the_head_at_once() {
    let c = tpm(100, Algorithm::SlidingWindow);
    let t0 = Instant::now();
    let mut a = c.acquire(&tokens(80), Deadline::NONE).await.unwrap();
    let c2 = c.clone();
    let b = tokio::spawn(async move {
        c2.acquire(&tokens(50), Deadline::NONE)
            .await
            .map(|_| Instant::now())
    });
    settle().await;
    tokio::time::advance(secs(10)).await;
    let s = a.reconcile(Usage::known(30)).unwrap();
    assert_eq!((s.refunded, s.debt, s.reported), (50, 0, Some(30)));
    assert_eq!(b.await.unwrap().unwrap() - t0, secs(10));
}

// proves: Q-5, Q-4 (debt pushes the head's start to the exact refill instant)
#[tokio::test(start_paused = true)]
async fn debt_delays_the_head_exactly() {
    let c = tpm(100, Algorithm::TokenBucket { burst: None });
    let t0 = Instant::now();
    let mut a = c.acquire(&tokens(80), Deadline::NONE).await.unwrap();
    let c2 = c.clone();
    let b = tokio::spawn(async move {
        c2.acquire(&tokens(50), Deadline::NONE)
            .await
            .map(|_| Instant::now())
    });
    settle().await;
    tokio::time::advance(secs(5)).await;
    // Without the debt B would start at 18 s (30 tokens at 100/min); with
    // 20 tokens of debt at 5 s it needs 41.67 more: 25 s later.
    let s = a.reconcile(Usage::known(100)).unwrap();
    assert_eq!((s.refunded, s.debt), (0, 20));
    assert_eq!(b.await.unwrap().unwrap() - t0, secs(30));
}

// proves: Q-5 (unknown keeps the estimate, known zero refunds all tokens but
// not the request unit; each attempt settles once)
#[tokio::test(start_paused = true)]
async fn unknown_zero_and_settle_once() {
    let c = AdmissionController::builder()
        .scope(
            ScopeConfig::new("main")
                .requests(10, MINUTE)
                .tokens(100, MINUTE),
        )
        .build()
        .unwrap();
    let mut a = c.acquire(&tokens(40), Deadline::NONE).await.unwrap();
    let mut b = c.acquire(&tokens(30), Deadline::NONE).await.unwrap();
    a.reconcile(Usage::UNKNOWN).unwrap();
    b.reconcile(Usage::known(0)).unwrap();
    assert_eq!(a.reconcile(Usage::known(0)), Err(AlreadySettled));
    assert_eq!(available(&c, Dimension::Tokens), 60);
    assert_eq!(available(&c, Dimension::Requests), 8);
    let k = c.snapshot().scopes[0].counters;
    assert_eq!(
        (
            k.unknown_usage,
            k.known_zero,
            k.tokens_reserved,
            k.tokens_refunded
        ),
        (1, 1, 70, 30)
    );
}

// proves: Q-10 (two models on one scope share its budget; another scope is
// independent)
#[tokio::test(start_paused = true)]
async fn shared_scope_contends_other_scope_does_not() {
    let c = AdmissionController::builder()
        .scope(ScopeConfig::new("account-1").tokens(100, MINUTE))
        .scope(ScopeConfig::new("account-2").tokens(100, MINUTE))
        .build()
        .unwrap();
    let (shared, other) = (
        c.scope_id("account-1").unwrap(),
        c.scope_id("account-2").unwrap(),
    );
    let model_a = Call::new(shared).with_estimate(TokenEstimate::new(60, 20));
    let model_b = Call::new(shared).with_estimate(TokenEstimate::new(30, 20));
    let model_c = Call::new(other).with_estimate(TokenEstimate::new(60, 20));
    let t0 = Instant::now();
    let _a = c.acquire(&model_a, Deadline::NONE).await.unwrap();
    let _c = c.acquire(&model_c, Deadline::NONE).await.unwrap();
    assert_eq!(Instant::now(), t0, "the other scope is independent");
    let _b = c.acquire(&model_b, Deadline::NONE).await.unwrap();
    assert_eq!(
        Instant::now() - t0,
        MINUTE,
        "model B waited for model A's tokens"
    );
}

struct Failing;

impl AsyncTokenEstimator<str> for Failing {
    async fn estimate(&self, _: &str) -> Result<TokenEstimate, EstimateError> {
        Err(EstimateError::new("tokenizer unavailable"))
    }
}

// proves: Q-3 (estimator failure and an oversized estimate are typed,
// non-retryable errors raised before any wait)
#[tokio::test(start_paused = true)]
async fn estimation_errors_are_configuration_errors() {
    let c = tpm(1_000, Algorithm::SlidingWindow);
    let err = Call::new(ScopeId::FIRST)
        .estimated_async(&Failing, "hello")
        .await
        .unwrap_err();
    assert!(
        matches!(&err, AdmissionError::TokenEstimationFailed { reason } if reason == "tokenizer unavailable")
    );
    assert!(err.is_configuration());
    let overflow = |_: &str| Ok(TokenEstimate::new(u64::MAX, 1));
    assert!(
        Call::new(ScopeId::FIRST)
            .estimated(&overflow, "x")
            .unwrap_err()
            .is_configuration()
    );
    let estimator = CharRatioEstimator::new(4.0, 900).unwrap();
    let call = Call::new(ScopeId::FIRST)
        .estimated(&estimator, "a short prompt")
        .unwrap();
    assert_eq!(call.estimate, Some(TokenEstimate::new(4, 900)));
    let big = Call::new(ScopeId::FIRST)
        .estimated(&estimator, &"x".repeat(800))
        .unwrap();
    let t = Instant::now();
    let err = c.acquire(&big, Deadline::NONE).await.unwrap_err();
    assert!(matches!(err, AdmissionError::EstimateExceedsLimit(_)));
    assert_eq!(Instant::now(), t);
}

// proves: Q-5, OBS-1 (per-scope token accounting in the snapshot)
#[tokio::test(start_paused = true)]
async fn snapshot_counts_tokens() {
    let c = tpm(1_000, Algorithm::SlidingWindow);
    let order = Arc::new(Mutex::new(Vec::new()));
    for (est, used) in [
        (100, Usage::known(60)),
        (100, Usage::known(130)),
        (50, Usage::UNKNOWN),
    ] {
        let mut lease = c.acquire(&tokens(est), Deadline::NONE).await.unwrap();
        order.lock().push(lease.reconcile(used).unwrap());
    }
    let k = c.snapshot().scopes[0].counters;
    assert_eq!(k.tokens_reserved, 250);
    assert_eq!(k.tokens_reported, 190);
    assert_eq!(k.tokens_refunded, 40);
    assert_eq!(k.tokens_debt, 30);
    assert_eq!(k.unknown_usage, 1);
    // reserved - refunded + debt = reported + retained estimates
    assert_eq!(250 - 40 + 30, 190 + 50);
}

//! A Redis that restarts empty starts a new epoch for every scope: a
//! reservation granted before it is part of no count kept after it, so
//! settling it (reconcile, refund, release) must change nothing, or it
//! would give back what was admitted since (SPEC Q-7, DQ-2). Found in
//! review, where the first version subtracted such settlements from the
//! new epoch's window (160 tokens admitted into a 100-token minute).

mod common;

use std::time::Duration;

use tollgate::config::{Algorithm, ScopeConfig};
use tollgate::quota::{Actual, Demand, OpId, RemoteHold, RemoteQuota, Reservation};
use tollgate_redis::RedisQuota;

use common::BUDGET;

const MINUTE: Duration = Duration::from_secs(60);

async fn until_up(store: &RedisQuota) {
    for _ in 0..200 {
        if store.snapshot(Duration::from_millis(200)).await.is_ok() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("redis did not come back");
}

async fn granted(store: &RedisQuota, d: Demand) -> Option<Reservation> {
    store
        .reserve(d, RemoteHold::Leased, BUDGET)
        .await
        .expect("store answers")
        .ok()
}

#[derive(Clone, Copy, Debug)]
enum Settle {
    Reconcile,
    Refund,
    Release,
}

/// One in-flight reservation from before the restart is settled after it;
/// then the post-restart window alone (100 tokens) must still hold.
async fn stale_settlement(algorithm: Algorithm, how: Settle, name: &str) {
    let Some(mut server) = common::server(name) else {
        return;
    };
    let config = ScopeConfig::new(common::unique(name))
        .algorithm(algorithm)
        .tokens(100, MINUTE);
    let store = common::backend(&server, "restart").open_scope(&config);
    // The old epoch lives a while, so its ticks are ahead of the new one's.
    store.snapshot(BUDGET).await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let old = granted(&store, Demand::new(60, 0)).await.expect("fits");

    server.restart().expect("restart");
    until_up(&store).await;

    // After the restart: the limit's whole budget is admitted...
    let fresh = granted(&store, Demand::new(100, 0)).await.expect("fits");
    assert!(
        fresh.tick < old.tick,
        "new epoch: {} vs {}",
        fresh.tick,
        old.tick
    );
    assert_ne!(fresh.seq, old.seq, "a new epoch has a tag of its own");
    assert!(granted(&store, Demand::new(60, 0)).await.is_none(), "full");
    // ...then the pre-restart call settles (its usage below the estimate,
    // never started, or refused by the provider).
    match how {
        Settle::Reconcile => store
            .reconcile(old, Actual::total(0), OpId::new(), BUDGET)
            .await
            .unwrap(),
        Settle::Refund => store.refund(old, OpId::new(), BUDGET).await.unwrap(),
        Settle::Release => store
            .release(old, false, true, OpId::new(), BUDGET)
            .await
            .unwrap(),
    }
    // Nothing admitted after the restart was given back: still full.
    let extra = granted(&store, Demand::new(60, 0)).await;
    let snap = store.snapshot(BUDGET).await.unwrap();
    assert!(
        extra.is_none(),
        "{how:?} of a pre-restart reservation (tick {}) let 160 tokens into a 100-token window \
         opened after the restart (new tick {}); snapshot {:?}",
        old.tick,
        fresh.tick,
        snap.iter().map(|l| l.available).collect::<Vec<_>>()
    );
}

// proves: Q-7, DQ-2
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_reconcile_gives_nothing_back_sliding() {
    stale_settlement(Algorithm::SlidingWindow, Settle::Reconcile, "rv_rec_s").await;
}

// proves: Q-7, DQ-2
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_refund_gives_nothing_back_sliding() {
    stale_settlement(Algorithm::SlidingWindow, Settle::Refund, "rv_ref_s").await;
}

// proves: Q-7, DQ-2
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_release_gives_nothing_back_sliding() {
    stale_settlement(Algorithm::SlidingWindow, Settle::Release, "rv_rel_s").await;
}

// proves: Q-7, DQ-2
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_reconcile_gives_nothing_back_fixed() {
    stale_settlement(Algorithm::FixedWindow, Settle::Reconcile, "rv_rec_f").await;
}

// proves: Q-7, DQ-2
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_refund_gives_nothing_back_bucket() {
    stale_settlement(
        Algorithm::TokenBucket { burst: None },
        Settle::Refund,
        "rv_ref_b",
    )
    .await;
}

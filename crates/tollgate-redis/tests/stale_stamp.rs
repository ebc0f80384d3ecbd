//! A settlement that names its reservation by a stamp that no longer
//! locates it: the engine keeps the lease instant when every attempt of a
//! recount lost its answer (the recount may have landed and moved the
//! amount), so the release, refund or reconcile that follows arrives with
//! the old stamp (SPEC DQ-6, Q-9). What it takes must come only from what
//! that slot holds leased: never from the pending holds of other calls in
//! the same slot, or their leases take less than they hold, a slot ends
//! up holding more pending than its amount, and the difference stays
//! counted for ever. The scripts run at explicit store times: every
//! instant is exact.

mod common;

use std::time::Duration;

use tollgate::config::ScopeConfig;
use tollgate::quota::{Actual, Demand, HoldId, OpId, RemoteHold, RemoteQuota, Reservation};
use tollgate_redis::RedisQuota;

use common::BUDGET;

const WINDOW: Duration = Duration::from_secs(1);
const BASE: u64 = 5_000_000;

async fn available(store: &RedisQuota) -> Vec<i64> {
    let snapshot = store.snapshot(BUDGET).await.expect("snapshot");
    snapshot.iter().map(|s| s.available).collect()
}

async fn reserve(store: &RedisQuota, demand: Demand, hold: RemoteHold) -> Reservation {
    store
        .reserve(demand, hold, BUDGET)
        .await
        .expect("answered")
        .expect("granted")
}

#[derive(Debug, Clone, Copy)]
enum Stale {
    Release,
    Refund,
    Reconcile,
}

// proves: Q-9, DQ-6, Q-7 (two pending holds and a leased call share a
// slot; the leased call's recount moves it and its answer is lost, so its
// settlement (release, refund or a reconcile below the estimate) names
// the old stamp: it takes nothing that the slot holds pending, both holds
// are leased in full, and once every window has passed the whole limit is
// available again: nothing counted for ever)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_settlement_with_a_stale_stamp_leaves_pending_holds_alone() {
    let Some(server) = common::server("stale_stamp") else {
        return;
    };
    for how in [Stale::Release, Stale::Refund, Stale::Reconcile] {
        let config = ScopeConfig::new(common::unique("stale"))
            .requests(10, WINDOW)
            .tokens(100, WINDOW);
        let store = common::backend(&server, "stale").open_scope(&config);
        store.set_store_time(Some(BASE));
        let ttl = Duration::from_secs(30);
        let one = Demand::new(5, 0);
        let (h1, h2) = (HoldId::new(), HoldId::new());
        let first = reserve(&store, one, RemoteHold::Pending { id: h1, ttl }).await;
        let second = reserve(&store, one, RemoteHold::Pending { id: h2, ttl }).await;
        let leased = reserve(&store, one, RemoteHold::Leased).await;
        assert_eq!(available(&store).await, vec![7, 85], "{how:?}");
        // The provider counted the leased call 100 ms later: the recount
        // moves it there, and its answer is lost (the engine keeps the
        // lease instant).
        store.set_store_time(Some(BASE + 100_000));
        let _lost = store
            .recount(leased, Duration::ZERO, OpId::new(), BUDGET)
            .await
            .expect("recount");
        match how {
            Stale::Release => store
                .release(leased, true, true, OpId::new(), BUDGET)
                .await
                .expect("release"),
            Stale::Refund => store
                .refund(leased, OpId::new(), BUDGET)
                .await
                .expect("refund"),
            Stale::Reconcile => store
                .reconcile(leased, Actual::total(0), OpId::new(), BUDGET)
                .await
                .expect("reconcile"),
        }
        store.set_store_time(Some(BASE + 200_000));
        for (r, id) in [(first, h1), (second, h2)] {
            store
                .lease(r, id, BUDGET)
                .await
                .expect("lease")
                .expect("the hold is there");
        }
        // Every amount has aged out two windows later.
        store.set_store_time(Some(BASE + 3_000_000));
        assert_eq!(
            available(&store).await,
            vec![10, 100],
            "{how:?}: nothing stays counted"
        );
    }
}

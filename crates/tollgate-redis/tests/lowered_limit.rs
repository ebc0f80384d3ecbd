//! A reload that lowers a shared scope's limit (SPEC GW-15, DQ-1, Q-7): the
//! engine opens a new handle for the new limits on the same keys while the
//! reservations taken before settle through the old one. The scripts run
//! at explicit store times, so every instant is exact.

mod common;

use std::time::Duration;

use tollgate::config::ScopeConfig;
use tollgate::quota::{
    Actual, BudgetReport, Demand, Dimension, OpId, RemoteHold, RemoteQuota, Reservation,
};
use tollgate_redis::{RawReserve, RedisQuota};

use common::BUDGET;

const MS: u64 = 1_000;
const WINDOW: u64 = 8_000 * MS;

fn at(stores: &[&RedisQuota], micros: u64) {
    for s in stores {
        s.set_store_time(Some(micros));
    }
}

async fn available(store: &RedisQuota) -> i64 {
    store.snapshot(BUDGET).await.unwrap()[0].available
}

async fn reserve(store: &RedisQuota) -> RawReserve {
    store
        .reserve_raw(Demand::new(10, 0), RemoteHold::Leased, BUDGET)
        .await
        .unwrap()
}

/// The wait of a refused reservation (µs), or `None` when it was granted.
async fn refused_for(store: &RedisQuota) -> Option<u64> {
    match reserve(store).await {
        RawReserve::Refused { wait, .. } => Some(wait.expect("a known instant")),
        RawReserve::Granted { .. } => None,
    }
}

// proves: GW-15, DQ-1, Q-7 (five calls admitted under `requests = 5`, then
// the limit lowered to 4 on the same keys: the new handle counts the five
// (-1 available) and admits nothing until two of them have left the
// window, one more when the third has; the old reservations' settlements
// through the old handle (each recount to the provider's instant, the
// provider's remaining budget of 0 after the fifth, a reconcile of their
// tokens) give nothing back under the new limit)
#[tokio::test]
async fn a_lowered_limit_counts_what_the_old_one_admitted() {
    let Some(server) = common::server("a_lowered_limit_counts_what_the_old_one_admitted") else {
        return;
    };
    let name = common::unique("lowered");
    let per = Duration::from_micros(WINDOW);
    let five = ScopeConfig::new(name.clone()).requests(5, per);
    let four = ScopeConfig::new(name).requests(4, per);
    let old = common::backend(&server, "lowered").open_scope(&five);
    // Opened before the calls, as a replica already running the new
    // configuration would be.
    let new = common::backend(&server, "lowered").open_scope(&four);
    let start = 1_000 * MS;
    let mut leased: Vec<Reservation> = Vec::new();
    for i in 0..5 {
        // 100 ms apart.
        at(&[&old, &new], start + i * 100 * MS);
        let r = old
            .reserve(Demand::new(10, 0), RemoteHold::Leased, BUDGET)
            .await
            .unwrap()
            .expect("room under the old limit");
        leased.push(r);
    }
    at(&[&old, &new], start + 450 * MS);
    assert_eq!(available(&old).await, 0);
    assert_eq!(
        available(&new).await,
        -1,
        "the five counted under the new limit"
    );
    // Room for one once two of the five have left: the second leaves one
    // window after its lease.
    assert_eq!(refused_for(&new).await, Some(100 * MS + WINDOW - 450 * MS));
    // Late settlements of the old reservations, through the old handle:
    // each recounted 20 ms after its lease (its response began then), the
    // provider reporting what it had left, its tokens reconciled lower.
    let counted = |i: u64| start + i * 100 * MS + 20 * MS;
    for (i, r) in (0..).zip(&leased) {
        let now = start + 500 * MS + i * MS;
        at(&[&old, &new], now);
        let ago = Duration::from_micros(now - counted(i));
        let moved = old.recount(*r, ago, OpId::new(), BUDGET).await.unwrap();
        let report = BudgetReport {
            dimension: Dimension::Requests,
            limit: None,
            remaining: Some(4 - i),
            reset: Some(per),
        };
        let observed = old
            .observe(
                vec![report],
                (*r, moved),
                Duration::ZERO,
                OpId::new(),
                BUDGET,
            )
            .await
            .unwrap();
        assert_eq!(observed[0].freed, 0, "{observed:?}");
        old.reconcile(moved, Actual::total(3), OpId::new(), BUDGET)
            .await
            .unwrap();
    }
    at(&[&old, &new], start + 600 * MS);
    assert!(available(&new).await <= -1, "nothing given back");
    assert!(refused_for(&new).await.is_some());
    // Each is counted until one window after the provider counted it.
    let second_leaves = counted(1) + WINDOW;
    at(&[&old, &new], second_leaves - 1);
    assert_eq!(refused_for(&new).await, Some(1), "the second still counts");
    at(&[&old, &new], second_leaves);
    assert!(refused_for(&new).await.is_none(), "two have left: one fits");
    assert_eq!(
        refused_for(&new).await,
        Some(counted(2) + WINDOW - second_leaves),
        "four in the window until the third leaves"
    );
}

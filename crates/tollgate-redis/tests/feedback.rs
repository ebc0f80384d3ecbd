//! Provider feedback and cooldowns kept in Redis (SPEC DQ-9): what one
//! replica learns from a provider's answer, and the cooldown after a
//! provider 429, hold for every replica of the scope, at the store's
//! instants. Two backends (two connections) stand for two replicas; the
//! scripts run at explicit store times.

mod common;

use std::time::Duration;

use tollgate::config::ScopeConfig;
use tollgate::quota::{
    BudgetReport, Demand, Dimension, OpId, RemoteHold, RemoteQuota, Reservation,
};
use tollgate_redis::{RawReserve, RedisQuota};

use common::BUDGET;

const SECOND: u64 = 1_000_000;

fn at(stores: &[&RedisQuota], micros: u64) {
    for s in stores {
        s.set_store_time(Some(micros));
    }
}

fn requests(remaining: u64, reset: Duration) -> BudgetReport {
    BudgetReport {
        dimension: Dimension::Requests,
        limit: None,
        remaining: Some(remaining),
        reset: Some(reset),
    }
}

async fn lease_one(store: &RedisQuota) -> Reservation {
    store
        .reserve(Demand::new(0, 0), RemoteHold::Leased, BUDGET)
        .await
        .unwrap()
        .expect("room")
}

async fn available(store: &RedisQuota) -> i64 {
    store.snapshot(BUDGET).await.unwrap()[0].available
}

// proves: DQ-9, Q-14 (the provider tells replica A it has 3 of 10 left
// after counting A's attempt, while the store's log holds 2 of the
// account's sends: the other 5 are another client's, taken out of the
// shared window until the provider's reset, so replica B, which saw no
// header, admits 3 and waits for the 4th; a retry of the same report
// takes nothing more; after the reset the room is back)
#[tokio::test]
async fn a_report_to_one_replica_holds_for_every_replica() {
    let Some(server) = common::server("a_report_to_one_replica_holds_for_every_replica") else {
        return;
    };
    let config = ScopeConfig::new(common::unique("fb")).requests(10, Duration::from_secs(60));
    let a = common::backend(&server, "fb").open_scope(&config);
    let b = common::backend(&server, "fb").open_scope(&config);
    at(&[&a, &b], 10 * SECOND);
    let _earlier = lease_one(&b).await;
    at(&[&a, &b], 11 * SECOND);
    let sent = lease_one(&a).await;
    // Its response began 100 ms after it was sent: recounted there.
    at(&[&a, &b], 11 * SECOND + 100_000);
    let moved = a
        .recount(sent, Duration::ZERO, OpId::new(), BUDGET)
        .await
        .unwrap();
    let op = OpId::new();
    let reports = vec![requests(3, Duration::from_secs(20))];
    let observed = a
        .observe(reports.clone(), (sent, moved), Duration::ZERO, op, BUDGET)
        .await
        .unwrap();
    assert_eq!(observed[0].gap, 5, "{observed:?}");
    assert_eq!(available(&b).await, 3);
    // The engine's retry of the same report (its answer lost).
    let again = a
        .observe(reports, (sent, moved), Duration::ZERO, op, BUDGET)
        .await
        .unwrap();
    assert_eq!(again, observed);
    assert_eq!(available(&b).await, 3, "taken twice");
    for _ in 0..3 {
        lease_one(&b).await;
    }
    let refused = b
        .reserve_raw(Demand::new(0, 0), RemoteHold::Leased, BUDGET)
        .await
        .unwrap();
    // Until the reset, 20 s after the response began.
    assert_eq!(
        refused,
        RawReserve::Refused {
            wait: Some(20 * SECOND),
            limited_by: tollgate::LimitedBy {
                requests: true,
                ..Default::default()
            },
        }
    );
    at(&[&a, &b], 31 * SECOND + 100_000);
    assert_eq!(available(&b).await, 10 - 2 - 3);
}

// proves: DQ-9 (an estimate in force is not lowered by a report that
// measured less, and a larger one replaces it: the window counts the
// largest estimate still in force)
#[tokio::test]
async fn the_largest_estimate_in_force_counts() {
    let Some(server) = common::server("the_largest_estimate_in_force_counts") else {
        return;
    };
    let config = ScopeConfig::new(common::unique("fb")).requests(100, Duration::from_secs(60));
    let a = common::backend(&server, "fb").open_scope(&config);
    at(&[&a], SECOND);
    let first = lease_one(&a).await;
    let second = lease_one(&a).await;
    let observe = |r: Reservation, remaining, reset| {
        let a = &a;
        async move {
            a.observe(
                vec![requests(remaining, Duration::from_secs(reset))],
                (r, r),
                Duration::ZERO,
                OpId::new(),
                BUDGET,
            )
            .await
            .unwrap()[0]
        }
    };
    // Both at their lease slot (no recount): the log holds both.
    assert_eq!(observe(first, 100 - 2 - 30, 10).await.gap, 30);
    assert_eq!(available(&a).await, 100 - 2 - 30);
    assert_eq!(observe(second, 100 - 2 - 20, 30).await.gap, 0);
    assert_eq!(available(&a).await, 100 - 2 - 30);
    at(&[&a], 12 * SECOND);
    // The larger one's reset passed: the smaller, longer one counts.
    assert_eq!(available(&a).await, 100 - 2 - 20);
    // Not recounted: the response began when it was sent (11 s ago).
    let late = a
        .observe(
            vec![requests(100 - 2 - 40, Duration::from_secs(30))],
            (second, second),
            Duration::from_secs(11),
            OpId::new(),
            BUDGET,
        )
        .await
        .unwrap()[0];
    assert_eq!(late.gap, 20);
    assert_eq!(available(&a).await, 100 - 2 - 40);
}

// proves: DQ-9, CD-1, CD-2, DQ-6 (a provider 429 seen by replica A pauses
// replica B's reservations until the cooldown's end on the store's clock;
// a 429 of an attempt leased before that cooldown began (an earlier
// generation) neither starts nor extends one; the same cooldown sent
// again under its name, later, extends nothing; after the end both admit)
#[tokio::test]
async fn a_cooldown_pauses_every_replica() {
    let Some(server) = common::server("a_cooldown_pauses_every_replica") else {
        return;
    };
    let config = ScopeConfig::new(common::unique("cool")).requests(100, Duration::from_secs(60));
    let a = common::backend(&server, "cool").open_scope(&config);
    let b = common::backend(&server, "cool").open_scope(&config);
    at(&[&a, &b], SECOND);
    let older = lease_one(&b).await;
    let refused = lease_one(&a).await;
    at(&[&a, &b], 2 * SECOND);
    let op = OpId::new();
    let left = a
        .cool_down(refused, Duration::from_secs(3), op, BUDGET)
        .await
        .unwrap();
    assert_eq!(left, Some(Duration::from_secs(3)));
    let paused = b
        .reserve_raw(Demand::new(0, 0), RemoteHold::Leased, BUDGET)
        .await
        .unwrap();
    assert_eq!(
        paused,
        RawReserve::Refused {
            wait: Some(3 * SECOND),
            limited_by: tollgate::LimitedBy::default(),
        }
    );
    at(&[&a, &b], 3 * SECOND);
    // Stale: leased before the running cooldown began.
    let stale = b
        .cool_down(older, Duration::from_secs(30), OpId::new(), BUDGET)
        .await
        .unwrap();
    assert_eq!(stale, Some(Duration::from_secs(2)));
    // A retry of the first, a second later: its first answer, no change.
    let again = a
        .cool_down(refused, Duration::from_secs(3), op, BUDGET)
        .await
        .unwrap();
    assert_eq!(again, left);
    at(&[&a, &b], 5 * SECOND);
    lease_one(&a).await;
    let fresh = lease_one(&b).await;
    // A 429 of an attempt leased after it ended starts a new one.
    at(&[&a, &b], 6 * SECOND);
    let next = b
        .cool_down(fresh, Duration::from_secs(1), OpId::new(), BUDGET)
        .await
        .unwrap();
    assert_eq!(next, Some(Duration::from_secs(1)));
    assert!(
        a.reserve(Demand::new(0, 0), RemoteHold::Leased, BUDGET)
            .await
            .unwrap()
            .is_err()
    );
}

// proves: DQ-9, Q-14 (without another client nothing is taken: attempts
// one after another, each recounted when its response began, each answer
// reporting what the account's own traffic left, leave the window at the
// account's own count)
#[tokio::test]
async fn the_accounts_own_traffic_takes_nothing() {
    let Some(server) = common::server("the_accounts_own_traffic_takes_nothing") else {
        return;
    };
    let w = Duration::from_secs(2);
    let config = ScopeConfig::new(common::unique("own")).requests(5, w);
    let a = common::backend(&server, "own").open_scope(&config);
    let mut t = SECOND;
    for i in 1..=5u64 {
        at(&[&a], t);
        let sent = lease_one(&a).await;
        // The response begins 1.5 ms later.
        at(&[&a], t + 1_500);
        let moved = a
            .recount(sent, Duration::ZERO, OpId::new(), BUDGET)
            .await
            .unwrap();
        let reset = Duration::from_micros(2 * SECOND - (t - SECOND));
        let observed = a
            .observe(
                vec![requests(5 - i, reset)],
                (sent, moved),
                Duration::ZERO,
                OpId::new(),
                BUDGET,
            )
            .await
            .unwrap();
        assert_eq!(observed[0].gap, 0, "attempt {i}");
        t += 2_000;
    }
    assert_eq!(available(&a).await, 0);
}

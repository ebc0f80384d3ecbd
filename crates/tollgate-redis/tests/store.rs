//! The store's contract with Redis itself (SPEC DQ-1, DQ-4, DQ-5): keys,
//! TTLs, scripts reloaded after NOSCRIPT, notices across replicas.

mod common;

use std::time::Duration;

use tollgate::config::{Algorithm, ScopeConfig};
use tollgate::quota::{
    Actual, Demand, HoldId, OpId, RemoteHold, RemoteQuota, Reservation, StoreError,
};
use tollgate_redis::{BuildError, RedisBackend, RedisSettings};

use common::BUDGET;

/// Every algorithm a limit can count with.
const ALGORITHMS: [Algorithm; 3] = [
    Algorithm::SlidingWindow,
    Algorithm::TokenBucket { burst: None },
    Algorithm::FixedWindow,
];

/// Reserves `demand` as `hold`, which must be granted.
async fn granted(store: &impl RemoteQuota, demand: Demand, hold: RemoteHold) -> Reservation {
    let answer = store.reserve(demand, hold, BUDGET).await.expect("answered");
    answer.expect("granted")
}

/// A pending hold that lives an hour.
fn pending(id: HoldId) -> RemoteHold {
    RemoteHold::Pending {
        id,
        ttl: Duration::from_secs(3_600),
    }
}

fn config(name: &str) -> ScopeConfig {
    ScopeConfig::new(common::unique(name))
        .requests(10, Duration::from_secs(60))
        .requests(100, Duration::from_secs(3_600))
        .tokens(1_000, Duration::from_secs(60))
}

/// `SCRIPT FLUSH`: the next EVALSHA answers NOSCRIPT.
async fn flush_scripts(raw: &mut redis::aio::MultiplexedConnection) {
    let () = redis::cmd("SCRIPT")
        .arg("FLUSH")
        .query_async(raw)
        .await
        .unwrap();
}

// proves: DQ-1 (scripts are called with EVALSHA and loaded again when
// Redis answers NOSCRIPT: an operation after SCRIPT FLUSH still works)
#[tokio::test]
async fn operations_survive_a_script_flush() {
    let Some(server) = common::server("operations_survive_a_script_flush") else {
        return;
    };
    let store = common::backend(&server, "noscript").open_scope(&config("noscript"));
    let mut raw = common::raw(&server).await;
    granted(&store, Demand::new(5, 0), RemoteHold::Leased).await;
    flush_scripts(&mut raw).await;
    let id = HoldId::new();
    let r = granted(&store, Demand::new(5, 0), pending(id)).await;
    flush_scripts(&mut raw).await;
    store.lease(r, id, BUDGET).await.unwrap().unwrap();
    let snapshot = store.snapshot(BUDGET).await.unwrap();
    assert_eq!(snapshot[0].available, 8);
    assert_eq!(snapshot[2].available, 990);
}

// proves: DQ-5, DQ-6 (every key written has a TTL longer than the longest
// window, refreshed on write, the whole scope's the same, and each
// operation's marker one of a few minutes; all keys of a scope share one
// hash tag and start with the prefix)
#[tokio::test]
async fn every_key_has_a_ttl() {
    let Some(server) = common::server("every_key_has_a_ttl") else {
        return;
    };
    for algorithm in ALGORITHMS {
        let config = config("ttl").algorithm(algorithm);
        let store = common::backend(&server, "ttl").open_scope(&config);
        let id = HoldId::new();
        let r = granted(&store, Demand::new(7, 0), pending(id)).await;
        // A second hold, still pending: its keys are written too.
        granted(&store, Demand::new(1, 0), pending(HoldId::new())).await;
        let r = store.lease(r, id, BUDGET).await.unwrap().unwrap();
        store
            .reconcile(r, Actual::total(3), OpId::new(), BUDGET)
            .await
            .unwrap();
        store
            .release(r, true, false, OpId::new(), BUDGET)
            .await
            .unwrap();
        let tag = format!("{{ttl:{}}}", config.name());
        assert_eq!(
            store.keys().len(),
            13,
            "meta + state, log, holds and their expiries per limit"
        );
        let written = if algorithm == Algorithm::SlidingWindow {
            13
        } else {
            10
        };
        let mut raw = common::raw(&server).await;
        let keys: Vec<String> = redis::cmd("KEYS")
            .arg(format!("*{}*", config.name()))
            .query_async(&mut raw)
            .await
            .unwrap();
        // Reconcile, release: one marker each (a single node names no
        // reserve or lease: nothing repeats them).
        let (markers, keys): (Vec<String>, Vec<String>) =
            keys.into_iter().partition(|k| k.contains(":op:"));
        assert_eq!(keys.len(), written, "{keys:?}");
        assert_eq!(markers.len(), 2, "{markers:?}");
        for key in &markers {
            assert!(key.starts_with(&format!("{tag}:op:")), "{key}");
            let ttl: i64 = redis::cmd("PTTL")
                .arg(key)
                .query_async(&mut raw)
                .await
                .unwrap();
            assert!(ttl > 240_000 && ttl <= 300_000, "{key}: TTL {ttl} ms");
        }
        for key in &keys {
            assert!(store.keys().contains(key), "unexpected key {key}");
            assert!(key.starts_with(&tag), "{key} outside the hash tag {tag}");
            let ttl: i64 = redis::cmd("PTTL")
                .arg(key)
                .query_async(&mut raw)
                .await
                .unwrap();
            // Longest window one hour: two of it plus an hour; every key
            // of the scope expires with it, a TTL beyond the latest
            // pending hold's expiry (an hour here).
            let most = 4 * 3_600_000;
            assert!(
                ttl > 3 * 3_600_000 - 60_000 && ttl <= most,
                "{key}: TTL {ttl} ms"
            );
        }
    }
}

// proves: DQ-4 (a refund, a release or a reconciliation below the estimate
// in one replica wakes the waiters of the scope in another one)
#[tokio::test]
async fn giving_quota_back_notifies_other_replicas() {
    let Some(server) = common::server("giving_quota_back_notifies_other_replicas") else {
        return;
    };
    let config = config("notice");
    let waiter = common::backend(&server, "notice").open_scope(&config);
    let giver = common::backend(&server, "notice").open_scope(&config);
    let changes = waiter.changes().expect("redis sends notices");
    // Let the subscriber connect: a notice before then is lost (waiters
    // then wake at their computed instants).
    tokio::time::sleep(Duration::from_millis(300)).await;
    let notified = |what: &'static str| {
        let n = changes.clone();
        async move {
            tokio::time::timeout(Duration::from_secs(5), n.notified())
                .await
                .unwrap_or_else(|_| panic!("no notice after {what}"));
        }
    };
    let id = HoldId::new();
    granted(&giver, Demand::new(50, 0), pending(id)).await;
    let wait = tokio::spawn(notified("forget"));
    tokio::task::yield_now().await;
    assert!(giver.forget(id, BUDGET).await.unwrap());
    wait.await.unwrap();

    let r = granted(&giver, Demand::new(50, 0), RemoteHold::Leased).await;
    let wait = tokio::spawn(notified("refund"));
    tokio::task::yield_now().await;
    giver.refund(r, OpId::new(), BUDGET).await.unwrap();
    wait.await.unwrap();

    let r = granted(&giver, Demand::new(50, 0), RemoteHold::Leased).await;
    let wait = tokio::spawn(notified("reconcile"));
    tokio::task::yield_now().await;
    giver
        .reconcile(r, Actual::total(10), OpId::new(), BUDGET)
        .await
        .unwrap();
    wait.await.unwrap();

    let r = granted(&giver, Demand::new(50, 0), RemoteHold::Leased).await;
    let wait = tokio::spawn(notified("release"));
    tokio::task::yield_now().await;
    giver
        .release(r, true, true, OpId::new(), BUDGET)
        .await
        .unwrap();
    wait.await.unwrap();
}

// proves: Q-3 (a demand above a whole limit never fits: judged from the
// configuration, without a round trip)
#[tokio::test]
async fn check_needs_no_round_trip() {
    // No server at all: an unreachable URL.
    let backend = tollgate_redis::RedisBackend::new(tollgate_redis::RedisSettings::new(
        "redis://127.0.0.1:1",
    ))
    .unwrap();
    let store = backend.open_scope(&config("check"));
    assert!(store.check(&Demand::new(1_000, 0)).is_ok());
    let e = store.check(&Demand::new(1_001, 0)).unwrap_err();
    assert_eq!(e.limit, 1_000);
}

// proves: Q-2 (memory per limit stays bounded in Redis too: admissions
// merge into at most 512 + 1 slots per window, whatever the rate)
#[tokio::test]
async fn the_slot_log_stays_bounded() {
    let Some(server) = common::server("the_slot_log_stays_bounded") else {
        return;
    };
    let config =
        ScopeConfig::new(common::unique("bounded")).requests(1_000_000, Duration::from_millis(512));
    let store = common::backend(&server, "bounded").open_scope(&config);
    let mut raw = common::raw(&server).await;
    let log = store.keys()[2].clone();
    let mut longest = 0;
    // One admission every 300 µs of store time for three windows.
    for i in 0..5_000u64 {
        store.set_store_time(Some(1_000_000 + i * 300));
        granted(&store, Demand::new(0, 0), RemoteHold::Leased).await;
        if i % 100 == 0 {
            let len: u64 = redis::cmd("LLEN")
                .arg(&log)
                .query_async(&mut raw)
                .await
                .unwrap();
            longest = longest.max(len);
        }
    }
    assert!(longest > 400 && longest <= 513, "log held {longest} slots");
}

// proves: DQ-5 (keys of different prefixes and scopes never meet: a prefix
// with `:` (prefix `a` + scope `b:c` vs prefix `a:b` + scope `c`) or with a
// hash-tag brace is refused when the backend is built)
#[tokio::test]
async fn a_prefix_that_could_share_keys_is_refused() {
    for prefix in ["a:b", "a{b", "a}b", ""] {
        let e = RedisBackend::new(RedisSettings::new("redis://127.0.0.1:1").prefix(prefix))
            .err()
            .unwrap_or_else(|| panic!("{prefix:?} accepted"));
        assert!(matches!(e, BuildError::Prefix(_)), "{prefix:?}: {e}");
    }
    assert!(RedisBackend::new(RedisSettings::new("redis://127.0.0.1:1").prefix("prod-eu")).is_ok());
}

// proves: Q-9, DQ-5 (a pending hold that nobody leases or gives back stops
// counting at its expiry on the store's clock, to the microsecond; a lease
// after that leases nothing; a hold given back twice is given back once;
// giving back a hold whose lease landed changes nothing)
#[tokio::test]
async fn pending_holds_expire_and_are_given_back_once() {
    let Some(server) = common::server("pending_holds_expire_and_are_given_back_once") else {
        return;
    };
    for algorithm in ALGORITHMS {
        let config = ScopeConfig::new(common::unique("expiry"))
            .algorithm(algorithm)
            .requests(2, Duration::from_secs(60));
        let store = common::backend(&server, "expiry").open_scope(&config);
        const T: u64 = 5_000_000_000;
        let at = |us: u64| store.set_store_time(Some(T + us));
        let available = || async { store.snapshot(BUDGET).await.unwrap()[0].available };
        at(0);
        let (short, long) = (HoldId::new(), HoldId::new());
        let one = || Demand::new(0, 0);
        let a = granted(
            &store,
            one(),
            RemoteHold::Pending {
                id: short,
                ttl: Duration::from_secs(1),
            },
        )
        .await;
        granted(&store, one(), pending(long)).await;
        assert!(
            store
                .reserve(one(), RemoteHold::Leased, BUDGET)
                .await
                .unwrap()
                .is_err(),
            "{algorithm:?}: both holds count"
        );
        at(999_999);
        assert_eq!(available().await, 0, "{algorithm:?}: before the expiry");
        at(1_000_000);
        assert_eq!(available().await, 1, "{algorithm:?}: at the expiry");
        assert_eq!(
            store.lease(a, short, BUDGET).await.unwrap(),
            None,
            "{algorithm:?}: an expired hold is not leased"
        );
        assert_eq!(available().await, 1, "{algorithm:?}: nothing leased");
        assert!(store.forget(long, BUDGET).await.unwrap());
        assert!(
            !store.forget(long, BUDGET).await.unwrap(),
            "given back once"
        );
        assert_eq!(available().await, 2, "{algorithm:?}: both back");

        let d = HoldId::new();
        let r = granted(&store, one(), pending(d)).await;
        at(2_000_000);
        assert!(store.lease(r, d, BUDGET).await.unwrap().is_some());
        assert!(
            !store.forget(d, BUDGET).await.unwrap(),
            "{algorithm:?}: a leased hold is no longer pending"
        );
        assert_eq!(available().await, 1, "{algorithm:?}: the lease counts");
    }
}

// proves: DQ-5 (a zero budget sends nothing: the operation fails with a
// timeout at once, before a command could reach Redis and land unseen)
#[tokio::test]
async fn a_zero_budget_sends_nothing() {
    let Some(server) = common::server("a_zero_budget_sends_nothing") else {
        return;
    };
    let store = common::backend(&server, "zero").open_scope(&config("zero"));
    // Connected, scripts loaded: an operation could complete at once.
    granted(&store, Demand::new(1, 0), RemoteHold::Leased).await;
    for _ in 0..20 {
        let answer = store
            .reserve(Demand::new(1, 0), RemoteHold::Leased, Duration::ZERO)
            .await;
        assert_eq!(answer, Err(StoreError::Timeout(Duration::ZERO)));
    }
    // Let anything sent land, then count.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let snapshot = store.snapshot(BUDGET).await.unwrap();
    assert_eq!(
        snapshot[0].available, 9,
        "only the first reservation landed"
    );
}

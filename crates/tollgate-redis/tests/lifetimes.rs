//! Key lifetimes (SPEC DQ-5): no caller shortens a key's TTL, so a key
//! lives as long as the longest window any user of the scope keeps in it.

mod common;

use std::time::Duration;

use tollgate::config::{Algorithm, ScopeConfig};
use tollgate::quota::{Demand, RemoteHold, RemoteQuota};
use tollgate_redis::RedisQuota;

use common::BUDGET;

const MINUTE: Duration = Duration::from_secs(60);
const DAY: Duration = Duration::from_secs(86_400);

/// Moves every key of `keys` `by` closer to its expiry, as if that much
/// time had passed for Redis's TTLs: a key that would have expired by then
/// is deleted.
async fn age(raw: &mut redis::aio::MultiplexedConnection, keys: &[String], by: Duration) {
    let by = i64::try_from(by.as_millis()).expect("small");
    for key in keys {
        let left: i64 = redis::cmd("PTTL").arg(key).query_async(raw).await.unwrap();
        assert_ne!(left, -1, "{key} has no TTL");
        if left == -2 {
            continue;
        }
        if left <= by {
            let () = redis::cmd("DEL").arg(key).query_async(raw).await.unwrap();
        } else {
            let () = redis::cmd("PEXPIRE")
                .arg(key)
                .arg(left - by)
                .query_async(raw)
                .await
                .unwrap();
        }
    }
}

/// Each key's PTTL (-2: missing), in order: the meta key's first, so
/// that it is never read later (shorter) than a key expiring with it.
async fn ttls(raw: &mut redis::aio::MultiplexedConnection, keys: &[String]) -> Vec<i64> {
    let mut out = Vec::with_capacity(keys.len());
    for key in keys {
        out.push(redis::cmd("PTTL").arg(key).query_async(raw).await.unwrap());
    }
    out
}

/// Whether `store` grants one request at store time `at` (µs).
async fn grants(store: &RedisQuota, at: u64) -> bool {
    store.set_store_time(Some(at));
    let answer = store.reserve(Demand::new(0, 0), RemoteHold::Leased, BUDGET);
    answer.await.expect("answered").is_ok()
}

// proves: DQ-5 (a replica configured with minute limits only, interleaved
// with one that also keeps a day limit in the same scope, shortens no key:
// once the minute-only replica's TTL (2 minutes + 1 hour) has passed, the
// day window still holds what it admitted and refuses)
#[tokio::test]
async fn a_shorter_configuration_never_shortens_a_key() {
    let Some(server) = common::server("a_shorter_configuration_never_shortens_a_key") else {
        return;
    };
    let mut raw = common::raw(&server).await;
    for algorithm in [
        Algorithm::SlidingWindow,
        Algorithm::TokenBucket { burst: None },
        Algorithm::FixedWindow,
    ] {
        let name = common::unique("lifetimes");
        let minute_only = ScopeConfig::new(&name)
            .algorithm(algorithm)
            .requests(100, MINUTE);
        let with_day = minute_only.clone().requests(5, DAY);
        let backend = common::backend(&server, "lifetimes");
        let (short, long) = (
            backend.open_scope(&minute_only),
            backend.open_scope(&with_day),
        );
        const T0: u64 = 1_000_000;
        for i in 0..5 {
            assert!(grants(&long, T0 + i).await, "{algorithm:?}: day call {i}");
            assert!(
                grants(&short, T0 + i).await,
                "{algorithm:?}: minute call {i}"
            );
        }
        assert!(
            !grants(&long, T0 + 10).await,
            "{algorithm:?}: the day is spent"
        );
        // The minute-only replica writes last.
        assert!(grants(&short, T0 + 11).await);
        // Every key lives as the day needs (two days and an hour), and
        // the meta key (whose lapse starts a new epoch) outlives them all.
        let lives = ttls(&mut raw, long.keys()).await;
        let meta = lives[0];
        for (key, left) in long.keys().iter().zip(&lives) {
            if *left == -2 {
                continue;
            }
            assert!(
                *left > 48 * 3_600_000,
                "{algorithm:?}: {key} lives {left} ms"
            );
            assert!(meta >= *left, "{algorithm:?}: {key} outlives the meta key");
        }
        // Its TTL passes for Redis, and two hours for the windows.
        age(
            &mut raw,
            long.keys(),
            2 * MINUTE + Duration::from_secs(3_601),
        )
        .await;
        let later = T0 + 2 * 3_600_000_000;
        assert!(
            !grants(&long, later).await,
            "{algorithm:?}: the day limit admitted again after the minute-only TTL"
        );
        assert!(
            grants(&short, later).await,
            "{algorithm:?}: the minute is new"
        );
    }
}

// proves: DQ-5 (a token bucket whose burst is longer than two windows and
// an hour keeps its keys until it would have refilled from empty: a burst
// of three hours on 100 tokens a minute, emptied, leaves every key of the
// scope at least three hours to live, so an abandoned scope never comes
// back as a fresh, full bucket while the bucket it replaces still refills)
#[tokio::test]
async fn a_bucket_keeps_its_keys_until_it_has_refilled() {
    let Some(server) = common::server("a_bucket_keeps_its_keys_until_it_has_refilled") else {
        return;
    };
    let mut raw = common::raw(&server).await;
    let burst = Duration::from_secs(3 * 3_600);
    let config = ScopeConfig::new(common::unique("refill"))
        .algorithm(Algorithm::TokenBucket { burst: Some(burst) })
        .tokens(100, MINUTE);
    let store = common::backend(&server, "refill").open_scope(&config);
    // The store's clock held still: the bucket refills nothing meanwhile.
    store.set_store_time(Some(1_000_000));
    assert_eq!(store.snapshot(BUDGET).await.unwrap()[0].available, 18_000);
    for _ in 0..180 {
        store
            .reserve(Demand::new(100, 0), RemoteHold::Leased, BUDGET)
            .await
            .expect("answered")
            .expect("room");
    }
    assert_eq!(store.snapshot(BUDGET).await.unwrap()[0].available, 0);
    let burst_ms = i64::try_from(burst.as_millis()).expect("small");
    let mut checked = 0;
    for (key, ttl) in store.keys().iter().zip(ttls(&mut raw, store.keys()).await) {
        if ttl == -2 {
            continue;
        }
        assert!(
            ttl >= burst_ms,
            "{key} expires in {ttl} ms, before the bucket refills"
        );
        checked += 1;
    }
    assert!(checked >= 2, "the meta key and the bucket's key exist");
}

//! A reload that changes a shared scope's bucket amount or burst, or a
//! limit's window (SPEC GW-15, DQ-8, Q-7): what was admitted stays
//! counted. The reload is what the engine does: the same backend opens a
//! handle for the new limits. The scripts run at explicit store times and
//! the handles on a manual local clock, so every instant is exact.

mod common;

use std::sync::Arc;
use std::time::Duration;

use tollgate::clock::{Instant, ManualClock};
use tollgate::config::{Algorithm, ScopeConfig};
use tollgate::quota::{Demand, RemoteHold, RemoteQuota};
use tollgate_redis::{RawReserve, RedisBackend, RedisQuota, RedisServer, RedisSettings};

use common::BUDGET;

const DAY: Duration = Duration::from_secs(86_400);
const DAY_US: u64 = 86_400_000_000;
const BUCKET: Algorithm = Algorithm::TokenBucket { burst: None };

/// A backend whose handles read `clock` (when transitional limits end).
fn backend(server: &RedisServer, clock: &ManualClock) -> RedisBackend {
    RedisBackend::new(
        RedisSettings::new(server.url())
            .prefix("changed")
            .timeout(Duration::from_secs(2))
            .clock(Arc::new(clock.clone())),
    )
    .expect("backend")
}

fn at(stores: &[&RedisQuota], micros: u64) {
    for s in stores {
        s.set_store_time(Some(micros));
    }
}

async fn granted(store: &RedisQuota, tokens: u64) -> bool {
    let got = store
        .reserve_raw(Demand::new(tokens, 0), RemoteHold::Leased, BUDGET)
        .await
        .unwrap();
    matches!(got, RawReserve::Granted { .. })
}

async fn available(store: &RedisQuota) -> Vec<i64> {
    let snapshot = store.snapshot(BUDGET).await.unwrap();
    snapshot.iter().map(|s| s.available).collect()
}

// proves: GW-15, DQ-8, Q-7 (a day's bucket of 10,000 emptied, then the
// limit reloaded as 5,000 a day: the new handle reads the same count
// (its tick is another, its key the same) and, what was taken staying
// taken, admits nothing; raised to 15,000 instead, exactly the 5,000 of
// the raise is there at once)
#[tokio::test]
async fn a_reloaded_bucket_amount_keeps_the_days_count() {
    let Some(server) = common::server("a_reloaded_bucket_amount_keeps_the_days_count") else {
        return;
    };
    let clock = ManualClock::new(Instant::now());
    let backend = backend(&server, &clock);
    for (after, room) in [(5_000, 0), (15_000, 5_000)] {
        let name = common::unique("bucket-day");
        let before = ScopeConfig::new(name.clone())
            .algorithm(BUCKET)
            .tokens(10_000, DAY);
        let reloaded = ScopeConfig::new(name).algorithm(BUCKET).tokens(after, DAY);
        let old = backend.open_scope(&before);
        at(&[&old], 1_000);
        assert!(granted(&old, 10_000).await, "the day's capacity");
        let new = backend.open_scope(&reloaded);
        assert_eq!(new.keys(), old.keys(), "one count for both amounts");
        at(&[&new], 1_000);
        if room > 0 {
            assert!(!granted(&new, room + 1).await, "more than the raise");
            assert!(granted(&new, room).await, "the raise is there at once");
        }
        assert!(
            !granted(&new, 1).await,
            "{after} a day after 10,000 taken: a fresh bucket was handed out"
        );
    }
}

// proves: GW-15, DQ-8, Q-7 (a bucket's burst lowered by a reload: what is
// left of the bucket is capped at the new capacity and what was taken
// stays taken)
#[tokio::test]
async fn a_lowered_burst_keeps_what_was_taken() {
    let Some(server) = common::server("a_lowered_burst_keeps_what_was_taken") else {
        return;
    };
    let clock = ManualClock::new(Instant::now());
    let backend = backend(&server, &clock);
    let name = common::unique("burst");
    let minute = Duration::from_secs(60);
    let full = ScopeConfig::new(name.clone())
        .algorithm(BUCKET)
        .tokens(600, minute);
    // A burst of 30 s: a capacity of 300.
    let half = ScopeConfig::new(name)
        .algorithm(Algorithm::TokenBucket {
            burst: Some(Duration::from_secs(30)),
        })
        .tokens(600, minute);
    let old = backend.open_scope(&full);
    at(&[&old], 1_000);
    assert!(granted(&old, 200).await);
    let new = backend.open_scope(&half);
    at(&[&new], 1_000);
    // 600 - 200 left before; the capacity 300 smaller: 100.
    assert_eq!(available(&new).await, vec![100]);
    assert!(!granted(&new, 101).await);
    assert!(granted(&new, 100).await);
}

// proves: GW-15, DQ-8, Q-7 (10,000 a day admitted, then the limit reloaded
// as 20,000 per two days: the old day limit still bounds the day after the
// reload, and the new limit starts with the 10,000, so over the two days
// from the first admission exactly 20,000 are admitted)
#[tokio::test]
async fn a_longer_window_counts_what_the_shorter_one_admitted() {
    let Some(server) = common::server("a_longer_window_counts_what_the_shorter_one_admitted")
    else {
        return;
    };
    let clock = ManualClock::new(Instant::now());
    let backend = backend(&server, &clock);
    let name = common::unique("longer");
    let before = ScopeConfig::new(name.clone()).tokens(10_000, DAY);
    let after = ScopeConfig::new(name).tokens(20_000, 2 * DAY);
    let old = backend.open_scope(&before);
    at(&[&old], 1_000);
    assert!(granted(&old, 10_000).await);
    let new = backend.open_scope(&after);
    at(&[&new], 2_000);
    assert!(!granted(&new, 1).await, "the day is spent");
    assert_eq!(
        available(&new).await,
        vec![10_000, 0],
        "seeded; transitional"
    );
    // A day on, the old window is free again: the new one has room for
    // the other 10,000 of its two days, and no more.
    clock.advance(DAY / 2);
    at(&[&new], 1_000 + DAY_US);
    assert!(!granted(&new, 10_001).await);
    assert!(granted(&new, 10_000).await);
    assert!(!granted(&new, 1).await, "20,000 in two days");
    // Past the old window the transitional limit is gone; the new one
    // still counts both halves until two days after each.
    clock.advance(DAY);
    at(&[&new], 2_000 + 2 * DAY_US - 1);
    assert_eq!(available(&new).await.len(), 1, "transitional limit ended");
    assert!(!granted(&new, 1).await, "the seed counts for two days");
    at(&[&new], 2_000 + 2 * DAY_US);
    assert!(granted(&new, 10_000).await, "the seeded 10,000 left");
}

// proves: GW-15, DQ-8, Q-7 (the same for a shorter window and for the
// fixed window: 10,000 a day admitted, reloaded as 10,000 an hour, nothing
// more for the rest of the day the old limit counts)
#[tokio::test]
async fn a_shorter_window_keeps_the_old_one_until_it_has_passed() {
    let Some(server) = common::server("a_shorter_window_keeps_the_old_one_until_it_has_passed")
    else {
        return;
    };
    let clock = ManualClock::new(Instant::now());
    let backend = backend(&server, &clock);
    let hour = Duration::from_secs(3_600);
    for algorithm in [Algorithm::SlidingWindow, Algorithm::FixedWindow] {
        let name = common::unique("shorter");
        let before = ScopeConfig::new(name.clone())
            .algorithm(algorithm)
            .tokens(10_000, DAY);
        let after = ScopeConfig::new(name)
            .algorithm(algorithm)
            .tokens(10_000, hour);
        let old = backend.open_scope(&before);
        at(&[&old], 1_000);
        assert!(granted(&old, 10_000).await);
        let new = backend.open_scope(&after);
        at(&[&new], 2 * 3_600_000_000);
        assert!(
            !granted(&new, 1).await,
            "{algorithm:?}: 20,000 in one day under 10,000 a day"
        );
    }
}

//! A reload that changes a shared scope's bucket amount or burst, or a
//! limit's window (SPEC GW-15, DQ-8, Q-7): what was admitted stays
//! counted. A new limit takes its count from any limit of its dimension in
//! force before, kept or replaced; a longer one keeps counting at least
//! what its replaced source counts, so what reaches only the source (a
//! call settled through its pre-reload handle, a replica not reloaded yet,
//! a key left from an earlier change) is not missed; a limit the new
//! configuration drops goes. The reload is what the engine does: the same backend opens a
//! handle for the new limits. The scripts run at explicit store times and
//! the handles on a manual local clock, so every instant is exact.

mod common;

use std::sync::Arc;
use std::time::Duration;

use tollgate::clock::{Instant, ManualClock};
use tollgate::config::{Algorithm, ScopeConfig};
use tollgate::quota::{Actual, Demand, OpId, RemoteHold, RemoteQuota, Reservation};
use tollgate_redis::{RawReserve, RedisBackend, RedisQuota, RedisServer, RedisSettings};

use common::BUDGET;

const DAY: Duration = Duration::from_secs(86_400);
const DAY_US: u64 = 86_400_000_000;
const HOUR: Duration = Duration::from_secs(3_600);
const MINUTE: Duration = Duration::from_secs(60);
const HOUR_US: u64 = 3_600_000_000;
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

/// A server for `test`, a manual clock and a backend whose handles read it.
fn setup(test: &str) -> Option<(RedisServer, ManualClock, RedisBackend)> {
    let server = common::server(test)?;
    let clock = ManualClock::new(Instant::now());
    let backend = backend(&server, &clock);
    Some((server, clock, backend))
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

async fn reserve(store: &RedisQuota, tokens: u64) -> Reservation {
    store
        .reserve(Demand::new(tokens, 0), RemoteHold::Leased, BUDGET)
        .await
        .expect("answered")
        .expect("granted")
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
    let Some((_server, _clock, backend)) = setup("a_reloaded_bucket_amount_keeps_the_days_count")
    else {
        return;
    };
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
    let Some((_server, _clock, backend)) = setup("a_lowered_burst_keeps_what_was_taken") else {
        return;
    };
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
    let Some((_server, clock, backend)) =
        setup("a_longer_window_counts_what_the_shorter_one_admitted")
    else {
        return;
    };
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
    let Some((_server, _clock, backend)) =
        setup("a_shorter_window_keeps_the_old_one_until_it_has_passed")
    else {
        return;
    };
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

// proves: Q-7, DQ-8, GW-15 (a call leased before a reload, 10,000 tokens a
// day with an estimate of 1,000, settles its debt of 9,000 through the
// handle it was taken with, after the reloaded handle, 20,000 per two days,
// seeded its key: the two-day limit counts it from its next operation, and
// still does once the transitional day has ended)
#[tokio::test]
async fn debt_settled_through_the_old_handle_reaches_the_longer_window() {
    let Some((_server, clock, backend)) = setup("debt_settled_through_the_old_handle") else {
        return;
    };
    let name = common::unique("debt");
    let before = ScopeConfig::new(name.clone()).tokens(10_000, DAY);
    let after = ScopeConfig::new(name).tokens(20_000, 2 * DAY);
    let old = backend.open_scope(&before);
    at(&[&old], 1_000);
    let call = reserve(&old, 1_000).await;
    let new = backend.open_scope(&after);
    at(&[&new], 2_000);
    // The reloaded handle's first operation seeds the two-day key.
    assert_eq!(available(&new).await, vec![19_000, 9_000]);
    // The call in flight settles through its own handle: 10,000 used.
    at(&[&old], 3_000);
    old.reconcile(call, Actual::total(10_000), OpId::new(), BUDGET)
        .await
        .expect("reconcile");
    // The reloaded handle's next call.
    at(&[&new], 4_000);
    assert!(!granted(&new, 1).await, "the day is spent");
    assert!(granted(&new, 0).await);
    assert_eq!(available(&new).await, vec![10_000, 0]);
    // A day and a bit on: the transitional day limit has ended.
    clock.advance(DAY + HOUR);
    at(&[&new], 1_000 + DAY_US + HOUR_US);
    assert_eq!(available(&new).await.len(), 1, "transitional limit ended");
    assert!(
        !granted(&new, 10_001).await,
        "10,000 were used within these two days; 20,000 per two days leaves 10,000"
    );
    assert!(granted(&new, 10_000).await);
}

// proves: GW-15, DQ-8, Q-7 (a window changed back: 10,000 tokens a day,
// reloaded as 10,000 an hour, 10,000 admitted in an hour more than a day
// later, then reloaded back to the day while the old day key still lives
// (keys live two windows and an hour): the day counts what the hour counts,
// and no fresh day is handed out once the transitional hour has passed)
#[tokio::test]
async fn a_window_changed_back_while_its_key_lives_counts_the_hour() {
    let Some((_server, clock, backend)) = setup("a_window_changed_back") else {
        return;
    };
    let name = common::unique("back");
    let day = ScopeConfig::new(name.clone()).tokens(10_000, DAY);
    let hour = ScopeConfig::new(name).tokens(10_000, HOUR);
    let first = backend.open_scope(&day);
    at(&[&first], 1_000);
    assert!(granted(&first, 10).await);
    let second = backend.open_scope(&hour);
    at(&[&second], 2_000);
    assert!(granted(&second, 10).await);
    // A day and an hour on: the transitional day limit ended.
    clock.advance(DAY + HOUR);
    let t = 2_000 + DAY_US + HOUR_US;
    at(&[&second], t);
    assert!(granted(&second, 10_000).await, "the hour's 10,000");
    // Reloaded back to the day, a minute later.
    clock.advance(Duration::from_secs(60));
    let third = backend.open_scope(&day);
    at(&[&third], t + 60_000_000);
    assert!(!granted(&third, 1).await, "the transitional hour bounds");
    // Past the transitional hour.
    clock.advance(HOUR);
    at(&[&third], t + 60_000_000 + HOUR_US + 1);
    assert!(
        !granted(&third, 10_000).await,
        "20,000 within ~1 hour under 10,000 a day: the day was handed out fresh"
    );
    assert!(!granted(&third, 1).await);
}

// proves: DQ-2, GW-15, Q-7 (a rolling reload: process A reloads 10,000 a
// day to 15,000 per two days while process B still runs the day limit;
// what B admits into the day key a minute later is counted by A's two-day
// window from A's next call, so the next day leaves the two days' rest,
// not more)
#[tokio::test]
async fn a_replica_not_yet_reloaded_is_counted_by_the_new_window() {
    let Some(server) = common::server("a_replica_not_yet_reloaded") else {
        return;
    };
    let clock = ManualClock::new(Instant::now());
    let name = common::unique("rolling");
    let before = ScopeConfig::new(name.clone()).tokens(10_000, DAY);
    let after = ScopeConfig::new(name).tokens(15_000, 2 * DAY);
    let a_process = backend(&server, &clock);
    let b_process = backend(&server, &clock);
    let a_old = a_process.open_scope(&before);
    let b = b_process.open_scope(&before);
    at(&[&a_old, &b], 1_000);
    assert!(granted(&b, 4_000).await);
    let a = a_process.open_scope(&after);
    at(&[&a], 2_000);
    assert_eq!(available(&a).await, vec![11_000, 6_000]);
    // B, not reloaded yet, admits 6,000 more a minute later.
    at(&[&b], 60_000_000);
    assert!(granted(&b, 6_000).await);
    // A's next call counts them in the two days.
    at(&[&a], 120_000_000);
    assert!(!granted(&a, 1).await, "the day is spent");
    // The next day, after A's transitional day: 10,000 of the two days'
    // 15,000 are spent.
    clock.advance(DAY + HOUR);
    at(&[&a], DAY_US + HOUR_US);
    assert_eq!(available(&a).await, vec![5_000]);
    assert!(
        !granted(&a, 5_001).await,
        "more than 15,000 within two days"
    );
    assert!(granted(&a, 5_000).await);
}

// proves: GW-15, DQ-8, Q-7 (a reload that adds a window beside a kept one
// of the same dimension: 10,000 tokens a day spent, then reloaded as
// 10,000 a day and 15,000 per two days: the two-day limit is seeded from
// the kept day, as in the in-process store, so the next day admits 5,000,
// not 10,000)
#[tokio::test]
async fn a_window_added_beside_a_kept_one_is_seeded_from_it() {
    let Some((_server, clock, backend)) = setup("a_window_added_beside_a_kept_one") else {
        return;
    };
    let name = common::unique("added");
    let before = ScopeConfig::new(name.clone()).tokens(10_000, DAY);
    let after = ScopeConfig::new(name)
        .tokens(10_000, DAY)
        .tokens(15_000, 2 * DAY);
    let old = backend.open_scope(&before);
    at(&[&old], 1_000);
    assert!(granted(&old, 10_000).await);
    let new = backend.open_scope(&after);
    at(&[&new], 2_000);
    assert!(!granted(&new, 1).await, "the day is spent");
    clock.advance(DAY);
    at(&[&new], 2_000 + DAY_US);
    assert!(
        !granted(&new, 5_001).await,
        "10,000 counted in these two days: 15,000 per two days leaves 5,000"
    );
    assert!(granted(&new, 5_000).await);
}

// proves: GW-15 (a reload that removes a dimension's limit altogether,
// 10,000 tokens a day gone and 100 requests a minute kept: the removed
// limit goes, as in the in-process store, and no longer refuses calls
// with tokens)
#[tokio::test]
async fn a_removed_limit_goes_at_once() {
    let Some((_server, _clock, backend)) = setup("a_removed_limit_goes_at_once") else {
        return;
    };
    let name = common::unique("removed");
    let minute = Duration::from_secs(60);
    let before = ScopeConfig::new(name.clone())
        .requests(100, minute)
        .tokens(10_000, DAY);
    let after = ScopeConfig::new(name).requests(100, minute);
    let old = backend.open_scope(&before);
    at(&[&old], 1_000);
    assert!(granted(&old, 10_000).await);
    let new = backend.open_scope(&after);
    at(&[&new], 2_000);
    assert!(
        granted(&new, 1).await,
        "no token limit is configured any more, yet a 1-token call is refused"
    );
}

// proves: Q-7, GW-15 (100 tokens a minute, reloaded as 10,000 an hour,
// 100 admitted under the hour, then reloaded back to the minute a second
// later while the old minute key still lives: the minute must not admit
// 100 more within the same 60 s; a missing key would be seeded with the
// hour's count, as the in-process store seeds it)
#[tokio::test]
async fn shorter_window_changed_back_while_its_key_lives() {
    let Some((_server, clock, backend)) = setup("shorter_window_changed_back") else {
        return;
    };
    let name = common::unique("shorter-back");
    let minute = ScopeConfig::new(name.clone()).tokens(100, MINUTE);
    let hour = ScopeConfig::new(name).tokens(10_000, HOUR);
    let first = backend.open_scope(&minute);
    at(&[&first], 1_000);
    assert!(granted(&first, 10).await);
    let second = backend.open_scope(&hour);
    at(&[&second], 2_000);
    assert!(granted(&second, 10).await);
    // Two minutes on: the transitional minute ended.
    clock.advance(2 * MINUTE);
    let t = 2_000 + 120_000_000;
    at(&[&second], t);
    assert!(granted(&second, 100).await, "the hour admits 100");
    // Reloaded back to the minute, one second later.
    clock.advance(Duration::from_secs(1));
    let third = backend.open_scope(&minute);
    at(&[&third], t + 1_000_000);
    assert!(
        !granted(&third, 100).await,
        "200 tokens admitted within one second under 100 tokens a minute"
    );
}

// proves: Q-7, GW-15 (1,000 tokens a minute and 1,000 an hour; the hour
// removed, 990 admitted, and the hour added back a second later while its
// key still lives: the in-process store seeds it from the kept minute
// (990 + 10), Redis keeps the stale key's 10, so a minute later the hour
// admits 990 more: 1,990 within the hour)
#[tokio::test]
async fn longer_window_added_back_beside_a_kept_one_while_its_key_lives() {
    let Some((_server, clock, backend)) = setup("longer_window_added_back") else {
        return;
    };
    let name = common::unique("added-back");
    let both = ScopeConfig::new(name.clone())
        .tokens(1_000, MINUTE)
        .tokens(1_000, HOUR);
    let only_minute = ScopeConfig::new(name).tokens(1_000, MINUTE);
    let first = backend.open_scope(&both);
    at(&[&first], 1_000);
    assert!(granted(&first, 10).await);
    let second = backend.open_scope(&only_minute);
    at(&[&second], 2_000);
    assert!(granted(&second, 990).await);
    clock.advance(Duration::from_secs(1));
    let third = backend.open_scope(&both);
    at(&[&third], 1_002_000);
    assert!(!granted(&third, 1).await, "the minute is spent");
    // Two minutes on: the minute is free again, the hour is not.
    clock.advance(2 * MINUTE);
    at(&[&third], 121_002_000);
    assert!(
        !granted(&third, 990).await,
        "1,990 tokens admitted within the hour under 1,000 an hour"
    );
}

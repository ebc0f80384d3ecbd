//! Quota state saved in UTC and restored after a restart (SPEC DQ-8): the
//! monotonic clock starts over, the saved times are wall-clock times, and
//! a restored window never counts shorter than the one that was saved.

mod common;

use common::admitted_now;
use std::time::{Duration, SystemTime};

use proptest::prelude::*;
use tokio::time::Instant;
use tollgate::clock::WallClock;
use tollgate::config::{Algorithm, Calendar, Limit, Period, ScopeConfig};
use tollgate::quota::{Counted, Demand, Dimension, Hold, LocalQuota, QuotaStore, SavedScope};

const LIMIT: u64 = 50;
const W: Duration = Duration::from_secs(3_600);
/// 2028-02-28T22:00:00Z: a leap day and a month end ahead.
const START: u64 = 1_835_474_400;

#[derive(Debug, Clone, Copy)]
enum Kind {
    Sliding,
    Fixed,
    Bucket,
    CalendarDay,
}

fn kinds() -> impl Strategy<Value = Kind> {
    prop_oneof![
        Just(Kind::Sliding),
        Just(Kind::Fixed),
        Just(Kind::Bucket),
        Just(Kind::CalendarDay),
    ]
}

fn scope(kind: Kind) -> ScopeConfig {
    let requests = |algorithm| {
        ScopeConfig::new("s")
            .requests(LIMIT, W)
            .algorithm(algorithm)
    };
    match kind {
        Kind::Sliding => requests(Algorithm::SlidingWindow),
        Kind::Fixed => requests(Algorithm::FixedWindow),
        Kind::Bucket => requests(Algorithm::TokenBucket { burst: None }),
        Kind::CalendarDay => ScopeConfig::new("s").limit(Limit::per(
            Dimension::Requests,
            LIMIT,
            Calendar::new(Period::Day),
        )),
    }
}

#[derive(Debug, Clone)]
enum Op {
    /// Requests at once.
    Admit(u64),
    /// Requests at once, which the provider may count as late as this many
    /// milliseconds ahead (an attempt cancelled before its arrival bound,
    /// SPEC Q-15).
    AdmitAhead(u64, u64),
    /// Time passes (milliseconds).
    Wait(u64),
    /// The process stops, and starts again this many milliseconds later.
    Restart(u64),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (1u64..=8).prop_map(Op::Admit),
        1 => (1u64..=8, 1u64..=10_000).prop_map(|(n, ms)| Op::AdmitAhead(n, ms)),
        4 => (0u64..1_500_000).prop_map(Op::Wait),
        1 => (0u64..2_000_000).prop_map(Op::Restart),
    ]
}

/// A store and its clock: `at(utc)` is the store's instant of a UTC time.
struct Process {
    quota: LocalQuota,
    wall: WallClock,
}

impl Process {
    fn start(kind: Kind, utc: SystemTime, saved: Option<&SavedScope>) -> Process {
        // Each process has its own monotonic origin.
        let t0 = Instant::now() + Duration::from_secs(fastrand_secs());
        let wall = WallClock::new(t0, utc);
        let mut quota = LocalQuota::with_wall(&scope(kind), t0, wall);
        if let Some(saved) = saved {
            quota.restore(saved, t0);
        }
        Process { quota, wall }
    }

    fn at(&self, utc: SystemTime) -> Instant {
        self.wall.instant(utc).unwrap()
    }

    /// What its limit has available at `utc` (on a copy).
    fn available(&self, utc: SystemTime) -> i64 {
        let mut copy = self.quota.clone();
        let mut out = Vec::new();
        copy.snapshot(self.at(utc), &mut out);
        out[0].available
    }
}

/// A different monotonic origin per process, deterministic per call site.
fn fastrand_secs() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    NEXT.fetch_add(7_777, Ordering::Relaxed) % 100_000
}

fn every_limit(_: &Limit) -> bool {
    true
}

proptest! {
    // proves: DQ-8 (a window restored after a restart counts what the
    // saved one counted until the same UTC times: from the restart on it
    // never has more available than the process that was not restarted
    // would have had, at any later instant; a sliding or calendar window
    // exactly as much; and across restarts a sliding window never admits
    // more than its limit in any hour, a calendar day never more than its
    // limit per day)
    #[test]
    fn a_restored_window_never_counts_shorter(
        kind in kinds(),
        ops in proptest::collection::vec(op(), 1..80),
    ) {
        let mut utc = SystemTime::UNIX_EPOCH + Duration::from_secs(START);
        let mut p = Process::start(kind, utc, None);
        let mut admitted: Vec<(SystemTime, u64)> = Vec::new();
        for op in ops {
            match op {
                Op::Admit(n) => {
                    let demand = Demand { requests: n, input: 0, output: 0, cost: 0 };
                    if p.quota.reserve(&demand, p.at(utc), Hold::Leased).is_ok() {
                        admitted.push((utc, n));
                    }
                }
                Op::AdmitAhead(n, ms) => {
                    let demand = Demand { requests: n, input: 0, output: 0, cost: 0 };
                    let now = p.at(utc);
                    if let Ok(mut r) = p.quota.reserve(&demand, now, Hold::Leased) {
                        p.quota.recount(&mut r, now + Duration::from_millis(ms), now);
                        admitted.push((utc, n));
                    }
                }
                Op::Wait(ms) => utc += Duration::from_millis(ms),
                Op::Restart(ms) => {
                    let saved = p.quota.save(p.at(utc), every_limit);
                    let mut reference = Process { quota: p.quota.clone(), wall: p.wall };
                    utc += Duration::from_millis(ms);
                    p = Process::start(kind, utc, Some(&saved));
                    for probe in [0, 1, 600, 1_800, 3_599, 3_600, 3_601, 7_200, 86_400] {
                        let t = utc + Duration::from_secs(probe);
                        let (restored, kept) = (p.available(t), reference.available(t));
                        match kind {
                            Kind::Sliding | Kind::CalendarDay => {
                                prop_assert_eq!(restored, kept, "{:?} at +{}s", kind, probe);
                            }
                            Kind::Fixed | Kind::Bucket => {
                                prop_assert!(restored <= kept, "{:?} at +{}s: {} > {}", kind, probe, restored, kept);
                            }
                        }
                    }
                    reference.quota = p.quota.clone();
                }
            }
        }
        match kind {
            Kind::Sliding => {
                for (i, (t, _)) in admitted.iter().enumerate() {
                    let sum: u64 = admitted[i..]
                        .iter()
                        .take_while(|(s, _)| s.duration_since(*t).unwrap() < W)
                        .map(|(_, n)| n)
                        .sum();
                    prop_assert!(sum <= LIMIT, "{} in the hour from {:?}", sum, t);
                }
            }
            Kind::CalendarDay => {
                let mut per_day = std::collections::BTreeMap::new();
                for (t, n) in &admitted {
                    let day = t.duration_since(SystemTime::UNIX_EPOCH).unwrap().as_secs() / 86_400;
                    *per_day.entry(day).or_insert(0u64) += n;
                }
                prop_assert!(per_day.values().all(|&n| n <= LIMIT), "{:?}", per_day);
            }
            Kind::Fixed | Kind::Bucket => {}
        }
    }
}

// proves: DQ-8 (what is saved is in UTC: the sliding window's amounts
// until their expiry, a calendar day's count with its period)
#[test]
fn saved_state_is_in_utc() {
    let utc = SystemTime::UNIX_EPOCH + Duration::from_secs(START);
    let t0 = Instant::now();
    let wall = WallClock::new(t0, utc);
    let config = ScopeConfig::new("s").requests(10, W).limit(Limit::per(
        Dimension::Requests,
        10,
        Calendar::new(Period::Day),
    ));
    let mut q = LocalQuota::with_wall(&config, t0, wall);
    q.reserve(
        &Demand::new(0, 0),
        t0 + Duration::from_secs(60),
        Hold::Leased,
    )
    .unwrap();
    let v = q.version();
    let saved = q.save(t0 + Duration::from_secs(120), every_limit);
    assert_eq!(q.version(), v, "saving changes nothing");
    assert_eq!(
        saved.limits[0].counted,
        Counted::Until(vec![(utc + Duration::from_secs(60) + W, 1)])
    );
    let midnight = SystemTime::UNIX_EPOCH + Duration::from_secs(START + 2 * 3_600);
    assert!(matches!(
        saved.limits[1].counted,
        Counted::Window { end, used: 1, .. } if end == midnight
    ));
    // Only what `keep` selects.
    let days = q.save(t0, |l| l.calendar.is_some());
    assert_eq!(days.limits.len(), 1);
}

// proves: DQ-8 (a limit whose window changed while the process was down
// starts from what the saved limit of its dimension still counts)
#[test]
fn a_changed_window_is_seeded_from_the_saved_one() {
    let utc = SystemTime::UNIX_EPOCH + Duration::from_secs(START);
    let t0 = Instant::now();
    let wall = WallClock::new(t0, utc);
    let mut old = LocalQuota::with_wall(&ScopeConfig::new("s").requests(10, W), t0, wall);
    for _ in 0..4 {
        old.reserve(&Demand::new(0, 0), t0, Hold::Leased).unwrap();
    }
    let saved = old.save(t0, every_limit);
    let day = ScopeConfig::new("s").limit(Limit::per(
        Dimension::Requests,
        6,
        Calendar::new(Period::Day),
    ));
    let t1 = t0 + Duration::from_secs(10);
    let mut new =
        LocalQuota::with_wall(&day, t1, WallClock::new(t1, utc + Duration::from_secs(10)));
    assert!(new.restore(&saved, t1));
    let mut out = Vec::new();
    new.snapshot(t1, &mut out);
    assert_eq!(out[0].available, 2);
}

/// A controller of one scope "day" with `limit` requests per UTC day, on
/// tokio's (paused) clock anchored at `utc`: one process.
fn day_process(limit: u64, utc: SystemTime) -> tollgate::AdmissionController {
    let config = tollgate::config::ControllerConfig {
        scopes: vec![ScopeConfig::new("day").limit(Limit::per(
            Dimension::Requests,
            limit,
            Calendar::new(Period::Day),
        ))],
        ..Default::default()
    };
    tollgate::AdmissionController::builder()
        .config(config)
        .clock(std::sync::Arc::new(tollgate::clock::AnchoredClock::new(
            utc,
        )))
        .build()
        .unwrap()
}

// proves: DQ-8 (a controller hands out what its long windows count and a
// new controller, started later in the same UTC day, counts it: the day
// is not handed out afresh; an unchanged scope is not handed out twice;
// the next UTC day has the whole limit)
#[tokio::test(start_paused = true)]
async fn a_restarted_controller_keeps_the_day() {
    let start = SystemTime::UNIX_EPOCH + Duration::from_secs(START); // 22:00 UTC
    let first = day_process(5, start);
    assert_eq!(admitted_now(&first, 3).await, 3);
    let saved = first.save_quota(|l| l.calendar.is_some(), &|_, _| false);
    assert_eq!(saved.len(), 1);
    assert_eq!(saved[0].scope, "day");
    let version = saved[0].version;
    assert!(
        first.save_quota(|_| true, &|_, v| v == version).is_empty(),
        "nothing changed since the last save"
    );
    drop(first);
    // A new process, an hour later (its monotonic clock starts over).
    tokio::time::advance(Duration::from_secs(3_600)).await;
    let second = day_process(5, start + Duration::from_secs(3_600));
    assert!(second.restore_quota("day", &saved[0].state));
    assert!(!second.restore_quota("unknown", &saved[0].state));
    assert_eq!(admitted_now(&second, 10).await, 2, "5 per day, 3 counted");
    // Midnight UTC: a new day.
    tokio::time::advance(Duration::from_secs(3_600)).await;
    assert_eq!(admitted_now(&second, 10).await, 5);
}

/// What `q`'s first limit has available at `at` (on a copy).
fn free_at(q: &LocalQuota, at: Instant) -> i64 {
    let mut copy = q.clone();
    let mut out = Vec::new();
    copy.snapshot(at, &mut out);
    out[0].available
}

// proves: DQ-8, Q-15 (10 requests an hour, fixed windows; 10 admitted at
// 59 min whose provider may count them until 61 min (kept ahead), saved,
// and restored by a process whose wall clock reads a day earlier (an NTP
// step back): a sliding window believes a saved expiry at most one window
// plus max(window, arrival cap) ahead; the fixed window must not count the
// amount kept ahead in every hour for a whole day)
#[test]
fn an_amount_kept_ahead_is_not_counted_for_a_day_after_the_clock_went_back() {
    let config = ScopeConfig::new("s")
        .requests(10, W)
        .algorithm(Algorithm::FixedWindow);
    let utc = SystemTime::UNIX_EPOCH + Duration::from_secs(START);
    let t0 = Instant::now();
    let mut old = LocalQuota::with_wall(&config, t0, WallClock::new(t0, utc));
    let t = t0 + Duration::from_secs(59 * 60);
    let mut r = old
        .reserve(&Demand::new(0, 0), t, Hold::Leased)
        .expect("granted");
    for _ in 0..9 {
        old.reserve(&Demand::new(0, 0), t, Hold::Leased).unwrap();
    }
    old.recount(&mut r, t + Duration::from_secs(120), t);
    let saved = old.save(t, every_limit);
    // The restarted process's wall clock reads a day earlier.
    let t1 = Instant::now() + Duration::from_secs(10_000);
    let mut new = LocalQuota::with_wall(
        &config,
        t1,
        WallClock::new(
            t1,
            utc + Duration::from_secs(59 * 60) - Duration::from_secs(86_400),
        ),
    );
    new.restore(&saved, t1);
    // Five hours on: far more than one window plus the arrival cap.
    let later = t1 + 5 * W;
    assert_eq!(
        free_at(&new, later),
        10,
        "one request kept ahead 2 minutes is still counted five hours after the restart"
    );
}

// proves: DQ-8, Q-15, Q-7 (10 requests an hour in fixed windows; 10
// admitted at 59 min which the provider may count until 61 min (kept
// ahead into the next hour), saved at 59 min; the process restarts at
// 62 min with a sliding hour: the fixed window would still count them
// until 120 min, a reload at 62 min would seed them; the restart must not
// hand out a fresh hour: 20 within 3 minutes under 10 an hour)
#[test]
fn a_changed_window_is_seeded_with_what_an_ended_window_keeps_ahead() {
    let fixed = ScopeConfig::new("s")
        .requests(10, W)
        .algorithm(Algorithm::FixedWindow);
    let sliding = ScopeConfig::new("s")
        .requests(10, W)
        .algorithm(Algorithm::SlidingWindow);
    let utc = SystemTime::UNIX_EPOCH + Duration::from_secs(START);
    let t0 = Instant::now();
    let mut old = LocalQuota::with_wall(&fixed, t0, WallClock::new(t0, utc));
    let t = t0 + Duration::from_secs(59 * 60);
    let mut leases = Vec::new();
    for _ in 0..10 {
        leases.push(
            old.reserve(&Demand::new(0, 0), t, Hold::Leased)
                .expect("granted"),
        );
    }
    for r in &mut leases {
        old.recount(r, t + Duration::from_secs(120), t);
    }
    let saved = old.save(t, every_limit);
    let t1 = Instant::now() + Duration::from_secs(20_000);
    let mut new = LocalQuota::with_wall(
        &sliding,
        t1,
        WallClock::new(t1, utc + Duration::from_secs(62 * 60)),
    );
    new.restore(&saved, t1);
    assert_eq!(
        free_at(&new, t1),
        0,
        "the 10 the provider counts in this hour are not counted after the restart"
    );
}

// proves: DQ-8, Q-15, Q-7 (10 requests a minute, sliding; 10 admitted
// whose provider may count them as late as 50 s later, saved, and
// restored a second later by a process whose window changed to 30 s: the
// new window holding that instant counts them, however the restarted
// process counts windows)
#[test]
fn a_changed_window_counts_an_amount_ahead_at_its_instant() {
    let minute = Duration::from_secs(60);
    let old_scope = ScopeConfig::new("s").requests(10, minute);
    let utc = SystemTime::UNIX_EPOCH + Duration::from_secs(START);
    let t0 = Instant::now();
    let mut old = LocalQuota::with_wall(&old_scope, t0, WallClock::new(t0, utc));
    let mut leases = Vec::new();
    for _ in 0..10 {
        leases.push(
            old.reserve(&Demand::new(0, 0), t0, Hold::Leased)
                .expect("granted"),
        );
    }
    for r in &mut leases {
        old.recount(r, t0 + Duration::from_secs(50), t0);
    }
    let saved = old.save(t0, every_limit);
    for algorithm in [Algorithm::SlidingWindow, Algorithm::FixedWindow] {
        let new_scope = ScopeConfig::new("s")
            .requests(10, Duration::from_secs(30))
            .algorithm(algorithm);
        let t1 = Instant::now() + Duration::from_secs(20_000);
        let mut new = LocalQuota::with_wall(
            &new_scope,
            t1,
            WallClock::new(t1, utc + Duration::from_secs(1)),
        );
        new.restore(&saved, t1);
        // 49 s after the restart lies in its second 30 s window.
        assert_eq!(
            free_at(&new, t1 + Duration::from_secs(35)),
            0,
            "{algorithm:?}: the 10 the provider may count at 49 s are not counted"
        );
        assert_eq!(
            free_at(&new, t1 + Duration::from_secs(95)),
            10,
            "{algorithm:?}: counted past their window"
        );
    }
}

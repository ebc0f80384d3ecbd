//! Calendar windows (SPEC BUD-3): a limit per day, week or month of the
//! calendar, in UTC or a time zone, across month ends, year ends, the leap
//! day 2028-02-29 and daylight-saving changes. The store's arithmetic is
//! driven by explicit instants; the controller runs on tokio's paused
//! clock with a chosen wall time.

mod common;

use common::admitted_now;
use std::time::{Duration, SystemTime};

use jiff::tz::TimeZone;
use jiff::{Timestamp, ToSpan, ZonedDateTime};
use proptest::prelude::*;
use tokio::time::Instant;
use tollgate::clock::{AnchoredClock, WallClock};
use tollgate::config::{Calendar, ControllerConfig, Limit, Period, ScopeConfig, Zone};
use tollgate::quota::{Actual, Demand, Dimension, Hold, LocalQuota, QuotaStore, Reservation};
use tollgate::{AdmissionController, AdmissionError, Call, Deadline, Phase, ScopeId};

const LIMIT: u64 = 100;

fn utc(text: &str) -> Timestamp {
    text.parse().unwrap()
}

fn system(ts: Timestamp) -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_nanos(u64::try_from(ts.as_nanosecond()).unwrap())
}

/// Where a case starts and which calendar it counts.
fn anchors() -> Vec<(&'static str, Period, &'static str)> {
    vec![
        ("2026-12-31T22:00:00Z", Period::Day, "UTC"),
        ("2026-12-31T22:00:00Z", Period::Month, "UTC"),
        ("2028-02-28T20:00:00Z", Period::Day, "UTC"),
        ("2028-02-28T20:00:00Z", Period::Month, "UTC"),
        ("2028-02-26T00:00:00Z", Period::Week, "UTC"),
        ("2027-03-27T20:00:00Z", Period::Day, "Europe/Paris"),
        ("2027-10-30T20:00:00Z", Period::Day, "Europe/Paris"),
        ("2027-10-30T20:00:00Z", Period::Month, "Europe/Paris"),
        ("2027-03-13T20:00:00Z", Period::Day, "America/New_York"),
    ]
}

/// The model's period holding `at`, by jiff's own calendar arithmetic
/// (`start_of_day`, `first_of_month`), not the engine's.
fn model_period(period: Period, tz: &TimeZone, at: Timestamp) -> (Timestamp, Timestamp) {
    let z: ZonedDateTime = at.to_zoned_datetime(tz.clone());
    let (start, end) = match period {
        Period::Day => (
            z.start_of_day().unwrap(),
            z.tomorrow().unwrap().start_of_day().unwrap(),
        ),
        Period::Week => {
            let back = i64::from(z.weekday().to_monday_zero_offset());
            let monday = z.checked_sub(back.days()).unwrap().start_of_day().unwrap();
            let next = monday
                .checked_add(7.days())
                .unwrap()
                .start_of_day()
                .unwrap();
            (monday, next)
        }
        Period::Month => (
            z.first_of_month().unwrap().start_of_day().unwrap(),
            z.last_of_month()
                .unwrap()
                .tomorrow()
                .unwrap()
                .start_of_day()
                .unwrap(),
        ),
        Period::Hour => unreachable!("not modelled"),
    };
    (start.timestamp(), end.timestamp())
}

#[derive(Debug, Clone)]
enum Step {
    /// Up to two hours, to the nanosecond.
    Small(u64),
    /// Up to three days.
    Long(u64),
    /// Exactly to the next boundary.
    ToBoundary,
    /// One nanosecond before the next boundary.
    JustBefore,
}

#[derive(Debug, Clone)]
enum Op {
    Reserve {
        input: u64,
        output: u64,
    },
    /// Settles the `i`-th held reservation with less than its estimate.
    Settle {
        i: usize,
        keep: u64,
    },
    Wait(Step),
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        (0u64..7_200_000_000_000).prop_map(Step::Small),
        (0u64..259_200_000_000_000).prop_map(Step::Long),
        Just(Step::ToBoundary),
        Just(Step::JustBefore),
    ]
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0u64..=60, 0u64..=40).prop_map(|(input, output)| Op::Reserve { input, output }),
        1 => (any::<usize>(), 0u64..=100).prop_map(|(i, keep)| Op::Settle { i, keep }),
        3 => step().prop_map(Op::Wait),
    ]
}

fn dimensions() -> impl Strategy<Value = Dimension> {
    prop_oneof![
        Just(Dimension::Requests),
        Just(Dimension::Tokens),
        Just(Dimension::InputTokens),
        Just(Dimension::OutputTokens),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    // proves: BUD-3 (a calendar window never admits more than its limit
    // inside one period of the calendar, and admits exactly what fits:
    // a demand is refused only when it does not fit in what the period
    // has left, the refusal names the period's end to the nanosecond, and
    // the whole limit is there again at the boundary's first instant;
    // across month and year ends, the leap day 2028-02-29 and
    // daylight-saving changes, in every dimension, with refunds)
    #[test]
    fn a_calendar_window_holds_its_limit_per_period_exactly(
        anchor in 0usize..9,
        dimension in dimensions(),
        ops in proptest::collection::vec(op(), 1..120),
    ) {
        let (start, period, zone) = anchors()[anchor];
        let tz = TimeZone::get(zone).unwrap();
        let start = utc(start);
        let t0 = Instant::now();
        let wall = WallClock::new(t0, system(start));
        let calendar = Calendar::new(period).zone(Zone::named(zone).unwrap());
        let scope = ScopeConfig::new("c").limit(Limit::per(dimension, LIMIT, calendar));
        let mut q = LocalQuota::with_wall(&scope, t0, wall);
        let mut now = start;
        let at = |ts: Timestamp| wall.instant(system(ts)).unwrap();
        // What the model counts in the current period, and the held
        // reservations with the period they were counted in.
        let mut period_now = model_period(period, &tz, now);
        let mut used = 0u64;
        let mut held: Vec<(Reservation, (Timestamp, Timestamp))> = Vec::new();
        for op in ops {
            match op {
                Op::Wait(step) => {
                    let (_, end) = model_period(period, &tz, now);
                    now = match step {
                        Step::Small(n) | Step::Long(n) => {
                            now.checked_add(jiff::SignedDuration::from_nanos(n as i64)).unwrap()
                        }
                        Step::ToBoundary => end,
                        Step::JustBefore => {
                            let before = end.checked_sub(1.nanosecond()).unwrap();
                            if before > now { before } else { now }
                        }
                    };
                    let p = model_period(period, &tz, now);
                    if p != period_now {
                        period_now = p;
                        used = 0;
                    }
                }
                Op::Reserve { input, output } => {
                    let demand = Demand::new(input, output);
                    let amount = demand.amount(dimension);
                    let fits = used + amount <= LIMIT;
                    match q.reserve(&demand, at(now), Hold::Leased) {
                        Ok(r) => {
                            prop_assert!(fits, "admitted {amount} over {used} of {LIMIT} at {now}");
                            used += amount;
                            held.push((r, period_now));
                        }
                        Err(not_until) => {
                            prop_assert!(!fits, "refused {amount} with {used} of {LIMIT} at {now}");
                            prop_assert_eq!(
                                not_until.at,
                                Some(at(period_now.1)),
                                "the refusal names the period's end"
                            );
                        }
                    }
                    prop_assert!(used <= LIMIT);
                }
                Op::Settle { i, keep } => {
                    if held.is_empty() {
                        continue;
                    }
                    let (r, p) = held.swap_remove(i % held.len());
                    let input = keep.min(r.demand.input);
                    let output = keep.saturating_sub(input).min(r.demand.output);
                    q.reconcile(&r, &Actual::split(input, output));
                    // A refund lands in the period the estimate was
                    // counted in, if it is still the current one.
                    if p == period_now && dimension != Dimension::Requests {
                        let actual = Demand::new(input, output).amount(dimension);
                        used -= r.demand.amount(dimension) - actual;
                    }
                }
            }
        }
        // The boundary: the whole limit again at its first instant, not a
        // nanosecond before once the period is spent.
        let (_, end) = model_period(period, &tz, now);
        let spend = match dimension {
            Dimension::Requests => Demand { requests: LIMIT, input: 0, output: 0, cost: 0 },
            Dimension::Cost => Demand { requests: 0, input: 0, output: 0, cost: LIMIT },
            Dimension::Tokens => Demand::new(LIMIT / 2, LIMIT - LIMIT / 2),
            Dimension::InputTokens => Demand::new(LIMIT, 0),
            Dimension::OutputTokens => Demand::new(0, LIMIT),
        };
        let full = q.reserve(&spend, at(now), Hold::Leased).is_ok();
        prop_assert_eq!(full, used == 0);
        if !full {
            let before = end.checked_sub(1.nanosecond()).unwrap().max(now);
            prop_assert!(q.reserve(&spend, at(before), Hold::Leased).is_err());
        }
        prop_assert!(q.reserve(&spend, at(end), Hold::Leased).is_ok(), "full at {end}");
        let one = Demand { requests: 1, input: 1, output: 1, cost: 1 };
        prop_assert!(q.reserve(&one, at(end), Hold::Leased).is_err());
    }
}

/// A controller of one scope with `limit` requests per UTC day, its clock
/// tokio's (paused) at `wall`.
fn day_controller(limit: u64, wall: &str, max_wait: Option<Duration>) -> AdmissionController {
    let scope = ScopeConfig::new("day").limit(Limit::per(
        Dimension::Requests,
        limit,
        Calendar::new(Period::Day),
    ));
    let config = ControllerConfig {
        scopes: vec![scope],
        max_wait,
        ..ControllerConfig::default()
    };
    AdmissionController::builder()
        .config(config)
        .clock(std::sync::Arc::new(AnchoredClock::new(system(utc(wall)))))
        .build()
        .unwrap()
}

fn deadline(after: Duration) -> Deadline {
    Deadline::from_timeout(Some(after), Instant::now())
}

// proves: BUD-3, Q-11 (a spent day answers at once, with the next
// midnight UTC as its retry hint; a call whose deadline reaches midnight
// waits and is admitted exactly then, with the whole limit)
#[tokio::test(start_paused = true)]
async fn a_spent_day_answers_at_once_and_resets_at_midnight_utc() {
    let controller = day_controller(3, "2026-12-31T23:59:00Z", None);
    let midnight = controller
        .wall()
        .instant(system(utc("2027-01-01T00:00:00Z")))
        .unwrap();
    let call = Call::new(ScopeId::FIRST);
    for _ in 0..3 {
        drop(
            controller
                .acquire(&call, deadline(Duration::from_secs(1)))
                .await
                .unwrap(),
        );
    }
    let asked = Instant::now();
    let err = controller
        .acquire(&call, deadline(Duration::from_secs(30)))
        .await
        .unwrap_err();
    assert_eq!(Instant::now(), asked, "answered at once");
    assert_eq!(
        err,
        AdmissionError::DeadlineExceeded {
            phase: Phase::Rate,
            retry_at: Some(midnight),
        }
    );
    // A deadline past midnight waits for it, to the nanosecond.
    let lease = controller
        .acquire(&call, deadline(Duration::from_secs(120)))
        .await
        .unwrap();
    assert_eq!(Instant::now(), midnight);
    drop(lease);
    for _ in 0..2 {
        drop(
            controller
                .acquire(&call, deadline(Duration::from_secs(1)))
                .await
                .unwrap(),
        );
    }
    assert!(
        controller
            .acquire(&call, deadline(Duration::from_secs(1)))
            .await
            .is_err()
    );
}

// proves: BUD-3, Q-11 (with max_wait, a spent month is QuotaWaitTooLong at
// once, ready at the first of the next month in the configured zone)
#[tokio::test(start_paused = true)]
async fn a_spent_month_in_a_time_zone_is_too_long_a_wait() {
    let paris = Zone::named("Europe/Paris").unwrap();
    let scope = ScopeConfig::new("month").limit(Limit::per(
        Dimension::Requests,
        1,
        Calendar::new(Period::Month).zone(paris),
    ));
    let config = ControllerConfig {
        scopes: vec![scope],
        max_wait: Some(Duration::from_secs(60)),
        ..ControllerConfig::default()
    };
    // 2028-02-29 20:00 UTC is 21:00 in Paris: March begins at 23:00 UTC.
    let controller = AdmissionController::builder()
        .config(config)
        .clock(std::sync::Arc::new(AnchoredClock::new(system(utc(
            "2028-02-29T20:00:00Z",
        )))))
        .build()
        .unwrap();
    let call = Call::new(ScopeId::FIRST);
    drop(
        controller
            .acquire(&call, deadline(Duration::from_secs(1)))
            .await
            .unwrap(),
    );
    let err = controller
        .acquire(&call, deadline(Duration::from_secs(86_400)))
        .await
        .unwrap_err();
    let ready = controller
        .wall()
        .instant(system(utc("2028-02-29T23:00:00Z")))
        .unwrap();
    match err {
        AdmissionError::QuotaWaitTooLong { ready_at, wait, .. } => {
            assert_eq!(ready_at, ready);
            assert_eq!(wait, Duration::from_secs(3 * 3_600));
        }
        other => panic!("{other:?}"),
    }
}

fn day_config(limit: u64, calendar: Calendar) -> ControllerConfig {
    ControllerConfig {
        scopes: vec![ScopeConfig::new("day").limit(Limit::per(
            Dimension::Requests,
            limit,
            calendar,
        ))],
        ..ControllerConfig::default()
    }
}

// proves: BUD-3, GW-15 (a reload keeps a calendar window's count: the same
// period keeps it as it is, with the new amount; another period or time
// zone starts from what was counted, never from a fresh day, and the
// replaced window bounds admissions until its own period ends)
#[tokio::test(start_paused = true)]
async fn a_reload_keeps_what_a_calendar_window_counted() {
    let utc_day = Calendar::new(Period::Day);
    let controller = day_controller(5, "2027-06-15T10:00:00Z", None);
    assert_eq!(admitted_now(&controller, 3).await, 3);
    controller.reconfigure(day_config(6, utc_day)).unwrap();
    assert_eq!(
        admitted_now(&controller, 10).await,
        3,
        "6 per day, 3 counted"
    );
    // The same day in Tokyo (UTC+9): it counts the 6 of the UTC day.
    let tokyo = utc_day.zone(Zone::named("Asia/Tokyo").unwrap());
    controller.reconfigure(day_config(8, tokyo)).unwrap();
    assert_eq!(
        admitted_now(&controller, 10).await,
        0,
        "the UTC day is spent"
    );
    // Tokyo's day ends at 15:00 UTC; the replaced UTC day still bounds.
    tokio::time::advance(Duration::from_secs(5 * 3_600)).await;
    assert_eq!(admitted_now(&controller, 10).await, 0);
    // At midnight UTC the replaced window is done: Tokyo's whole day.
    tokio::time::advance(Duration::from_secs(9 * 3_600)).await;
    assert_eq!(admitted_now(&controller, 10).await, 8);
    tokio::time::advance(Duration::from_secs(3_600)).await;
    assert_eq!(admitted_now(&controller, 10).await, 0, "8 per Tokyo day");
    // Back to UTC: seeded with Tokyo's 8, the UTC day holds 2 more.
    controller.reconfigure(day_config(10, utc_day)).unwrap();
    assert_eq!(admitted_now(&controller, 10).await, 0, "Tokyo's day bounds");
    tokio::time::advance(Duration::from_secs(14 * 3_600)).await; // 15:00 UTC
    assert_eq!(
        admitted_now(&controller, 10).await,
        2,
        "10 per UTC day, 8 counted"
    );
}

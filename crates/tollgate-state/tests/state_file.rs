//! The state file on disk (SPEC DQ-8): what a process saves, a new process
//! on the same directory restores; a file it cannot read stops it at start
//! with an error naming the file (or, when told to, is moved aside).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use tokio::time::Instant;
use tollgate::clock::AnchoredClock;
use tollgate::config::{Calendar, ControllerConfig, Limit, Period, ScopeConfig};
use tollgate::quota::Dimension;
use tollgate::{AdmissionController, Call, Deadline, ScopeId, TokenEstimate};
use tollgate_state::{FILE_NAME, OnUnreadable, StateError, StateFile};

/// A fresh directory for one test.
fn dir(name: &str) -> PathBuf {
    let p = std::env::temp_dir().join(format!("tollgate-state-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&p);
    p
}

/// 2028-02-28T22:00:00Z.
fn start() -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_secs(1_835_474_400)
}

/// One process's controller: scope "day" with `limit` requests per UTC
/// day and 1000 per minute (not kept), on tokio's paused clock at `utc`.
fn process(limit: u64, utc: SystemTime) -> AdmissionController {
    let scope = ScopeConfig::new("day")
        .limit(Limit::per(
            Dimension::Requests,
            limit,
            Calendar::new(Period::Day),
        ))
        .requests(1_000, Duration::from_secs(60))
        .tokens(1_000_000, Duration::from_secs(86_400));
    AdmissionController::builder()
        .config(ControllerConfig {
            scopes: vec![scope],
            ..ControllerConfig::default()
        })
        .clock(Arc::new(AnchoredClock::new(utc)))
        .build()
        .unwrap()
}

async fn admitted_now(controller: &AdmissionController, most: u64) -> u64 {
    let call = Call::new(ScopeId::FIRST).with_estimate(TokenEstimate::new(10, 0));
    let mut n = 0;
    while n < most {
        let deadline = Deadline::from_timeout(Some(Duration::from_millis(1)), Instant::now());
        match controller.acquire(&call, deadline).await {
            Ok(lease) => drop(lease),
            Err(_) => break,
        }
        n += 1;
    }
    n
}

// proves: DQ-8 (a day counted by one process and saved is counted by the
// next process on the same state directory: restored at start, not a
// fresh day; only kept limits are written; the file is in WAL mode)
#[tokio::test(start_paused = true)]
async fn a_restart_on_the_same_directory_keeps_the_day() {
    let d = dir("restart");
    let file = StateFile::open(&d, OnUnreadable::Refuse).unwrap();
    assert_eq!(file.loaded_scopes(), 0);
    let first = process(5, start());
    assert_eq!(admitted_now(&first, 3).await, 3);
    assert_eq!(file.save(&[("upstream", &first)]).unwrap(), 1);
    assert_eq!(file.save(&[("upstream", &first)]).unwrap(), 0, "unchanged");
    drop((first, file));

    tokio::time::advance(Duration::from_secs(600)).await;
    let file = StateFile::open(&d, OnUnreadable::Refuse).unwrap();
    assert_eq!(file.loaded_scopes(), 1);
    let second = process(5, start() + Duration::from_secs(600));
    assert_eq!(file.restore("tenant:other", &second), 0, "another owner's");
    assert_eq!(file.restore("upstream", &second), 1);
    assert_eq!(admitted_now(&second, 10).await, 2, "5 per day, 3 counted");
    // Kept: the day (calendar) and the 1-day token window; not the minute.
    let conn = rusqlite::Connection::open(d.join(FILE_NAME)).unwrap();
    let mut kept: Vec<(String, i64)> = conn
        .prepare("SELECT dimension, window_ns FROM counted")
        .unwrap()
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
        .unwrap()
        .map(Result::unwrap)
        .collect();
    kept.sort();
    assert_eq!(
        kept,
        [
            ("requests".to_owned(), 86_400_000_000_000),
            ("tokens".to_owned(), 86_400_000_000_000)
        ]
    );
    let mode: String = conn
        .query_row("PRAGMA journal_mode", [], |r| r.get(0))
        .unwrap();
    assert_eq!(mode, "wal");
    // Midnight UTC: the whole limit again.
    tokio::time::advance(Duration::from_secs(6_600)).await;
    assert_eq!(admitted_now(&second, 10).await, 5);
    let _ = std::fs::remove_dir_all(&d);
}

fn unreadable(e: StateError) -> (PathBuf, String) {
    match e {
        StateError::Unreadable { path, reason } => (path, reason),
        other => panic!("{other:?}"),
    }
}

// proves: DQ-8 (a file that is not a state database stops the start with
// an error naming it; told to start empty, the process moves it aside and
// starts with nothing saved)
#[test]
fn a_garbage_file_is_refused_or_moved_aside_when_told() {
    let d = dir("garbage");
    std::fs::create_dir_all(&d).unwrap();
    let path = d.join(FILE_NAME);
    std::fs::write(&path, vec![0x5a; 8_192]).unwrap();
    let e = StateFile::open(&d, OnUnreadable::Refuse).unwrap_err();
    let text = e.to_string();
    let (at, reason) = unreadable(e);
    assert_eq!(at, path);
    assert!(text.contains(&path.display().to_string()), "{text}");
    assert!(reason.contains("not a database"), "{reason}");
    assert_eq!(
        std::fs::read(&path).unwrap(),
        vec![0x5a; 8_192],
        "left as it was"
    );

    let file = StateFile::open(&d, OnUnreadable::StartEmpty).unwrap();
    assert_eq!(file.loaded_scopes(), 0);
    let aside: Vec<_> = std::fs::read_dir(&d)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n.contains(".unreadable-"))
        .collect();
    assert_eq!(aside.len(), 1, "{aside:?}");
    let _ = std::fs::remove_dir_all(&d);
}

// proves: DQ-8 (a database whose row is damaged, or of a newer schema, is
// refused with the row or the schema named)
#[tokio::test(start_paused = true)]
async fn a_bad_row_or_a_newer_schema_is_located() {
    let d = dir("row");
    let file = StateFile::open(&d, OnUnreadable::Refuse).unwrap();
    let first = process(5, start());
    assert_eq!(admitted_now(&first, 1).await, 1);
    file.save(&[("upstream", &first)]).unwrap();
    drop(file);
    let conn = rusqlite::Connection::open(d.join(FILE_NAME)).unwrap();
    conn.execute(
        "UPDATE counted SET counted = '{\"window\": 3}' WHERE dimension = 'requests'",
        [],
    )
    .unwrap();
    let (_, reason) = unreadable(StateFile::open(&d, OnUnreadable::Refuse).unwrap_err());
    assert!(
        reason.contains("row ") && reason.contains("scope \"day\"") && reason.contains("requests"),
        "{reason}"
    );
    conn.execute("DELETE FROM counted", []).unwrap();
    conn.pragma_update(None, "user_version", 7).unwrap();
    let (_, reason) = unreadable(StateFile::open(&d, OnUnreadable::Refuse).unwrap_err());
    assert!(reason.contains("schema 7"), "{reason}");
    drop(conn);
    let _ = std::fs::remove_dir_all(&d);
}

// proves: DQ-8 (a state directory that cannot be created is an error
// naming it)
#[test]
fn an_impossible_directory_is_named() {
    let d = dir("file-in-the-way");
    std::fs::create_dir_all(&d).unwrap();
    let blocker = d.join("blocker");
    std::fs::write(&blocker, b"x").unwrap();
    let e = StateFile::open(&blocker.join("state"), OnUnreadable::StartEmpty).unwrap_err();
    assert!(matches!(e, StateError::Dir { .. }), "{e:?}");
    assert!(e.to_string().contains("blocker"), "{e}");
    let _ = std::fs::remove_dir_all(&d);
}

// proves: DQ-8 (every cost limit is kept whatever its window; other
// dimensions only from one hour and on calendar windows)
#[test]
fn cost_limits_are_kept_whatever_their_window() {
    let minute = Duration::from_secs(60);
    assert!(tollgate_state::keep(&Limit::new(
        Dimension::Cost,
        1_000_000,
        minute
    )));
    assert!(!tollgate_state::keep(&Limit::new(
        Dimension::Tokens,
        1_000,
        minute
    )));
    assert!(tollgate_state::keep(&Limit::new(
        Dimension::Tokens,
        1_000,
        Duration::from_secs(3_600)
    )));
}

// proves: DQ-8, BUD-2 (a budget is kept whatever its window: the money a
// process spent in a one-minute budget is still spent for the next process
// on the same state directory)
#[tokio::test(start_paused = true)]
async fn a_restart_keeps_a_budget_spent() {
    // 50 micro-dollars a minute; each call's worst case is 10 input tokens
    // at one micro-dollar a token: 5 calls.
    let budget = |utc: SystemTime| {
        AdmissionController::builder()
            .config(ControllerConfig {
                scopes: vec![ScopeConfig::new("spend").cost(50, Duration::from_secs(60))],
                ..ControllerConfig::default()
            })
            .clock(Arc::new(AnchoredClock::new(utc)))
            .build()
            .unwrap()
    };
    let spend = |controller: AdmissionController| async move {
        let call = Call::new(ScopeId::FIRST)
            .with_estimate(TokenEstimate::new(10, 0))
            .with_price(tollgate::Price::new(1_000_000, 1_000_000));
        let mut n = 0;
        while n < 10 {
            let deadline = Deadline::from_timeout(Some(Duration::from_millis(1)), Instant::now());
            match controller.acquire(&call, deadline).await {
                Ok(lease) => drop(lease),
                Err(_) => break,
            }
            n += 1;
        }
        (controller, n)
    };
    let d = dir("budget");
    let file = StateFile::open(&d, OnUnreadable::Refuse).unwrap();
    let (first, n) = spend(budget(start())).await;
    assert_eq!(n, 5, "the budget holds five calls");
    assert_eq!(file.save(&[("upstream", &first)]).unwrap(), 1);
    drop((first, file));

    tokio::time::advance(Duration::from_secs(10)).await;
    let file = StateFile::open(&d, OnUnreadable::Refuse).unwrap();
    let second = budget(start() + Duration::from_secs(10));
    assert_eq!(file.restore("upstream", &second), 1);
    let (second, n) = spend(second).await;
    assert_eq!(n, 0, "the minute's budget was spent before the restart");
    // A minute after the spending: the whole budget again.
    tokio::time::advance(Duration::from_secs(60)).await;
    assert_eq!(spend(second).await.1, 5);
    let _ = std::fs::remove_dir_all(&d);
}

// proves: DQ-8 (a damaged row of two saved entries of 2⁶³ tokens each is
// restored without overflow and keeps the day's token limit spent)
#[tokio::test(start_paused = true)]
async fn huge_saved_amounts_are_restored_without_overflow() {
    let d = dir("huge");
    drop(StateFile::open(&d, OnUnreadable::Refuse).unwrap());
    let until = (start() + Duration::from_secs(3_600))
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    let half = 1_u64 << 63;
    let conn = rusqlite::Connection::open(d.join(FILE_NAME)).unwrap();
    conn.execute(
        "INSERT INTO counted (owner, scope, dimension, amount, window_ns, period, zone, counted)
         VALUES ('upstream', 'day', 'tokens', 1000000, 86400000000000, NULL, NULL, ?1)",
        [format!(
            "{{\"until\": [[{until}, {half}], [{until}, {half}]]}}"
        )],
    )
    .unwrap();
    drop(conn);
    let file = StateFile::open(&d, OnUnreadable::Refuse).unwrap();
    let controller = process(1_000, start());
    assert_eq!(file.restore("upstream", &controller), 1);
    assert_eq!(
        admitted_now(&controller, 1).await,
        0,
        "the restored tokens counted nothing"
    );
    let _ = std::fs::remove_dir_all(&d);
}

fn set_aside(d: &std::path::Path) -> Vec<String> {
    std::fs::read_dir(d)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n.contains(".unreadable-"))
        .collect()
}

// proves: DQ-8 (one process per state directory: a second one opening the
// directory while the first holds it is refused, even when told to start
// empty, and the first one's file is neither moved aside nor overwritten;
// once the first is gone the directory opens. Found in review: both opened
// it, each full rewrite deleting the other's rows, and the counts of the
// one that saved first were lost at the next restart)
#[tokio::test(start_paused = true)]
async fn a_second_process_on_the_directory_is_refused() {
    let d = dir("two-processes");
    let first = StateFile::open(&d, OnUnreadable::Refuse).unwrap();
    let a = process(5, start());
    assert_eq!(admitted_now(&a, 3).await, 3);
    assert_eq!(first.save(&[("upstream", &a)]).unwrap(), 1);
    for on_unreadable in [OnUnreadable::Refuse, OnUnreadable::StartEmpty] {
        let e = StateFile::open(&d, on_unreadable).unwrap_err();
        assert!(
            matches!(&e, StateError::InUse { path } if path == &d.join(FILE_NAME)),
            "{e:?}"
        );
        assert!(e.to_string().contains("another process"), "{e}");
    }
    assert_eq!(set_aside(&d), Vec::<String>::new(), "nothing moved aside");
    // The first process goes on saving.
    assert_eq!(admitted_now(&a, 1).await, 1);
    assert_eq!(first.save(&[("upstream", &a)]).unwrap(), 1);
    drop((a, first));

    let second = StateFile::open(&d, OnUnreadable::Refuse).unwrap();
    assert_eq!(second.loaded_scopes(), 1);
    let b = process(5, start());
    assert_eq!(second.restore("upstream", &b), 1);
    assert_eq!(admitted_now(&b, 10).await, 1, "4 of 5 counted");
    let _ = std::fs::remove_dir_all(&d);
}

// proves: DQ-8 (a state file another program holds locked, e.g. a write
// transaction left open in a sqlite3 shell, is in use, not unreadable:
// told to start empty, the process still does not move it aside)
#[test]
fn a_file_locked_by_another_program_is_not_moved_aside() {
    let d = dir("locked");
    drop(StateFile::open(&d, OnUnreadable::Refuse).unwrap());
    let other = rusqlite::Connection::open(d.join(FILE_NAME)).unwrap();
    other
        .execute_batch("PRAGMA locking_mode = EXCLUSIVE; BEGIN EXCLUSIVE; COMMIT;")
        .unwrap();
    let e = StateFile::open(&d, OnUnreadable::StartEmpty).unwrap_err();
    assert!(matches!(e, StateError::InUse { .. }), "{e:?}");
    assert_eq!(set_aside(&d), Vec::<String>::new(), "nothing moved aside");
    drop(other);
    let _ = std::fs::remove_dir_all(&d);
}

/// A process without scope "day": scope "other" only.
fn process_without_day(utc: SystemTime) -> AdmissionController {
    AdmissionController::builder()
        .config(ControllerConfig {
            scopes: vec![ScopeConfig::new("other").limit(Limit::per(
                Dimension::Requests,
                9,
                Calendar::new(Period::Day),
            ))],
            ..ControllerConfig::default()
        })
        .clock(Arc::new(AnchoredClock::new(utc)))
        .build()
        .unwrap()
}

// proves: DQ-8 (a scope a run's configuration leaves out keeps its saved
// count while it still counts: the run's saves, full rewrites included, do
// not drop it, and a later run that configures it again counts the day
// spent; once nothing of it counts any more a full rewrite drops it. Found
// in review: the first save of a run without the scope deleted its rows,
// and the run after it handed the scope a fresh day)
#[tokio::test(start_paused = true)]
async fn a_scope_left_out_for_a_run_keeps_its_day() {
    let d = dir("left-out");
    let file = StateFile::open(&d, OnUnreadable::Refuse).unwrap();
    let first = process(5, start());
    assert_eq!(admitted_now(&first, 3).await, 3);
    assert_eq!(file.save(&[("upstream", &first)]).unwrap(), 1);
    drop((first, file));

    // A run whose configuration lacks "day" (a mistake, a rename undone).
    tokio::time::advance(Duration::from_secs(60)).await;
    let file = StateFile::open(&d, OnUnreadable::Refuse).unwrap();
    let without = process_without_day(start() + Duration::from_secs(60));
    assert_eq!(file.restore("upstream", &without), 0);
    assert_eq!(admitted_now(&without, 1).await, 1);
    file.save(&[("upstream", &without)]).unwrap();
    file.rewrite_all();
    file.save(&[("upstream", &without)]).unwrap();
    drop((without, file));

    // "day" is back, the same UTC day: 3 of 5 spent.
    tokio::time::advance(Duration::from_secs(60)).await;
    let file = StateFile::open(&d, OnUnreadable::Refuse).unwrap();
    assert_eq!(file.loaded_scopes(), 2, "day and other");
    let back = process(5, start() + Duration::from_secs(120));
    assert_eq!(file.restore("upstream", &back), 1);
    assert_eq!(admitted_now(&back, 10).await, 2, "3 of 5 spent");
    drop((back, file));

    // The next UTC day, before the tokens saved at 22:00 leave the rolling
    // day: still kept; after: a run without "day" drops what counts
    // nothing.
    tokio::time::advance(Duration::from_secs(86_220)).await;
    let file = StateFile::open(&d, OnUnreadable::Refuse).unwrap();
    let without = process_without_day(start() + Duration::from_secs(86_340));
    file.save(&[("upstream", &without)]).unwrap();
    drop((without, file));
    let file = StateFile::open(&d, OnUnreadable::Refuse).unwrap();
    assert_eq!(
        file.loaded_scopes(),
        2,
        "the rolling day's tokens still count"
    );
    drop(file);
    tokio::time::advance(Duration::from_secs(7_200)).await;
    let file = StateFile::open(&d, OnUnreadable::Refuse).unwrap();
    let without = process_without_day(start() + Duration::from_secs(93_540));
    file.save(&[("upstream", &without)]).unwrap();
    drop((without, file));
    let file = StateFile::open(&d, OnUnreadable::Refuse).unwrap();
    assert_eq!(file.loaded_scopes(), 1, "other only");
    let _ = std::fs::remove_dir_all(&d);
}

/// Scope "s" with one requests limit, on tokio's paused clock at `utc`.
fn one_limit(limit: Limit, utc: SystemTime) -> AdmissionController {
    AdmissionController::builder()
        .config(ControllerConfig {
            scopes: vec![ScopeConfig::new("s").limit(limit)],
            ..ControllerConfig::default()
        })
        .clock(Arc::new(AnchoredClock::new(utc)))
        .build()
        .unwrap()
}

// proves: DQ-8, Q-2 (a calendar day changed to a rolling day while the
// process was down, restarted just after midnight: what the calendar day
// spent before midnight is within the rolling day and stays counted until
// a day after the day's end; found in review: an ended window counted
// nothing, and the rolling day admitted its whole limit again 40 minutes
// after it had been spent)
#[tokio::test(start_paused = true)]
async fn an_ended_calendar_day_seeds_the_rolling_day_it_overlaps() {
    let d = dir("calendar-to-rolling");
    let file = StateFile::open(&d, OnUnreadable::Refuse).unwrap();
    // 23:50 UTC: the calendar day spent.
    tokio::time::advance(Duration::from_secs(6_600)).await;
    let calendar = Limit::per(Dimension::Requests, 5, Calendar::new(Period::Day));
    let first = one_limit(calendar, start() + Duration::from_secs(6_600));
    assert_eq!(admitted_now(&first, 10).await, 5);
    assert_eq!(file.save(&[("upstream", &first)]).unwrap(), 1);
    drop((first, file));

    // 00:30 UTC, now 5 per rolling day.
    tokio::time::advance(Duration::from_secs(2_400)).await;
    let file = StateFile::open(&d, OnUnreadable::Refuse).unwrap();
    let rolling = Limit::new(Dimension::Requests, 5, Duration::from_secs(86_400));
    let second = one_limit(rolling, start() + Duration::from_secs(9_000));
    assert!(file.restore("upstream", &second) == 1);
    assert_eq!(admitted_now(&second, 10).await, 0, "spent at 23:50");
    // A day after the calendar day's end (at most: counted as at midnight
    // or later, never earlier than spent), the rolling day is free again.
    tokio::time::advance(Duration::from_secs(86_400)).await;
    assert_eq!(admitted_now(&second, 10).await, 5);
    let _ = std::fs::remove_dir_all(&d);
}

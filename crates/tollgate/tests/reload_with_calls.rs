//! Reloads (SPEC GW-15) with calls in flight and queued, on local scopes:
//! a concurrency cap lowered below the permits held, a scope removed while
//! calls hold leases on it and others wait, a dimension removed, a window
//! changed, then `close()`. Every queued call is admitted when it fits or
//! fails with a typed error; nothing leaks (idle, and the whole limit back
//! after the window). All on paused time: exact instants.

mod common;

use std::time::Duration;

use common::{assert_idle, available, available_at, plain, secs, settle, tokens};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tollgate::config::{ControllerConfig, MINUTE, ScopeConfig};
use tollgate::quota::Dimension;
use tollgate::{AdmissionController, AdmissionError, Call, Deadline, Lease};

fn config(scopes: Vec<ScopeConfig>, concurrency: Option<u64>) -> ControllerConfig {
    ControllerConfig {
        scopes,
        concurrency,
        ..ControllerConfig::default()
    }
}

/// Acquires `call` in a task; its result is how long after `t0` it was
/// admitted, with its lease.
fn spawn(
    c: &AdmissionController,
    call: Call,
    t0: Instant,
    deadline: Deadline,
) -> JoinHandle<Result<(Duration, Lease), AdmissionError>> {
    let c = c.clone();
    tokio::spawn(async move {
        let lease = c.acquire(&call, deadline).await?;
        Ok((Instant::now() - t0, lease))
    })
}

// proves: GW-15, POOL-1, ADM-7 (a concurrency cap lowered below the
// permits held: nothing new starts until the holders are below the new
// cap, then the waiters start one at a time in order; every permit comes
// back and `close()` completes)
#[tokio::test(start_paused = true)]
async fn a_cap_lowered_below_the_permits_held() {
    let scope = || ScopeConfig::new("m").requests(100, MINUTE);
    let c = AdmissionController::new(config(vec![scope()], Some(3))).unwrap();
    let t0 = Instant::now();
    let mut held = Vec::new();
    for _ in 0..3 {
        held.push(c.acquire(&plain(), Deadline::NONE).await.unwrap());
    }
    let a = spawn(&c, plain(), t0, Deadline::NONE);
    settle().await;
    let b = spawn(&c, plain(), t0, Deadline::NONE);
    settle().await;
    c.reconfigure(config(vec![scope()], Some(1))).unwrap();
    settle().await;
    assert_eq!(c.snapshot().active, 3);
    // Two of three back: still one held, the cap is 1.
    held.pop();
    held.pop();
    settle().await;
    assert!(!a.is_finished() && !b.is_finished(), "over the lowered cap");
    assert_eq!(c.snapshot().active, 1);
    tokio::time::advance(secs(1)).await;
    held.pop();
    settle().await;
    assert!(a.is_finished(), "the first waiter did not start");
    assert!(!b.is_finished(), "two started under a cap of 1");
    let (at, lease) = a.await.unwrap().unwrap();
    assert_eq!(at, secs(1));
    assert_eq!(c.snapshot().active, 1);
    tokio::time::advance(secs(1)).await;
    drop(lease);
    let (at, lease) = b.await.unwrap().unwrap();
    assert_eq!(at, secs(2));
    drop(lease);
    assert_idle(&c);
    tokio::time::timeout(secs(1), c.close())
        .await
        .expect("close() completes");
}

// proves: GW-15, Q-9, LC-7 (a scope removed while calls hold leases on it
// and others wait: the waiters finish there, admitted when they fit under
// its limits; the leases settle there; nothing of it is left held when it
// is configured again, and `close()` completes)
#[tokio::test(start_paused = true)]
async fn a_scope_removed_with_leases_and_waiters() {
    let keep = || ScopeConfig::new("keep").requests(100, MINUTE);
    let gone = || ScopeConfig::new("gone").requests(2, MINUTE);
    let c = AdmissionController::new(config(vec![keep(), gone()], Some(10))).unwrap();
    let g = c.scope_id("gone").unwrap();
    let t0 = Instant::now();
    let mut first = c.acquire(&Call::new(g), Deadline::NONE).await.unwrap();
    let second = c.acquire(&Call::new(g), Deadline::NONE).await.unwrap();
    let waits = spawn(&c, Call::new(g), t0, Deadline::NONE);
    settle().await;
    let late = spawn(&c, Call::new(g), t0, Deadline::after(secs(30)));
    settle().await;
    c.reconfigure(config(vec![keep()], Some(10))).unwrap();
    assert!(c.scope_id("gone").is_none());
    // A new call by the retired ordinal is still judged there (its limit
    // is spent): the early verdict holds.
    tokio::time::advance(secs(1)).await;
    first.reconcile(tollgate::Usage::from_io(0, 0)).unwrap();
    drop(first);
    drop(second);
    settle().await;
    assert!(!waits.is_finished(), "over its limit in its window");
    match late.await.unwrap() {
        Err(AdmissionError::DeadlineExceeded { .. }) => {}
        other => panic!("expected DeadlineExceeded, got {:?}", other.map(|(d, _)| d)),
    }
    tokio::time::advance(MINUTE - secs(1)).await;
    let (at, lease) = waits.await.unwrap().unwrap();
    assert_eq!(at, MINUTE);
    drop(lease);
    assert_idle(&c);
    // Configured again: the same scope, nothing held, the window's one
    // admission still counted until it ages out.
    c.reconfigure(config(vec![keep(), gone()], Some(10)))
        .unwrap();
    let s = c.snapshot();
    let back = s.scope_named("gone").unwrap();
    assert_eq!((back.queued, back.pending), (0, 0));
    assert_eq!(available_at(&s, g.index(), Dimension::Requests), 1);
    tokio::time::advance(MINUTE).await;
    assert_eq!(
        available_at(&c.snapshot(), g.index(), Dimension::Requests),
        2
    );
    tokio::time::timeout(secs(1), c.close())
        .await
        .expect("close() completes");
}

// proves: GW-15, Q-1 (a token limit removed while calls wait for tokens:
// the request limit alone judges them, so they are admitted at once; the
// tokens they reserved before count nowhere, and the request units come
// back after the window)
#[tokio::test(start_paused = true)]
async fn a_dimension_removed_admits_the_waiters() {
    let both = || {
        ScopeConfig::new("m")
            .requests(10, MINUTE)
            .tokens(100, MINUTE)
    };
    let c = AdmissionController::new(config(vec![both()], None)).unwrap();
    let t0 = Instant::now();
    let held = c.acquire(&tokens(90), Deadline::NONE).await.unwrap();
    let a = spawn(&c, tokens(50), t0, Deadline::NONE);
    settle().await;
    let b = spawn(&c, tokens(80), t0, Deadline::NONE);
    settle().await;
    tokio::time::advance(secs(1)).await;
    let requests = ScopeConfig::new("m").requests(10, MINUTE);
    c.reconfigure(config(vec![requests], None)).unwrap();
    let (at_a, la) = a.await.unwrap().unwrap();
    let (at_b, lb) = b.await.unwrap().unwrap();
    assert_eq!((at_a, at_b), (secs(1), secs(1)));
    assert_eq!(available(&c, Dimension::Requests), 7);
    drop((held, la, lb));
    assert_idle(&c);
    tokio::time::advance(MINUTE).await;
    assert_eq!(available(&c, Dimension::Requests), 10);
}

// proves: GW-15, Q-7 (a window shortened while calls are in flight and
// queued: the queued calls are admitted when both the old window in
// progress and the new one allow, never over either; all come back)
#[tokio::test(start_paused = true)]
async fn a_window_changed_with_calls_queued() {
    let c = AdmissionController::new(config(
        vec![ScopeConfig::new("m").requests(4, MINUTE)],
        Some(10),
    ))
    .unwrap();
    let t0 = Instant::now();
    let mut held = Vec::new();
    for _ in 0..4 {
        held.push(c.acquire(&plain(), Deadline::NONE).await.unwrap());
    }
    let calls: Vec<_> = (0..3)
        .map(|_| spawn(&c, plain(), t0, Deadline::NONE))
        .collect();
    settle().await;
    tokio::time::advance(secs(5)).await;
    // 4 per 10 s: the new window holds the 4 until t0 + 15 s, the old
    // minute until t0 + 60 s (its first admissions leave it).
    c.reconfigure(config(
        vec![ScopeConfig::new("m").requests(4, secs(10))],
        Some(10),
    ))
    .unwrap();
    let mut at = Vec::new();
    for call in calls {
        let (d, lease) = call.await.unwrap().unwrap();
        at.push(d);
        held.push(lease);
    }
    assert_eq!(at, vec![MINUTE; 3]);
    drop(held);
    assert_idle(&c);
    tokio::time::advance(MINUTE).await;
    assert_eq!(available(&c, Dimension::Requests), 4);
}

// proves: GW-15, LC-7, Q-9 (a reload with calls queued behind a lowered
// limit, then `close()`: every waiter fails with `Closed`, holding
// nothing; `close()` completes once the leases drop)
#[tokio::test(start_paused = true)]
async fn close_after_a_reload_with_waiters() {
    let c = AdmissionController::new(config(
        vec![ScopeConfig::new("m").requests(3, MINUTE)],
        Some(3),
    ))
    .unwrap();
    let t0 = Instant::now();
    let mut leases = Vec::new();
    for _ in 0..3 {
        leases.push(c.acquire(&plain(), Deadline::NONE).await.unwrap());
    }
    let waiters: Vec<_> = (0..3)
        .map(|_| spawn(&c, plain(), t0, Deadline::NONE))
        .collect();
    settle().await;
    c.reconfigure(config(
        vec![ScopeConfig::new("m").requests(1, MINUTE)],
        Some(1),
    ))
    .unwrap();
    settle().await;
    assert_eq!(c.snapshot().scopes[0].queued, 3);
    let closing = {
        let c = c.clone();
        tokio::spawn(async move { c.close().await })
    };
    settle().await;
    for w in waiters {
        assert!(matches!(w.await.unwrap(), Err(AdmissionError::Closed)));
    }
    leases.pop();
    leases.pop();
    settle().await;
    assert!(!closing.is_finished(), "closed with a lease held");
    drop(leases);
    tokio::time::timeout(secs(1), closing)
        .await
        .expect("close() completes")
        .unwrap();
    assert_idle(&c);
}

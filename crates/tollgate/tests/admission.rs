//! Admission controller behaviour: FIFO, bounded queue, concurrency, ids,
//! close and snapshot (SPEC §3, LC-7, OBS-1). All on paused time.

mod common;

use std::sync::Arc;

use common::*;
use parking_lot::Mutex;
use tokio::time::Instant;
use tollgate::config::{MINUTE, Overflow, ScopeConfig};
use tollgate::quota::Dimension;
use tollgate::{AdmissionController, AdmissionError, CallId, Deadline, ScopeId, Usage};

fn rpm(n: u64) -> AdmissionController {
    AdmissionController::builder()
        .scope(ScopeConfig::new("main").requests(n, MINUTE))
        .build()
        .unwrap()
}

// proves: Q-9 (a request unit is spent by the lease, not refunded on release)
#[tokio::test(start_paused = true)]
async fn fast_path_admits_and_spends_one_request_unit() {
    let c = rpm(2);
    let lease = c.acquire(&plain(), Deadline::NONE).await.unwrap();
    assert_eq!(available(&c, Dimension::Requests), 1);
    assert_eq!(c.snapshot().active, 1);
    drop(lease);
    assert_eq!(available(&c, Dimension::Requests), 1);
    assert_idle(&c);
}

// proves: Q-4 (the head is admitted at the exact instant the window frees)
#[tokio::test(start_paused = true)]
async fn head_wakes_exactly_when_the_window_frees() {
    let c = rpm(2);
    let t0 = Instant::now();
    let _a = c.acquire(&plain(), Deadline::NONE).await.unwrap();
    tokio::time::advance(secs(10)).await;
    let _b = c.acquire(&plain(), Deadline::NONE).await.unwrap();
    let third = c.acquire(&plain(), Deadline::NONE).await.unwrap();
    assert_eq!(Instant::now() - t0, secs(60));
    assert_eq!(third.admission().quota_wait, secs(50));
    assert!(third.admission().limited_by.requests);
    let fourth = c.acquire(&plain(), Deadline::NONE).await.unwrap();
    assert_eq!(Instant::now() - t0, secs(70));
    drop((third, fourth));
}

// proves: ADM-4 (a later small request never overtakes an earlier large one)
#[tokio::test(start_paused = true)]
async fn fifo_holds_with_a_large_head_and_small_followers() {
    let c = AdmissionController::builder()
        .scope(ScopeConfig::new("main").tokens(100, MINUTE))
        .build()
        .unwrap();
    let t0 = Instant::now();
    let first = c.acquire(&tokens(90), Deadline::NONE).await.unwrap();
    let order = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for (name, n) in [("large", 50u64), ("small-1", 5), ("small-2", 5)] {
        let (c, order) = (c.clone(), order.clone());
        tasks.push(tokio::spawn(async move {
            let lease = c.acquire(&tokens(n), Deadline::NONE).await.unwrap();
            order.lock().push((name, Instant::now() - t0));
            lease
        }));
        settle().await;
    }
    // 10 tokens are free, enough for the small ones, yet nobody passes the
    // large head.
    assert!(order.lock().is_empty());
    assert_eq!(c.snapshot().scopes[0].queued, 3);
    let mut leases = Vec::new();
    for t in tasks {
        leases.push(t.await.unwrap());
    }
    assert_eq!(
        *order.lock(),
        [
            ("large", secs(60)),
            ("small-1", secs(60)),
            ("small-2", secs(60))
        ]
    );
    drop((first, leases));
    assert_idle(&c);
}

// proves: ADM-5 (overflow policy reject fails at once with QueueFull)
#[tokio::test(start_paused = true)]
async fn full_queue_with_reject_fails_at_once() {
    let c = AdmissionController::builder()
        .scope(ScopeConfig::new("main").requests(1, MINUTE))
        .queue_capacity(2)
        .overflow(Overflow::Reject)
        .build()
        .unwrap();
    let _a = c.acquire(&plain(), Deadline::NONE).await.unwrap();
    let mut waiting = Vec::new();
    for _ in 0..2 {
        let c = c.clone();
        waiting.push(tokio::spawn(async move {
            c.acquire(&plain(), Deadline::NONE).await
        }));
    }
    settle().await;
    let t = Instant::now();
    let err = c.acquire(&plain(), Deadline::NONE).await.unwrap_err();
    assert_eq!(
        err,
        AdmissionError::QueueFull {
            scope: ScopeId::FIRST
        }
    );
    assert_eq!(Instant::now(), t);
    assert_eq!(c.snapshot().scopes[0].queued, 2);
    for w in waiting {
        w.abort();
    }
}

// proves: ADM-5, ADM-7 (overflow policy wait back-pressures the producer;
// queued and waiting-for-slot are counted apart)
#[tokio::test(start_paused = true)]
async fn full_queue_with_wait_back_pressures() {
    let c = AdmissionController::builder()
        .scope(ScopeConfig::new("main").requests(1, MINUTE))
        .queue_capacity(1)
        .build()
        .unwrap();
    let t0 = Instant::now();
    let _a = c.acquire(&plain(), Deadline::NONE).await.unwrap();
    let mut tasks = Vec::new();
    for _ in 0..3 {
        let c = c.clone();
        tasks.push(tokio::spawn(async move {
            let lease = c.acquire(&plain(), Deadline::NONE).await.unwrap();
            (Instant::now() - t0, lease)
        }));
        settle().await;
    }
    let s = c.snapshot();
    assert_eq!((s.scopes[0].queued, s.scopes[0].waiting_for_slot), (1, 2));
    let mut admitted = Vec::new();
    for t in tasks {
        admitted.push(t.await.unwrap().0);
    }
    assert_eq!(admitted, [secs(60), secs(120), secs(180)]);
}

// proves: ADM-2, ADM-7 (no permit is held while waiting for quota; active
// and queued are separate populations)
#[tokio::test(start_paused = true)]
async fn no_permit_is_held_while_waiting_for_quota() {
    let c = AdmissionController::builder()
        .scope(ScopeConfig::new("main").requests(1, MINUTE))
        .concurrency(2)
        .build()
        .unwrap();
    let a = c.acquire(&plain(), Deadline::NONE).await.unwrap();
    let c2 = c.clone();
    let waiter = tokio::spawn(async move { c2.acquire(&plain(), Deadline::NONE).await });
    settle().await;
    let s = c.snapshot();
    assert_eq!(s.active, 1);
    assert_eq!(s.scopes[0].queued, 1);
    assert_eq!(s.concurrency_available, Some(1));
    drop(a);
    let b = waiter.await.unwrap().unwrap();
    assert!(!b.admission().concurrency);
    drop(b);
    assert_idle(&c);
}

// proves: ADM-1 (quota first, then concurrency, with waits measured apart)
#[tokio::test(start_paused = true)]
async fn concurrency_wait_is_measured_separately() {
    let c = AdmissionController::builder()
        .concurrency(1)
        .build()
        .unwrap();
    let a = c.acquire(&plain(), Deadline::NONE).await.unwrap();
    let c2 = c.clone();
    let waiter = tokio::spawn(async move { c2.acquire(&plain(), Deadline::NONE).await });
    settle().await;
    assert_eq!(c.snapshot().scopes[0].pending, 1);
    tokio::time::advance(secs(3)).await;
    drop(a);
    let b = waiter.await.unwrap().unwrap();
    assert_eq!(b.admission().quota_wait, secs(0));
    assert_eq!(b.admission().concurrency_wait, secs(3));
    assert!(b.admission().concurrency);
    drop(b);
    assert_idle(&c);
}

// proves: ADM-6 (an id already queued or active is refused)
#[tokio::test(start_paused = true)]
async fn duplicate_ids_are_refused_while_queued_or_active() {
    let c = rpm(1);
    let id = CallId(7);
    let lease = c
        .acquire(&plain().with_id(id), Deadline::NONE)
        .await
        .unwrap();
    assert_eq!(
        c.acquire(&plain().with_id(id), Deadline::NONE)
            .await
            .unwrap_err(),
        AdmissionError::Conflict(id)
    );
    let c2 = c.clone();
    let queued = tokio::spawn(async move {
        c2.acquire(&plain().with_id(CallId(8)), Deadline::NONE)
            .await
    });
    settle().await;
    assert_eq!(
        c.acquire(&plain().with_id(CallId(8)), Deadline::NONE)
            .await
            .unwrap_err(),
        AdmissionError::Conflict(CallId(8))
    );
    queued.abort();
    settle().await;
    drop(lease);
    // Once released (or abandoned) the ids are free again.
    let c2 = c.clone();
    let again = tokio::spawn(async move { c2.acquire(&plain().with_id(id), Deadline::NONE).await });
    let again8 = tokio::spawn({
        let c = c.clone();
        async move { c.acquire(&plain().with_id(CallId(8)), Deadline::NONE).await }
    });
    assert!(again.await.unwrap().is_ok());
    assert!(again8.await.unwrap().is_ok());
}

// proves: Q-3 (token limit without estimate, and an estimate above the whole
// limit, fail before any wait)
#[tokio::test(start_paused = true)]
async fn token_limits_need_a_fitting_estimate() {
    let c = AdmissionController::builder()
        .scope(ScopeConfig::new("main").tokens(1_000, MINUTE))
        .build()
        .unwrap();
    let err = c.acquire(&plain(), Deadline::NONE).await.unwrap_err();
    assert_eq!(
        err,
        AdmissionError::TokenEstimateRequired {
            scope: ScopeId::FIRST
        }
    );
    assert!(err.is_configuration());
    let err = c.acquire(&tokens(1_001), Deadline::NONE).await.unwrap_err();
    assert!(
        matches!(err, AdmissionError::EstimateExceedsLimit(e) if e.demand == 1_001 && e.limit == 1_000)
    );
    assert!(err.is_configuration());
    assert_eq!(available(&c, Dimension::Tokens), 1_000);
}

// proves: LC-7 (close rejects new calls, aborts queued ones, tells active
// ones, awaits their release; idempotent)
#[tokio::test(start_paused = true)]
async fn close_with_queued_and_active_calls() {
    let c = AdmissionController::builder()
        .scope(ScopeConfig::new("main").requests(1, MINUTE))
        .concurrency(4)
        .build()
        .unwrap();
    let active = c.acquire(&plain(), Deadline::NONE).await.unwrap();
    let c2 = c.clone();
    let queued = tokio::spawn(async move { c2.acquire(&plain(), Deadline::NONE).await });
    settle().await;
    let holder = tokio::spawn(async move {
        active.closing().await;
        drop(active);
    });
    c.close().await;
    assert_eq!(queued.await.unwrap().unwrap_err(), AdmissionError::Closed);
    holder.await.unwrap();
    assert_eq!(
        c.acquire(&plain(), Deadline::NONE).await.unwrap_err(),
        AdmissionError::Closed
    );
    c.close().await;
    let s = c.snapshot();
    assert!(s.closed);
    assert_eq!(
        (s.active, s.scopes[0].queued, s.scopes[0].pending),
        (0, 0, 0)
    );
}

// proves: LC-7 (closing an empty controller is a no-op)
#[tokio::test(start_paused = true)]
async fn close_when_empty_returns_at_once() {
    let c = rpm(5);
    let t = Instant::now();
    c.close().await;
    c.close().await;
    assert_eq!(Instant::now(), t);
}

// proves: OBS-1 (the snapshot reports queue, limits, concurrency, closed)
#[tokio::test(start_paused = true)]
async fn snapshot_reports_every_population() {
    let c = AdmissionController::builder()
        .scope(
            ScopeConfig::new("a")
                .requests(3, MINUTE)
                .tokens(500, MINUTE),
        )
        .scope(ScopeConfig::new("b"))
        .concurrency(8)
        .queue_capacity(16)
        .build()
        .unwrap();
    assert_eq!(c.scope_id("b").map(|s| s.index()), Some(1));
    let _lease = c.acquire(&tokens(120), Deadline::NONE).await.unwrap();
    let s = c.snapshot();
    assert_eq!(s.active, 1);
    assert_eq!(s.concurrency_limit, Some(8));
    assert_eq!(s.concurrency_available, Some(7));
    assert_eq!(s.queue_capacity, 16);
    assert_eq!(s.backend, "local");
    assert_eq!(s.scopes.len(), 2);
    assert_eq!(available_at(&s, 0, Dimension::Requests), 2);
    assert_eq!(available_at(&s, 0, Dimension::Tokens), 380);
    assert!(s.scopes[1].limits.is_empty());
    assert!(!s.closed);
}

// proves: ADM-4, ADM-1 (permits are handed out in the order reservations
// were granted, however the waiting tasks happen to be scheduled)
#[tokio::test(start_paused = true)]
async fn permits_follow_the_order_of_reservations() {
    let c = AdmissionController::builder()
        .scope(ScopeConfig::new("main").tokens(100, MINUTE))
        .concurrency(1)
        .build()
        .unwrap();
    let mut holder = c.acquire(&tokens(100), Deadline::NONE).await.unwrap();
    let order = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for name in ["first", "second", "third"] {
        let (c, order) = (c.clone(), order.clone());
        tasks.push(tokio::spawn(async move {
            let lease = c.acquire(&tokens(10), Deadline::NONE).await.unwrap();
            order.lock().push(name);
            drop(lease);
        }));
        settle().await;
    }
    // All three are granted their tokens in one step, in queue order, and
    // line up for the single permit in that order.
    holder.reconcile(Usage::known(0)).unwrap();
    assert_eq!(c.snapshot().scopes[0].pending, 3);
    drop(holder);
    for t in tasks {
        t.await.unwrap();
    }
    assert_eq!(*order.lock(), ["first", "second", "third"]);
    assert_idle(&c);
}

// proves: GW-8, LC-7 (stop_admitting aborts queued calls and refuses new
// ones while active leases keep running; close then finishes them)
#[tokio::test(start_paused = true)]
async fn stop_admitting_keeps_active_calls() {
    let c = rpm(1);
    let active = c.acquire(&plain(), Deadline::NONE).await.unwrap();
    let c2 = c.clone();
    let queued = tokio::spawn(async move { c2.acquire(&plain(), Deadline::NONE).await });
    settle().await;
    c.stop_admitting();
    assert_eq!(queued.await.unwrap().unwrap_err(), AdmissionError::Closed);
    assert_eq!(
        c.acquire(&plain(), Deadline::NONE).await.unwrap_err(),
        AdmissionError::Closed
    );
    assert_eq!(c.snapshot().active, 1);
    drop(active);
    c.close().await;
    assert_eq!(c.snapshot().active, 0);
}

//! Coordinated cooldown after provider 429s (SPEC CD-1..CD-3). All on
//! paused time.

mod common;

use common::*;
use tokio::time::Instant;
use tollgate::config::{MINUTE, ScopeConfig};
use tollgate::quota::Dimension;
use tollgate::{AdmissionController, CooldownOutcome, Deadline, ScopeId};

fn controller(concurrency: Option<u64>) -> AdmissionController {
    let mut b = AdmissionController::builder().scope(
        ScopeConfig::new("main")
            .requests(100, MINUTE)
            .tokens(1_000, MINUTE),
    );
    if let Some(c) = concurrency {
        b = b.concurrency(c);
    }
    b.build().unwrap()
}

// proves: CD-1 (a 429 pauses the whole scope for the hinted time; peers
// start no provider work before it ends)
#[tokio::test(start_paused = true)]
async fn a_429_pauses_waiting_peers() {
    let c = controller(None);
    let t0 = Instant::now();
    let a = c.acquire(&tokens(10), Deadline::NONE).await.unwrap();
    let outcome = a.rate_limited(Some(secs(5)));
    assert!(matches!(
        outcome,
        CooldownOutcome::Started { generation: 1, .. }
    ));
    let mut peers = Vec::new();
    for _ in 0..3 {
        let c = c.clone();
        peers.push(tokio::spawn(async move {
            let lease = c.acquire(&tokens(10), Deadline::NONE).await.unwrap();
            (
                Instant::now(),
                lease.admission().cooldown,
                lease.generation(),
            )
        }));
    }
    for p in peers {
        let (at, cooled, generation) = p.await.unwrap();
        assert_eq!(at - t0, secs(5));
        assert!(cooled);
        assert_eq!(generation, 1);
    }
}

// proves: CD-1 (without a hint: a short exponential backoff from 1 s, reset
// by a success)
#[tokio::test(start_paused = true)]
async fn hintless_cooldowns_grow_from_one_second() {
    let c = controller(None);
    let mut lengths = Vec::new();
    for _ in 0..3 {
        let lease = c.acquire(&tokens(1), Deadline::NONE).await.unwrap();
        let start = Instant::now();
        let until = lease.rate_limited(None).until().unwrap();
        lengths.push(until - start);
        drop(lease);
        tokio::time::advance(until - start).await;
    }
    assert_eq!(lengths, [secs(1), secs(2), secs(4)]);
    c.clear_backoff(ScopeId::FIRST);
    let lease = c.acquire(&tokens(1), Deadline::NONE).await.unwrap();
    let start = Instant::now();
    assert_eq!(lease.rate_limited(None).until().unwrap() - start, secs(1));
}

// proves: CD-2 (a late 429 from an attempt that started before the running
// cooldown neither extends it nor starts another)
#[tokio::test(start_paused = true)]
async fn late_429_from_an_old_generation_does_not_extend() {
    let c = controller(None);
    let t0 = Instant::now();
    let a = c.acquire(&tokens(1), Deadline::NONE).await.unwrap();
    let b = c.acquire(&tokens(1), Deadline::NONE).await.unwrap();
    assert_eq!((a.generation(), b.generation()), (0, 0));
    assert!(matches!(
        a.rate_limited(Some(secs(2))),
        CooldownOutcome::Started { .. }
    ));
    assert_eq!(b.rate_limited(Some(secs(30))), CooldownOutcome::Stale);
    let (generation, until) = c.cooldown(ScopeId::FIRST).unwrap();
    assert_eq!((generation, until), (1, Some(t0 + secs(2))));
    assert_eq!(c.snapshot().scopes[0].counters.stale_rate_limits, 1);
    let next = c.acquire(&tokens(1), Deadline::NONE).await.unwrap();
    assert_eq!(Instant::now() - t0, secs(2));
    // An attempt of the new generation may start the next cooldown.
    assert!(matches!(
        next.rate_limited(Some(secs(3))),
        CooldownOutcome::Started { generation: 2, .. }
    ));
}

// proves: CD-3, Q-9, ADM-4 (a cooldown that begins while a granted attempt
// waits for concurrency preempts it: its reservation is refunded exactly
// once, it re-enters at the tail and is admitted after the calls that
// queued during the cooldown)
#[tokio::test(start_paused = true)]
async fn preemption_refunds_once_and_requeues_at_the_tail() {
    let c = controller(Some(1));
    let t0 = Instant::now();
    let holder = c.acquire(&tokens(10), Deadline::NONE).await.unwrap();
    let c2 = c.clone();
    let preempted = tokio::spawn(async move {
        let lease = c2.acquire(&tokens(100), Deadline::NONE).await.unwrap();
        (Instant::now(), *lease.admission())
    });
    settle().await;
    assert_eq!(c.snapshot().scopes[0].pending, 1);
    assert_eq!(available(&c, Dimension::Tokens), 890);
    holder.rate_limited(Some(secs(4)));
    tokio::time::advance(ms(500)).await;
    let c3 = c.clone();
    let queued = tokio::spawn(async move {
        let lease = c3.acquire(&tokens(1), Deadline::NONE).await.unwrap();
        let at = Instant::now();
        drop(lease);
        at
    });
    settle().await;
    drop(holder);
    settle().await;
    // Preempted: refunded, no permit held, back in the queue.
    let s = c.snapshot();
    assert_eq!(s.scopes[0].counters.preempted, 1);
    assert_eq!(s.scopes[0].counters.refunded_reservations, 1);
    assert_eq!(s.scopes[0].queued, 2);
    assert_eq!(s.concurrency_available, Some(1));
    assert_eq!(available(&c, Dimension::Tokens), 990);
    let queued_at = queued.await.unwrap();
    let (preempted_at, admission) = preempted.await.unwrap();
    assert_eq!(queued_at - t0, secs(4));
    assert_eq!(preempted_at - t0, secs(4));
    assert_eq!(admission.preemptions, 1);
    assert!(admission.cooldown);
    assert_eq!(c.snapshot().scopes[0].counters.refunded_reservations, 1);
}

// proves: CD-1, DL-7 (cancelling a call that waits out a cooldown restores
// everything)
#[tokio::test(start_paused = true)]
async fn cancel_during_cooldown_restores_everything() {
    let c = controller(Some(2));
    let a = c.acquire(&tokens(10), Deadline::NONE).await.unwrap();
    a.rate_limited(Some(secs(10)));
    drop(a);
    let c2 = c.clone();
    let waiting = tokio::spawn(async move { c2.acquire(&tokens(10), Deadline::NONE).await });
    settle().await;
    assert_eq!(c.snapshot().scopes[0].queued, 1);
    waiting.abort();
    settle().await;
    assert_idle(&c);
    assert_eq!(available(&c, Dimension::Tokens), 990);
    assert_eq!(available(&c, Dimension::Requests), 99);
}

//! One deadline across admission, early verdicts and cancellation at every
//! await point (SPEC DL-3..DL-7, Q-9, Q-11). All on paused time.

mod common;

use common::*;
use tokio::time::Instant;
use tollgate::config::{DAY, MINUTE, ScopeConfig};
use tollgate::quota::Dimension;
use tollgate::{AdmissionController, AdmissionError, Deadline, Phase, Usage};

fn build(scope: ScopeConfig) -> AdmissionController {
    AdmissionController::builder().scope(scope).build().unwrap()
}

// proves: DL-5 (a deadline already past fails before any wait, nothing spent)
#[tokio::test(start_paused = true)]
async fn past_deadline_fails_before_any_wait() {
    let c = build(ScopeConfig::new("main").requests(5, MINUTE));
    let err = c
        .acquire(&plain(), Deadline::at(Instant::now()))
        .await
        .unwrap_err();
    assert_eq!(err.phase(), Some(Phase::Queue));
    assert_eq!(available(&c, Dimension::Requests), 5);
    assert_idle(&c);
}

// proves: DL-3, DL-4 (a 3 s deadline with 2.8 s spent queueing leaves 0.2 s
// for the concurrency wait, not a fresh allowance)
#[tokio::test(start_paused = true)]
async fn time_spent_queueing_is_not_given_back() {
    let c = AdmissionController::builder()
        .scope(ScopeConfig::new("main").requests(1, ms(2_800)))
        .concurrency(1)
        .build()
        .unwrap();
    let t0 = Instant::now();
    let holder = c.acquire(&plain(), Deadline::NONE).await.unwrap();
    let err = c.acquire(&plain(), within(secs(3))).await.unwrap_err();
    assert_eq!(err.phase(), Some(Phase::Concurrency));
    assert_eq!(Instant::now() - t0, secs(3));
    // The reservation it got at 2.8 s is back.
    assert_eq!(available(&c, Dimension::Requests), 1);
    assert_eq!(c.snapshot().scopes[0].pending, 0);
    drop(holder);
    assert_idle(&c);
}

// proves: Q-11 (a spent day window answers at once with the instant as a hint)
#[tokio::test(start_paused = true)]
async fn spent_day_window_answers_at_once() {
    let c = build(ScopeConfig::new("main").requests(1, DAY));
    let t0 = Instant::now();
    let _lease = c.acquire(&plain(), Deadline::NONE).await.unwrap();
    let err = c.acquire(&plain(), within(secs(60))).await.unwrap_err();
    assert_eq!(Instant::now(), t0);
    assert_eq!(
        err,
        AdmissionError::DeadlineExceeded {
            phase: Phase::Rate,
            retry_at: Some(t0 + DAY)
        }
    );
    assert_eq!(c.snapshot().scopes[0].queued, 0);
}

// proves: Q-11 (max_wait bounds the wait even without a deadline)
#[tokio::test(start_paused = true)]
async fn max_wait_fails_early_with_quota_wait_too_long() {
    let c = AdmissionController::builder()
        .scope(ScopeConfig::new("main").requests(1, DAY))
        .max_wait(secs(60))
        .build()
        .unwrap();
    let t0 = Instant::now();
    let _lease = c.acquire(&plain(), Deadline::NONE).await.unwrap();
    let err = c.acquire(&plain(), Deadline::NONE).await.unwrap_err();
    assert!(matches!(
        err,
        AdmissionError::QuotaWaitTooLong { ready_at, wait, max_wait }
            if ready_at == t0 + DAY && wait == DAY && max_wait == secs(60)
    ));
    assert_eq!(err.retry_at(), Some(t0 + DAY));
}

// proves: Q-11 (the early verdict counts the reservations queued ahead)
#[tokio::test(start_paused = true)]
async fn early_verdict_counts_the_queue_ahead() {
    let c = build(ScopeConfig::new("main").requests(1, MINUTE));
    let t0 = Instant::now();
    let _a = c.acquire(&plain(), Deadline::NONE).await.unwrap();
    let c2 = c.clone();
    let queued = tokio::spawn(async move { c2.acquire(&plain(), Deadline::NONE).await });
    settle().await;
    // Alone it would fit at 60 s, but the queued call takes that slot: 120 s.
    let err = c.acquire(&plain(), within(secs(90))).await.unwrap_err();
    assert_eq!(
        err,
        AdmissionError::DeadlineExceeded {
            phase: Phase::Rate,
            retry_at: Some(t0 + secs(120))
        }
    );
    assert_eq!(Instant::now(), t0);
    let c3 = c.clone();
    let fits = tokio::spawn(async move { c3.acquire(&plain(), within(secs(130))).await });
    let _b = queued.await.unwrap().unwrap();
    let _c = fits.await.unwrap().unwrap();
    assert_eq!(Instant::now() - t0, secs(120));
}

// proves: Q-11 (the early verdict is a lower bound with a granted call
// waiting for its permit: the projection counts that reservation from now,
// as its earliest start, not for ever, so a call admitted in time is not
// refused, and the instant projected is the one it is admitted at)
#[tokio::test(start_paused = true)]
async fn early_verdict_counts_a_pending_grant_from_now() {
    use tollgate::config::PoolConfig;
    use tollgate::{Call, Lease};
    let c = AdmissionController::builder()
        .scope(ScopeConfig::new("limited").requests(2, secs(10)))
        .scope(ScopeConfig::new("other"))
        .pool(PoolConfig::new("p", 1))
        .build()
        .unwrap();
    let limited = c.scope_id("limited").unwrap();
    let other = c.scope_id("other").unwrap();
    let p = c.pool_id("p").unwrap();
    let spawn = |call: Call, deadline: Deadline| spawn_acquire(&c, call, deadline);
    let t0 = Instant::now();
    // A holds the pool's only permit, spending nothing of `limited`.
    let a = c
        .acquire(&Call::new(other).with_pool(p), Deadline::NONE)
        .await
        .unwrap();
    // B is granted on `limited` and waits for the permit (pending).
    let b = spawn(Call::new(limited).with_pool(p), Deadline::NONE);
    settle().await;
    // X fills `limited` at t0.
    let x = c
        .acquire(&Call::new(limited), Deadline::NONE)
        .await
        .unwrap();
    tokio::time::advance(secs(1)).await;
    // C2 waits for X's unit to age out at t0 + 10 s.
    let c2 = spawn(Call::new(limited), Deadline::NONE);
    settle().await;
    // B starts no earlier than t0 + 1 s, so its unit frees no later than
    // t0 + 11 s: the next call could be admitted then.
    let forecast = c.forecast(limited, None).unwrap();
    assert_eq!(forecast.ready_at, Some(t0 + secs(11)));
    let c3 = spawn(Call::new(limited), Deadline::at(t0 + secs(14)));
    settle().await;
    assert!(!c3.is_finished(), "refused at once: {:?}", c3.await);
    // The permit frees now: B starts at t0 + 1 s.
    drop(a);
    let (b_at, b): (Instant, Lease) = b.await.unwrap().unwrap();
    assert_eq!(b_at - t0, secs(1));
    drop((b, x));
    let (c2_at, _c2) = c2.await.unwrap().unwrap();
    assert_eq!(c2_at - t0, secs(10));
    let (c3_at, _c3) = c3.await.unwrap().unwrap();
    assert_eq!(c3_at - t0, secs(11));
}

// proves: DL-6 (deadline while queued behind the head: phase queue; while at
// the head in a cooldown: phase cooldown, at once once it cannot be met)
#[tokio::test(start_paused = true)]
async fn deadline_phases_in_the_queue() {
    let c = build(ScopeConfig::new("main").requests(1, MINUTE));
    let t0 = Instant::now();
    let _a = c.acquire(&plain(), Deadline::NONE).await.unwrap();
    let c2 = c.clone();
    let head = tokio::spawn(async move { c2.acquire(&plain(), within(secs(100))).await });
    settle().await;
    let c3 = c.clone();
    let follower = tokio::spawn(async move { c3.acquire(&plain(), within(secs(150))).await });
    settle().await;
    // A long cooldown begins: the head can no longer make its deadline and
    // learns it at once; the follower waits until its own deadline.
    c.start_cooldown(tollgate::ScopeId::FIRST, secs(200))
        .unwrap();
    let err = head.await.unwrap().unwrap_err();
    assert_eq!(
        err,
        AdmissionError::DeadlineExceeded {
            phase: Phase::Cooldown,
            retry_at: Some(t0 + secs(200))
        }
    );
    assert_eq!(Instant::now(), t0);
    let err = follower.await.unwrap().unwrap_err();
    // The follower became head of a cooling scope and was judged at once too.
    assert_eq!(err.phase(), Some(Phase::Cooldown));
    assert_eq!(c.snapshot().scopes[0].queued, 0);
}

// proves: DL-6 (a waiter behind the head whose deadline passes fails in
// phase queue, and leaves the queue)
#[tokio::test(start_paused = true)]
async fn deadline_behind_the_head_is_phase_queue() {
    let c = AdmissionController::builder()
        .scope(ScopeConfig::new("main").tokens(100, MINUTE))
        .build()
        .unwrap();
    let t0 = Instant::now();
    let mut big = c.acquire(&tokens(100), Deadline::NONE).await.unwrap();
    let c2 = c.clone();
    let head = tokio::spawn(async move { c2.acquire(&tokens(100), Deadline::NONE).await });
    settle().await;
    // Projected at 120 s (behind the head), within its 130 s deadline...
    let c3 = c.clone();
    let follower = tokio::spawn(async move { c3.acquire(&tokens(10), within(secs(130))).await });
    settle().await;
    // ...but then a cooldown longer than its deadline begins. The head has
    // no deadline and keeps waiting; the follower, still behind it, runs out
    // of time in the queue.
    big.reconcile(Usage::known(100)).unwrap();
    c.start_cooldown(tollgate::ScopeId::FIRST, secs(200))
        .unwrap();
    let err = follower.await.unwrap().unwrap_err();
    assert_eq!(
        err,
        AdmissionError::DeadlineExceeded {
            phase: Phase::Queue,
            retry_at: None
        }
    );
    assert_eq!(Instant::now() - t0, secs(130));
    assert_eq!(c.snapshot().scopes[0].queued, 1);
    head.abort();
}

// proves: DL-7, Q-9 (dropping the acquire at each await point restores
// everything: queued, head, granted-waiting-for-concurrency, waiting for a
// queue slot)
#[tokio::test(start_paused = true)]
async fn cancellation_at_each_await_point_restores_everything() {
    let c = AdmissionController::builder()
        .scope(ScopeConfig::new("main").tokens(100, MINUTE))
        .concurrency(1)
        .queue_capacity(2)
        .build()
        .unwrap();
    let first = c.acquire(&tokens(60), Deadline::NONE).await.unwrap();
    // Granted its tokens, then waits for the only permit.
    let c2 = c.clone();
    let granted = tokio::spawn(async move { c2.acquire(&tokens(30), Deadline::NONE).await });
    settle().await;
    assert_eq!(c.snapshot().scopes[0].pending, 1);
    assert_eq!(available(&c, Dimension::Tokens), 10);
    // Head waiting for rate, one queued behind it, one waiting for a slot.
    let mut waiters = Vec::new();
    for n in [50, 5, 5] {
        let c = c.clone();
        waiters.push(tokio::spawn(async move {
            c.acquire(&tokens(n), Deadline::NONE).await
        }));
        settle().await;
    }
    let s = c.snapshot();
    assert_eq!((s.scopes[0].queued, s.scopes[0].waiting_for_slot), (2, 1));

    granted.abort();
    settle().await;
    assert_eq!(c.snapshot().scopes[0].pending, 0);
    assert_eq!(
        available(&c, Dimension::Tokens),
        40,
        "pending reservation refunded"
    );
    for w in waiters.drain(..).rev() {
        w.abort();
        settle().await;
    }
    let s = c.snapshot();
    assert_eq!((s.scopes[0].queued, s.scopes[0].waiting_for_slot), (0, 0));
    assert_eq!(available(&c, Dimension::Tokens), 40);
    drop(first);
    assert_idle(&c);
    // Nothing leaked: the whole limit comes back once the window passes.
    tokio::time::advance(MINUTE).await;
    assert_eq!(available(&c, Dimension::Tokens), 100);
}

// proves: Q-9 (a grant made by another call's drain but never collected by
// its cancelled waiter is refunded in full exactly once)
#[tokio::test(start_paused = true)]
async fn uncollected_grant_is_refunded() {
    let c = build(ScopeConfig::new("main").tokens(100, MINUTE));
    let mut first = c.acquire(&tokens(100), Deadline::NONE).await.unwrap();
    let c2 = c.clone();
    let waiter = tokio::spawn(async move { c2.acquire(&tokens(40), Deadline::NONE).await });
    settle().await;
    // Known zero usage refunds the tokens and grants the waiter right here...
    first.reconcile(Usage::known(0)).unwrap();
    assert_eq!(c.snapshot().scopes[0].pending, 1);
    // ...which is cancelled before it ever runs again.
    waiter.abort();
    settle().await;
    assert_eq!(c.snapshot().scopes[0].pending, 0);
    assert_eq!(available(&c, Dimension::Tokens), 100);
    drop(first);
    assert_idle(&c);
}

// proves: DL-5, Q-9 (a concurrency permit collected just after the call's
// deadline starts no provider work, and the call's request unit goes back)
#[tokio::test(start_paused = true)]
async fn a_permit_collected_after_the_deadline_sends_nothing() {
    use common::script::{Script, Step};
    use tollgate::config::PoolConfig;
    use tollgate::lifecycle::{CallError, CallOptions, Supervisor};
    use tollgate::{Call, ScopeId};
    let c = AdmissionController::builder()
        .scope(ScopeConfig::new("m").requests(100, secs(60)))
        .pool(PoolConfig::new("p", 1))
        .build()
        .unwrap();
    let p = c.pool_id("p").unwrap();
    let script = Script::new(vec![Step::Hang]);
    let work = script.work.clone();
    let sup = Supervisor::builder(c.clone(), script)
        .pool(p)
        .without_jitter()
        .build()
        .unwrap();
    let t0 = Instant::now();
    let holder = c
        .acquire(&Call::new(ScopeId::FIRST).with_pool(p), Deadline::NONE)
        .await
        .unwrap();
    let call = tokio::spawn({
        let sup = sup.clone();
        let options = CallOptions::deadline(Deadline::at(t0 + secs(1)));
        async move { sup.invoke(&"a".to_string(), options).await }
    });
    settle().await;
    tokio::time::advance(ms(999)).await;
    drop(holder); // the permit goes to the waiting call at t0 + 999 ms
    tokio::time::advance(ms(2)).await; // its task runs at t0 + 1001 ms
    settle().await;
    let result = call.await.unwrap();
    assert!(
        matches!(
            result,
            Err(CallError::Deadline {
                phase: Phase::Concurrency,
                ..
            })
        ),
        "{result:?}"
    );
    // The holder's unit stays counted; the late call's came back.
    assert_eq!(
        (work.started(), available(&c, Dimension::Requests)),
        (0, 99),
        "provider work started after the deadline, or the unit was kept"
    );
}

// proves: DL-5, DL-6, Q-9 (acquire itself hands out no lease after the
// deadline: a permit handed over just before it but collected just after
// fails in the concurrency phase, the permit goes back, and the
// reservation, never leased, is refunded in full)
#[tokio::test(start_paused = true)]
async fn acquire_refuses_a_permit_collected_after_the_deadline() {
    use tollgate::config::PoolConfig;
    use tollgate::{Call, ScopeId};
    let c = AdmissionController::builder()
        .scope(ScopeConfig::new("m").requests(100, MINUTE))
        .pool(PoolConfig::new("p", 1))
        .build()
        .unwrap();
    let p = c.pool_id("p").unwrap();
    let call = Call::new(ScopeId::FIRST).with_pool(p);
    let t0 = Instant::now();
    let holder = c.acquire(&call, Deadline::NONE).await.unwrap();
    let late = tokio::spawn({
        let c = c.clone();
        async move { c.acquire(&call, Deadline::at(t0 + secs(1))).await.map(drop) }
    });
    settle().await;
    tokio::time::advance(ms(999)).await;
    drop(holder); // the permit goes to the waiting call at t0 + 999 ms
    tokio::time::advance(ms(2)).await; // its task runs at t0 + 1001 ms
    settle().await;
    assert_eq!(
        late.await.unwrap(),
        Err(AdmissionError::DeadlineExceeded {
            phase: Phase::Concurrency,
            retry_at: None
        })
    );
    // The holder's unit stays spent; the late call's came back.
    assert_eq!(available(&c, Dimension::Requests), 99);
    assert_idle(&c);
    // The permit is free again.
    drop(c.acquire(&call, within(ms(1))).await.unwrap());
}

// proves: DL-5, DL-6, Q-9 (a grant made just before the deadline but
// collected just after gives no lease: it fails in the rate phase and the
// reservation is refunded in full)
#[tokio::test(start_paused = true)]
async fn acquire_refuses_a_grant_collected_after_the_deadline() {
    // The head waits until t0 + 999.5 ms, before its deadline: no early
    // verdict.
    let window = std::time::Duration::from_micros(999_500);
    let c = build(ScopeConfig::new("m").tokens(100, window));
    let t0 = Instant::now();
    let mut first = c.acquire(&tokens(100), Deadline::NONE).await.unwrap();
    let late = tokio::spawn({
        let c = c.clone();
        async move {
            c.acquire(&tokens(40), Deadline::at(t0 + secs(1)))
                .await
                .map(drop)
        }
    });
    settle().await;
    tokio::time::advance(ms(999)).await;
    // Known zero usage gives the tokens back and grants the waiter now...
    first.reconcile(Usage::known(0)).unwrap();
    assert_eq!(c.snapshot().scopes[0].pending, 1);
    // ...which collects the grant at t0 + 1001 ms.
    tokio::time::advance(ms(2)).await;
    settle().await;
    assert_eq!(
        late.await.unwrap(),
        Err(AdmissionError::DeadlineExceeded {
            phase: Phase::Rate,
            retry_at: None
        })
    );
    assert_eq!(available(&c, Dimension::Tokens), 100);
    drop(first);
    assert_idle(&c);
}

// proves: DL-5, Q-9, Q-13 (tiny deadlines racing a pool of 2 on
// oversubscribed threads and the real clock: every request unit counted
// is an attempt the provider saw, no permit or reservation is left, and
// the controller ends idle)
#[tokio::test(flavor = "multi_thread", worker_threads = 8)]
async fn tiny_deadlines_on_threads_count_only_what_was_sent() {
    use common::script::{Script, Step};
    use tollgate::config::PoolConfig;
    use tollgate::lifecycle::{CallOptions, Supervisor};
    const LIMIT: u64 = 100_000;
    let c = AdmissionController::builder()
        .scope(ScopeConfig::new("m").requests(LIMIT, MINUTE))
        .pool(PoolConfig::new("p", 2))
        .build()
        .unwrap();
    let p = c.pool_id("p").unwrap();
    let steps = (0..600)
        .map(|_| Step::Reply {
            after: ms(1),
            usage: Usage::known(1),
        })
        .collect();
    let script = Script::new(steps);
    let work = script.work.clone();
    let sup = Supervisor::builder(c.clone(), script)
        .pool(p)
        .without_jitter()
        .build()
        .unwrap();
    let tasks: Vec<_> = (0..600u64)
        .map(|i| {
            let sup = sup.clone();
            tokio::spawn(async move {
                let deadline =
                    Deadline::at(Instant::now() + std::time::Duration::from_micros(i % 4 * 700));
                let _ = sup
                    .invoke(&i.to_string(), CallOptions::deadline(deadline))
                    .await;
            })
        })
        .collect();
    for t in tasks {
        tokio::time::timeout(secs(30), t)
            .await
            .expect("a call hung")
            .unwrap();
    }
    assert_eq!(work.in_flight(), 0);
    let used = LIMIT as i64 - available(&c, Dimension::Requests);
    assert_eq!(
        used,
        i64::from(work.started()),
        "request units counted vs attempts the provider saw"
    );
    assert_idle(&c);
}

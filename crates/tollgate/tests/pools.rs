//! Concurrency pools: per-attempt pools of a controller and standalone
//! per-call pools (SPEC POOL-1..POOL-5, ADM-7). All on paused time.

mod common;

use common::*;
use tokio::time::Instant;
use tollgate::config::{MINUTE, PoolConfig, ScopeConfig};
use tollgate::quota::Dimension;
use tollgate::{AdmissionController, AdmissionError, Call, Deadline, Phase, Pool, PoolId, ScopeId};

fn controller() -> AdmissionController {
    AdmissionController::builder()
        .scope(
            ScopeConfig::new("account")
                .requests(100, MINUTE)
                .tokens(10_000, MINUTE),
        )
        .pool(PoolConfig::new("model-a", 1).max_waiting(1))
        .pool(PoolConfig::new("model-b", 1).max_wait(secs(2)))
        .build()
        .unwrap()
}

fn on(c: &AdmissionController, pool: &str, tokens: u64) -> Call {
    Call::new(ScopeId::FIRST)
        .with_pool(c.pool_id(pool).unwrap())
        .with_estimate(tollgate::TokenEstimate::new(tokens, 0))
}

// proves: POOL-1 (each model pool caps its attempts; pools are independent)
#[tokio::test(start_paused = true)]
async fn model_pools_are_independent() {
    let c = controller();
    let a = c
        .acquire(&on(&c, "model-a", 10), Deadline::NONE)
        .await
        .unwrap();
    assert_eq!(a.pool(), c.pool_id("model-a"));
    let t = Instant::now();
    let b = c
        .acquire(&on(&c, "model-b", 10), Deadline::NONE)
        .await
        .unwrap();
    assert_eq!(Instant::now(), t);
    let c2 = c.clone();
    let call = on(&c, "model-a", 10);
    let waiting = tokio::spawn(async move {
        c2.acquire(&call, Deadline::NONE)
            .await
            .map(|_| Instant::now())
    });
    settle().await;
    let s = c.snapshot();
    assert_eq!((s.pools[0].available, s.pools[0].waiting), (0, 1));
    tokio::time::advance(secs(3)).await;
    drop(a);
    assert_eq!(waiting.await.unwrap().unwrap() - t, secs(3));
    drop(b);
    assert_idle(&c);
}

// proves: POOL-3 (arrivals beyond the waiting bound are rejected at once) and
// that a call rejected by one limit consumes nothing from any other limit
#[tokio::test(start_paused = true)]
async fn full_pool_rejects_at_once_and_consumes_nothing() {
    let c = controller();
    let _a = c
        .acquire(&on(&c, "model-a", 10), Deadline::NONE)
        .await
        .unwrap();
    let c2 = c.clone();
    let call = on(&c, "model-a", 10);
    let _waiting = tokio::spawn(async move { c2.acquire(&call, Deadline::NONE).await });
    settle().await;
    let before = (
        available(&c, Dimension::Requests),
        available(&c, Dimension::Tokens),
    );
    let t = Instant::now();
    let err = c
        .acquire(&on(&c, "model-a", 500), Deadline::NONE)
        .await
        .unwrap_err();
    assert_eq!(
        err,
        AdmissionError::PoolFull {
            pool: c.pool_id("model-a").unwrap()
        }
    );
    assert_eq!(Instant::now(), t);
    assert_eq!(
        (
            available(&c, Dimension::Requests),
            available(&c, Dimension::Tokens)
        ),
        before
    );
    assert_eq!(c.snapshot().scopes[0].pending, 1);
}

// proves: POOL-3, DL-4 (the effective wait is min(pool max wait, remaining
// deadline); the reservation comes back)
#[tokio::test(start_paused = true)]
async fn pool_max_wait_caps_the_wait() {
    let c = controller();
    let t0 = Instant::now();
    let _b = c
        .acquire(&on(&c, "model-b", 10), Deadline::NONE)
        .await
        .unwrap();
    let err = c
        .acquire(&on(&c, "model-b", 10), within(secs(60)))
        .await
        .unwrap_err();
    assert_eq!(err.phase(), Some(Phase::Concurrency));
    assert_eq!(Instant::now() - t0, secs(2));
    let err = c
        .acquire(&on(&c, "model-b", 10), within(secs(1)))
        .await
        .unwrap_err();
    assert_eq!(err.phase(), Some(Phase::Concurrency));
    assert_eq!(Instant::now() - t0, secs(3));
    assert_eq!(available(&c, Dimension::Tokens), 9_990);
    assert_eq!(c.snapshot().scopes[0].pending, 0);
}

// proves: POOL-5 (an unknown pool is refused, not silently unlimited)
#[tokio::test(start_paused = true)]
async fn unknown_pool_is_an_error() {
    let c = controller();
    let call = Call::new(ScopeId::FIRST)
        .with_pool(PoolId::new(9))
        .with_tokens(1);
    assert_eq!(
        c.acquire(&call, Deadline::NONE).await.unwrap_err(),
        AdmissionError::UnknownPool(PoolId::new(9))
    );
}

// proves: POOL-1, POOL-3 (a standalone per-call pool: FIFO, bounded waiting,
// max wait clipped by the deadline, release exactly once)
#[tokio::test(start_paused = true)]
async fn standalone_pool_semantics() {
    let pool = Pool::new(
        PoolId::new(3),
        &PoolConfig::new("tenant-a", 1)
            .max_waiting(1)
            .max_wait(secs(5)),
    )
    .unwrap();
    let t0 = Instant::now();
    let mut held = pool.acquire(Deadline::NONE).await.unwrap();
    let p2 = pool.clone();
    let waiter =
        tokio::spawn(async move { p2.acquire(Deadline::NONE).await.map(|_| Instant::now()) });
    settle().await;
    assert_eq!(
        pool.acquire(Deadline::NONE).await.unwrap_err(),
        AdmissionError::PoolFull {
            pool: PoolId::new(3)
        }
    );
    // The waiter's max wait (5 s) runs out before anyone releases.
    let err = waiter.await.unwrap().unwrap_err();
    assert_eq!(err.phase(), Some(Phase::Concurrency));
    assert_eq!(Instant::now() - t0, secs(5));
    // A deadline shorter than max wait wins.
    let err = pool.acquire(within(secs(1))).await.unwrap_err();
    assert_eq!(err.phase(), Some(Phase::Concurrency));
    assert_eq!(Instant::now() - t0, secs(6));
    held.release();
    held.release();
    let s = pool.snapshot();
    assert_eq!((s.available, s.waiting, s.limit), (1, 0, 1));
    pool.close();
    assert_eq!(
        pool.acquire(Deadline::NONE).await.unwrap_err(),
        AdmissionError::Closed
    );
}

// proves: Q-11, POOL-3, FAIR-2 (a granted call refused because its pool's
// waiting line is full gives its reservation back, counted as refunded and
// not as cost served to its class, and the early verdict of a later arrival
// counts that room: it is judged by the instant it really gets in, not
// refused at once)
#[tokio::test(start_paused = true)]
async fn a_pool_full_refund_reaches_the_early_verdict() {
    let c = AdmissionController::builder()
        .scope(ScopeConfig::new("account").requests(2, MINUTE))
        .scope(ScopeConfig::new("other"))
        .pool(PoolConfig::new("model-a", 1).max_waiting(1))
        .build()
        .unwrap();
    let other = c.scope_id("other").unwrap();
    let pool = c.pool_id("model-a").unwrap();
    let t0 = Instant::now();
    // The pool's permit and its one waiting place are taken (by calls of a
    // scope without limits: they hold no request of the account).
    let holder = c
        .acquire(&Call::new(other).with_pool(pool), Deadline::NONE)
        .await
        .unwrap();
    let c2 = c.clone();
    let pool_waiter = tokio::spawn(async move {
        c2.acquire(&Call::new(other).with_pool(pool), Deadline::NONE)
            .await
            .map(drop)
    });
    settle().await;
    // The account's two requests: at t0 and t0 + 30 s.
    let x = c.acquire(&plain(), Deadline::NONE).await.unwrap();
    tokio::time::sleep(secs(30)).await;
    let y = c.acquire(&plain(), Deadline::NONE).await.unwrap();
    let spawn = |call: Call, deadline: Deadline| spawn_acquire(&c, call, deadline);
    // b (on the full pool) heads the queue until t0 + 60 s; d and e follow.
    let b = spawn(plain().with_pool(pool), Deadline::NONE);
    settle().await;
    let d = spawn(plain(), within(secs(600)));
    let e = spawn(plain(), within(secs(600)));
    settle().await;
    assert_eq!(c.snapshot().scopes[0].queued, 3);
    tokio::time::sleep_until(t0 + secs(60)).await;
    settle().await;
    // At t0 + 60 s b got its request but not a place for a permit: refunded.
    assert_eq!(
        b.await.unwrap().map(drop).unwrap_err(),
        AdmissionError::PoolFull { pool }
    );
    // d took the room b gave back; e waits for y's request (t0 + 90 s).
    let (at, d) = d.await.unwrap().unwrap();
    assert_eq!(at, t0 + secs(60));
    let s = &c.snapshot().scopes[0];
    assert_eq!(s.queued, 1);
    // b was never admitted: it counts as a refunded reservation and
    // not in the cost its class was served (FAIR-2, FAIR-8): x, y and d.
    assert_eq!(s.counters.refunded_reservations, 1);
    assert_eq!(s.counters.served_cost.iter().sum::<u64>(), 3);
    // f can be admitted when d's request ages out, at t0 + 120 s: inside
    // its deadline of t0 + 130 s, so it must not be refused at once.
    let f = spawn(plain(), within(secs(70)));
    let (at, f) = f.await.unwrap().unwrap();
    assert_eq!(at, t0 + secs(120));
    let (at, e) = e.await.unwrap().unwrap();
    assert_eq!(at, t0 + secs(90));
    drop((x, y, d, e, f, holder));
    pool_waiter.await.unwrap().unwrap();
    assert_idle(&c);
}

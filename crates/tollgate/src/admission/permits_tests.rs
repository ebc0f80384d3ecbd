//! Unit tests of the fair semaphore (kept apart from `permits.rs` so the
//! loom model in `tests/loom_permits.rs` can include that file alone).
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use parking_lot::Mutex;

use super::permits::*;

async fn settle() {
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
}

#[test]
fn fast_path_counts_permits() {
    let p = Permits::new(2);
    assert_eq!(p.try_acquire(), Ok(()));
    assert_eq!(p.try_acquire(), Ok(()));
    assert_eq!(p.try_acquire(), Err(TryAcquire::NoPermits));
    p.release();
    assert_eq!(p.available(), 1);
    p.close();
    assert_eq!(p.try_acquire(), Err(TryAcquire::Closed));
}

// proves: POOL-3 (waiters are served in FIFO order; no barging)
#[tokio::test]
async fn waiters_are_served_in_order() {
    let p = Arc::new(Permits::new(1));
    p.try_acquire().unwrap();
    let order = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for i in 0..5 {
        let (p, order) = (p.clone(), order.clone());
        tasks.push(tokio::spawn(async move {
            p.acquire().await.unwrap();
            order.lock().push(i);
            p.release();
        }));
        settle().await;
    }
    // A newcomer cannot take the permit around the queue.
    p.release();
    assert_eq!(p.try_acquire(), Err(TryAcquire::NoPermits));
    for t in tasks {
        t.await.unwrap();
    }
    assert_eq!(*order.lock(), [0, 1, 2, 3, 4]);
    assert_eq!(p.available(), 1);
    assert_eq!(p.try_acquire(), Ok(()));
}

// proves: DL-7 (a cancelled waiter that was handed a permit passes it on)
#[tokio::test]
async fn cancelled_waiter_passes_its_permit_on() {
    let p = Arc::new(Permits::new(1));
    p.try_acquire().unwrap();
    let p1 = p.clone();
    let first = tokio::spawn(async move { p1.acquire().await });
    settle().await;
    let p2 = p.clone();
    let second = tokio::spawn(async move { p2.acquire().await });
    settle().await;
    assert_eq!(p.waiting(), 2);
    p.release(); // handed to `first`, which is cancelled before running
    first.abort();
    assert!(second.await.unwrap().is_ok());
    assert_eq!(p.waiting(), 0);
    p.release();
    assert_eq!(p.available(), 1);
}

// proves: LC-7 (close wakes every waiter with an error)
#[tokio::test]
async fn close_wakes_waiters() {
    let p = Arc::new(Permits::new(1));
    p.try_acquire().unwrap();
    let p1 = p.clone();
    let w = tokio::spawn(async move { p1.acquire().await });
    settle().await;
    p.close();
    assert_eq!(w.await.unwrap(), Err(Refused::Closed));
}

// proves: POOL-3 (a finite waiting bound: arrivals beyond it are
// refused at once)
#[tokio::test]
async fn waiting_bound_refuses_at_once() {
    let p = Arc::new(Permits::bounded(1, 1));
    p.try_acquire().unwrap();
    let p1 = p.clone();
    let first = tokio::spawn(async move { p1.acquire().await });
    settle().await;
    assert_eq!(p.acquire().await, Err(Refused::Full));
    assert_eq!(p.register(), Err(Refused::Full));
    p.release();
    assert_eq!(first.await.unwrap(), Ok(()));
}

// Many threads hammering acquire/release never exceed the limit and
// never lose a permit.
#[test]
fn stress_never_exceeds_the_limit() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .build()
        .unwrap();
    let p = Arc::new(Permits::new(3));
    let inside = Arc::new(AtomicUsize::new(0));
    rt.block_on(async {
        let mut tasks = Vec::new();
        for _ in 0..64 {
            let (p, inside) = (p.clone(), inside.clone());
            tasks.push(tokio::spawn(async move {
                for i in 0..500 {
                    if i % 3 == 0 {
                        if p.try_acquire().is_err() {
                            continue;
                        }
                    } else {
                        p.acquire().await.unwrap();
                    }
                    let n = inside.fetch_add(1, Ordering::SeqCst);
                    assert!(n < 3, "limit exceeded");
                    tokio::task::yield_now().await;
                    inside.fetch_sub(1, Ordering::SeqCst);
                    p.release();
                }
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
    });
    assert_eq!(p.available(), 3);
    assert_eq!(p.waiting(), 0);
}

// proves: GW-15, POOL-1 (a pool resized in place: permits held count
// against the new size; a lowered size frees nothing until the excess is
// back; a raised one serves the waiters in line first)
#[tokio::test]
async fn resizing_keeps_the_permits_held() {
    let p = Arc::new(Permits::new(3));
    for _ in 0..3 {
        p.try_acquire().unwrap();
    }
    p.resize(1, usize::MAX);
    assert_eq!((p.limit(), p.held(), p.available()), (1, 3, 0));
    let waiter = {
        let p = p.clone();
        tokio::spawn(async move { p.acquire().await })
    };
    settle().await;
    p.release();
    p.release();
    settle().await;
    assert!(!waiter.is_finished(), "still one held of one");
    p.release();
    waiter.await.unwrap().unwrap();
    assert_eq!((p.held(), p.available()), (1, 0));
    // Raised: the new permits go to the line, then to the pool.
    let waiter = {
        let p = p.clone();
        tokio::spawn(async move { p.acquire().await })
    };
    settle().await;
    p.resize(4, usize::MAX);
    waiter.await.unwrap().unwrap();
    assert_eq!((p.held(), p.available()), (2, 2));
    assert_eq!(p.try_acquire(), Ok(()), "fast path open");
    p.release();
    p.release();
    p.release();
    assert_eq!((p.held(), p.available()), (0, 4));
}

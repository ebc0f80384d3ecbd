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

/// Polls a registered waiter once, without a waker.
fn poll_once(p: &Permits, key: &mut Option<usize>) -> std::task::Poll<Result<(), Refused>> {
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    p.poll_acquire_for(&mut cx, key, DEFAULT_HOLDER)
}

// proves: FAIR-10, POOL-3 (a pool's full waiting line is shared between
// holders: a holder under its equal share still gets in, the holder with
// the most gives up its last waiter, and the line never grows past its
// bound)
#[test]
fn a_full_pool_line_makes_room_for_a_holder_under_its_share() {
    let (a, b) = (7, 9);
    let p = Permits::bounded(1, 4);
    assert_eq!(p.register_for(a), Ok(None), "the one permit");
    let mut a_keys: Vec<Option<usize>> = (0..4).map(|_| p.register_for(a).unwrap()).collect();
    assert!(a_keys.iter().all(Option::is_some));
    // Full, and `a` holds all four places: its fifth is refused.
    assert_eq!(p.register_for(a), Err(Refused::Full));
    // `b`'s first call gets in; `a`'s last waiter is refused instead.
    let mut b1 = p.register_for(b).unwrap();
    assert!(b1.is_some());
    assert_eq!(p.waiting(), 4);
    assert_eq!(
        poll_once(&p, &mut a_keys[3]),
        std::task::Poll::Ready(Err(Refused::Full))
    );
    assert_eq!(a_keys[3], None);
    for key in &mut a_keys[..3] {
        assert!(
            poll_once(&p, key).is_pending(),
            "a's earlier waiters keep their places"
        );
    }
    // `b` holds 1 of an equal share of 2: its second gets in too.
    let mut b2 = p.register_for(b).unwrap();
    assert!(poll_once(&p, &mut a_keys[2]).is_ready());
    // Two each: both at their share, both refused now.
    assert_eq!(p.register_for(b), Err(Refused::Full));
    assert_eq!(p.register_for(a), Err(Refused::Full));
    assert_eq!(p.waiting(), 4);
    // A third holder's first call: its share is 4/3 > 0.
    let mut c1 = p.register_for(11).unwrap();
    assert_eq!(p.waiting(), 4);
    // The victim was the latest last waiter of the two holders with two.
    assert!(poll_once(&p, &mut b2).is_ready());
    // The permit still reaches every waiter left, fewest held first
    // (FAIR-6), then in order of arrival.
    let [first, second, ..] = &mut a_keys[..] else {
        unreachable!()
    };
    for (holder, key) in [(a, first), (a, second), (a, &mut b1), (b, &mut c1)] {
        p.release_for(holder);
        assert_eq!(poll_once(&p, key), std::task::Poll::Ready(Ok(())));
    }
    p.release_for(11);
    assert_eq!((p.waiting(), p.held(), p.available()), (0, 0, 1));
}

// proves: FAIR-10, POOL-3, Q-13 (five holders on real threads and a real
// clock, with waits cut short at random: the shared line never holds more
// than its bound, the permits never more than their limit, every holder
// is served, and at the end every permit is back and nobody waits)
#[test]
fn a_shared_line_under_threads_loses_nothing() {
    const LIMIT: usize = 2;
    const LINE: usize = 6;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .enable_time()
        .build()
        .unwrap();
    let p = Arc::new(Permits::bounded(LIMIT, LINE));
    let inside = Arc::new(AtomicUsize::new(0));
    let served: Arc<[AtomicUsize; 5]> = Arc::new(Default::default());
    let full = Arc::new(AtomicUsize::new(0));
    rt.block_on(async {
        let mut tasks = Vec::new();
        for task in 0..40u64 {
            let holder = task % 5 + 1;
            let (p, inside, served, full) =
                (p.clone(), inside.clone(), served.clone(), full.clone());
            tasks.push(tokio::spawn(async move {
                for i in 0..200u64 {
                    let patience = std::time::Duration::from_micros((task * 37 + i * 11) % 2_000);
                    match tokio::time::timeout(patience, p.acquire_for(holder)).await {
                        Ok(Ok(())) => {
                            let n = inside.fetch_add(1, Ordering::SeqCst);
                            assert!(n < LIMIT, "limit exceeded");
                            served[(holder - 1) as usize].fetch_add(1, Ordering::SeqCst);
                            tokio::task::yield_now().await;
                            inside.fetch_sub(1, Ordering::SeqCst);
                            p.release_for(holder);
                        }
                        Ok(Err(Refused::Full)) => {
                            full.fetch_add(1, Ordering::SeqCst);
                        }
                        Err(_) => {}
                        Ok(Err(e)) => panic!("{e:?}"),
                    }
                    assert!(p.waiting() <= LINE, "line over its bound");
                }
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
    });
    // The line was full most of the time (thousands of refusals and
    // displacements per run): the path under test ran.
    assert!(full.load(Ordering::SeqCst) > 0);
    for (h, n) in served.iter().enumerate() {
        assert!(
            n.load(Ordering::SeqCst) > 0,
            "holder {} never served",
            h + 1
        );
    }
    assert_eq!((p.waiting(), p.held(), p.available()), (0, 0, LIMIT));
}

mod fair_line_props {
    use proptest::prelude::*;

    use super::super::permits::*;
    use super::poll_once;

    #[derive(Debug, Clone)]
    enum Op {
        Arrive(u64),
        Release,
        Cancel(usize),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            4 => (1u64..5).prop_map(Op::Arrive),
            2 => Just(Op::Release),
            1 => (0usize..64).prop_map(Op::Cancel),
        ]
    }

    proptest! {
        // proves: FAIR-10, POOL-3 (under any arrivals, releases and
        // cancellations of four holders: the line never holds more than
        // its bound; an arrival whose holder has fewer waiters than an
        // equal share among the waiting holders is never refused; no
        // permit is lost)
        #[test]
        fn a_shared_pool_line_is_bounded_and_fair(
            limit in 1usize..4,
            capacity in 1usize..9,
            ops in proptest::collection::vec(op(), 1..120),
        ) {
            let p = Permits::bounded(limit, capacity);
            // Queued waiters (holder, key) and permits held, by holder.
            let mut queued: Vec<(u64, Option<usize>)> = Vec::new();
            let mut held: Vec<u64> = Vec::new();
            for op in ops {
                match op {
                    Op::Arrive(h) => {
                        let own = queued.iter().filter(|(q, _)| *q == h).count();
                        let mut holders: Vec<u64> = queued.iter().map(|(q, _)| *q).collect();
                        holders.push(h);
                        holders.sort_unstable();
                        holders.dedup();
                        match p.register_for(h) {
                            Ok(None) => held.push(h),
                            Ok(Some(k)) => queued.push((h, Some(k))),
                            Err(Refused::Full) => prop_assert!(
                                own * holders.len() >= capacity,
                                "holder {h} with {own} of {capacity} among {} refused",
                                holders.len()
                            ),
                            Err(e) => prop_assert!(false, "{e:?}"),
                        }
                    }
                    Op::Release => {
                        if let Some(h) = held.pop() {
                            p.release_for(h);
                        }
                    }
                    Op::Cancel(i) => {
                        if !queued.is_empty() {
                            let (_, key) = queued.remove(i % queued.len());
                            if let Some(k) = key {
                                p.cancel(k);
                            }
                        }
                    }
                }
                // Learn what happened to every waiter.
                let mut still = Vec::new();
                for (h, mut key) in queued.drain(..) {
                    match poll_once(&p, &mut key) {
                        std::task::Poll::Ready(Ok(())) => held.push(h),
                        std::task::Poll::Ready(Err(Refused::Full)) => {}
                        std::task::Poll::Ready(Err(e)) => prop_assert!(false, "{e:?}"),
                        std::task::Poll::Pending => still.push((h, key)),
                    }
                }
                queued = still;
                prop_assert!(p.waiting() <= capacity);
                prop_assert_eq!(p.waiting(), queued.len());
                prop_assert!(held.len() <= limit);
                prop_assert_eq!(p.held(), held.len());
            }
            for (_, key) in queued {
                if let Some(k) = key {
                    p.cancel(k);
                }
            }
            for h in held {
                p.release_for(h);
            }
            prop_assert_eq!((p.waiting(), p.held(), p.available()), (0, 0, limit));
        }
    }
}

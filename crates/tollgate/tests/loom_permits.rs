//! An exhaustive model of the fair semaphore's hand-over (SPEC POOL-3,
//! `admission/permits.rs` compiled against loom's atomics and mutex,
//! every interleaving of a few threads explored, as tokio checks its own
//! semaphore. Each model asserts that no permit is ever lost or duplicated
//! and that a queued waiter is never overtaken.
//!
//! The scope's queue and its grants live under one mutex, so their
//! interleavings are whole critical sections; the multi-threaded stress in
//! `tests/concurrency.rs` covers them. The lock-free part is here.
#![allow(dead_code)]

/// loom's primitives under the names `permits.rs` imports.
mod sync {
    use std::fmt;

    pub(crate) use loom::sync::atomic::{AtomicUsize, Ordering};

    /// loom's mutex with parking_lot's signature (no poisoning).
    pub(crate) struct Mutex<T>(loom::sync::Mutex<T>);

    impl<T> Mutex<T> {
        pub(crate) fn new(value: T) -> Self {
            Mutex(loom::sync::Mutex::new(value))
        }

        pub(crate) fn lock(&self) -> loom::sync::MutexGuard<'_, T> {
            self.0
                .lock()
                .expect("no test panics while holding the lock")
        }
    }

    impl<T> fmt::Debug for Mutex<T> {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("Mutex")
        }
    }
}

#[path = "../src/admission/queue.rs"]
mod queue;

#[path = "../src/admission/permits.rs"]
mod permits;

use std::task::{Context, Poll, Waker};

use loom::sync::Arc;
use loom::sync::atomic::{AtomicUsize, Ordering};
use loom::thread;
use permits::{Permits, TryAcquire};

/// Takes a permit the way the controller does: the fast path, else a place
/// in line, parked until the permit is handed over (loom's executor parks
/// the thread and explores the wake-up like any other event).
fn take(p: &Permits) {
    if p.try_acquire().is_ok() {
        return;
    }
    let mut key = None;
    loom::future::block_on(std::future::poll_fn(|cx| p.poll_acquire(cx, &mut key)))
        .expect("not closed");
}

/// Every interleaving of up to three preemptions per execution (as tokio
/// bounds its own models): exhaustive for the races that matter here and
/// quick enough for every test run.
fn model(f: impl Fn() + Sync + Send + 'static) {
    let mut builder = loom::model::Builder::new();
    builder.preemption_bound = Some(3);
    builder.check(f);
}

/// Counts holders and checks the limit at every acquisition.
struct Holders {
    now: AtomicUsize,
    limit: usize,
}

impl Holders {
    fn enter(&self) {
        let n = self.now.fetch_add(1, Ordering::SeqCst) + 1;
        assert!(n <= self.limit, "{n} holders of {} permits", self.limit);
    }

    fn leave(&self) {
        self.now.fetch_sub(1, Ordering::SeqCst);
    }
}

// proves: POOL-3 (two callers and a returner race for one permit: never
// two holders, and the permit is back at the end whatever the order)
#[test]
fn hand_over_never_duplicates_or_loses_a_permit() {
    model(|| {
        let p = Arc::new(Permits::bounded(1, 8));
        let holders = Arc::new(Holders {
            now: AtomicUsize::new(1),
            limit: 1,
        });
        // The main thread holds the permit at the start.
        assert_eq!(p.try_acquire(), Ok(()));
        let workers: Vec<_> = (0..2)
            .map(|_| {
                let (p, h) = (p.clone(), holders.clone());
                thread::spawn(move || {
                    take(&p);
                    h.enter();
                    h.leave();
                    p.release();
                })
            })
            .collect();
        holders.leave();
        p.release();
        for w in workers {
            w.join().unwrap();
        }
        assert_eq!(p.available(), 1);
        assert_eq!(p.waiting(), 0);
        assert_eq!(p.try_acquire(), Ok(()), "the fast path is open again");
    });
}

// proves: Q-9, POOL-3 (a waiter that gives up while the permit is being
// handed to it passes the permit on: nothing is lost)
#[test]
fn a_cancelled_waiter_passes_its_permit_on() {
    model(|| {
        let p = Arc::new(Permits::bounded(1, 8));
        assert_eq!(p.try_acquire(), Ok(()));
        let waiter = {
            let p = p.clone();
            thread::spawn(move || match p.register() {
                // Queued: give up, whether or not the permit reached us.
                Ok(Some(key)) => p.cancel(key),
                // The release came first: we hold it, so return it.
                Ok(None) => p.release(),
                Err(e) => panic!("refused: {e:?}"),
            })
        };
        p.release();
        waiter.join().unwrap();
        assert_eq!(p.available(), 1);
        assert_eq!(p.waiting(), 0);
    });
}

// proves: POOL-3 (FIFO: once a waiter is queued, the fast path is shut
// until it has been served, so a later caller never overtakes it)
#[test]
fn the_fast_path_never_overtakes_a_queued_waiter() {
    model(|| {
        let p = Arc::new(Permits::bounded(1, 8));
        assert_eq!(p.try_acquire(), Ok(()));
        let key = p.register().unwrap().expect("queued behind the holder");
        let barger = {
            let p = p.clone();
            thread::spawn(move || p.try_acquire())
        };
        p.release();
        let barged = barger.join().unwrap();
        // The release went to the queued waiter: the barger got nothing.
        assert_eq!(barged, Err(TryAcquire::NoPermits));
        let waker = Waker::noop();
        let mut key = Some(key);
        let polled = p.poll_acquire(&mut Context::from_waker(waker), &mut key);
        assert_eq!(polled, Poll::Ready(Ok(())));
        p.release();
        assert_eq!(p.available(), 1);
    });
}

// proves: LC-7, POOL-3 (closing while permits change hands: waiters are
// refused or served, and every permit still comes back)
#[test]
fn close_during_hand_over_loses_nothing() {
    model(|| {
        let p = Arc::new(Permits::bounded(1, 8));
        assert_eq!(p.try_acquire(), Ok(()));
        let waiter = {
            let p = p.clone();
            thread::spawn(move || {
                let mut key = None;
                let got =
                    loom::future::block_on(std::future::poll_fn(|cx| p.poll_acquire(cx, &mut key)));
                if got.is_ok() {
                    p.release();
                }
            })
        };
        let closer = {
            let p = p.clone();
            thread::spawn(move || p.close())
        };
        p.release();
        waiter.join().unwrap();
        closer.join().unwrap();
        assert_eq!(p.available(), 1);
        assert_eq!(p.waiting(), 0);
    });
}

// proves: FAIR-6, Q-9 (permits held by named holders are counted under
// the lock: a holder returning its permit while another holder's waiter
// gives up, and a third takes the fast path, never loses or duplicates a
// permit, and the counts come back to nothing)
#[test]
fn holders_hand_over_without_losing_a_permit() {
    model(|| {
        let p = Arc::new(Permits::bounded(1, 8));
        assert_eq!(p.try_acquire_for(7), Ok(()));
        let waiter = {
            let p = p.clone();
            thread::spawn(move || match p.register_for(9) {
                Ok(Some(key)) => p.cancel(key),
                Ok(None) => p.release_for(9),
                Err(e) => panic!("refused: {e:?}"),
            })
        };
        let barger = {
            let p = p.clone();
            thread::spawn(move || {
                if p.try_acquire_for(3).is_ok() {
                    p.release_for(3);
                }
            })
        };
        p.release_for(7);
        waiter.join().unwrap();
        barger.join().unwrap();
        assert_eq!(p.available(), 1);
        assert_eq!(p.waiting(), 0);
        assert_eq!(p.try_acquire(), Ok(()), "the fast path is open again");
    });
}

// proves: GW-15, POOL-1 (a pool lowered below the permits held while one
// is being returned: a caller that comes after the change gets a permit
// only once the holders are within the new size, and once all are back
// the pool holds exactly the new size)
#[test]
fn a_lowered_limit_admits_nothing_until_the_excess_is_back() {
    model(|| {
        let p = Arc::new(Permits::bounded(2, 8));
        assert_eq!(p.try_acquire(), Ok(()));
        assert_eq!(p.try_acquire(), Ok(()));
        // The main thread's permit and the returner's, counted against the
        // new size of 1 (each increment asserts the bound).
        let holders = Arc::new(Holders {
            now: AtomicUsize::new(2),
            limit: 1,
        });
        let returner = {
            let (p, h) = (p.clone(), holders.clone());
            thread::spawn(move || {
                h.leave();
                p.release();
            })
        };
        p.resize(1, 8);
        let taker = {
            let (p, h) = (p.clone(), holders.clone());
            thread::spawn(move || {
                take(&p);
                h.enter();
                h.leave();
                p.release();
            })
        };
        holders.leave();
        p.release();
        returner.join().unwrap();
        taker.join().unwrap();
        assert_eq!(p.limit(), 1);
        assert_eq!(p.held(), 0);
        assert_eq!(p.available(), 1);
        assert_eq!(p.try_acquire(), Ok(()), "the fast path is open again");
    });
}

// proves: GW-15, POOL-3 (a raised limit hands the new permits to the
// waiters in line while permits are returned: none lost or duplicated)
#[test]
fn a_raised_limit_serves_the_line_first() {
    model(|| {
        let p = Arc::new(Permits::bounded(1, 8));
        assert_eq!(p.try_acquire(), Ok(()));
        let waiter = {
            let p = p.clone();
            thread::spawn(move || {
                take(&p);
                p.release();
            })
        };
        let resizer = {
            let p = p.clone();
            thread::spawn(move || p.resize(2, 8))
        };
        p.release();
        waiter.join().unwrap();
        resizer.join().unwrap();
        assert_eq!(p.held(), 0);
        assert_eq!(p.available(), 2);
        assert_eq!(p.waiting(), 0);
    });
}

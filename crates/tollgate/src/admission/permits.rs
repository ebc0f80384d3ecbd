//! A fair (FIFO) counting semaphore with an allocation-free fast path.
//!
//! # Implementation notes
//!
//! `state` packs the free permits (bits 2..), a `WAITERS` flag (bit 0) and
//! a `CLOSED` flag (bit 1).
//!
//! * Taking a permit without waiting is one CAS, allowed only while
//!   `WAITERS` is clear, so nobody overtakes a queued waiter.
//! * Returning a permit is one CAS while `WAITERS` is clear. Once it is set,
//!   the returner takes the waiter lock and hands the permit straight to the
//!   first waiter (FIFO), so a released permit never lands in the free count
//!   while someone waits.
//! * `WAITERS` is only set or cleared with the waiter lock held. A waiter is
//!   linked only after setting it and seeing no free permit; the list being
//!   empty is the only reason to clear it.
//! * A waiter that is dropped after being handed a permit gives it back
//!   through the same path, so a permit is never lost (cancel safety).
//! * A limit lowered below the permits held (a reconfiguration, see
//!   [`resize`](Permits::resize)) leaves `owed` permits to be paid back:
//!   while any is owed, `WAITERS` stays set, so every return takes the
//!   lock and pays one back instead of freeing it, and the free count stays
//!   zero. `owed` is only read or written with the waiter lock held.
//! * Every access to `state` is sequentially consistent: idle detection
//!   (`idle.rs`) pairs a permit's return with a load of its own waiter
//!   count. On x86 the instructions are those of acquire/release anyway.

use std::task::{Context, Poll, Waker};

use super::queue::WaitList;
use crate::sync::{AtomicUsize, Mutex, Ordering};

const WAITERS: usize = 1;
const CLOSED: usize = 2;
const ONE: usize = 4;

/// Why a waiter was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refused {
    /// The permits are closed.
    Closed,
    /// The waiting bound is reached (SPEC POOL-3).
    Full,
}

/// Why a permit was not taken without waiting.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TryAcquire {
    /// None free (or others wait first).
    NoPermits,
    /// Closed.
    Closed,
}

#[derive(Debug, Default)]
struct Waiter {
    waker: Option<Waker>,
    granted: bool,
}

/// See the module documentation.
#[derive(Debug)]
pub(crate) struct Permits {
    state: AtomicUsize,
    /// The configured number of permits (changed only by `resize`, under
    /// the waiter lock).
    limit: AtomicUsize,
    /// Permits held beyond a lowered limit, paid back by the next returns
    /// (under the waiter lock).
    owed: AtomicUsize,
    max_waiters: AtomicUsize,
    waiters: Mutex<WaitList<Waiter>>,
}

impl Permits {
    /// The largest supported number of permits.
    pub(crate) const MAX: usize = usize::MAX / ONE;

    #[cfg(test)]
    pub(crate) fn new(limit: usize) -> Self {
        Self::bounded(limit, usize::MAX)
    }

    /// At most `max_waiters` calls wait; more are refused at once.
    pub(crate) fn bounded(limit: usize, max_waiters: usize) -> Self {
        let limit = limit.min(Self::MAX);
        Permits {
            state: AtomicUsize::new(limit * ONE),
            limit: AtomicUsize::new(limit),
            owed: AtomicUsize::new(0),
            max_waiters: AtomicUsize::new(max_waiters),
            waiters: Mutex::new(WaitList::new()),
        }
    }

    /// The configured number of permits.
    pub(crate) fn limit(&self) -> usize {
        self.limit.load(Ordering::SeqCst)
    }

    /// Permits taken now (by holders, or handed to waiters not yet
    /// polled): the limit, plus what is owed beyond a lowered one, minus
    /// what is free.
    pub(crate) fn held(&self) -> usize {
        let _list = self.waiters.lock();
        let free = self.state.load(Ordering::SeqCst) / ONE;
        (self.limit.load(Ordering::SeqCst) + self.owed.load(Ordering::SeqCst)).saturating_sub(free)
    }

    /// Changes the number of permits and the waiting bound in place
    /// (a reconfiguration): permits held stay held and count against the
    /// new limit. A raised limit hands the new permits to the first
    /// waiters at once; a limit lowered below what is held frees nothing
    /// until enough holders have returned theirs. Waiters keep their
    /// places; a lowered waiting bound refuses only new waiters.
    pub(crate) fn resize(&self, limit: usize, max_waiters: usize) {
        let limit = limit.min(Self::MAX);
        let mut list = self.waiters.lock();
        self.max_waiters.store(max_waiters, Ordering::SeqCst);
        let old = self.limit.swap(limit, Ordering::SeqCst);
        if limit > old {
            let mut more = limit - old;
            let owed = self.owed.load(Ordering::SeqCst);
            let paid = more.min(owed);
            self.owed.store(owed - paid, Ordering::SeqCst);
            more -= paid;
            // With nothing owed, a new permit goes to the first waiter or
            // to the pool, as a returned one would.
            while more > 0 && !list.is_empty() {
                self.hand_over(&mut list);
                more -= 1;
            }
            if more > 0 {
                self.state.fetch_add(more * ONE, Ordering::SeqCst);
            }
            self.clear_waiters(&list);
        } else if limit < old {
            // Close the fast paths (both need `WAITERS` clear), so the
            // free count only changes under the lock from here on.
            let s = self.state.fetch_or(WAITERS, Ordering::SeqCst);
            let fewer = old - limit;
            let taken = (s / ONE).min(fewer);
            self.state.fetch_sub(taken * ONE, Ordering::SeqCst);
            let owed = self.owed.load(Ordering::SeqCst);
            self.owed.store(owed + fewer - taken, Ordering::SeqCst);
            self.clear_waiters(&list);
        }
    }

    /// With the lock held: reopens the fast paths when nobody waits and
    /// nothing is owed.
    fn clear_waiters(&self, list: &WaitList<Waiter>) {
        if list.is_empty() && self.owed.load(Ordering::SeqCst) == 0 {
            self.state.fetch_and(!WAITERS, Ordering::SeqCst);
        }
    }

    /// Free permits now.
    pub(crate) fn available(&self) -> usize {
        self.state.load(Ordering::SeqCst) / ONE
    }

    /// Calls waiting for a permit.
    pub(crate) fn waiting(&self) -> usize {
        self.waiters.lock().len()
    }

    /// Takes a permit if one is free and nobody waits.
    #[inline]
    pub(crate) fn try_acquire(&self) -> Result<(), TryAcquire> {
        let mut s = self.state.load(Ordering::SeqCst);
        loop {
            if s & CLOSED != 0 {
                return Err(TryAcquire::Closed);
            }
            if s & WAITERS != 0 || s < ONE {
                return Err(TryAcquire::NoPermits);
            }
            match self
                .state
                .compare_exchange_weak(s, s - ONE, Ordering::SeqCst, Ordering::SeqCst)
            {
                Ok(_) => return Ok(()),
                Err(actual) => s = actual,
            }
        }
    }

    /// Returns one permit: to the first waiter if any, else to the pool.
    #[inline]
    pub(crate) fn release(&self) {
        let mut s = self.state.load(Ordering::SeqCst);
        while s & WAITERS == 0 {
            match self
                .state
                .compare_exchange_weak(s, s + ONE, Ordering::SeqCst, Ordering::SeqCst)
            {
                Ok(_) => return,
                Err(actual) => s = actual,
            }
        }
        self.release_slow();
    }

    #[cold]
    fn release_slow(&self) {
        let mut list = self.waiters.lock();
        self.hand_over(&mut list);
    }

    /// With the lock held: gives one permit to the first waiter, or to the
    /// pool (clearing `WAITERS`) when none is left.
    fn hand_over(&self, list: &mut WaitList<Waiter>) {
        let owed = self.owed.load(Ordering::SeqCst);
        if owed > 0 {
            // Held beyond a lowered limit: paid back, not freed.
            self.owed.store(owed - 1, Ordering::SeqCst);
            self.clear_waiters(list);
            return;
        }
        if let Some(key) = list.front() {
            list.unlink(key);
            if let Some(w) = list.get_mut(key) {
                w.granted = true;
                if let Some(waker) = w.waker.take() {
                    waker.wake();
                }
            }
            self.clear_waiters(list);
            return;
        }
        self.state.fetch_add(ONE, Ordering::SeqCst);
        self.clear_waiters(list);
    }

    /// Refuses new acquisitions and wakes every waiter with `Closed`.
    pub(crate) fn close(&self) {
        self.state.fetch_or(CLOSED, Ordering::SeqCst);
        let mut list = self.waiters.lock();
        for key in list.keys() {
            list.unlink(key);
            if let Some(w) = list.get_mut(key)
                && let Some(waker) = w.waker.take()
            {
                waker.wake();
            }
        }
    }

    /// Waits for a permit in FIFO order.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future removes the waiter; a permit handed to it in the
    /// meantime goes to the next waiter or back to the pool.
    #[cfg(test)]
    pub(crate) async fn acquire(&self) -> Result<(), Refused> {
        struct Waiting<'a>(&'a Permits, Option<usize>);
        impl Drop for Waiting<'_> {
            fn drop(&mut self) {
                if let Some(key) = self.1.take() {
                    self.0.cancel(key);
                }
            }
        }
        let mut waiting = Waiting(self, None);
        std::future::poll_fn(|cx| waiting.0.poll_acquire(cx, &mut waiting.1)).await
    }

    /// Takes a free permit, or joins the queue without a waker yet (the
    /// first [`poll_acquire`](Self::poll_acquire) adds it). `Ok(None)`: a
    /// permit is now held; `Ok(Some(key))`: queued under `key`. Lets a caller
    /// fix its place in line while holding a lock of its own.
    pub(crate) fn register(&self) -> Result<Option<usize>, Refused> {
        let mut list = self.waiters.lock();
        self.join(&mut list, None)
    }

    /// With the lock held: takes a free permit (`Ok(None)`) or links a
    /// waiter (`Ok(Some(key))`), unless closed or full.
    fn join(
        &self,
        list: &mut WaitList<Waiter>,
        waker: Option<Waker>,
    ) -> Result<Option<usize>, Refused> {
        let s = self.state.fetch_or(WAITERS, Ordering::SeqCst);
        let refuse = |list: &WaitList<Waiter>, why| {
            self.clear_waiters(list);
            Err(why)
        };
        if s & CLOSED != 0 {
            return refuse(list, Refused::Closed);
        }
        if list.is_empty() && s >= ONE {
            // Nobody waits and a permit is free: take it and reopen the
            // fast path.
            self.state.fetch_sub(ONE, Ordering::SeqCst);
            self.clear_waiters(list);
            return Ok(None);
        }
        if list.len() >= self.max_waiters.load(Ordering::SeqCst) {
            return refuse(list, Refused::Full);
        }
        match list.push_back(Waiter {
            waker,
            granted: false,
        }) {
            Ok(key) => Ok(Some(key)),
            // Four billion waiters: refuse rather than lose track.
            Err(_) => refuse(list, Refused::Full),
        }
    }

    /// Polls for a permit in FIFO order. `key` starts as `None`; while it
    /// is `Some` the caller is queued and must call [`cancel`](Self::cancel)
    /// if it gives up. It is `None` again once this returns `Ready`.
    pub(crate) fn poll_acquire(
        &self,
        cx: &mut Context<'_>,
        key: &mut Option<usize>,
    ) -> Poll<Result<(), Refused>> {
        let mut list = self.waiters.lock();
        let Some(k) = *key else {
            // First poll: join the queue unless a permit is free right now.
            return match self.join(&mut list, Some(cx.waker().clone())) {
                Ok(None) => Poll::Ready(Ok(())),
                Ok(Some(k)) => {
                    *key = Some(k);
                    Poll::Pending
                }
                Err(why) => Poll::Ready(Err(why)),
            };
        };
        let Some(w) = list.get_mut(k) else {
            *key = None;
            return Poll::Ready(Err(Refused::Closed));
        };
        if w.granted {
            list.remove(k);
            *key = None;
            return Poll::Ready(Ok(()));
        }
        if self.state.load(Ordering::SeqCst) & CLOSED != 0 {
            list.remove(k);
            *key = None;
            return Poll::Ready(Err(Refused::Closed));
        }
        match &w.waker {
            Some(old) if old.will_wake(cx.waker()) => {}
            _ => w.waker = Some(cx.waker().clone()),
        }
        Poll::Pending
    }

    /// Withdraws a queued waiter; a permit it was handed but never took
    /// goes to the next waiter or back to the pool.
    pub(crate) fn cancel(&self, key: usize) {
        let mut list = self.waiters.lock();
        let granted = list.get(key).is_some_and(|w| w.granted);
        list.remove(key);
        if granted {
            self.hand_over(&mut list);
        } else {
            self.clear_waiters(&list);
        }
    }
}

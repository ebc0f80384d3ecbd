//! A fair counting semaphore with an allocation-free fast path: first in,
//! first out for one holder, fewest permits first between holders.
//!
//! # Implementation notes
//!
//! `state` packs the free permits (bits 2..), a `WAITERS` flag (bit 0) and
//! a `CLOSED` flag (bit 1).
//!
//! * Taking a permit without waiting is one CAS, allowed only while
//!   `WAITERS` is clear, so nobody overtakes a queued waiter.
//! * Returning a permit is one CAS while `WAITERS` is clear. Once it is set,
//!   the returner takes the waiter lock and hands the permit straight to a
//!   waiter, so a released permit never lands in the free count while
//!   someone waits.
//! * `WAITERS` is only set or cleared with the waiter lock held. A waiter is
//!   linked only after setting it and seeing no free permit; the list being
//!   empty is the only reason to clear it. So while anyone waits, no permit
//!   is free and every permit changes hands under the lock.
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
//!
//! # Holders (SPEC FAIR-6)
//!
//! Each caller names its *holder* (a flow, as a number; `0` for calls
//! without one). Waiters line up per holder, and a permit that comes back
//! goes to the waiting holder that holds the fewest permits, ties to the
//! one whose first waiter came first; with a single holder that is plain
//! FIFO. Permits held by holders other than `0` are counted under the
//! lock (their fast path takes it); holder `0` keeps the lock-free fast
//! path, and what it holds is the rest: `limit - free - others`.

use std::collections::BTreeSet;
use std::task::{Context, Poll, Waker};

use super::queue::{Lines, NumberMap};
use crate::sync::{AtomicUsize, Mutex, Ordering};

const WAITERS: usize = 1;
const CLOSED: usize = 2;
const ONE: usize = 4;

/// The holder of calls without a flow.
pub(crate) const DEFAULT_HOLDER: u64 = 0;

/// Lines of holders kept open while they neither wait nor hold, at most.
const KEPT_LINES: usize = 256;

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
    /// Refused to make room in a full line (SPEC FAIR-10): unlinked, and
    /// its next poll fails with [`Refused::Full`].
    displaced: bool,
    /// Its place in the order of arrivals (ties between holders).
    seq: u64,
    holder: u64,
}

/// A holder's line and, for holders other than `0`, what it holds.
#[derive(Debug)]
struct Holder {
    id: u64,
    held: usize,
}

/// Everything behind the waiter lock.
#[derive(Debug, Default)]
struct Line {
    lines: Lines<Waiter, Holder>,
    /// The line of holder `0`, when open (looked up without hashing).
    default: Option<u32>,
    /// The lines of other holders.
    index: NumberMap<u64, u32>,
    /// Waiting holders other than `0`, by (held, first waiter's seq, chain).
    order: BTreeSet<(usize, u64, u32)>,
    /// Permits held by holders other than `0`.
    others: usize,
    seq: u64,
}

impl Line {
    fn len(&self) -> usize {
        self.lines.len()
    }

    fn is_empty(&self) -> bool {
        self.lines.is_empty()
    }

    fn chain(&mut self, holder: u64) -> Option<u32> {
        let known = if holder == DEFAULT_HOLDER {
            self.default
        } else {
            self.index.get(&holder).copied()
        };
        if known.is_some() {
            return known;
        }
        self.sweep();
        let c = self.lines.open(Holder {
            id: holder,
            held: 0,
        })?;
        if holder == DEFAULT_HOLDER {
            self.default = Some(c);
        } else {
            self.index.insert(holder, c);
        }
        Some(c)
    }

    /// The order entry of a waiting holder other than `0`.
    fn entry(&self, chain: u32) -> Option<(usize, u64, u32)> {
        if self.default == Some(chain) {
            return None;
        }
        let c = self.lines.chain(chain)?;
        let seq = self.lines.get(c.front()?)?.seq;
        Some((c.meta.held, seq, chain))
    }

    /// Runs `change` on a holder's line, keeping the order.
    fn update(&mut self, chain: u32, change: impl FnOnce(&mut Self)) {
        if let Some(e) = self.entry(chain) {
            self.order.remove(&e);
        }
        change(self);
        if let Some(e) = self.entry(chain) {
            self.order.insert(e);
        }
    }

    /// Closes the lines of holders that neither wait nor hold, once more
    /// than [`KEPT_LINES`] are open (a holder that comes and goes keeps its
    /// line meanwhile, without a map insertion per permit).
    fn sweep(&mut self) {
        if self.index.len() <= KEPT_LINES {
            return;
        }
        let idle: Vec<u32> = self
            .lines
            .chains()
            .filter(|(_, c)| c.len() == 0 && c.meta.held == 0)
            .map(|(id, _)| id)
            .collect();
        for chain in idle {
            if let Some(h) = self.lines.close(chain) {
                if h.id == DEFAULT_HOLDER {
                    self.default = None;
                } else {
                    self.index.remove(&h.id);
                }
            }
        }
    }

    /// Counts a permit taken (`+1`) or returned by `holder`.
    fn count(&mut self, holder: u64, taken: bool) {
        if holder == DEFAULT_HOLDER {
            return;
        }
        let Some(chain) = self.chain(holder) else {
            return;
        };
        self.update(chain, |line| {
            if let Some(c) = line.lines.chain_mut(chain) {
                if taken {
                    c.meta.held += 1;
                    line.others += 1;
                } else if c.meta.held > 0 {
                    c.meta.held -= 1;
                    line.others -= 1;
                }
            }
        });
    }

    /// The waiter to refuse so that one of `holder` may join a line of
    /// `capacity` that is full (SPEC FAIR-10 for a pool's waiting bound,
    /// POOL-3), or `None` when the arrival is refused instead: `holder`
    /// must have fewer waiters than an equal share of the capacity among
    /// the waiting holders (itself included), and the victim is the last
    /// waiter of the holder with the most (ties: the latest last waiter),
    /// which must have more than `holder`.
    fn room_for(&self, holder: u64, capacity: usize) -> Option<usize> {
        let own_chain = if holder == DEFAULT_HOLDER {
            self.default
        } else {
            self.index.get(&holder).copied()
        };
        let own = own_chain
            .and_then(|c| self.lines.chain(c))
            .map_or(0, |c| c.len());
        let waiting = self.lines.chains().filter(|(_, c)| c.len() > 0).count();
        let holders = waiting + usize::from(own == 0);
        if (own as u128) * (holders as u128) >= capacity as u128 {
            return None;
        }
        let (holds, _, victim) = self
            .lines
            .chains()
            .filter_map(|(_, c)| {
                let last = c.back()?;
                Some((c.len(), self.lines.get(last)?.seq, last))
            })
            .max()?;
        (holds > own).then_some(victim)
    }

    /// Refuses the waiter `key` (still linked) to make room: unlinked,
    /// marked, and woken to find out.
    fn displace(&mut self, key: usize) {
        let Some(chain) = self.lines.chain_of(key) else {
            return;
        };
        self.update(chain, |line| {
            line.lines.unlink(key);
            if let Some(w) = line.lines.get_mut(key) {
                w.displaced = true;
                if let Some(waker) = w.waker.take() {
                    waker.wake();
                }
            }
        });
    }

    /// The waiting holder to serve: the fewest permits held, then the
    /// earliest first waiter. `held_by_default` is what holder `0` holds.
    fn pick(&self, held_by_default: usize) -> Option<u32> {
        let other = self.order.first().map(|&(h, s, c)| (h, s, c));
        let default = self.default.and_then(|c| {
            let front = self.lines.chain(c)?.front()?;
            Some((held_by_default, self.lines.get(front)?.seq, c))
        });
        match (other, default) {
            (Some(o), Some(d)) => Some(o.min(d).2),
            (o, d) => o.or(d).map(|e| e.2),
        }
    }
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
    waiters: Mutex<Line>,
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
            waiters: Mutex::new(Line::default()),
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
    /// new limit. A raised limit hands the new permits to waiters
    /// at once (as returned ones); a limit lowered below what is held frees nothing
    /// until enough holders have returned theirs. Waiters keep their
    /// places; a lowered waiting bound refuses only new waiters (a full
    /// line may still make room for a holder under its share: `join`).
    pub(crate) fn resize(&self, limit: usize, max_waiters: usize) {
        let limit = limit.min(Self::MAX);
        let mut line = self.waiters.lock();
        self.max_waiters.store(max_waiters, Ordering::SeqCst);
        let old = self.limit.load(Ordering::SeqCst);
        if limit > old {
            let mut more = limit - old;
            let owed = self.owed.load(Ordering::SeqCst);
            let paid = more.min(owed);
            self.owed.store(owed - paid, Ordering::SeqCst);
            more -= paid;
            // With nothing owed, a new permit goes to a waiter or to the
            // pool, as a returned one would: counted in the limit one at a
            // time, so the waiter picked is the holder with the fewest
            // (SPEC FAIR-6).
            let mut counted = old + paid;
            while more > 0 && !line.is_empty() {
                counted += 1;
                self.limit.store(counted, Ordering::SeqCst);
                self.hand_over(&mut line);
                more -= 1;
            }
            self.limit.store(limit, Ordering::SeqCst);
            if more > 0 {
                self.state.fetch_add(more * ONE, Ordering::SeqCst);
            }
            self.clear_waiters(&line);
        } else if limit < old {
            self.limit.store(limit, Ordering::SeqCst);
            // Close the fast paths (both need `WAITERS` clear), so the
            // free count only changes under the lock from here on.
            let s = self.state.fetch_or(WAITERS, Ordering::SeqCst);
            let fewer = old - limit;
            let taken = (s / ONE).min(fewer);
            self.state.fetch_sub(taken * ONE, Ordering::SeqCst);
            let owed = self.owed.load(Ordering::SeqCst);
            self.owed.store(owed + fewer - taken, Ordering::SeqCst);
            self.clear_waiters(&line);
        }
    }

    /// With the lock held: reopens the fast paths when nobody waits and
    /// nothing is owed.
    fn clear_waiters(&self, line: &Line) {
        if line.is_empty() && self.owed.load(Ordering::SeqCst) == 0 {
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

    /// Takes a permit if one is free and nobody waits (holder `0`).
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

    /// [`try_acquire`](Self::try_acquire) for `holder`.
    #[inline]
    pub(crate) fn try_acquire_for(&self, holder: u64) -> Result<(), TryAcquire> {
        if holder == DEFAULT_HOLDER {
            return self.try_acquire();
        }
        // Without the lock first: a call that cannot take a permit now
        // (someone waits, none is free) does not contend for it.
        let s = self.state.load(Ordering::SeqCst);
        if s & CLOSED != 0 {
            return Err(TryAcquire::Closed);
        }
        if s & WAITERS != 0 || s < ONE {
            return Err(TryAcquire::NoPermits);
        }
        let mut line = self.waiters.lock();
        self.try_acquire()?;
        line.count(holder, true);
        Ok(())
    }

    /// Returns one permit of holder `0`: to a waiter if any, else to the
    /// pool.
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

    /// Returns one permit of `holder`.
    #[inline]
    pub(crate) fn release_for(&self, holder: u64) {
        if holder == DEFAULT_HOLDER {
            return self.release();
        }
        let mut line = self.waiters.lock();
        line.count(holder, false);
        // `WAITERS` only changes under the lock we hold.
        if self.state.load(Ordering::SeqCst) & WAITERS == 0 {
            self.state.fetch_add(ONE, Ordering::SeqCst);
        } else {
            self.hand_over(&mut line);
        }
    }

    #[cold]
    fn release_slow(&self) {
        let mut line = self.waiters.lock();
        self.hand_over(&mut line);
    }

    /// With the lock held: pays back a permit owed beyond a lowered limit,
    /// else gives the permit being returned to the waiting holder with the
    /// fewest permits, or to the pool (clearing `WAITERS`) when none waits.
    fn hand_over(&self, line: &mut Line) {
        let owed = self.owed.load(Ordering::SeqCst);
        if owed > 0 {
            // Held beyond a lowered limit: paid back, not freed.
            self.owed.store(owed - 1, Ordering::SeqCst);
            self.clear_waiters(line);
            return;
        }
        // The returned permit is in transit: not free, held by nobody.
        let free = self.state.load(Ordering::SeqCst) / ONE;
        let by_default = self
            .limit
            .load(Ordering::SeqCst)
            .saturating_sub(free)
            .saturating_sub(line.others)
            .saturating_sub(1);
        if let Some(chain) = line.pick(by_default) {
            let mut holder = DEFAULT_HOLDER;
            line.update(chain, |line| {
                let Some(key) = line.lines.chain(chain).and_then(|c| c.front()) else {
                    return;
                };
                line.lines.unlink(key);
                if let Some(w) = line.lines.get_mut(key) {
                    w.granted = true;
                    holder = w.holder;
                    if let Some(waker) = w.waker.take() {
                        waker.wake();
                    }
                }
            });
            line.count(holder, true);
            self.clear_waiters(line);
            return;
        }
        self.state.fetch_add(ONE, Ordering::SeqCst);
        self.clear_waiters(line);
    }

    /// Refuses new acquisitions and wakes every waiter with `Closed`.
    pub(crate) fn close(&self) {
        self.state.fetch_or(CLOSED, Ordering::SeqCst);
        let mut line = self.waiters.lock();
        for key in line.lines.keys() {
            line.lines.unlink(key);
            if let Some(w) = line.lines.get_mut(key)
                && let Some(waker) = w.waker.take()
            {
                waker.wake();
            }
        }
        line.order.clear();
    }

    /// Waits for a permit in FIFO order.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future removes the waiter; a permit handed to it in the
    /// meantime goes to the next waiter or back to the pool.
    #[cfg(test)]
    pub(crate) async fn acquire(&self) -> Result<(), Refused> {
        self.acquire_for(DEFAULT_HOLDER).await
    }

    /// [`acquire`](Self::acquire) for `holder` (the shared line's share is
    /// per holder, SPEC FAIR-10).
    #[cfg(test)]
    pub(crate) async fn acquire_for(&self, holder: u64) -> Result<(), Refused> {
        struct Waiting<'a>(&'a Permits, Option<usize>);
        impl Drop for Waiting<'_> {
            fn drop(&mut self) {
                if let Some(key) = self.1.take() {
                    self.0.cancel(key);
                }
            }
        }
        let mut waiting = Waiting(self, None);
        std::future::poll_fn(|cx| waiting.0.poll_acquire_for(cx, &mut waiting.1, holder)).await
    }

    /// Takes a free permit, or joins the queue without a waker yet (the
    /// first [`poll_acquire`](Self::poll_acquire) adds it). `Ok(None)`: a
    /// permit is now held; `Ok(Some(key))`: queued under `key`. Lets a caller
    /// fix its place in line while holding a lock of its own.
    #[allow(dead_code)] // The loom model and the unit tests use it.
    pub(crate) fn register(&self) -> Result<Option<usize>, Refused> {
        self.register_for(DEFAULT_HOLDER)
    }

    /// [`register`](Self::register) for `holder`.
    pub(crate) fn register_for(&self, holder: u64) -> Result<Option<usize>, Refused> {
        let mut line = self.waiters.lock();
        self.join(&mut line, None, holder)
    }

    /// With the lock held: takes a free permit (`Ok(None)`) or links a
    /// waiter (`Ok(Some(key))`), unless closed or full.
    fn join(
        &self,
        line: &mut Line,
        waker: Option<Waker>,
        holder: u64,
    ) -> Result<Option<usize>, Refused> {
        let s = self.state.fetch_or(WAITERS, Ordering::SeqCst);
        let refuse = |line: &Line, why| {
            self.clear_waiters(line);
            Err(why)
        };
        if s & CLOSED != 0 {
            return refuse(line, Refused::Closed);
        }
        if line.is_empty() && s >= ONE {
            // Nobody waits and a permit is free: take it and reopen the
            // fast path.
            self.state.fetch_sub(ONE, Ordering::SeqCst);
            self.clear_waiters(line);
            line.count(holder, true);
            return Ok(None);
        }
        let capacity = self.max_waiters.load(Ordering::SeqCst);
        let chain = if line.len() >= capacity {
            // A holder under its share of the full line still gets in, and
            // the holder waiting with the most gives up its last waiter
            // (SPEC FAIR-10): one holder's backlog cannot turn another's
            // first call away.
            let Some(victim) = line.room_for(holder, capacity) else {
                return refuse(line, Refused::Full);
            };
            // (Opening a line closes only lines without waiters.)
            let Some(chain) = line.chain(holder) else {
                return refuse(line, Refused::Full);
            };
            line.displace(victim);
            chain
        } else {
            match line.chain(holder) {
                Some(chain) => chain,
                None => return refuse(line, Refused::Full),
            }
        };
        let seq = line.seq;
        line.seq += 1;
        let mut linked = None;
        line.update(chain, |line| {
            let waiter = Waiter {
                waker,
                granted: false,
                displaced: false,
                seq,
                holder,
            };
            linked = line.lines.push_back(chain, waiter).ok();
        });
        match linked {
            Some(key) => Ok(Some(key)),
            // Four billion waiters: refuse rather than lose track.
            None => refuse(line, Refused::Full),
        }
    }

    /// Polls for a permit (holder `0`). `key` starts as `None`; while it
    /// is `Some` the caller is queued and must call [`cancel`](Self::cancel)
    /// if it gives up. It is `None` again once this returns `Ready`.
    pub(crate) fn poll_acquire(
        &self,
        cx: &mut Context<'_>,
        key: &mut Option<usize>,
    ) -> Poll<Result<(), Refused>> {
        self.poll_acquire_for(cx, key, DEFAULT_HOLDER)
    }

    /// [`poll_acquire`](Self::poll_acquire) for `holder` (used when `key`
    /// is `None`: a queued waiter keeps the holder it joined with).
    pub(crate) fn poll_acquire_for(
        &self,
        cx: &mut Context<'_>,
        key: &mut Option<usize>,
        holder: u64,
    ) -> Poll<Result<(), Refused>> {
        let mut line = self.waiters.lock();
        let Some(k) = *key else {
            // First poll: join the queue unless a permit is free right now.
            return match self.join(&mut line, Some(cx.waker().clone()), holder) {
                Ok(None) => Poll::Ready(Ok(())),
                Ok(Some(k)) => {
                    *key = Some(k);
                    Poll::Pending
                }
                Err(why) => Poll::Ready(Err(why)),
            };
        };
        let Some(w) = line.lines.get_mut(k) else {
            *key = None;
            return Poll::Ready(Err(Refused::Closed));
        };
        if w.granted {
            line.lines.remove(k);
            *key = None;
            return Poll::Ready(Ok(()));
        }
        if w.displaced {
            line.lines.remove(k);
            *key = None;
            self.clear_waiters(&line);
            return Poll::Ready(Err(Refused::Full));
        }
        if self.state.load(Ordering::SeqCst) & CLOSED != 0 {
            Self::withdraw(&mut line, k);
            *key = None;
            return Poll::Ready(Err(Refused::Closed));
        }
        match &w.waker {
            Some(old) if old.will_wake(cx.waker()) => {}
            _ => w.waker = Some(cx.waker().clone()),
        }
        Poll::Pending
    }

    /// Removes a waiter that was not granted, keeping its holder's order.
    fn withdraw(line: &mut Line, key: usize) {
        let chain = line.lines.is_linked(key).then(|| line.lines.chain_of(key));
        match chain.flatten() {
            Some(chain) => line.update(chain, |line| {
                line.lines.remove(key);
            }),
            None => {
                line.lines.remove(key);
            }
        }
    }

    /// Withdraws a queued waiter; a permit it was handed but never took
    /// goes to the next waiter or back to the pool.
    pub(crate) fn cancel(&self, key: usize) {
        let mut line = self.waiters.lock();
        let granted = line.lines.get(key).map(|w| (w.granted, w.holder));
        Self::withdraw(&mut line, key);
        match granted {
            Some((true, holder)) => {
                line.count(holder, false);
                self.hand_over(&mut line);
            }
            _ => self.clear_waiters(&line),
        }
    }
}

//! One limit of a scope, whatever its algorithm.

use std::time::Duration;

use super::Nanos;
use super::bucket::TokenBucket;
use super::demand::{Dimension, Hold};
use super::fixed::{FixedWindow, Periods};
use super::others::Others;
use super::saved::Counted;
use super::sent::Compared;
use super::sliding::SlidingWindow;
use crate::clock::{UtcNanos, from_nanos, utc_nanos};
use crate::config::{Algorithm, Limit};

#[derive(Debug, Clone)]
enum Algo {
    Sliding(SlidingWindow),
    Bucket(TokenBucket),
    Fixed(FixedWindow),
}

/// An answered attempt as a learned limit remembers it: its stamp and its
/// number in the record of what was sent (SPEC Q-14).
pub(crate) type Answer = (Nanos, u32);

/// Whether two advertisements came from distinct answers. A report without
/// an answered attempt counts as an answer of its own.
pub(crate) fn distinct(a: Option<Answer>, b: Option<Answer>) -> bool {
    a.is_none() || b.is_none() || a != b
}

/// The live state of one configured [`Limit`].
#[derive(Debug, Clone)]
pub(crate) struct LimitState {
    pub(crate) config: Limit,
    /// Learned from the provider (SPEC Q-14): its amount follows what the
    /// provider advertises.
    pub(crate) learned: bool,
    /// A stand-in until the provider first answers (SPEC Q-14): it admits,
    /// but tells no instant when it frees (the provider's answer decides,
    /// and may come sooner: no lower bound for an early verdict, SPEC
    /// Q-11); only [`recheck`](Self::recheck) says when its unit ages out.
    pub(crate) provisional: bool,
    /// A learned amount that two distinct answers advertised (SPEC Q-14).
    /// Until then a demand larger than it is not refused: it fits once the
    /// whole limit is free and goes out alone, so that the provider's
    /// answer confirms or corrects the amount.
    pub(crate) confirmed: bool,
    /// The answer that last advertised the learned amount.
    pub(crate) advertised_by: Option<Answer>,
    /// Until when a limit a reconfiguration replaced by one of another
    /// window or algorithm still bounds admissions (one of its windows
    /// after the reconfiguration, or sooner once it counts nothing), so
    /// that no window holding admissions from before admits more than the
    /// old configuration would (see `local/reconfigure.rs`). It never
    /// refuses a demand outright (SPEC Q-3 is the new limits' to judge)
    /// and is not reported.
    pub(crate) transitional: Option<Nanos>,
    /// The first stamps of reservations this limit counted from its start
    /// (a limit a reconfiguration seeded, or one learned from the
    /// provider): a pending reservation's, and a leased one's, which a
    /// recount may have moved ahead of the store's time (see
    /// [`foreign`](Self::foreign)).
    born: (Nanos, Nanos),
    /// Pending amounts of reservations from before `born` that it holds
    /// (a seed's): their leases and refunds take at most this much.
    seeded: u64,
    /// The first stamp of a pending reservation whose amount the seed
    /// holds: one from before it was never counted by the limit the seed
    /// came from, and takes nothing.
    held_from: Nanos,
    /// Other clients' spending, as the provider's answers reveal it.
    others: Others,
    algo: Algo,
}

impl LimitState {
    /// The state of `config` at `now`, in a scope counted by `algorithm`
    /// whose epoch is `epoch` in UTC. A calendar window is a fixed window
    /// whatever the algorithm (SPEC BUD-3).
    pub(crate) fn new(config: Limit, algorithm: Algorithm, now: Nanos, epoch: UtcNanos) -> Self {
        let window = nanos(config.window);
        let algo = match (config.calendar, config.algorithm_in(algorithm)) {
            (Some(calendar), _) => Algo::Fixed(FixedWindow::new(
                config.amount,
                Periods::Calendar { calendar, epoch },
                now,
            )),
            (None, Algorithm::SlidingWindow) => {
                Algo::Sliding(SlidingWindow::new(config.amount, window))
            }
            (None, Algorithm::TokenBucket { burst }) => Algo::Bucket(TokenBucket::new(
                config.amount,
                window,
                burst.map_or(window, nanos),
                now,
            )),
            (None, Algorithm::FixedWindow) => {
                Algo::Fixed(FixedWindow::new(config.amount, Periods::Every(window), now))
            }
        };
        LimitState {
            config,
            learned: false,
            provisional: false,
            confirmed: false,
            advertised_by: None,
            transitional: None,
            born: (0, 0),
            seeded: 0,
            held_from: 0,
            others: Others::default(),
            algo,
        }
    }

    /// Whether a reservation stamped `stamp` was taken before this limit
    /// counted reservations itself (a reconfiguration seeded it, or it was
    /// learned from the provider, SPEC GW-15, Q-14): its leased amount is part of
    /// the seed, or was no longer counted, so a settlement gives nothing
    /// back; a debt is counted from its own instant; a recount counts it
    /// at its new instant beside the seed (longer, never shorter). Its
    /// pending amount is part of the seed's (see
    /// [`release_seeded`](Self::release_seeded)), or was never held here.
    #[inline]
    fn foreign(&self, stamp: Nanos, hold: Hold) -> bool {
        match hold {
            Hold::Pending => stamp < self.born.0,
            Hold::Leased => stamp < self.born.1,
        }
    }

    /// Starts counting reservations as its own from `pending` (a pending
    /// one's stamp) and `leased` (a leased one's, at or after `pending`):
    /// see [`foreign`](Self::foreign).
    pub(crate) fn born_at(&mut self, pending: Nanos, leased: Nanos) {
        self.born = (pending, leased.max(pending));
        if self.seeded == 0 {
            self.held_from = pending;
        }
    }

    /// The first stamp of a pending reservation whose amount it holds:
    /// every one from its start, and those its seed holds.
    pub(crate) fn holds_from(&self) -> Nanos {
        if self.seeded > 0 {
            self.held_from
        } else {
            self.born.0
        }
    }

    /// Gives up to `amount` of the pending amounts a seed holds back, for
    /// a reservation from before `born` that starts or is given up: no
    /// more than the seed holds (one this limit never held, a learned
    /// limit's, takes nothing from the pending amounts of later ones).
    fn release_seeded(&mut self, stamp: Nanos, amount: u64) {
        if stamp < self.held_from {
            return;
        }
        let a = amount.min(self.seeded);
        self.seeded -= a;
        match &mut self.algo {
            Algo::Sliding(w) => w.take_carried(a),
            Algo::Bucket(b) => b.release(a),
            Algo::Fixed(w) => w.release_pending(a),
        }
    }

    /// A copy of the arithmetic for projections, without the answers kept
    /// for comparing a provider's budget, whose pending reservations are
    /// leased at `now` (the store's latest instant). A projection is a
    /// lower bound (SPEC Q-11): a granted call waiting for its permit
    /// starts no earlier than now and so frees its room no later than one
    /// window after now, as the calls queued ahead are assumed to go
    /// rather than leave; held for ever it would make the verdict refuse
    /// calls that are admitted in time.
    pub(crate) fn projected(&self, now: Nanos) -> Self {
        let mut algo = self.algo.clone();
        match &mut algo {
            Algo::Sliding(w) => w.lease_pending(now),
            Algo::Bucket(b) => b.lease_pending(),
            Algo::Fixed(w) => w.lease_pending(),
        }
        LimitState {
            config: self.config,
            learned: self.learned,
            provisional: self.provisional,
            confirmed: self.confirmed,
            advertised_by: self.advertised_by,
            transitional: self.transitional,
            born: self.born,
            seeded: self.seeded,
            held_from: self.held_from,
            others: Others::default(),
            algo,
        }
    }

    pub(crate) fn dimension(&self) -> Dimension {
        self.config.dimension
    }

    pub(crate) fn window(&self) -> Duration {
        self.config.window
    }

    /// Whether `amount` can never fit, whatever the wait (SPEC Q-3): larger
    /// than the whole limit, unless the limit is a learned amount not yet
    /// confirmed (SPEC Q-14); or larger than any amount counted exactly
    /// (2⁵³, far above any real request: a window would count it short).
    pub(crate) fn refuses(&self, amount: u64) -> bool {
        amount > super::sliding::MAX_AMOUNT
            || (amount > self.config.amount && (!self.learned || self.confirmed))
    }

    /// The room `amount` needs to fit: itself, or the whole limit for a
    /// demand larger than an unconfirmed learned limit (it fits once
    /// nothing else is counted, and is then counted in full: SPEC Q-14) or
    /// than a transitional limit (which never holds a demand larger than
    /// itself back for good).
    #[inline]
    pub(crate) fn room(&self, amount: u64) -> u64 {
        if self.transitional.is_some() || (self.learned && !self.confirmed) {
            amount.min(self.config.amount)
        } else {
            amount
        }
    }

    /// Brings the state up to `now` (prune, refill or roll).
    #[inline]
    pub(crate) fn advance(&mut self, now: Nanos) {
        match &mut self.algo {
            Algo::Sliding(w) => w.prune(now),
            Algo::Bucket(b) => b.refill(now),
            Algo::Fixed(w) => w.roll(now),
        }
    }

    #[inline]
    pub(crate) fn fits(&self, amount: u64) -> bool {
        match &self.algo {
            Algo::Sliding(w) => w.fits(amount),
            Algo::Bucket(b) => b.fits(amount),
            Algo::Fixed(w) => w.fits(amount),
        }
    }

    pub(crate) fn earliest(&self, amount: u64, now: Nanos) -> Option<Nanos> {
        if self.provisional {
            return None;
        }
        self.frees(amount, now)
    }

    /// When a provisional stand-in that does not hold `amount` now would
    /// hold it if the provider never answered (its unit ages out of its
    /// window): the instant a head waiting on it looks again (SPEC Q-4),
    /// not a lower bound for an early verdict (see
    /// [`provisional`](Self::provisional)). `None` for any other limit, or
    /// when only a pending lease or refund can make room.
    pub(crate) fn recheck(&self, amount: u64, now: Nanos) -> Option<Nanos> {
        if !self.provisional {
            return None;
        }
        self.frees(amount, now).filter(|&at| at > now)
    }

    /// The instant `amount` fits by the arithmetic alone.
    fn frees(&self, amount: u64, now: Nanos) -> Option<Nanos> {
        let at = match &self.algo {
            Algo::Sliding(w) => w.earliest(amount, now),
            Algo::Bucket(b) => b.earliest(amount, now),
            Algo::Fixed(w) => w.earliest(amount, now),
        };
        // A transitional limit bounds nothing after its end.
        match (at, self.transitional) {
            (Some(at), Some(until)) => Some(at.min(until.max(now))),
            (None, Some(until)) => Some(until.max(now)),
            (at, None) => at,
        }
    }

    /// Inlined: on the fast path of every admission (about 27 instructions
    /// of call overhead per operation otherwise).
    #[inline(always)]
    pub(crate) fn add(&mut self, amount: u64, now: Nanos, hold: Hold) {
        match &mut self.algo {
            Algo::Sliding(w) => w.add(amount, now, hold == Hold::Pending),
            Algo::Bucket(b) if hold == Hold::Pending => b.hold(amount),
            Algo::Bucket(b) => b.take(amount),
            Algo::Fixed(w) => w.add(amount, hold == Hold::Pending),
        }
    }

    pub(crate) fn refund(&mut self, stamp: Nanos, amount: u64, hold: Hold) {
        if self.foreign(stamp, hold) {
            if hold == Hold::Pending {
                self.release_seeded(stamp, amount);
            }
            return;
        }
        match &mut self.algo {
            Algo::Sliding(w) => w.refund(stamp, amount, hold == Hold::Pending),
            Algo::Bucket(b) if hold == Hold::Pending => b.release(amount),
            Algo::Bucket(b) => b.give(amount),
            Algo::Fixed(w) => w.refund(stamp, amount, hold == Hold::Pending),
        }
    }

    pub(crate) fn lease(&mut self, stamp: Nanos, amount: u64, now: Nanos) {
        if self.foreign(stamp, Hold::Pending) {
            self.release_seeded(stamp, amount);
            self.add(amount, now, Hold::Leased);
            return;
        }
        match &mut self.algo {
            Algo::Sliding(w) => w.lease(stamp, amount, now),
            Algo::Bucket(b) => b.lease(amount),
            Algo::Fixed(w) => w.lease(amount, now),
        }
    }

    pub(crate) fn reconcile(&mut self, stamp: Nanos, estimate: u64, actual: u64, now: Nanos) {
        if self.foreign(stamp, Hold::Leased) {
            match &mut self.algo {
                Algo::Sliding(w) => w.reconcile_foreign(stamp, estimate, actual, now),
                Algo::Bucket(b) => b.take(actual.saturating_sub(estimate)),
                Algo::Fixed(w) => w.reconcile_foreign(stamp, estimate, actual),
            }
            return;
        }
        match &mut self.algo {
            Algo::Sliding(w) => w.reconcile(stamp, estimate, actual, now),
            Algo::Bucket(b) => b.reconcile(estimate, actual),
            Algo::Fixed(w) => w.reconcile(stamp, estimate, actual),
        }
    }

    /// Moves a leased amount to `at`, the latest instant the provider can
    /// have counted it (SPEC Q-15); returns the stamp that now locates it.
    /// A token bucket counts a rate, not instants: nothing moves (but see
    /// [`adopt`](Self::adopt)).
    pub(crate) fn recount(&mut self, stamp: Nanos, amount: u64, at: Nanos, now: Nanos) -> Nanos {
        if self.foreign(stamp, Hold::Leased) {
            return match &mut self.algo {
                Algo::Sliding(w) => w.recount_foreign(stamp, amount, at, now),
                Algo::Bucket(_) => stamp,
                Algo::Fixed(w) => w.recount_foreign(stamp, amount, at),
            };
        }
        match &mut self.algo {
            Algo::Sliding(w) => w.recount(stamp, amount, at, now),
            Algo::Bucket(_) => stamp,
            Algo::Fixed(w) => w.recount(stamp, amount, at),
        }
    }

    /// A recount moved a leased reservation of `amount` from `stamp` to
    /// `moved` (see [`recount`](Self::recount)). A token bucket that took
    /// nothing of it, being from before its start, takes it as its own
    /// from there when `moved` is at or after that start, as a window
    /// counts it at `moved`: so a later settlement, which finds it its
    /// own, gives back only what it took (SPEC Q-15, GW-15, Q-7).
    pub(crate) fn adopt(&mut self, stamp: Nanos, moved: Nanos, amount: u64) {
        let adopts = self.foreign(stamp, Hold::Leased) && !self.foreign(moved, Hold::Leased);
        if let (true, Algo::Bucket(b)) = (adopts, &mut self.algo) {
            b.take(amount);
        }
    }

    /// Takes in what the provider had `remaining` for this limit (SPEC
    /// Q-14) and returns the change in what this limit counts (positive:
    /// the provider has less left than tollgate's view; negative: an
    /// earlier estimate of other clients' spending was too high).
    ///
    /// A sliding window brackets other clients' holding with `answer`
    /// (what the provider certainly held of tollgate's traffic when it
    /// counted the answered attempt, and what tollgate no longer counts
    /// but the provider may still have held), estimates it across answers
    /// (see `others.rs`) and counts the estimate until `until` or later,
    /// replacing the previous one; without `answer` it compares with its
    /// own count at `at`. A bucket or fixed window takes only a shortfall
    /// against what it has left.
    pub(crate) fn observe(
        &mut self,
        remaining: u64,
        answer: Option<Compared>,
        at: Nanos,
        until: Nanos,
        now: Nanos,
    ) -> i128 {
        let others = |limit: u64, own: u64| limit.saturating_sub(remaining).saturating_sub(own);
        match &mut self.algo {
            Algo::Sliding(w) => {
                match answer {
                    Some(a) => {
                        let upper = others(w.limit(), a.certain);
                        let lower = others(w.limit(), w.own().saturating_add(a.dropped));
                        match self.others.estimate(lower, upper, a.counted, until, now) {
                            Some((estimate, until)) => w.replace_debts(estimate, until, now),
                            None => 0,
                        }
                    }
                    // Without the answered attempt, tollgate's count at the
                    // answer includes attempts the provider had not counted
                    // yet: the comparison only ever takes more out.
                    None => {
                        let gap = others(w.limit(), w.own_at(at));
                        let debts = w.used().saturating_sub(w.own());
                        if gap <= debts {
                            return 0;
                        }
                        w.replace_debts(gap, until, now)
                    }
                }
            }
            Algo::Bucket(b) => {
                let gap = b.available() - i128::from(remaining);
                let Ok(gap) = u64::try_from(gap) else {
                    return 0;
                };
                b.take(gap);
                i128::from(gap)
            }
            Algo::Fixed(w) => {
                let gap =
                    i128::from(self.config.amount) - i128::from(w.used()) - i128::from(remaining);
                let Ok(gap) = u64::try_from(gap) else {
                    return 0;
                };
                w.charge_at(gap, at);
                i128::from(gap)
            }
        }
    }

    /// Gives a leased amount back in full (SPEC Q-16: a refusal the
    /// provider did not charge).
    pub(crate) fn release(&mut self, stamp: Nanos, amount: u64) {
        if self.foreign(stamp, Hold::Leased) {
            return;
        }
        match &mut self.algo {
            Algo::Sliding(w) => w.release(stamp, amount),
            Algo::Bucket(b) => b.give(amount),
            Algo::Fixed(w) => w.refund(stamp, amount, false),
        }
    }

    /// Changes the amount per window (a limit learned from the provider,
    /// SPEC Q-14).
    pub(crate) fn set_limit(&mut self, amount: u64) {
        self.config.amount = amount;
        match &mut self.algo {
            Algo::Sliding(w) => w.set_limit(amount),
            Algo::Bucket(b) => b.set_limit(amount),
            Algo::Fixed(w) => w.set_limit(amount),
        }
    }

    /// Whether `limit`, in a scope counted by `algorithm`, is this limit's
    /// window counted with the same arithmetic: then a reconfiguration
    /// carries the state as it is. A calendar window is the same only as
    /// the same period in the same time zone.
    pub(crate) fn same_window(&self, limit: &Limit, algorithm: Algorithm) -> bool {
        if self.config.calendar.is_some() || limit.calendar.is_some() {
            return self.config.calendar == limit.calendar;
        }
        self.config.window == limit.window
            && matches!(
                (&self.algo, limit.algorithm_in(algorithm)),
                (Algo::Sliding(_), Algorithm::SlidingWindow)
                    | (Algo::Bucket(_), Algorithm::TokenBucket { .. })
                    | (Algo::Fixed(_), Algorithm::FixedWindow)
            )
    }

    /// Takes a new amount per window, and a bucket's new burst (a
    /// reconfiguration of the same window and algorithm): what is counted
    /// stays counted, so a lowered amount admits nothing more in the
    /// window in progress until enough ages out, and a raised one admits
    /// the difference at once.
    pub(crate) fn set_amount(&mut self, amount: u64, algorithm: Algorithm) {
        self.config.amount = amount;
        let window = nanos(self.config.window);
        match (&mut self.algo, algorithm) {
            (Algo::Bucket(b), Algorithm::TokenBucket { burst }) => {
                b.reconfigure(amount, burst.map_or(window, nanos));
            }
            (Algo::Sliding(w), _) => w.set_limit(amount),
            (Algo::Bucket(b), _) => b.set_limit(amount),
            (Algo::Fixed(w), _) => w.set_limit(amount),
        }
    }

    /// What it counts now that is not pending, and what pending
    /// reservations hold (brought up to date by the caller).
    pub(crate) fn counted(&self) -> (u64, u64) {
        match &self.algo {
            Algo::Sliding(w) => w.counted(),
            Algo::Bucket(b) => b.counted(),
            Algo::Fixed(w) => w.counted(),
        }
    }

    /// The amounts among [`counted`](Self::counted) the provider may
    /// count as late as an instant after `now` (SPEC Q-15), each with
    /// that instant.
    pub(crate) fn ahead(&self, now: Nanos) -> Vec<(Nanos, u64)> {
        match &self.algo {
            Algo::Sliding(w) => w.ahead(now),
            Algo::Bucket(_) => Vec::new(),
            Algo::Fixed(w) => w.ahead(now),
        }
    }

    /// Seeds a fresh limit with what another one counted (see
    /// [`counted`](Self::counted) and [`ahead`](Self::ahead)), as admitted
    /// at `now`, or at its own instant for an amount of `ahead`.
    /// `held_from`: the first stamp of a pending reservation whose amount
    /// `pending` holds (see [`holds_from`](Self::holds_from)).
    pub(crate) fn seed(
        &mut self,
        counted: u64,
        pending: u64,
        ahead: &[(Nanos, u64)],
        now: Nanos,
        held_from: Nanos,
    ) {
        if pending > 0 {
            self.seeded = self.seeded.saturating_add(pending);
            self.held_from = held_from;
        }
        match &mut self.algo {
            Algo::Sliding(w) => w.seed(counted, pending, ahead, now),
            Algo::Bucket(b) => {
                b.take(counted);
                b.hold(pending);
            }
            Algo::Fixed(w) => w.seed(counted, pending, ahead, now),
        }
    }

    /// What it counts, in UTC (SPEC DQ-8): `epoch` is the scope's epoch in
    /// UTC. Brought up to date by the caller.
    pub(crate) fn save(&self, epoch: UtcNanos) -> Counted {
        let utc = |t: Nanos| from_nanos(epoch + i128::from(t));
        match &self.algo {
            Algo::Sliding(w) => {
                Counted::Until(w.saved().into_iter().map(|(t, a)| (utc(t), a)).collect())
            }
            Algo::Fixed(w) => {
                let (start, end, used, ahead) = w.saved();
                Counted::Window {
                    start: utc(start),
                    end: utc(end),
                    used,
                    ahead: ahead.into_iter().map(|(t, a)| (utc(t), a)).collect(),
                }
            }
            Algo::Bucket(b) => {
                let (at, taken) = b.saved();
                Counted::Taken { at: utc(at), taken }
            }
        }
    }

    /// Counts what a limit of the same window and arithmetic saved before
    /// a restart, at `now` (see `saved.rs`). Returns `false`, counting
    /// nothing, when `counted` is of another arithmetic.
    pub(crate) fn restore(&mut self, counted: &Counted, now: Nanos, epoch: UtcNanos) -> bool {
        // A UTC time in ticks; before the epoch, negative.
        let tick = |t: std::time::SystemTime| utc_nanos(t) - epoch;
        let now_at = i128::from(now);
        match (&mut self.algo, counted) {
            (Algo::Sliding(w), Counted::Until(entries)) => {
                let entries: Vec<(Nanos, u64)> = entries
                    .iter()
                    .filter(|(until, _)| tick(*until) > now_at)
                    .map(|&(until, a)| (u64::try_from(tick(until)).unwrap_or(Nanos::MAX), a))
                    .collect();
                w.restore(&entries, now);
            }
            (
                Algo::Fixed(w),
                Counted::Window {
                    end, used, ahead, ..
                },
            ) => {
                let live = (tick(*end) > now_at).then_some(*used);
                let ahead = ahead.iter().map(|&(at, a)| (tick(at), a));
                w.restore(live, tick(*end), ahead, now);
            }
            (Algo::Bucket(b), Counted::Taken { at, taken }) => {
                let elapsed = u64::try_from(now_at - tick(*at)).unwrap_or(0);
                b.restore(*taken, elapsed);
            }
            _ => return false,
        }
        true
    }

    /// Whether it is transitional.
    #[inline]
    pub(crate) fn is_transitional(&self) -> bool {
        self.transitional.is_some()
    }

    /// Whether a transitional limit has done its part at `now`.
    pub(crate) fn expired(&self, now: Nanos) -> bool {
        self.transitional
            .is_some_and(|until| now >= until || self.drained())
    }

    /// Whether it counts nothing any more (brought up to date by the
    /// caller).
    pub(crate) fn drained(&self) -> bool {
        match &self.algo {
            Algo::Sliding(w) => w.used() == 0,
            Algo::Bucket(b) => b.is_full(),
            Algo::Fixed(w) => w.used() == 0,
        }
    }

    /// tollgate's own count and the debts (a sliding window's estimate of
    /// other clients' holding), for tests.
    #[cfg(test)]
    pub(crate) fn own_and_debts(&self) -> (u64, u64) {
        match &self.algo {
            Algo::Sliding(w) => (w.own(), w.used() - w.own()),
            _ => (0, 0),
        }
    }

    /// Units available now; negative while in debt.
    pub(crate) fn available(&self) -> i128 {
        match &self.algo {
            Algo::Sliding(w) => i128::from(w.limit()) - i128::from(w.used()),
            Algo::Bucket(b) => b.available(),
            Algo::Fixed(w) => i128::from(self.config.amount) - i128::from(w.used()),
        }
    }

    /// The most this limit ever holds available.
    pub(crate) fn capacity(&self) -> u64 {
        match &self.algo {
            Algo::Bucket(b) => b.capacity(),
            _ => self.config.amount,
        }
    }
}

/// A duration in nanoseconds, saturating (about 584 years).
pub(crate) fn nanos(d: Duration) -> Nanos {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

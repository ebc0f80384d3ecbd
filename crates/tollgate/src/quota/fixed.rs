//! `fixed_window`: counters that reset at each window boundary (SPEC Q-2),
//! and calendar windows (SPEC BUD-3), which are fixed windows whose
//! boundaries come from the calendar.
//!
//! Rolling-length boundaries are aligned to the scope's epoch (its
//! creation); calendar ones are the periods' first instants (see
//! `calendar.rs`). The current window's bounds are kept, so a reservation
//! costs one comparison, and the calendar is read only when a boundary is
//! crossed. A reservation
//! refunded or reconciled in a later window than the one it was taken in
//! changes nothing: that window's counter is already gone.
//!
//! A reservation waiting for its lease is *pending*: it holds room in every
//! window until its attempt starts, and is then counted in the window in
//! which it starts, as a provider counting arrivals would. `used + pending`
//! never exceeds the limit (before debt), so at most `limit` attempts start
//! per window (SPEC Q-7).
//!
//! A started attempt the provider may count as late as a later window than
//! the current one (cancelled before its arrival bound passed, SPEC Q-15)
//! is kept *ahead*: counted again in each window up to the one holding
//! that instant. Its stamp is then that instant, so a settlement before
//! that window corrects the current window and the amount kept ahead,
//! and a second recount moves it rather than counting it twice.

use super::Nanos;
use super::calendar;
use crate::clock::UtcNanos;
use crate::config::Calendar;

/// Where a fixed window's boundaries lie.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Periods {
    /// Every so many nanoseconds from the scope's epoch.
    Every(Nanos),
    /// The calendar's periods; `epoch` is the scope's epoch in UTC.
    Calendar { calendar: Calendar, epoch: UtcNanos },
}

impl Periods {
    /// The window holding `at`: `[start, end)` with `start <= at < end`.
    fn of(&self, at: Nanos) -> (Nanos, Nanos) {
        match *self {
            Periods::Every(window) => {
                let start = at - at % window;
                (start, start.saturating_add(window))
            }
            Periods::Calendar { calendar, epoch } => {
                match calendar::period(&calendar, epoch + i128::from(at)) {
                    // A period that began before the scope did starts at
                    // its epoch: nothing is counted before it.
                    Some((start, end)) => (tick(start - epoch), tick(end - epoch)),
                    // Beyond the calendar's years: one endless window.
                    None => (0, Nanos::MAX),
                }
            }
        }
    }
}

/// A time since the epoch as a tick, clamped to the ticks' range.
fn tick(n: i128) -> Nanos {
    u64::try_from(n.max(0)).unwrap_or(Nanos::MAX)
}

#[derive(Debug, Clone)]
pub(crate) struct FixedWindow {
    limit: u64,
    periods: Periods,
    /// The current window: `[start, end)`.
    start: Nanos,
    end: Nanos,
    used: u64,
    /// Units held by pending reservations.
    pending: u64,
    /// Leased amounts the provider may count as late as the instant each
    /// is kept with, in a window after the current one (SPEC Q-15).
    ahead: Vec<(Nanos, u64)>,
    /// Leased amounts recounted to a later instant of the current window
    /// (SPEC Q-15): their latest instant and their sum, for a
    /// reconfiguration's seed (see [`ahead`](Self::ahead)).
    within: (Nanos, u64),
}

impl FixedWindow {
    /// A window of `limit` whose boundaries are `periods`, at `now`.
    pub(crate) fn new(limit: u64, periods: Periods, now: Nanos) -> Self {
        let periods = match periods {
            Periods::Every(w) => Periods::Every(w.max(1)),
            calendar => calendar,
        };
        let (start, end) = periods.of(now);
        FixedWindow {
            limit,
            periods,
            start,
            end,
            used: 0,
            pending: 0,
            ahead: Vec::new(),
            within: (0, 0),
        }
    }

    /// Counted plus held units.
    pub(crate) fn used(&self) -> u64 {
        self.used.saturating_add(self.pending)
    }

    /// Starts a new window when `now` crossed a boundary.
    #[inline]
    pub(crate) fn roll(&mut self, now: Nanos) {
        if now >= self.end {
            (self.start, self.end) = self.periods.of(now);
            self.used = 0;
            self.within = (0, 0);
            if !self.ahead.is_empty() {
                self.carry_ahead();
            }
        }
    }

    /// Counts in the new window what may still arrive in it.
    #[cold]
    fn carry_ahead(&mut self) {
        let start = self.start;
        self.ahead.retain(|&(at, _)| at >= start);
        self.used = self
            .ahead
            .iter()
            .fold(0u64, |sum, &(_, amount)| sum.saturating_add(amount));
    }

    /// Whether `amount` fits now. Nothing always fits, even in debt.
    #[inline]
    pub(crate) fn fits(&self, amount: u64) -> bool {
        amount == 0 || self.used().saturating_add(amount) <= self.limit
    }

    /// The next boundary, if a fresh window next to the pending
    /// reservations can hold `amount`; `None` if only their lease or refund
    /// can make room.
    pub(crate) fn earliest(&self, amount: u64, now: Nanos) -> Option<Nanos> {
        if self.fits(amount) {
            return Some(now);
        }
        if self.pending.saturating_add(amount) > self.limit {
            return None;
        }
        Some(self.end.max(now))
    }

    #[inline]
    pub(crate) fn add(&mut self, amount: u64, pending: bool) {
        if pending {
            self.pending = self.pending.saturating_add(amount);
        } else {
            self.used = self.used.saturating_add(amount);
        }
    }

    /// Whether `stamp` lies in the current window.
    fn same_window(&self, stamp: Nanos) -> bool {
        self.start <= stamp && stamp < self.end
    }

    pub(crate) fn refund(&mut self, stamp: Nanos, amount: u64, pending: bool) {
        if pending {
            self.pending = self.pending.saturating_sub(amount);
        } else if self.counts(stamp) {
            self.used = self.used.saturating_sub(amount);
            self.correct_ahead(stamp, amount, 0);
        }
    }

    /// Whether a leased amount stamped `stamp` is counted in the current
    /// window: stamped in it, or recounted to an instant of a later window
    /// (SPEC Q-15), which counts it here and in each window up to that one.
    fn counts(&self, stamp: Nanos) -> bool {
        self.same_window(stamp) || stamp >= self.end
    }

    /// A recounted amount kept ahead for `stamp` now counts `actual`
    /// instead of `estimate` in the windows still to come.
    fn correct_ahead(&mut self, stamp: Nanos, estimate: u64, actual: u64) {
        if stamp < self.end {
            return;
        }
        let found = self
            .ahead
            .iter()
            .position(|&(at, a)| at == stamp && a == estimate)
            .or_else(|| self.ahead.iter().position(|&(at, _)| at == stamp));
        if let Some(i) = found {
            let entry = &mut self.ahead[i].1;
            *entry = entry.saturating_sub(estimate).saturating_add(actual);
        }
    }

    /// Gives up `amount` held pending (a seed's, see
    /// `LimitState::release_seeded`).
    pub(crate) fn release_pending(&mut self, amount: u64) {
        self.pending = self.pending.saturating_sub(amount);
    }

    pub(crate) fn lease(&mut self, amount: u64, now: Nanos) {
        self.roll(now);
        self.pending = self.pending.saturating_sub(amount);
        self.used = self.used.saturating_add(amount);
    }

    /// Every pending reservation starts now, in the current window (a
    /// projection, SPEC Q-11).
    pub(crate) fn lease_pending(&mut self) {
        self.used = self.used.saturating_add(self.pending);
        self.pending = 0;
    }

    /// Counts a leased amount again in every window from the current one
    /// to the one of `at`, the latest instant the provider can have
    /// counted it (SPEC Q-15): in the current window unless it is counted
    /// there already, and in each later one (`at` may lie ahead of now)
    /// as it begins. Nothing when `at` lies before the current window.
    /// Returns the stamp that now locates it.
    pub(crate) fn recount(&mut self, stamp: Nanos, amount: u64, at: Nanos) -> Nanos {
        if at < self.start || at <= stamp {
            return stamp;
        }
        // Counted here already: stamped in this window, or kept ahead
        // by an earlier recount (whose entry then moves to `at`).
        let here = self.counts(stamp);
        if !here {
            self.used = self.used.saturating_add(amount);
        }
        if at >= self.end {
            let kept = (stamp >= self.end)
                .then(|| {
                    self.ahead
                        .iter()
                        .position(|&(t, a)| t == stamp && a == amount)
                })
                .flatten();
            match kept {
                Some(i) => self.ahead[i].0 = at,
                None => self.ahead.push((at, amount)),
            }
        } else {
            self.within = (self.within.0.max(at), self.within.1.saturating_add(amount));
        }
        at
    }

    /// Recounts a reservation this window may not count (taken before a
    /// reconfiguration seeded it, see `LimitState::foreign`) to `at`:
    /// counted in the current window once more unless `at` lies before
    /// it, and kept ahead when `at` lies in a later one.
    pub(crate) fn recount_foreign(&mut self, stamp: Nanos, amount: u64, at: Nanos) -> Nanos {
        if at < self.start || at <= stamp {
            return stamp;
        }
        self.used = self.used.saturating_add(amount);
        if at >= self.end {
            self.ahead.push((at, amount));
        } else {
            self.within = (self.within.0.max(at), self.within.1.saturating_add(amount));
        }
        at
    }

    /// Counts `amount` in the window of `at` if it is the current one
    /// (a provider's smaller remaining budget, SPEC Q-14).
    pub(crate) fn charge_at(&mut self, amount: u64, at: Nanos) {
        if self.same_window(at) {
            self.used = self.used.saturating_add(amount);
        }
    }

    /// Changes the limit (learned from the provider, SPEC Q-14).
    pub(crate) fn set_limit(&mut self, limit: u64) {
        self.limit = limit;
    }

    /// What is counted in the current window, and held by pending
    /// reservations.
    pub(crate) fn counted(&self) -> (u64, u64) {
        (self.used, self.pending)
    }

    /// The leased amounts counted as late as an instant after `now`, each
    /// with that instant (SPEC Q-15); those recounted within the current
    /// window as one amount at the latest of their instants (longer).
    pub(crate) fn ahead(&self, now: Nanos) -> Vec<(Nanos, u64)> {
        self.ahead
            .iter()
            .copied()
            .chain((self.within.1 > 0).then_some(self.within))
            .filter(|(at, _)| *at > now)
            .collect()
    }

    /// Seeds a fresh window with what another limit counted (a
    /// reconfiguration): counted in the window of `now`, and each amount
    /// of `ahead` (part of `counted`) kept ahead to its instant when that
    /// lies in a later window, where its reservation's stamp finds it, or
    /// remembered as recounted within this one (for a later seed).
    pub(crate) fn seed(&mut self, counted: u64, pending: u64, ahead: &[(Nanos, u64)], now: Nanos) {
        self.roll(now);
        self.used = self.used.saturating_add(counted);
        self.pending = self.pending.saturating_add(pending);
        for &(at, amount) in ahead {
            if at >= self.end {
                self.ahead.push((at, amount));
            } else if at > now {
                self.within = (self.within.0.max(at), self.within.1.saturating_add(amount));
            }
        }
    }

    /// The current window and what it counts, pending amounts aside (SPEC
    /// DQ-8): `(start, end, used)`, and the amounts kept ahead (SPEC
    /// Q-15), each with its instant: for later windows, and those
    /// recounted within this one as in [`ahead`](Self::ahead).
    pub(crate) fn saved(&self) -> (Nanos, Nanos, u64, Vec<(Nanos, u64)>) {
        let mut ahead = self.ahead.clone();
        if self.within.1 > 0 {
            ahead.push(self.within);
        }
        (self.start, self.end, self.used, ahead)
    }

    /// Settles a reservation this window may not count (see
    /// [`recount_foreign`](Self::recount_foreign)): nothing is given back
    /// (its amount is part of the seed, or was no longer counted); a debt
    /// above the estimate is counted where the reservation is.
    pub(crate) fn reconcile_foreign(&mut self, stamp: Nanos, estimate: u64, actual: u64) {
        if actual > estimate {
            self.reconcile(stamp, estimate, actual);
        }
    }

    /// Counts what was saved before a restart, at `now`: `used`, from a
    /// window that has not ended (`None` if it has), in the window of
    /// `now` (which ends no earlier for a calendar window, and later for a
    /// rolling-length one: its windows restart at the new epoch); and each
    /// amount kept ahead to an instant, counted until the saved windows'
    /// one holding that instant ends (`saved_end` is the saved window's
    /// end; times in ticks, negative before the epoch). A live window's
    /// `used` counts them already.
    pub(crate) fn restore(
        &mut self,
        used: Option<u64>,
        saved_end: i128,
        ahead: impl Iterator<Item = (i128, u64)>,
        now: Nanos,
    ) {
        self.roll(now);
        if let Some(used) = used {
            self.used = self.used.saturating_add(used);
        }
        let start = self.unclamped_start(now);
        // As a sliding window believes an expiry (see `SlidingWindow::
        // restore`): up to one window after `now` plus the larger of one
        // window and the arrival cap; later is a clock that went back.
        let len = i128::from(self.end - self.start);
        let cap = i128::from(super::limit::nanos(crate::lifecycle::ARRIVAL_CAP));
        let horizon = i128::from(now) + len + len.max(cap);
        for (at, amount) in ahead {
            // The last instant it is counted at, in this process's windows.
            let last = match self.periods {
                // The saved windows' boundaries, not this epoch's.
                Periods::Every(w) => {
                    let w = i128::from(w);
                    let ends = if at < saved_end {
                        saved_end
                    } else {
                        saved_end + ((at - saved_end) / w + 1) * w
                    };
                    if ends <= i128::from(now) {
                        continue;
                    }
                    ends - 1
                }
                Periods::Calendar { .. } if at < start => continue,
                Periods::Calendar { .. } => at,
            };
            if used.is_none() {
                self.used = self.used.saturating_add(amount);
            }
            let last = tick(last.min(horizon));
            if last >= self.end {
                self.ahead.push((last, amount));
            }
        }
    }

    /// The first instant of the window of `now`, negative when a calendar
    /// period began before the scope did.
    fn unclamped_start(&self, now: Nanos) -> i128 {
        match self.periods {
            Periods::Calendar { calendar, epoch } => {
                calendar::period(&calendar, epoch + i128::from(now))
                    .map_or(0, |(start, _)| start - epoch)
            }
            Periods::Every(_) => i128::from(self.start),
        }
    }

    pub(crate) fn reconcile(&mut self, stamp: Nanos, estimate: u64, actual: u64) {
        if self.counts(stamp) {
            self.used = self.used.saturating_sub(estimate).saturating_add(actual);
            self.correct_ahead(stamp, estimate, actual);
            self.within_debt(stamp, actual.saturating_sub(estimate));
        }
    }

    /// A debt on a reservation that may be one recounted within the
    /// current window (stamped no later than the latest of those) joins
    /// their sum: a seed counts it from their latest instant (longer).
    fn within_debt(&mut self, stamp: Nanos, debt: u64) {
        if debt > 0 && self.within.1 > 0 && stamp <= self.within.0 && self.same_window(stamp) {
            self.within.1 = self.within.1.saturating_add(debt);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Nanos = 1_000_000_000;

    // proves: Q-2 (fixed window: counters reset at each boundary)
    #[test]
    fn resets_at_each_boundary() {
        let mut w = FixedWindow::new(3, Periods::Every(60 * S), 0);
        w.add(3, false);
        assert!(!w.fits(1));
        assert_eq!(w.earliest(1, 10 * S), Some(60 * S));
        w.roll(60 * S);
        assert!(w.fits(3));
        // A refund for the previous window changes nothing now.
        w.add(2, false);
        w.refund(0, 2, false);
        assert_eq!(w.used(), 2);
        // A pending reservation holds room until it starts, then counts in
        // the window where it starts.
        w.add(1, true);
        assert_eq!(w.earliest(1, 70 * S), Some(120 * S));
        assert_eq!(w.earliest(3, 70 * S), None);
        w.lease(1, 130 * S);
        assert_eq!(w.used(), 1);
    }

    // proves: Q-15 (an amount the provider may count as late as a later
    // window is counted in every window up to that one, then no more)
    #[test]
    fn recount_ahead_counts_in_each_window_up_to_the_instant() {
        let mut w = FixedWindow::new(3, Periods::Every(10 * S), 0);
        w.add(1, false);
        // Leased at 8 s; the provider may count it until 25 s.
        assert_eq!(w.recount(8 * S, 1, 25 * S), 25 * S);
        assert_eq!(w.used(), 1, "counted once in its own window");
        w.roll(10 * S);
        assert_eq!(w.used(), 1);
        w.roll(20 * S);
        assert_eq!(w.used(), 1);
        w.roll(30 * S);
        assert_eq!(w.used(), 0);
        // Leased in an earlier window, counted by an instant of this one.
        assert_eq!(w.recount(25 * S, 2, 35 * S), 35 * S);
        assert_eq!(w.used(), 2);
        // An instant before the current window changes nothing.
        assert_eq!(w.recount(5 * S, 2, 15 * S), 5 * S);
        assert_eq!(w.used(), 2);
    }
}

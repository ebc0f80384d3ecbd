//! `fixed_window`: counters that reset at each window boundary (SPEC Q-2).
//!
//! Boundaries are aligned to the scope's epoch (its creation). A reservation
//! refunded or reconciled in a later window than the one it was taken in
//! changes nothing: that window's counter is already gone. A pending
//! reservation leased in a later window is counted again in the window in
//! which its attempt starts, as a provider counting arrivals would.

use super::Nanos;

#[derive(Debug, Clone)]
pub(crate) struct FixedWindow {
    limit: u64,
    window: Nanos,
    index: u64,
    used: u64,
}

impl FixedWindow {
    pub(crate) fn new(limit: u64, window: Nanos) -> Self {
        FixedWindow {
            limit,
            window: window.max(1),
            index: 0,
            used: 0,
        }
    }

    pub(crate) fn used(&self) -> u64 {
        self.used
    }

    fn index_of(&self, at: Nanos) -> u64 {
        at / self.window
    }

    /// Starts a new window when `now` crossed a boundary.
    #[inline]
    pub(crate) fn roll(&mut self, now: Nanos) {
        let idx = self.index_of(now);
        if idx > self.index {
            self.index = idx;
            self.used = 0;
        }
    }

    /// Whether `amount` fits now. Nothing always fits, even in debt.
    #[inline]
    pub(crate) fn fits(&self, amount: u64) -> bool {
        amount == 0 || self.used.saturating_add(amount) <= self.limit
    }

    /// The next boundary (a demand that fits a fresh window fits then).
    pub(crate) fn earliest(&self, amount: u64, now: Nanos) -> Nanos {
        if self.fits(amount) {
            return now;
        }
        self.window.saturating_mul(self.index + 1).max(now)
    }

    #[inline]
    pub(crate) fn add(&mut self, amount: u64) {
        self.used = self.used.saturating_add(amount);
    }

    fn same_window(&self, stamp: Nanos) -> bool {
        self.index_of(stamp) == self.index
    }

    pub(crate) fn refund(&mut self, stamp: Nanos, amount: u64) {
        if self.same_window(stamp) {
            self.used = self.used.saturating_sub(amount);
        }
    }

    pub(crate) fn lease(&mut self, stamp: Nanos, amount: u64, now: Nanos) {
        self.roll(now);
        if !self.same_window(stamp) {
            self.add(amount);
        }
    }

    pub(crate) fn reconcile(&mut self, stamp: Nanos, estimate: u64, actual: u64) {
        if self.same_window(stamp) {
            self.used = self.used.saturating_sub(estimate).saturating_add(actual);
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
        let mut w = FixedWindow::new(3, 60 * S);
        w.add(3);
        assert!(!w.fits(1));
        assert_eq!(w.earliest(1, 10 * S), 60 * S);
        w.roll(60 * S);
        assert!(w.fits(3));
        // A refund for the previous window changes nothing now.
        w.add(2);
        w.refund(0, 2);
        assert_eq!(w.used(), 2);
    }
}

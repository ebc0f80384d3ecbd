//! `sliding_window`: a log of admissions per limit (SPEC Q-2, the default).
//!
//! # Invariant
//!
//! `used` equals the sum of the amounts of the live log slots plus `carry`.
//! A demand is admitted only when `used + amount <= limit`, so the amounts
//! stamped inside any interval of length `window` never exceed `limit`
//! (before debt: reconciliation above the estimate may push `used` over the
//! limit, and later demands then wait until the debt ages out).
//!
//! # Bounded memory
//!
//! Admissions less than `resolution` after a slot opened are merged into it,
//! and the slot's expiry moves to one window after the latest of them.
//! Merging only ever keeps an amount counted for longer, never shorter, so
//! the bound above holds exactly; the price is that an amount may stay
//! counted up to `resolution` longer than strictly needed. With
//! `resolution = window / SLOTS` a limit holds at most `SLOTS + 1` slots
//! whatever its rate.
//!
//! # Pending reservations
//!
//! A reservation taken at the head of the queue may wait for concurrency
//! before its attempt starts. Until it is leased its amount is *pending*: if
//! its slot ages out meanwhile, the pending part moves to `carry` and stays
//! counted. Leasing moves the amount to a slot at the lease instant, so what
//! the provider sees arrive is what the log counts (and never earlier).
//!
//! Times are nanoseconds since the scope's epoch ([`Nanos`]).

use std::collections::VecDeque;

use super::Nanos;

/// Slots per window: bounds memory and the merge error (`window / SLOTS`).
pub(crate) const SLOTS: u64 = 512;

#[derive(Debug, Clone, Copy)]
struct Slot {
    opened: Nanos,
    /// No admission joins this slot at or after this instant.
    closes: Nanos,
    /// One window after the slot's latest admission.
    expires: Nanos,
    amount: u64,
    pending: u64,
}

#[derive(Debug, Clone)]
pub(crate) struct SlidingWindow {
    limit: u64,
    window: Nanos,
    resolution: Nanos,
    log: VecDeque<Slot>,
    used: u64,
    carry: u64,
}

impl SlidingWindow {
    pub(crate) fn new(limit: u64, window: Nanos) -> Self {
        SlidingWindow {
            limit,
            window,
            resolution: (window / SLOTS).max(1),
            log: VecDeque::with_capacity(SLOTS as usize + 2),
            used: 0,
            carry: 0,
        }
    }

    pub(crate) fn limit(&self) -> u64 {
        self.limit
    }

    /// Counted amount (may exceed the limit through debt).
    pub(crate) fn used(&self) -> u64 {
        self.used
    }

    /// Drops slots whose amounts aged out at `now`.
    #[inline]
    pub(crate) fn prune(&mut self, now: Nanos) {
        while let Some(front) = self.log.front() {
            if front.expires > now {
                break;
            }
            let (amount, pending) = (front.amount, front.pending);
            self.log.pop_front();
            self.used = self.used.saturating_sub(amount - pending);
            self.carry += pending;
        }
    }

    /// Whether `amount` fits now. Nothing always fits, even in debt.
    #[inline]
    pub(crate) fn fits(&self, amount: u64) -> bool {
        amount == 0 || self.used.saturating_add(amount) <= self.limit
    }

    /// Earliest instant at which `amount` fits, assuming no new admissions.
    /// `None`: only a pending lease or refund can make room.
    pub(crate) fn earliest(&self, amount: u64, now: Nanos) -> Option<Nanos> {
        let excess = self.used.saturating_add(amount).saturating_sub(self.limit);
        if excess == 0 || amount == 0 {
            return Some(now);
        }
        let mut freed = 0u64;
        for slot in &self.log {
            freed += slot.amount - slot.pending;
            if freed >= excess {
                return Some(slot.expires.max(now));
            }
        }
        None
    }

    /// Counts `amount` at `now` (the caller checked that it fits, or is
    /// recording debt).
    #[inline]
    pub(crate) fn add(&mut self, amount: u64, now: Nanos, pending: bool) {
        if amount == 0 {
            return;
        }
        self.used = self.used.saturating_add(amount);
        let pend = if pending { amount } else { 0 };
        let expires = now.saturating_add(self.window);
        if let Some(back) = self.log.back_mut()
            && now < back.closes
        {
            back.amount += amount;
            back.pending += pend;
            back.expires = back.expires.max(expires);
            return;
        }
        self.log.push_back(Slot {
            opened: now,
            closes: now.saturating_add(self.resolution),
            expires,
            amount,
            pending: pend,
        });
    }

    #[inline]
    fn locate(&self, stamp: Nanos) -> Option<usize> {
        // Most lookups are for a recent reservation: try the newest slot.
        if let Some(back) = self.log.back()
            && back.opened <= stamp
        {
            return Some(self.log.len() - 1);
        }
        let idx = self.log.partition_point(|s| s.opened <= stamp);
        idx.checked_sub(1)
    }

    /// Removes a reservation's amount from wherever it is counted.
    fn take(&mut self, stamp: Nanos, amount: u64, pending: bool) {
        match self.locate(stamp).and_then(|i| self.log.get_mut(i)) {
            Some(slot) => {
                let a = amount.min(slot.amount);
                slot.amount -= a;
                if pending {
                    slot.pending = slot.pending.saturating_sub(a);
                }
                self.used = self.used.saturating_sub(a);
            }
            None if pending => {
                let a = amount.min(self.carry);
                self.carry -= a;
                self.used = self.used.saturating_sub(a);
            }
            // A leased amount whose slot aged out is no longer counted.
            None => {}
        }
    }

    /// Returns a reservation that never started (SPEC Q-9).
    pub(crate) fn refund(&mut self, stamp: Nanos, amount: u64, pending: bool) {
        self.take(stamp, amount, pending);
    }

    /// Moves a pending reservation to the lease instant.
    pub(crate) fn lease(&mut self, stamp: Nanos, amount: u64, now: Nanos) {
        self.take(stamp, amount, true);
        self.add(amount, now, false);
    }

    /// Replaces a leased estimate by the reported amount in the same slot
    /// (SPEC Q-5). Nothing changes once the slot aged out.
    pub(crate) fn reconcile(&mut self, stamp: Nanos, estimate: u64, actual: u64) {
        if let Some(slot) = self.locate(stamp).and_then(|i| self.log.get_mut(i)) {
            if actual >= estimate {
                let debt = actual - estimate;
                slot.amount = slot.amount.saturating_add(debt);
                self.used = self.used.saturating_add(debt);
            } else {
                let refund = (estimate - actual).min(slot.amount - slot.pending);
                slot.amount -= refund;
                self.used = self.used.saturating_sub(refund);
            }
        }
    }

    #[cfg(test)]
    pub(crate) fn slots(&self) -> usize {
        self.log.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Nanos = 1_000_000_000;

    // proves: Q-2 (sliding window: a full limit may be used at once, and frees
    // exactly one window after each admission)
    #[test]
    fn frees_one_window_after_each_admission() {
        let mut w = SlidingWindow::new(2, 60 * S);
        w.add(1, 0, false);
        w.add(1, 30 * S, false);
        assert!(!w.fits(1));
        assert_eq!(w.earliest(1, 31 * S), Some(60 * S));
        assert_eq!(w.earliest(2, 31 * S), Some(90 * S));
        w.prune(60 * S);
        assert!(w.fits(1));
        assert!(!w.fits(2));
    }

    // proves: Q-2 (memory stays bounded by merging admissions into slots)
    #[test]
    fn slots_stay_bounded_under_a_high_rate() {
        let mut w = SlidingWindow::new(u64::MAX / 2, 60 * S);
        for i in 0..200_000u64 {
            let now = i * 1_000_000;
            w.prune(now);
            w.add(1, now, false);
            assert!(w.slots() <= SLOTS as usize + 1);
        }
    }

    // proves: Q-5 (reconciliation lands in the slot of the estimate)
    #[test]
    fn reconcile_adjusts_the_original_slot() {
        let mut w = SlidingWindow::new(100, 60 * S);
        w.add(40, 0, false);
        w.add(10, 10 * S, false);
        w.reconcile(0, 40, 25);
        assert_eq!(w.used(), 35);
        w.reconcile(10 * S, 10, 30);
        assert_eq!(w.used(), 55);
        // The refund frees room now, the debt expires with its own slot.
        w.prune(60 * S);
        assert_eq!(w.used(), 30);
        w.prune(70 * S);
        assert_eq!(w.used(), 0);
        // Once aged out, reconciliation changes nothing.
        w.reconcile(0, 40, 400);
        assert_eq!(w.used(), 0);
    }

    // proves: Q-9 (a pending reservation stays counted until leased or
    // refunded, even when its slot ages out)
    #[test]
    fn pending_amounts_outlive_their_slot() {
        let mut w = SlidingWindow::new(10, 60 * S);
        w.add(6, 0, true);
        w.prune(61 * S);
        assert_eq!(w.used(), 6);
        assert_eq!(w.earliest(5, 61 * S), None);
        w.lease(0, 6, 61 * S);
        assert_eq!(w.used(), 6);
        w.prune(121 * S);
        assert_eq!(w.used(), 0);

        w.add(4, 130 * S, true);
        w.prune(200 * S);
        w.refund(130 * S, 4, true);
        assert_eq!(w.used(), 0);
    }

    // proves: Q-2 (merged admissions expire one window after the latest)
    #[test]
    fn merged_slot_expires_after_its_latest_admission() {
        let mut w = SlidingWindow::new(10, 60 * S);
        w.add(1, 0, false);
        w.add(1, 50_000_000, false); // 50 ms later: same slot
        assert_eq!(w.slots(), 1);
        w.prune(60 * S);
        assert_eq!(w.used(), 2);
        w.prune(60 * S + 50_000_000);
        assert_eq!(w.used(), 0);
    }
}

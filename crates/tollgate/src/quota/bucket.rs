//! `token_bucket`: continuous refill with a burst capacity (SPEC Q-2).
//!
//! The level is kept exactly in integer units scaled by the window length in
//! nanoseconds: refilling for `e` nanoseconds adds `e * limit` scaled units,
//! so `limit` units arrive per window with no rounding drift. The level may
//! go negative (debt) and is capped at the capacity
//! `C = max(1, limit * burst / window)`; the bucket starts full. A demand
//! larger than `C` is admitted when the bucket is full and leaves debt.
//!
//! A reservation still waiting for its lease is *pending*: it holds room
//! (`level - pending` is what others may take) but leaves the bucket level
//! alone until its attempt starts. Refunding it then restores exactly the
//! state in which it never existed, and the bound of SPEC Q-7
//! (`max(C, E_max) + limit` per window) holds at the instants attempts
//! start.

use super::Nanos;

#[derive(Debug, Clone)]
pub(crate) struct TokenBucket {
    limit: u64,
    window: i128,
    capacity: u64,
    /// Level in units × `window` nanoseconds.
    level: i128,
    updated: Nanos,
    /// Units held by pending reservations.
    pending: u64,
}

impl TokenBucket {
    pub(crate) fn new(limit: u64, window: Nanos, burst: Nanos, now: Nanos) -> Self {
        let window = u128::from(window.max(1));
        let capacity =
            (u128::from(limit) * u128::from(burst) / window).clamp(1, u128::from(u64::MAX)) as u64;
        // Lossless: `window` came from a u64.
        let window = window as i128;
        TokenBucket {
            limit,
            window,
            capacity,
            level: i128::from(capacity) * window,
            updated: now,
            pending: 0,
        }
    }

    pub(crate) fn capacity(&self) -> u64 {
        self.capacity
    }

    fn scaled(&self, units: u64) -> i128 {
        i128::from(units).saturating_mul(self.window)
    }

    /// Adds what flowed in since the last update.
    #[inline]
    pub(crate) fn refill(&mut self, now: Nanos) {
        if now <= self.updated {
            return;
        }
        let elapsed = i128::from(now - self.updated);
        let cap = self.scaled(self.capacity);
        self.level = self
            .level
            .saturating_add(elapsed.saturating_mul(i128::from(self.limit)))
            .min(cap);
        self.updated = now;
    }

    /// Whole units available to new reservations now (negative: debt).
    pub(crate) fn available(&self) -> i128 {
        self.free().div_euclid(self.window)
    }

    /// The level minus what pending reservations hold.
    fn free(&self) -> i128 {
        self.level.saturating_sub(self.scaled(self.pending))
    }

    fn need(&self, amount: u64) -> i128 {
        self.scaled(amount.min(self.capacity))
    }

    /// Whether `amount` fits now. Nothing always fits, even in debt.
    #[inline]
    pub(crate) fn fits(&self, amount: u64) -> bool {
        amount == 0 || self.free() >= self.need(amount)
    }

    /// When `amount` fits by refill alone; `None` when the bucket cannot
    /// hold it next to the pending reservations (their lease or refund
    /// decides).
    pub(crate) fn earliest(&self, amount: u64, now: Nanos) -> Option<Nanos> {
        let need = self.need(amount);
        let deficit = need - self.free();
        if deficit <= 0 || amount == 0 {
            return Some(now.max(self.updated));
        }
        if need.saturating_add(self.scaled(self.pending)) > self.scaled(self.capacity) {
            return None;
        }
        let limit = i128::from(self.limit.max(1));
        let wait = (deficit + limit - 1) / limit;
        Some(
            self.updated
                .saturating_add(u64::try_from(wait).unwrap_or(u64::MAX))
                .max(now),
        )
    }

    /// Holds `amount` for a reservation that has not started yet.
    pub(crate) fn hold(&mut self, amount: u64) {
        self.pending = self.pending.saturating_add(amount);
    }

    /// A pending reservation starts: its amount leaves the bucket now.
    pub(crate) fn lease(&mut self, amount: u64) {
        self.pending = self.pending.saturating_sub(amount);
        self.take(amount);
    }

    /// Every pending reservation starts now (a projection, SPEC Q-11).
    pub(crate) fn lease_pending(&mut self) {
        self.lease(self.pending);
    }

    /// A pending reservation is given up: as if it never was.
    pub(crate) fn release(&mut self, amount: u64) {
        self.pending = self.pending.saturating_sub(amount);
    }

    #[inline]
    pub(crate) fn take(&mut self, amount: u64) {
        self.level = self.level.saturating_sub(self.scaled(amount));
    }

    /// Returns units, never above the capacity.
    pub(crate) fn give(&mut self, amount: u64) {
        let cap = self.scaled(self.capacity);
        self.level = self.level.saturating_add(self.scaled(amount)).min(cap);
    }

    /// Changes the limit (learned from the provider, SPEC Q-14): the rate
    /// and the capacity follow it; the level is kept, capped at the new
    /// capacity.
    pub(crate) fn set_limit(&mut self, limit: u64) {
        let scaled_capacity = i128::from(self.capacity).saturating_mul(self.window);
        let burst = if self.limit == 0 {
            self.window
        } else {
            scaled_capacity / i128::from(self.limit)
        };
        self.limit = limit;
        let capacity = (i128::from(limit) * burst / self.window).clamp(1, i128::from(u64::MAX));
        self.capacity = u64::try_from(capacity).unwrap_or(u64::MAX);
        self.level = self.level.min(self.scaled(self.capacity));
    }

    /// Takes a new limit and burst (a reconfiguration): what was taken
    /// stays taken, so the level moves by the change in capacity (a raised
    /// capacity is available at once, a lowered one may leave debt). The
    /// rate follows the new limit from the last refill on.
    pub(crate) fn reconfigure(&mut self, limit: u64, burst: Nanos) {
        let window = u128::try_from(self.window).unwrap_or(1).max(1);
        let capacity =
            (u128::from(limit) * u128::from(burst) / window).clamp(1, u128::from(u64::MAX)) as u64;
        let grown = i128::from(capacity) - i128::from(self.capacity);
        self.level = self
            .level
            .saturating_add(grown.saturating_mul(self.window))
            .min(self.scaled(capacity));
        self.limit = limit;
        self.capacity = capacity;
    }

    /// Units taken (rounded up) and held by pending reservations.
    pub(crate) fn counted(&self) -> (u64, u64) {
        let missing = self.scaled(self.capacity).saturating_sub(self.level).max(0);
        let taken = (missing + self.window - 1) / self.window;
        (u64::try_from(taken).unwrap_or(u64::MAX), self.pending)
    }

    /// When it was last refilled, and the units missing from a full bucket
    /// then (rounded up, pending amounts aside): what a restart must not
    /// forget (SPEC DQ-8).
    pub(crate) fn saved(&self) -> (Nanos, u64) {
        (self.updated, self.counted().0)
    }

    /// Takes `taken` units saved before a restart, less what flowed in
    /// during the `elapsed` nanoseconds since (rounded down).
    pub(crate) fn restore(&mut self, taken: u64, elapsed: Nanos) {
        let refilled = i128::from(elapsed).saturating_mul(i128::from(self.limit)) / self.window;
        let left = i128::from(taken).saturating_sub(refilled).max(0);
        self.take(u64::try_from(left).unwrap_or(u64::MAX));
    }

    /// Whether it is full with nothing pending: it limits nothing more
    /// than a fresh bucket would.
    pub(crate) fn is_full(&self) -> bool {
        self.pending == 0 && self.level >= self.scaled(self.capacity)
    }

    pub(crate) fn reconcile(&mut self, estimate: u64, actual: u64) {
        if actual >= estimate {
            self.take(actual - estimate);
        } else {
            self.give(estimate - actual);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Nanos = 1_000_000_000;

    // proves: Q-2 (token bucket: full at start, continuous refill at limit/W)
    #[test]
    fn starts_full_and_refills_continuously() {
        let mut b = TokenBucket::new(60, 60 * S, 60 * S, 0);
        assert_eq!(b.capacity(), 60);
        b.take(60);
        assert!(!b.fits(1));
        assert_eq!(b.earliest(1, 0), Some(S));
        assert_eq!(b.earliest(3, 0), Some(3 * S));
        b.refill(2_500_000_000);
        assert_eq!(b.available(), 2);
    }

    // proves: Q-2 (capacity C = max(1, limit * burst / W))
    #[test]
    fn burst_sets_the_capacity() {
        assert_eq!(TokenBucket::new(600, 60 * S, 6 * S, 0).capacity(), 60);
        assert_eq!(TokenBucket::new(5, 60 * S, S, 0).capacity(), 1);
    }

    // proves: Q-5 (debt makes the level negative; refill pays it back)
    #[test]
    fn a_demand_above_capacity_leaves_debt() {
        let mut b = TokenBucket::new(10, 10 * S, S, 0);
        assert_eq!(b.capacity(), 1);
        assert!(b.fits(5));
        b.take(5);
        assert_eq!(b.available(), -4);
        assert_eq!(b.earliest(1, 0), Some(5 * S));
        b.give(100);
        assert_eq!(b.available(), 1);
    }

    // proves: Q-9 (a pending reservation holds room without touching the
    // level; its refund leaves the bucket as if it never was)
    #[test]
    fn pending_reservations_hold_room() {
        let mut b = TokenBucket::new(60, 60 * S, 60 * S, 0);
        b.hold(50);
        assert!(!b.fits(20));
        assert_eq!(b.earliest(20, 0), None);
        assert_eq!(b.earliest(5, 0), Some(0));
        b.release(50);
        assert_eq!(b.available(), 60);
        b.hold(50);
        b.lease(50);
        assert_eq!(b.available(), 10);
        assert_eq!(b.earliest(20, 0), Some(10 * S));
    }
}

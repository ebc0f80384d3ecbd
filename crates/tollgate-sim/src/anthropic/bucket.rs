//! An exact, continuously replenished token bucket: Anthropic's documented
//! rate-limit model ("capacity is continuously replenished up to your maximum
//! limit, rather than being reset at fixed intervals").
//!
//! # Semantics
//!
//! A bucket of capacity `C` per period `P` starts full, refills at `C / P`
//! per unit of time up to `C`, and admits an amount `n` at instant `t` iff it
//! holds at least `n` at `t`. So over any interval of length `d` it admits at
//! most `C + C·d/P` (minus what is still reserved).
//!
//! # Implementation notes
//!
//! * The level is kept in fixed point, scaled by the period in nanoseconds:
//!   `level = tokens × P_ns`. Refilling for `e` nanoseconds adds exactly
//!   `e × C`, so there is no rounding anywhere; `u128` holds
//!   `u64::MAX × 366 days` with room to spare, and every operation
//!   saturates.
//! * The bucket never moves backwards in time: an instant older than the
//!   last one it has seen is treated as that one (the caller reads the clock
//!   under the lock that updates, so this does not happen in practice).

use std::time::Duration;

use tokio::time::Instant;

use crate::window::Fit;

/// A token bucket over one dimension (requests, input or output tokens).
#[derive(Debug, Clone)]
pub struct TokenBucket {
    capacity: u64,
    /// The period in nanoseconds (at least 1).
    period: u128,
    /// Tokens × `period`, at most `capacity × period`.
    level: u128,
    /// The last instant the level was brought up to.
    at: Option<Instant>,
}

impl TokenBucket {
    /// A full bucket of `capacity` replenished over `period` (a zero period
    /// counts as one nanosecond).
    pub fn new(capacity: u64, period: Duration) -> Self {
        let period = period.as_nanos().max(1);
        Self {
            capacity,
            period,
            level: u128::from(capacity).saturating_mul(period),
            at: None,
        }
    }

    /// The capacity.
    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    fn full(&self) -> u128 {
        u128::from(self.capacity).saturating_mul(self.period)
    }

    /// Brings the level up to `now` and returns the instant used (never
    /// earlier than the last one seen).
    fn refill(&mut self, now: Instant) -> Instant {
        let now = match self.at {
            Some(at) if at > now => at,
            _ => now,
        };
        if let Some(at) = self.at {
            let elapsed = now.saturating_duration_since(at).as_nanos();
            let added = elapsed.saturating_mul(u128::from(self.capacity));
            self.level = self.level.saturating_add(added).min(self.full());
        }
        self.at = Some(now);
        now
    }

    /// Whole tokens in the bucket at `now`.
    pub fn available(&mut self, now: Instant) -> u64 {
        self.refill(now);
        u64::try_from(self.level / self.period).unwrap_or(u64::MAX)
    }

    /// When `amount` fits: now, from an exact instant on (if nothing else is
    /// taken meanwhile), or never (larger than the capacity).
    pub fn wait_for(&mut self, now: Instant, amount: u64) -> Fit {
        if amount > self.capacity {
            return Fit::Never;
        }
        let now = self.refill(now);
        let need = u128::from(amount).saturating_mul(self.period);
        if self.level >= need {
            return Fit::Now;
        }
        // `capacity >= amount > 0` here, so the division is defined.
        let nanos = (need - self.level).div_ceil(u128::from(self.capacity.max(1)));
        Fit::At(now + nanos_duration(nanos))
    }

    /// Takes `amount` at `now`. The caller has checked that it fits
    /// ([`wait_for`](Self::wait_for) said `Now`); otherwise the level
    /// stops at zero.
    pub fn take(&mut self, now: Instant, amount: u64) {
        self.refill(now);
        let amount = u128::from(amount).saturating_mul(self.period);
        self.level = self.level.saturating_sub(amount);
    }

    /// Gives back `amount` at `now` (a refund), never above the capacity.
    pub fn give(&mut self, now: Instant, amount: u64) {
        self.refill(now);
        let amount = u128::from(amount).saturating_mul(self.period);
        self.level = self.level.saturating_add(amount).min(self.full());
    }

    /// Time from `now` until the bucket is full again (zero when full).
    pub fn until_full(&mut self, now: Instant) -> Duration {
        self.refill(now);
        let missing = self.full().saturating_sub(self.level);
        nanos_duration(missing.div_ceil(u128::from(self.capacity.max(1))))
    }

    /// Refills the bucket completely.
    pub fn clear(&mut self) {
        self.level = self.full();
        self.at = None;
    }
}

fn nanos_duration(nanos: u128) -> Duration {
    Duration::from_nanos(u64::try_from(nanos).unwrap_or(u64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    const P: Duration = Duration::from_secs(60);

    // proves: SIM-2 (Anthropic buckets: start full, refill continuously, exact wait)
    #[test]
    fn a_bucket_refills_continuously_and_waits_exactly() {
        let t0 = Instant::now();
        let mut b = TokenBucket::new(60, P);
        assert_eq!(b.available(t0), 60);
        assert_eq!(b.wait_for(t0, 60), Fit::Now);
        b.take(t0, 60);
        assert_eq!(b.available(t0), 0);
        // One token per second comes back.
        assert_eq!(b.wait_for(t0, 1), Fit::At(t0 + Duration::from_secs(1)));
        assert_eq!(b.wait_for(t0, 30), Fit::At(t0 + Duration::from_secs(30)));
        let t = t0 + Duration::from_millis(1_500);
        assert_eq!(b.available(t), 1);
        assert_eq!(b.wait_for(t, 2), Fit::At(t0 + Duration::from_secs(2)));
        assert_eq!(b.until_full(t), Duration::from_millis(58_500));
        assert_eq!(b.wait_for(t, 61), Fit::Never);
        // Never above the capacity.
        assert_eq!(b.available(t0 + 10 * P), 60);
        b.give(t0 + 10 * P, 5);
        assert_eq!(b.available(t0 + 10 * P), 60);
        assert_eq!(b.until_full(t0 + 10 * P), Duration::ZERO);
    }

    // proves: SIM-2 (a late clock read cannot move a bucket backwards)
    #[test]
    fn an_older_instant_is_treated_as_the_last_seen() {
        let t0 = Instant::now();
        let mut b = TokenBucket::new(10, P);
        b.take(t0 + Duration::from_secs(6), 10);
        // Read at t0: treated as t0 + 6 s, nothing refilled, nothing lost.
        assert_eq!(b.available(t0), 0);
        assert_eq!(b.available(t0 + Duration::from_secs(12)), 1);
    }

    // proves: SIM-2 (a bucket never admits more than C + C·d/P over d)
    #[test]
    fn greedy_taking_never_exceeds_the_refill_bound() {
        let t0 = Instant::now();
        let mut b = TokenBucket::new(7, Duration::from_secs(1));
        let mut taken = 0u64;
        let step = Duration::from_millis(13);
        let mut t = t0;
        for _ in 0..1_000 {
            if b.wait_for(t, 3) == Fit::Now {
                b.take(t, 3);
                taken += 3;
            }
            t += step;
        }
        let elapsed = t.duration_since(t0).as_nanos();
        let bound = 7 + u64::try_from(elapsed * 7 / 1_000_000_000).expect("fits");
        assert!(taken <= bound, "{taken} > {bound}");
        assert!(taken + 3 + 7 >= bound, "greedy takes nearly all: {taken}");
    }
}

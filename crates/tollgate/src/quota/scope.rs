//! All limits of one scope, reserved atomically (SPEC Q-1).

use std::time::Duration;

use super::Nanos;
use super::demand::{Demand, Dimension, Hold, LimitedBy, NotUntil, Reservation};
use super::limit::{LimitState, nanos};
use super::store::{LimitSnapshot, QuotaStore};
use crate::clock::Instant;
use crate::config::{Algorithm, ScopeConfig};
use crate::error::ExceedsLimit;

/// The in-process quota arithmetic of one scope (the default store).
///
/// Every method takes the current instant explicitly; nothing here reads a
/// clock or runs in the background (refill is computed on demand, SPEC Q-2).
/// Internally instants are nanoseconds since the scope's creation.
#[derive(Debug, Clone)]
pub struct LocalQuota {
    algorithm: Algorithm,
    epoch: Instant,
    /// The latest instant seen (nanoseconds since `epoch`): the store's
    /// time never goes backwards (SPEC Q-13).
    latest: Nanos,
    limits: Vec<LimitState>,
}

impl LocalQuota {
    /// The state of a freshly configured scope at `now`.
    pub fn new(config: &ScopeConfig, now: Instant) -> Self {
        LocalQuota {
            algorithm: config.algorithm,
            epoch: now,
            latest: 0,
            limits: config
                .limits
                .iter()
                .map(|l| LimitState::new(*l, config.algorithm, 0))
                .collect(),
        }
    }

    /// The store's time for `at`: nanoseconds since the epoch, never
    /// earlier than an instant already seen (SPEC Q-13).
    ///
    /// Callers read the clock before they take the scope's lock, so two
    /// threads can hand the store their instants in the opposite order of
    /// their reads. Every algorithm assumes that time only moves forward
    /// (a sliding window locates a reservation by the slot open at its
    /// stamp), so an instant older than the latest one is treated as the
    /// latest one. The difference is the time between a clock read and the
    /// lock: an amount is counted that much later, never earlier, which
    /// keeps every bound of SPEC Q-7.
    #[inline]
    fn tick(&mut self, at: Instant) -> Nanos {
        let t = nanos(at.saturating_duration_since(self.epoch));
        if t > self.latest {
            self.latest = t;
        }
        self.latest
    }

    fn instant(&self, at: Nanos) -> Instant {
        self.epoch
            .checked_add(Duration::from_nanos(at))
            .unwrap_or(self.epoch)
    }

    fn advance(&mut self, now: Nanos) {
        for l in &mut self.limits {
            l.advance(now);
        }
    }
}

impl QuotaStore for LocalQuota {
    fn check(&self, demand: &Demand) -> Result<(), ExceedsLimit> {
        for l in &self.limits {
            let amount = demand.amount(l.dimension());
            if amount > l.config.amount {
                return Err(ExceedsLimit {
                    dimension: l.dimension(),
                    demand: amount,
                    limit: l.config.amount,
                    window: l.window(),
                });
            }
        }
        Ok(())
    }

    #[inline]
    fn try_reserve(&mut self, demand: &Demand, now: Instant, hold: Hold) -> Option<u64> {
        let t = self.tick(now);
        let mut fits = true;
        for l in &mut self.limits {
            l.advance(t);
            fits &= l.fits(demand.amount(l.dimension()));
        }
        if !fits {
            return None;
        }
        for l in &mut self.limits {
            l.add(demand.amount(l.dimension()), t, hold);
        }
        Some(t)
    }

    #[cold]
    fn not_until(&mut self, demand: &Demand, now: Instant) -> NotUntil {
        let t = self.tick(now);
        self.advance(t);
        let mut limited_by = LimitedBy::default();
        let mut at: Option<Nanos> = None;
        for l in &self.limits {
            let amount = demand.amount(l.dimension());
            if !l.fits(amount) {
                limited_by.add(l.dimension());
                // A known instant is still a useful lower bound when another
                // limit waits on a pending lease: the waiter re-checks then.
                if let Some(e) = l.earliest(amount, t) {
                    at = Some(at.map_or(e, |a| a.max(e)));
                }
            }
        }
        NotUntil {
            at: at.map(|a| self.instant(a)),
            limited_by,
        }
    }

    fn lease(&mut self, reservation: &mut Reservation, now: Instant) {
        if reservation.hold == Hold::Leased {
            return;
        }
        let (t, stamp) = (self.tick(now), reservation.tick);
        self.advance(t);
        for l in &mut self.limits {
            l.lease(stamp, reservation.demand.amount(l.dimension()), t);
        }
        reservation.stamp = self.instant(t);
        reservation.tick = t;
        reservation.hold = Hold::Leased;
    }

    fn refund(&mut self, reservation: &Reservation, now: Instant) {
        let (t, stamp) = (self.tick(now), reservation.tick);
        self.advance(t);
        for l in &mut self.limits {
            l.refund(
                stamp,
                reservation.demand.amount(l.dimension()),
                reservation.hold,
            );
        }
    }

    #[inline]
    fn reconcile(&mut self, reservation: &Reservation, actual_tokens: u64) {
        if actual_tokens == reservation.demand.tokens {
            return;
        }
        let stamp = reservation.tick;
        for l in &mut self.limits {
            if l.dimension() == Dimension::Tokens {
                l.reconcile(stamp, reservation.demand.tokens, actual_tokens);
            }
        }
    }

    fn project(&self) -> Option<Box<dyn QuotaStore>> {
        Some(Box::new(self.clone()))
    }

    fn snapshot(&mut self, now: Instant, out: &mut Vec<LimitSnapshot>) {
        let t = self.tick(now);
        self.advance(t);
        out.extend(self.limits.iter().map(|l| LimitSnapshot {
            dimension: l.dimension(),
            window: l.window(),
            limit: l.config.amount,
            capacity: l.capacity(),
            available: i64::try_from(l.available()).unwrap_or(i64::MIN),
            algorithm: self.algorithm,
        }));
    }
}

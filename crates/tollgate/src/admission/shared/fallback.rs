//! The local share a shared scope falls back to (SPEC DQ-3,
//! `fail_open_local`).

use crate::clock::Instant;
use crate::config::ScopeConfig;
use crate::error::ExceedsLimit;
use crate::quota::{
    Actual, Demand, Hold, LimitSnapshot, LocalQuota, NotUntil, QuotaStore, Reservation,
};

/// `limit / replicas` (at least 1) of every limit of a scope, in process.
///
/// It is the scope's in-process store while the scope is kept in a shared
/// store: reservations go to it only while the shared store is
/// unavailable under `fail_open_local`. It cannot be projected (the early
/// verdict and forecasts of a shared scope cannot see the other
/// processes), and it ignores provider budget reports: those describe the
/// shared budget, not this share (SPEC Q-14 is per process; see
/// `docs/design.md`).
#[derive(Debug)]
pub(crate) struct FallbackQuota(LocalQuota);

impl FallbackQuota {
    /// The share of `scope` for one of `replicas` processes, at `now`.
    pub(crate) fn new(scope: &ScopeConfig, replicas: u32, now: Instant) -> Self {
        let mut share = scope.clone();
        share.learn = None;
        for limit in &mut share.limits {
            limit.amount = (limit.amount / u64::from(replicas.max(1))).max(1);
        }
        FallbackQuota(LocalQuota::new(&share, now))
    }
}

impl QuotaStore for FallbackQuota {
    fn check(&self, demand: &Demand) -> Result<(), ExceedsLimit> {
        self.0.check(demand)
    }

    fn try_reserve(&mut self, demand: &Demand, now: Instant, hold: Hold) -> Option<u64> {
        self.0.try_reserve(demand, now, hold)
    }

    fn not_until(&mut self, demand: &Demand, now: Instant) -> NotUntil {
        self.0.not_until(demand, now)
    }

    fn lease(&mut self, reservation: &mut Reservation, now: Instant) {
        self.0.lease(reservation, now);
    }

    fn refund(&mut self, reservation: &Reservation, now: Instant) {
        self.0.refund(reservation, now);
    }

    fn reconcile(&mut self, reservation: &Reservation, actual: &Actual) {
        self.0.reconcile(reservation, actual);
    }

    fn recount(&mut self, reservation: &mut Reservation, at: Instant, now: Instant) {
        self.0.recount(reservation, at, now);
    }

    fn release(&mut self, reservation: &Reservation, requests: bool, tokens: bool) {
        self.0.release(reservation, requests, tokens);
    }

    fn project(&self) -> Option<Box<dyn QuotaStore>> {
        None
    }

    fn snapshot(&mut self, now: Instant, out: &mut Vec<LimitSnapshot>) {
        self.0.snapshot(now, out);
    }
}

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
/// shared budget, not this share, and go to the shared store (SPEC DQ-9;
/// see `docs/design.md`).
#[derive(Debug)]
pub(crate) struct FallbackQuota {
    share: LocalQuota,
    replicas: u32,
}

impl FallbackQuota {
    /// The share of `scope` for one of `replicas` processes, at `now`.
    pub(crate) fn new(scope: &ScopeConfig, replicas: u32, now: Instant) -> Self {
        FallbackQuota {
            share: LocalQuota::new(&share(scope, replicas), now),
            replicas,
        }
    }
}

/// `limit / replicas` (at least 1) of every limit of `scope`, learning
/// nothing.
fn share(scope: &ScopeConfig, replicas: u32) -> ScopeConfig {
    let mut share = scope.clone();
    share.learn = None;
    for limit in &mut share.limits {
        limit.amount = (limit.amount / u64::from(replicas.max(1))).max(1);
    }
    share
}

impl QuotaStore for FallbackQuota {
    fn check(&self, demand: &Demand) -> Result<(), ExceedsLimit> {
        self.share.check(demand)
    }

    fn try_reserve(&mut self, demand: &Demand, now: Instant, hold: Hold) -> Option<u64> {
        self.share.try_reserve(demand, now, hold)
    }

    fn not_until(&mut self, demand: &Demand, now: Instant) -> NotUntil {
        self.share.not_until(demand, now)
    }

    fn recheck_at(&mut self, demand: &Demand, now: Instant) -> Option<Instant> {
        self.share.recheck_at(demand, now)
    }

    fn lease(&mut self, reservation: &mut Reservation, now: Instant) {
        self.share.lease(reservation, now);
    }

    fn refund(&mut self, reservation: &Reservation, now: Instant) {
        self.share.refund(reservation, now);
    }

    fn reconcile(&mut self, reservation: &Reservation, actual: &Actual) {
        self.share.reconcile(reservation, actual);
    }

    fn recount(&mut self, reservation: &mut Reservation, at: Instant, now: Instant) {
        self.share.recount(reservation, at, now);
    }

    fn release(&mut self, reservation: &Reservation, requests: bool, tokens: bool, cost: bool) {
        self.share.release(reservation, requests, tokens, cost);
    }

    /// The share of the new configuration, keeping what the share
    /// counts (SPEC GW-15).
    fn reconfigure(&mut self, scope: &ScopeConfig, now: Instant) -> bool {
        self.share.reconfigure(&share(scope, self.replicas), now);
        true
    }

    fn project(&self) -> Option<Box<dyn QuotaStore>> {
        None
    }

    fn snapshot(&mut self, now: Instant, out: &mut Vec<LimitSnapshot>) {
        self.share.snapshot(now, out);
    }
}

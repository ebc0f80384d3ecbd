//! All limits of one scope, reserved atomically (SPEC Q-1).

use std::time::Duration;

use super::Nanos;
use super::demand::{
    Actual, BudgetReport, Demand, Dimension, Hold, LimitedBy, NotUntil, Observed, Reservation,
};
use super::limit::{Answer, LimitState, distinct, nanos};
use super::saved::SavedScope;
use super::sent::SentLog;
use super::store::{LimitSnapshot, QuotaStore};
use crate::clock::{Instant, UtcNanos, WallClock};
use crate::config::{Algorithm, Limit, ScopeConfig};
use crate::error::ExceedsLimit;

mod reconfigure;
mod saved;

/// What an advertised limit changed (SPEC Q-14).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Adopted {
    Nothing,
    /// A new amount, not yet confirmed.
    Changed(u64),
    /// A second, distinct answer advertised the amount in force.
    Confirmed(u64),
}

/// The in-process quota arithmetic of one scope (the default store).
///
/// Every method takes the current instant explicitly; nothing here reads a
/// clock or runs in the background (refill is computed on demand, SPEC Q-2).
/// Internally instants are nanoseconds since the scope's creation.
#[derive(Debug, Clone)]
pub struct LocalQuota {
    algorithm: Algorithm,
    epoch: Instant,
    /// `epoch` in UTC: where calendar periods begin (SPEC BUD-3) and what
    /// saved state is measured against (SPEC DQ-8).
    epoch_utc: UtcNanos,
    /// The latest instant seen (nanoseconds since `epoch`): the store's
    /// time never goes backwards (SPEC Q-13).
    latest: Nanos,
    /// The latest stamp a recount gave a reservation (SPEC Q-15): it may
    /// lie ahead of `latest`.
    furthest: Nanos,
    /// The tick a reservation was last stamped at (reserved or leased).
    stamped: Option<Nanos>,
    limits: Vec<LimitState>,
    /// The window of limits learned from the provider (SPEC Q-14).
    learn: Option<Duration>,
    /// What was sent and by when the provider counted it (SPEC Q-14).
    sent: SentLog,
    /// Some limit is transitional (a reconfiguration replaced it): drained
    /// ones are dropped as time advances.
    draining: bool,
    /// Changes whenever what is counted may have changed (SPEC DQ-8: a
    /// saver skips a scope whose version it has already written).
    version: u64,
}

impl LocalQuota {
    /// The state of a freshly configured scope at `now`, calendar windows
    /// read on the system's wall clock.
    pub fn new(config: &ScopeConfig, now: Instant) -> Self {
        Self::with_wall(config, now, WallClock::system_at(now))
    }

    /// The state of a freshly configured scope at `now`, whose instants
    /// are in UTC what `wall` says (calendar windows, SPEC BUD-3).
    pub fn with_wall(config: &ScopeConfig, now: Instant, wall: WallClock) -> Self {
        let epoch_utc = wall.nanos(now);
        let mut limits: Vec<LimitState> = config
            .limits
            .iter()
            .map(|l| LimitState::new(*l, config.algorithm, 0, epoch_utc))
            .collect();
        if let Some(window) = config.learn
            && !limits.iter().any(|l| l.dimension() == Dimension::Requests)
        {
            // One request per window until the provider says more: nothing
            // is sent blind (SPEC Q-14).
            let mut provisional = LimitState::new(
                Limit::new(Dimension::Requests, 1, window),
                config.algorithm,
                0,
                epoch_utc,
            );
            provisional.learned = true;
            provisional.provisional = true;
            limits.push(provisional);
        }
        // Providers report per-window budgets: the record serves the
        // scope's shortest window, and only a sliding window reads it.
        let sliding = matches!(config.algorithm, Algorithm::SlidingWindow);
        let shortest = limits
            .iter()
            .map(LimitState::window)
            .chain(config.learn)
            .min()
            .unwrap_or_default();
        LocalQuota {
            algorithm: config.algorithm,
            epoch: now,
            epoch_utc,
            latest: 0,
            furthest: 0,
            stamped: None,
            limits,
            learn: config.learn,
            sent: SentLog::new(if sliding { nanos(shortest) } else { 0 }),
            draining: false,
            version: 0,
        }
    }

    /// Adopts an advertised limit for a dimension the configuration left
    /// out (SPEC Q-14), advertised by `answer`.
    ///
    /// A new amount, higher or lower, is adopted at once as the rate, but
    /// unconfirmed: a demand larger than it is not refused (see
    /// [`LimitState::room`]). The same amount advertised again by a
    /// distinct answer confirms it; only a confirmed amount refuses larger
    /// demands. So one answer, right or wrong, never makes a call fail.
    fn adopt(
        &mut self,
        dimension: Dimension,
        amount: u64,
        answer: Option<Answer>,
        now: Nanos,
    ) -> Adopted {
        let Some(window) = self.learn else {
            return Adopted::Nothing;
        };
        if amount == 0 {
            return Adopted::Nothing;
        }
        if let Some(l) = self
            .limits
            .iter_mut()
            .find(|l| l.dimension() == dimension && !l.is_transitional())
        {
            if !l.learned {
                return Adopted::Nothing;
            }
            if l.config.amount == amount && !l.provisional {
                if l.confirmed || !distinct(l.advertised_by, answer) {
                    return Adopted::Nothing;
                }
                l.confirmed = true;
                return Adopted::Confirmed(amount);
            }
            l.provisional = false;
            l.confirmed = false;
            l.advertised_by = answer;
            l.set_limit(amount);
            return Adopted::Changed(amount);
        }
        let now = self.fresh_start().max(now);
        let mut learned = LimitState::new(
            Limit::new(dimension, amount, window),
            self.algorithm,
            now,
            self.epoch_utc,
        );
        learned.learned = true;
        learned.advertised_by = answer;
        // It holds none of the reservations taken before it: their
        // settlements give it nothing back, their leases count from then.
        learned.born_at(now, self.leased_born(now));
        learned.advance(now);
        self.limits.push(learned);
        Adopted::Changed(amount)
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
        if self.draining {
            self.drop_expired(now);
        }
    }

    /// The instant a new limit (a reconfiguration's, a learned one) starts
    /// at: the store's time, moved a nanosecond on when a reservation is
    /// stamped with it, so that every reservation taken before the limit
    /// is stamped earlier than every one taken after (see
    /// `LimitState::foreign`).
    fn fresh_start(&mut self) -> Nanos {
        if self.stamped == Some(self.latest) {
            self.latest = self.latest.saturating_add(1);
        }
        self.latest
    }

    /// The first stamp of a leased reservation a limit that starts
    /// counting at `at` (a reconfiguration's, a learned one) takes as its
    /// own: `at`, or past every stamp a recount moved ahead of it.
    fn leased_born(&self, at: Nanos) -> Nanos {
        if self.furthest >= at {
            self.furthest.saturating_add(1)
        } else {
            at
        }
    }

    /// Drops the transitional limits that have done their part.
    #[cold]
    fn drop_expired(&mut self, now: Nanos) {
        self.limits.retain(|l| !l.expired(now));
        self.draining = self.limits.iter().any(LimitState::is_transitional);
    }
}

impl QuotaStore for LocalQuota {
    fn check(&self, demand: &Demand) -> Result<(), ExceedsLimit> {
        for l in self.limits.iter().filter(|l| !l.is_transitional()) {
            let amount = demand.amount(l.dimension());
            if l.refuses(amount) {
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
        if self.draining {
            self.advance(t);
        }
        let mut fits = true;
        for l in &mut self.limits {
            l.advance(t);
            fits &= l.fits(l.room(demand.amount(l.dimension())));
        }
        if !fits {
            return None;
        }
        self.version = self.version.wrapping_add(1);
        self.stamped = Some(t);
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
            let amount = l.room(demand.amount(l.dimension()));
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

    fn recheck_at(&mut self, demand: &Demand, now: Instant) -> Option<Instant> {
        let t = self.tick(now);
        self.advance(t);
        let mut at: Option<Nanos> = None;
        for l in self.limits.iter().filter(|l| l.provisional) {
            let amount = l.room(demand.amount(l.dimension()));
            if !l.fits(amount)
                && let Some(e) = l.recheck(amount, t)
            {
                at = Some(at.map_or(e, |a| a.max(e)));
            }
        }
        at.map(|a| self.instant(a))
    }

    fn lease(&mut self, reservation: &mut Reservation, now: Instant) {
        if reservation.hold == Hold::Leased {
            return;
        }
        self.version = self.version.wrapping_add(1);
        let (t, stamp) = (self.tick(now), reservation.tick);
        self.advance(t);
        for l in &mut self.limits {
            l.lease(stamp, reservation.demand.amount(l.dimension()), t);
        }
        reservation.stamp = self.instant(t);
        reservation.tick = t;
        self.stamped = Some(t);
        reservation.hold = Hold::Leased;
    }

    fn refund(&mut self, reservation: &Reservation, now: Instant) {
        self.version = self.version.wrapping_add(1);
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
    fn reconcile(&mut self, reservation: &Reservation, actual: &Actual) {
        self.version = self.version.wrapping_add(1);
        let (stamp, demand) = (reservation.tick, &reservation.demand);
        for l in &mut self.limits {
            // Each token limit from its own figure (SPEC Q-12).
            let Some(used) = actual.amount(l.dimension(), demand) else {
                continue;
            };
            let estimate = demand.amount(l.dimension());
            if used != estimate {
                l.reconcile(stamp, estimate, used, self.latest);
            }
        }
        self.sent.reconcile(reservation.seq, demand, actual);
    }

    fn recount(&mut self, reservation: &mut Reservation, at: Instant, now: Instant) {
        if reservation.hold != Hold::Leased {
            return;
        }
        self.version = self.version.wrapping_add(1);
        let now = self.tick(now);
        // `at` may lie ahead of now (an attempt cancelled before its
        // arrival bound passed): counted until one window after it, so
        // longer, never shorter (SPEC Q-15).
        let at = nanos(at.saturating_duration_since(self.epoch));
        if reservation.seq == 0 {
            // The record of what was sent keeps the store's own time (its
            // horizon follows the latest instant it holds).
            let counted = at.min(now).max(reservation.tick);
            reservation.seq = self
                .sent
                .record(reservation.tick, counted, &reservation.demand);
        }
        if at <= reservation.tick {
            return;
        }
        let stamp = reservation.tick;
        let mut moved = stamp;
        for l in &mut self.limits {
            l.advance(now);
            let amount = reservation.demand.amount(l.dimension());
            // Every limit moves it to the same instant or leaves it.
            moved = moved.max(l.recount(stamp, amount, at, now));
        }
        if moved != stamp {
            for l in &mut self.limits {
                l.adopt(stamp, moved, reservation.demand.amount(l.dimension()));
            }
            self.furthest = self.furthest.max(moved);
            reservation.tick = moved;
            reservation.stamp = self.instant(moved);
        }
    }

    fn release(&mut self, reservation: &Reservation, requests: bool, tokens: bool, cost: bool) {
        self.version = self.version.wrapping_add(1);
        for l in &mut self.limits {
            // `tokens` stands for every token dimension (SPEC ).
            let give = match l.dimension() {
                Dimension::Requests => requests,
                Dimension::Cost => cost,
                _ => tokens,
            };
            if give {
                l.release(reservation.tick, reservation.demand.amount(l.dimension()));
            }
        }
        self.sent.release(reservation.seq, requests, tokens);
    }

    fn observe(
        &mut self,
        report: &BudgetReport,
        answered: Option<&Reservation>,
        at: Instant,
        now: Instant,
    ) -> Observed {
        // No provider reports money (SPEC BUD-2): nothing to learn.
        if report.dimension.is_cost() {
            return Observed::default();
        }
        let now = self.tick(now);
        self.version = self.version.wrapping_add(1);
        let at = nanos(at.saturating_duration_since(self.epoch)).min(now);
        for l in &mut self.limits {
            l.advance(now);
        }
        let mut observed = Observed::default();
        if let Some(limit) = report.limit {
            let answer = answered.map(|r| (r.tick, r.seq));
            match self.adopt(report.dimension, limit, answer, now) {
                Adopted::Nothing => {}
                Adopted::Changed(amount) => observed.adopted = Some(amount),
                Adopted::Confirmed(amount) => observed.confirmed = Some(amount),
            }
        }
        let Some(remaining) = report.remaining else {
            return observed;
        };
        // The provider's per-window budget is matched by the shortest
        // window of the dimension (a day limit is not what it reports).
        let Some(l) = self
            .limits
            .iter_mut()
            .filter(|l| l.dimension() == report.dimension && !l.is_transitional())
            .min_by_key(|l| l.window())
        else {
            return observed;
        };
        let window = nanos(l.window());
        // What tollgate knows of its own traffic when the provider counted
        // the answered attempt, and when that was.
        let answer = answered.and_then(|r| self.sent.compare(r.seq, report.dimension, window, now));
        // Counted until the provider's reset, at most one window, from the
        // answer (the provider may have reported its state when it
        // answered rather than when it counted the attempt). A zero reset
        // (the provider had room in this dimension) says nothing about
        // when others' spending leaves its window.
        let from = answer.map_or(at, |a| a.counted.max(at));
        let reset = match report.reset {
            Some(r) if !r.is_zero() => nanos(r).min(window),
            _ => window,
        };
        let until = from.saturating_add(reset);
        let change = l.observe(remaining, answer, at, until, now);
        observed.gap = u64::try_from(change).unwrap_or(0);
        observed.freed = u64::try_from(-change).unwrap_or(0);
        observed
    }

    fn answered(&mut self) -> bool {
        let before = self.limits.len();
        self.limits.retain(|l| !l.provisional);
        let changed = self.limits.len() != before;
        if changed {
            self.version = self.version.wrapping_add(1);
        }
        changed
    }

    fn version(&self) -> Option<u64> {
        Some(self.version)
    }

    fn save(&mut self, now: Instant, keep: fn(&Limit) -> bool) -> Option<SavedScope> {
        Some(LocalQuota::save(self, now, keep))
    }

    fn restore(&mut self, saved: &SavedScope, now: Instant) -> bool {
        LocalQuota::restore(self, saved, now)
    }

    fn reconfigure(&mut self, config: &ScopeConfig, now: Instant) -> bool {
        self.version = self.version.wrapping_add(1);
        LocalQuota::reconfigure(self, config, now);
        true
    }

    fn project(&self) -> Option<Box<dyn QuotaStore>> {
        // The arithmetic only: a projection never compares a provider's
        // answer, so it carries no record of what was sent.
        Some(Box::new(LocalQuota {
            algorithm: self.algorithm,
            epoch: self.epoch,
            epoch_utc: self.epoch_utc,
            latest: self.latest,
            furthest: self.furthest,
            stamped: self.stamped,
            limits: self
                .limits
                .iter()
                .map(|l| l.projected(self.latest))
                .collect(),
            learn: self.learn,
            sent: SentLog::new(0),
            draining: self.draining,
            version: self.version,
        }))
    }

    fn snapshot(&mut self, now: Instant, out: &mut Vec<LimitSnapshot>) {
        let t = self.tick(now);
        self.advance(t);
        out.extend(
            self.limits
                .iter()
                .filter(|l| !l.is_transitional())
                .map(|l| LimitSnapshot {
                    dimension: l.dimension(),
                    window: l.window(),
                    calendar: l.config.calendar,
                    limit: l.config.amount,
                    capacity: l.capacity(),
                    available: saturate(l.available()),
                    algorithm: self.algorithm,
                }),
        );
    }
}

/// `value` as an `i64`, saturated by sign: a huge limit shows as a lot
/// available, never as a debt.
fn saturate(value: i128) -> i64 {
    i64::try_from(value).unwrap_or(if value < 0 { i64::MIN } else { i64::MAX })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const W: Duration = Duration::from_secs(10);

    /// One attempt: sent at `sent` ms, arriving `delay` ms later, its
    /// response beginning `lag` ms after arrival.
    fn attempts() -> impl Strategy<Value = Vec<(u64, u64, u64)>> {
        proptest::collection::vec((0u64..40_000, 0u64..2_000, 0u64..500), 1..80)
    }

    proptest! {
        // proves: Q-14 (against a provider that counts on arrival, with
        // another client holding a constant amount: after every answer
        // the estimate of others' holding is at least that amount, so
        // tollgate's window never counts less than the provider does; and
        // it never rises, so an answer's bracket always held the truth,
        // whatever the arrival delays, orders and overlaps)
        #[test]
        fn the_estimate_never_undercounts_a_steady_other_client(
            raw in attempts(),
            others in 0u64..200,
        ) {
            const LIMIT: u64 = 10_000;
            let epoch = Instant::now();
            let config = ScopeConfig::new("p").requests(LIMIT, W);
            let mut q = LocalQuota::new(&config, epoch);
            // Distinct instants (µs): each attempt's own offset.
            let us = |ms: u64, i: usize| ms * 1_000 + i as u64;
            let a: Vec<(u64, u64, u64)> = raw
                .iter()
                .enumerate()
                .map(|(i, &(sent, delay, lag))| {
                    (us(sent, i), us(sent + delay, i), us(sent + delay + lag, i))
                })
                .collect();
            let w = u64::try_from(W.as_micros()).unwrap();
            // Events in time order: leases, then answers.
            let mut events: Vec<(u64, bool, usize)> = Vec::new();
            for (i, x) in a.iter().enumerate() {
                events.push((x.0, false, i));
                events.push((x.2, true, i));
            }
            events.sort();
            let at = |t: u64| epoch + Duration::from_micros(t);
            let mut held: Vec<Option<Reservation>> = vec![None; a.len()];
            let mut last: Option<(u64, u64)> = None;
            for (t, answer, i) in events {
                if !answer {
                    let r = q.reserve(&Demand::new(0, 0), at(t), Hold::Leased);
                    held[i] = Some(r.expect("the limit is never reached"));
                    continue;
                }
                let Some(mut r) = held[i].take() else { continue };
                q.recount(&mut r, at(t), at(t));
                // The provider's count when `i` arrived.
                let arrival = a[i].1;
                let own = a.iter().filter(|x| x.1 <= arrival && x.1 + w > arrival).count() as u64;
                let report = BudgetReport {
                    dimension: Dimension::Requests,
                    limit: None,
                    remaining: Some(LIMIT - own - others),
                    reset: Some(W),
                };
                q.observe(&report, Some(&r), at(t), at(t));
                let (_, estimate) = q.limits[0].own_and_debts();
                prop_assert!(estimate >= others, "estimate {estimate} < {others}");
                // Every answer keeps the estimate for a window (the
                // reset); after a window without answers it starts afresh.
                if let Some((previous, answered)) = last
                    && t < answered + w
                {
                    prop_assert!(estimate <= previous, "rose: {previous} -> {estimate}");
                }
                last = Some((estimate, t));
            }
        }
    }
}

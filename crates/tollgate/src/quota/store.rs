//! The seam between quota arithmetic and its storage (SPEC DQ-1).
//!
//! The admission controller keeps the FIFO queue, the cooldown and the
//! concurrency permits; a [`QuotaStore`] keeps the numbers of one scope and
//! answers one question at a time, atomically: "does this demand fit now,
//! and if not, when?". The controller calls it under the scope's lock, so an
//! in-process store needs no locking of its own. [`LocalQuota`] is the
//! default; a distributed store (one Lua script per operation against a
//! shared server) implements the same operations.
//!
//! [`LocalQuota`]: super::LocalQuota

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use super::demand::{
    Actual, BudgetReport, Demand, Dimension, Hold, NotUntil, Observed, Reservation,
};
use super::local::LocalQuota;
use super::saved::SavedScope;
use crate::clock::{Instant, WallClock};
use crate::config::{Algorithm, Calendar, Limit, ScopeConfig};
use crate::error::ExceedsLimit;

/// Quota arithmetic of one scope.
pub trait QuotaStore: fmt::Debug + Send + 'static {
    /// Fails when `demand` can never fit, whatever the wait (SPEC Q-3).
    fn check(&self, demand: &Demand) -> Result<(), ExceedsLimit>;

    /// Takes `demand` from every limit at `now`, all or nothing (SPEC Q-1).
    /// On success it returns the store's tick for `now`, and the
    /// reservation is `Reservation { stamp: now, tick, demand, hold, seq: 0 }`; on
    /// failure nothing changed and [`not_until`] tells why.
    ///
    /// [`not_until`]: QuotaStore::not_until
    fn try_reserve(&mut self, demand: &Demand, now: Instant, hold: Hold) -> Option<u64>;

    /// Which limits keep `demand` from fitting at `now`, and when it can
    /// (called after `try_reserve` failed at the same instant).
    fn not_until(&mut self, demand: &Demand, now: Instant) -> NotUntil;

    /// When to look at `demand` again although [`not_until`] told no
    /// instant: a provisional stand-in of a learning scope (SPEC Q-14)
    /// holds it back and its unit ages out then, unless the provider's
    /// first answer lifts it sooner. A wake-up for the head of the queue
    /// only (SPEC Q-4), never an early verdict or a retry hint (SPEC
    /// `None` (the default) when nothing but an event can make room.
    ///
    /// [`not_until`]: QuotaStore::not_until
    fn recheck_at(&mut self, demand: &Demand, now: Instant) -> Option<Instant> {
        let _ = (demand, now);
        None
    }

    /// [`try_reserve`](QuotaStore::try_reserve) returning the reservation or
    /// the reason.
    fn reserve(
        &mut self,
        demand: &Demand,
        now: Instant,
        hold: Hold,
    ) -> Result<Reservation, NotUntil> {
        match self.try_reserve(demand, now, hold) {
            Some(tick) => Ok(Reservation {
                stamp: now,
                tick,
                demand: *demand,
                hold,
                seq: 0,
            }),
            None => Err(self.not_until(demand, now)),
        }
    }

    /// Turns a pending reservation into a leased one stamped `now`.
    fn lease(&mut self, reservation: &mut Reservation, now: Instant);

    /// Restores a reservation in full (SPEC Q-9). Called exactly once, and
    /// only for a reservation whose attempt never started.
    fn refund(&mut self, reservation: &Reservation, now: Instant);

    /// Replaces a started attempt's token estimate by what the provider
    /// reported (SPEC Q-5), each token limit from its own figure (SPEC
    /// `tokens` from the total, `input_tokens` from the input,
    /// `output_tokens` from the output, or its estimate when the split is
    /// unknown); zero gives every reserved token back while the request
    /// unit stays spent. Called at most once per reservation. The
    /// change lands where the reservation was counted, so it needs no
    /// current time: a window that aged out is not touched, and debt in a
    /// bucket is charged as of its last refill, which lies between the
    /// attempt's start and now.
    fn reconcile(&mut self, reservation: &Reservation, actual: &Actual);

    /// The provider counted a leased reservation no later than `at`
    /// (SPEC Q-15): it stays counted until one window after `at`, and the
    /// reservation is restamped so that settling finds it. `at` may lie
    /// after `now` (an attempt cancelled before its arrival bound passed):
    /// it is still counted until one window after `at`. Stores that
    /// cannot move an amount leave it where it is (the default).
    fn recount(&mut self, reservation: &mut Reservation, at: Instant, now: Instant) {
        let _ = (reservation, at, now);
    }

    /// Gives back what a leased attempt took from the chosen dimensions:
    /// the provider refused it and charged nothing for them (SPEC Q-16).
    /// `tokens` covers every token dimension (tokens, input and output);
    /// `cost` the cost limits (SPEC BUD-5: a refusal is not billed).
    /// Called at most once per reservation, before any reconciliation.
    fn release(&mut self, reservation: &Reservation, requests: bool, tokens: bool, cost: bool) {
        let _ = (reservation, requests, tokens, cost);
    }

    /// Takes in what a provider's response at `at` said about its budget
    /// (SPEC Q-14): a learned limit follows the advertised amount, and when
    /// the provider has less left than this store's own traffic explains,
    /// the difference is counted until the provider's reset. `answered` is
    /// the answered attempt's reservation when known (after its recount):
    /// the comparison is then with what the provider certainly counted of
    /// tollgate's traffic when it counted that attempt. Never raises
    /// availability above the store's own accounting.
    fn observe(
        &mut self,
        report: &BudgetReport,
        answered: Option<&Reservation>,
        at: Instant,
        now: Instant,
    ) -> Observed {
        let _ = (report, answered, at, now);
        Observed::default()
    }

    /// The provider answered an attempt (after any [`observe`] of the
    /// answer's reports): a provisional stand-in for a limit it did not
    /// advertise is dropped (SPEC Q-14). Returns whether anything changed.
    ///
    /// [`observe`]: QuotaStore::observe
    fn answered(&mut self) -> bool {
        false
    }

    /// Takes a new configuration of the same scope at `now`, keeping what
    /// is counted (SPEC GW-15, see `docs/design.md`, "Reload"): pending and
    /// leased reservations stay valid, and every limit of the new
    /// configuration counts what the running one counted in its dimension.
    /// Returns `false` when the store cannot (the default): the controller
    /// then opens a new store for the scope, which starts afresh.
    fn reconfigure(&mut self, config: &ScopeConfig, now: Instant) -> bool {
        let _ = (config, now);
        false
    }

    /// A number that changes whenever what the store counts may have
    /// changed; `None` for a store that keeps no state to save (a shared
    /// store keeps its own, SPEC DQ-8).
    fn version(&self) -> Option<u64> {
        None
    }

    /// What the limits `keep` selects count at `now`, in UTC, for a
    /// restart to restore (SPEC DQ-8; see
    /// [`SavedScope`](super::SavedScope)). `None` (the default): the store
    /// keeps its state elsewhere.
    fn save(&mut self, now: Instant, keep: fn(&Limit) -> bool) -> Option<SavedScope> {
        let _ = (now, keep);
        None
    }

    /// Counts what a save before a restart still counts, at `now`;
    /// returns whether anything was counted (`false`, the default, for a
    /// store that keeps its state elsewhere).
    fn restore(&mut self, saved: &SavedScope, now: Instant) -> bool {
        let _ = (saved, now);
        false
    }

    /// A detached copy used to project when queued demands will fit
    /// (SPEC Q-11), a lower bound: pending reservations in it count as
    /// leased at the store's latest instant (their earliest start).
    /// `None` when the store cannot be copied (remote stores); the
    /// controller then judges each demand on its own.
    fn project(&self) -> Option<Box<dyn QuotaStore>>;

    /// Appends one entry per limit, brought up to `now`.
    fn snapshot(&mut self, now: Instant, out: &mut Vec<LimitSnapshot>);
}

/// Opens the store of each scope.
pub trait QuotaBackend: fmt::Debug + Send + Sync + 'static {
    /// The store for `scope`, created at `now`, which is in UTC what
    /// `wall` says (calendar windows, SPEC BUD-3).
    fn open(&self, scope: &ScopeConfig, now: Instant, wall: WallClock) -> Box<dyn QuotaStore>;

    /// The backend's name, for the snapshot.
    fn name(&self) -> &'static str;
}

/// The in-process backend (the default).
#[derive(Debug, Clone, Copy, Default)]
pub struct LocalBackend;

impl QuotaBackend for LocalBackend {
    fn open(&self, scope: &ScopeConfig, now: Instant, wall: WallClock) -> Box<dyn QuotaStore> {
        Box::new(LocalQuota::with_wall(scope, now, wall))
    }

    fn name(&self) -> &'static str {
        "local"
    }
}

/// A shared backend.
pub type SharedBackend = Arc<dyn QuotaBackend>;

/// The state of one limit (SPEC OBS-1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LimitSnapshot {
    /// Requests, tokens, input tokens or output tokens.
    pub dimension: Dimension,
    /// The window (a calendar window's nominal length).
    pub window: Duration,
    /// The calendar period of a calendar window (SPEC BUD-3).
    pub calendar: Option<Calendar>,
    /// The configured amount per window.
    pub limit: u64,
    /// The most it can hold (the burst capacity for a token bucket).
    pub capacity: u64,
    /// Available now; negative while in debt.
    pub available: i64,
    /// The scope's algorithm.
    pub algorithm: Algorithm,
}

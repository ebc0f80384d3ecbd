//! Counting where and what the provider counts (SPEC ).
//!
//! tollgate's windows are exact about tollgate's own admissions. A provider
//! counts a request when it *arrives*, with its own accounting, next to
//! other clients of the same account. The supervisor closes those gaps
//! after every attempt, so every shell over it (gateway, batch runner,
//! tower layer) inherits them:
//!
//! * **Where .** Each attempt's amounts stay counted until one window
//!   after the latest instant the provider can have counted it. A response
//!   that began (a refusal, an error status, a stream's headers) bounds
//!   that instant exactly. A one-shot answer arrives only after it was
//!   generated; there the bound is the attempt's start plus the largest
//!   arrival delay seen on this provider (learned from its refusals, which
//!   it answers on arrival), never less than [`Accounting::arrival_floor`].
//!   Cost: an attempt holds its slot up to that bound longer, a utilisation
//!   loss of about `bound / window`.
//! * **What a refusal costs .** A 429 is settled with the provider's
//!   [`RefusalCost`], not as "usage unknown".
//! * **What the provider reconciles .** A provider that charges its
//!   limiter at admission and never settles keeps that charge: settlement
//!   does not refund below it.
//! * **Who else spends .** Budget reports in responses go to the
//!   controller, which takes any gap out of the scope's window.

use std::time::Duration;

use parking_lot::Mutex;

use crate::admission::Lease;
use crate::clock::Instant;
use crate::quota::{BudgetReport, RefusalCost};

/// How a provider's own limiter counts (SPEC ); see the module
/// documentation. The defaults are the safe ones.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Accounting {
    /// What a 429 costs at the provider (default [`RefusalCost::Full`]).
    pub refusal_cost: RefusalCost,
    /// Whether the provider's limiter settles a request with its actual
    /// usage (default `true`). When `false`, settlement keeps the whole
    /// estimate: the provider charged it at admission and gives nothing
    /// back.
    pub reconciles: bool,
    /// The least arrival delay assumed for a request whose response has not
    /// begun (default 500 ms): the floor of the learned bound.
    pub arrival_floor: Duration,
}

impl Default for Accounting {
    fn default() -> Self {
        Accounting {
            refusal_cost: RefusalCost::Full,
            reconciles: true,
            arrival_floor: Duration::from_millis(500),
        }
    }
}

/// The most a learned arrival delay counts for (SPEC Q-15): a refusal
/// answered later than this (a proxy answering after its own timeout, a
/// stalled connection) tells of the path, not of when the provider counted
/// the request. A configured floor above it still holds.
pub const ARRIVAL_CAP: Duration = Duration::from_secs(10);

/// How long a learned arrival delay is remembered (SPEC Q-15): the bound
/// is the largest delay seen in the current period of this length or the
/// one before, so one slow refusal is forgotten after at most twice this.
pub const ARRIVAL_MEMORY: Duration = Duration::from_secs(300);

/// The largest arrival delay seen recently on one provider (a windowed
/// maximum over the last one or two [`ARRIVAL_MEMORY`] periods, each
/// delay capped at [`ARRIVAL_CAP`]), never below the floor.
#[derive(Debug)]
pub(crate) struct ArrivalBound {
    floor: Duration,
    recent: Mutex<Recent>,
}

/// The largest delay of each of the two latest periods.
#[derive(Debug, Default)]
struct Recent {
    /// Periods are counted from the first delay learned.
    epoch: Option<Instant>,
    /// (period number, largest delay in it): the latest period first.
    periods: [(u64, Duration); 2],
}

impl Recent {
    fn period(&self, at: Instant) -> u64 {
        let since = self
            .epoch
            .map_or(Duration::ZERO, |e| at.saturating_duration_since(e));
        u64::try_from(since.as_nanos() / ARRIVAL_MEMORY.as_nanos()).unwrap_or(u64::MAX)
    }

    fn learn(&mut self, delay: Duration, at: Instant) {
        self.epoch.get_or_insert(at);
        let p = self.period(at);
        let [latest, before] = &mut self.periods;
        if p == latest.0 {
            latest.1 = latest.1.max(delay);
        } else if p > latest.0 {
            *before = *latest;
            *latest = (p, delay);
        } else if p == before.0 {
            // Learned late, of the period before.
            before.1 = before.1.max(delay);
        }
    }

    fn largest(&self, at: Instant) -> Duration {
        let p = self.period(at);
        self.periods
            .iter()
            .filter(|(q, _)| q.saturating_add(1) >= p)
            .map(|(_, d)| *d)
            .max()
            .unwrap_or_default()
    }
}

impl ArrivalBound {
    pub(crate) fn new(floor: Duration) -> Self {
        ArrivalBound {
            floor,
            recent: Mutex::new(Recent::default()),
        }
    }

    /// The bound at `at`.
    pub(crate) fn get(&self, at: Instant) -> Duration {
        self.floor.max(self.recent.lock().largest(at))
    }

    /// A refusal answered `delay` after its attempt started, at `at`: the
    /// provider counted it within that delay (at most [`ARRIVAL_CAP`]).
    pub(crate) fn learn(&self, delay: Duration, at: Instant) {
        self.recent.lock().learn(delay.min(ARRIVAL_CAP), at);
    }
}

/// Budget reports of one response, one per dimension at most.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Budgets {
    /// The request dimension, if reported.
    pub requests: Option<BudgetReport>,
    /// The token dimension, if reported.
    pub tokens: Option<BudgetReport>,
    /// The input-token dimension (SPEC Q-12; e.g. Anthropic's ITPM), if
    /// reported.
    pub input_tokens: Option<BudgetReport>,
    /// The output-token dimension (e.g. Anthropic's OTPM), if reported.
    pub output_tokens: Option<BudgetReport>,
}

impl Budgets {
    /// Whether nothing was reported.
    pub fn is_empty(&self) -> bool {
        self.iter().next().is_none()
    }

    pub(crate) fn iter(&self) -> impl Iterator<Item = &BudgetReport> {
        self.requests
            .iter()
            .chain(self.tokens.iter())
            .chain(self.input_tokens.iter())
            .chain(self.output_tokens.iter())
    }
}

/// A started attempt's lease: whichever way the attempt ends, even by
/// being dropped, its amounts are recounted to the latest instant the
/// provider can have counted them (SPEC Q-15). Dropped while the attempt
/// was cut, it hands the lease to `cut` (the provider's
/// [`Provider::cut`](super::Provider::cut)), which returns the permit once
/// the attempt's work has ended (SPEC POOL-1).
pub(crate) struct CountedLease<'a> {
    lease: Option<Lease>,
    started: Instant,
    arrival: &'a ArrivalBound,
    cut: &'a (dyn Fn(Lease) + Sync),
}

impl<'a> CountedLease<'a> {
    pub(crate) fn new(
        lease: Lease,
        started: Instant,
        arrival: &'a ArrivalBound,
        cut: &'a (dyn Fn(Lease) + Sync),
    ) -> Self {
        CountedLease {
            lease: Some(lease),
            started,
            arrival,
            cut,
        }
    }

    /// The latest instant the provider can have counted the attempt if no
    /// response has begun by `now`.
    fn unseen_bound(&self, now: Instant) -> Instant {
        self.started
            .checked_add(self.arrival.get(now))
            .map_or(now, |b| b.min(now))
    }

    /// A response began at `at` (status and headers): the provider counted
    /// the attempt by then.
    pub(crate) fn response_began(mut self, at: Instant) -> Lease {
        let mut lease = self.lease.take().expect("taken once");
        lease.counted_by(at);
        lease
    }

    /// The provider refused the attempt at `at`: it counted it on arrival,
    /// which also teaches the arrival bound.
    pub(crate) fn refused(self, at: Instant) -> Lease {
        self.arrival
            .learn(at.saturating_duration_since(self.started), at);
        self.response_began(at)
    }

    /// The request never left (see [`ProviderError::unsent`]): the
    /// provider cannot count it, so it is not recounted.
    ///
    /// [`ProviderError::unsent`]: super::ProviderError::unsent
    pub(crate) fn unsent(mut self) -> Lease {
        self.lease.take().expect("taken once")
    }

    /// The attempt ended at `now` without telling when the provider saw
    /// it (a one-shot answer, a transport failure).
    pub(crate) fn ended(mut self, now: Instant) -> Lease {
        let at = self.unseen_bound(now);
        let mut lease = self.lease.take().expect("taken once");
        lease.counted_by(at);
        lease
    }
}

impl Drop for CountedLease<'_> {
    fn drop(&mut self) {
        // Cancelled or out of time mid-attempt: the request may still
        // arrive within the bound.
        if let Some(mut lease) = self.lease.take() {
            let bound = self.started.checked_add(self.arrival.get(self.started));
            if let Some(at) = bound {
                lease.counted_by(at);
            }
            (self.cut)(lease);
        }
    }
}

//! What a scope kept in a shared store holds in this process: the store,
//! the FIFO turn, the store's health and its counters.
//!
//! # Implementation notes
//!
//! * The *turn* (`fair/turn.rs`): one reservation of the scope is in
//!   flight at a time, handed out by the fair scheduler (SPEC FAIR-9; FIFO
//!   for a single flow, DQ-4, ADM-4). Its holder and its waiting line are
//!   the scope's queue, bounded by the queue capacity under the `reject`
//!   overflow policy and shared between flows (ADM-5, FAIR-10); under
//!   `wait`, producers past the capacity line up behind it.
//! * *Health* is the store's state as this process last saw it
//!   ([`StoreMode`]). It is judged by admissions: a failed reservation or
//!   lease makes the scope unavailable at once; a detached round trip (a
//!   settlement, a refund, a hold given back) that fails is counted but
//!   changes nothing, so one slow settlement never turns a healthy store
//!   into an outage (and, under `fail_closed`, into refusals). While
//!   unavailable, reservations never touch the store (so no call waits for
//!   a store that does not answer) and at most one *probe* (a read of the
//!   store's limits) runs at a time, at most one per [`PROBE_INTERVAL`].
//!   Any answer of the store (a probe's or an operation's) makes it shared
//!   again.
//! * `room` is notified whenever quota of the scope comes back: by the
//!   store's own notices ([`RemoteQuota::changes`]), by this process's
//!   refunds and settlements, and when admission stops. Only the turn's
//!   holder waits on it, so a notice wakes one call, not a herd.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use parking_lot::{Mutex, RwLock};
use tokio::sync::Notify;

use super::detached::Detached;
use crate::admission::fair::FairTurn;
use crate::admission::scope::ScopeCounters;
use crate::clock::{Instant, SharedClock};
use crate::config::{Overflow, ScopeConfig};
use crate::deadline::Deadline;
use crate::in_flight::InFlight;
use crate::quota::{RemoteQuota, Unavailable};

/// How often an unavailable store is probed, at most.
pub(crate) const PROBE_INTERVAL: Duration = Duration::from_millis(200);

/// Where a shared scope takes its quota from now (SPEC DQ-3).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum StoreMode {
    /// From the shared store.
    Shared,
    /// Nowhere: the store did not answer and the policy is `fail_closed`,
    /// so admissions fail at once with
    /// [`AdmissionError::QuotaStoreUnavailable`](crate::AdmissionError::QuotaStoreUnavailable).
    Unavailable,
    /// From this process's fallback share (`limit / replicas` of every
    /// limit): the store did not answer and the policy is
    /// `fail_open_local`.
    LocalFallback,
}

impl StoreMode {
    /// The stable name: `shared`, `unavailable`, `local_fallback`.
    pub const fn as_str(self) -> &'static str {
        match self {
            StoreMode::Shared => "shared",
            StoreMode::Unavailable => "unavailable",
            StoreMode::LocalFallback => "local_fallback",
        }
    }
}

#[derive(Debug)]
struct Health {
    mode: StoreMode,
    /// A probe is running.
    probing: bool,
    /// No probe starts before this instant.
    next_probe: Option<Instant>,
}

/// Totals of a shared scope, kept outside the scope's lock so detached
/// settlements can count.
#[derive(Debug, Default)]
pub(crate) struct SharedStats {
    pub(crate) store_errors: AtomicU64,
    pub(crate) rejected_unavailable: AtomicU64,
    pub(crate) fallback_admissions: AtomicU64,
    pub(crate) settlements_failed: AtomicU64,
    /// Reservations granted to calls that had gone while the round trip
    /// was in flight (refunded when the answer arrived).
    pub(crate) refunded_in_flight: AtomicU64,
    /// Pending holds the store no longer had when their call came to lease
    /// them (expired): the call reserved again.
    pub(crate) holds_expired: AtomicU64,
    /// Units the store took out of the shared window from this process's
    /// provider answers (SPEC Q-14, DQ-9), requests and tokens.
    pub(crate) gap_requests: AtomicU64,
    pub(crate) gap_tokens: AtomicU64,
}

impl SharedStats {
    pub(crate) fn count(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }
}

/// A scope's shared store as this process uses it. See the module notes.
#[derive(Debug)]
pub(crate) struct SharedScope {
    /// The store's handle for the scope's current limits (replaced by a
    /// reconfiguration, SPEC GW-15). Each reservation is taken and settled
    /// through the handle it was taken with, so it is settled against the
    /// limits that counted it; it also counts in the limits a reload
    /// added since, through this one (`settle.rs`). With the instant it
    /// took over (the reload's, or the scope's start).
    remote: RwLock<(Arc<dyn RemoteQuota>, Instant)>,
    /// The per-operation timeout, before clipping by a deadline.
    pub(crate) timeout: Duration,
    pub(crate) on_unavailable: Unavailable,
    /// One reservation in flight at a time, in fair order (FAIR-9).
    pub(crate) turn: FairTurn,
    /// Notified when quota comes back or admission stops.
    pub(crate) room: Arc<Notify>,
    pub(crate) clock: SharedClock,
    health: Mutex<Health>,
    pub(crate) stats: SharedStats,
    /// Round trips running after their call (refunds, settlements,
    /// probes).
    pub(crate) detached: Arc<Detached>,
    /// Calls of this process with a pending hold in the store (or a
    /// reservation of one in flight), until it is leased or its giving
    /// back is counted in `detached`.
    pub(crate) holds: InFlight,
}

impl SharedScope {
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        config: &ScopeConfig,
        remote: Arc<dyn RemoteQuota>,
        timeout: Duration,
        on_unavailable: Unavailable,
        capacity: usize,
        overflow: Overflow,
        clock: SharedClock,
    ) -> Self {
        let waiting = waiting_line(capacity, overflow);
        let room = remote.changes().unwrap_or_default();
        SharedScope {
            remote: RwLock::new((remote, clock.now())),
            timeout,
            on_unavailable,
            turn: FairTurn::new(config, waiting),
            room,
            clock,
            health: Mutex::new(Health {
                mode: StoreMode::Shared,
                probing: false,
                next_probe: None,
            }),
            stats: SharedStats::default(),
            detached: Arc::default(),
            holds: InFlight::default(),
        }
    }

    /// The store's handle for the scope's current limits.
    pub(crate) fn remote(&self) -> Arc<dyn RemoteQuota> {
        Arc::clone(&self.remote.read().0)
    }

    /// The store's handle for the scope's current limits, and the instant
    /// it took over: a limit it added takes a reservation from before as
    /// its own once the reservation is recounted to that instant or later
    /// (as the in-process store's limits do, `LimitState::foreign`).
    pub(crate) fn current(&self) -> (Arc<dyn RemoteQuota>, Instant) {
        let current = self.remote.read();
        (Arc::clone(&current.0), current.1)
    }

    /// Takes a new configuration of the scope (SPEC GW-15): reservations
    /// from now on go through `remote`; those already taken settle
    /// through the handle they were taken with. The turn's waiting line
    /// takes the new queue bound; the calls in it keep their places.
    pub(crate) fn reconfigure(
        &self,
        config: &ScopeConfig,
        remote: Arc<dyn RemoteQuota>,
        capacity: usize,
        overflow: Overflow,
    ) {
        *self.remote.write() = (remote, self.clock.now());
        self.turn
            .reconfigure(config, waiting_line(capacity, overflow));
        // The new limits may have room now.
        self.wake();
    }

    /// Runs `task` detached, counted until it ends (so closing waits for
    /// it); `false` outside a runtime (nothing runs).
    pub(crate) fn spawn(&self, task: impl Future<Output = ()> + Send + 'static) -> bool {
        self.detached.spawn(task).is_some()
    }

    /// Calls queued: the turn's holder (the head) and those in its line.
    pub(crate) fn queued(&self) -> usize {
        let (waiting, held) = self.turn.queued();
        waiting + usize::from(held)
    }

    /// Where quota comes from now.
    pub(crate) fn mode(&self) -> StoreMode {
        self.health.lock().mode
    }

    /// The budget of one operation started at `now`: the timeout clipped
    /// by the deadline (SPEC DQ-5). `None` once the deadline has passed.
    pub(crate) fn budget(&self, deadline: Deadline, now: Instant) -> Option<Duration> {
        match deadline.remaining(now) {
            None => Some(self.timeout),
            Some(left) if left.is_zero() => None,
            Some(left) => Some(left.min(self.timeout)),
        }
    }

    /// Whether reservations may go to the store now. While it is
    /// unavailable they may not; a probe is started when one is due.
    pub(crate) fn usable(self: &Arc<Self>, now: Instant) -> bool {
        let mut health = self.health.lock();
        if health.mode == StoreMode::Shared {
            return true;
        }
        if !health.probing && health.next_probe.is_none_or(|t| t <= now) {
            health.probing = true;
            drop(health);
            let this = Arc::clone(self);
            let started = self.spawn(async move {
                let answered = this.remote().snapshot(this.timeout).await.is_ok();
                if !answered {
                    SharedStats::count(&this.stats.store_errors);
                }
                this.probed(answered);
            });
            if !started {
                self.probed(false);
            }
        }
        false
    }

    fn probed(&self, answered: bool) {
        let now = self.clock.now();
        let mut health = self.health.lock();
        health.probing = false;
        if answered {
            health.mode = StoreMode::Shared;
            health.next_probe = None;
            drop(health);
            tracing::info!("quota store answers again: shared mode");
        } else {
            health.next_probe = now.checked_add(PROBE_INTERVAL);
        }
    }

    /// The store answered an operation.
    pub(crate) fn answered(&self) {
        let mut health = self.health.lock();
        if health.mode != StoreMode::Shared {
            health.mode = StoreMode::Shared;
            health.next_probe = None;
        }
    }

    /// A detached round trip (a settlement, a refund, a hold given back)
    /// failed: counted, and logged, but the store's mode stays as it is
    /// (admissions judge it, see the module notes).
    pub(crate) fn detached_failed(&self, error: &crate::quota::StoreError) {
        SharedStats::count(&self.stats.store_errors);
        tracing::debug!(%error, "quota store round trip failed after its call");
    }

    /// A reservation or a lease failed: the store is unavailable from now
    /// on, until it answers again.
    pub(crate) fn failed(&self, now: Instant, error: &crate::quota::StoreError) {
        SharedStats::count(&self.stats.store_errors);
        let mode = match self.on_unavailable {
            Unavailable::FailClosed => StoreMode::Unavailable,
            Unavailable::FailOpenLocal { .. } => StoreMode::LocalFallback,
        };
        let mut health = self.health.lock();
        if health.mode == StoreMode::Shared {
            health.mode = mode;
            health.next_probe = Some(now);
            drop(health);
            tracing::warn!(mode = mode.as_str(), %error, "quota store unavailable");
        }
    }

    /// Adds this scope's shared-store totals to `counters`.
    pub(crate) fn count(&self, counters: &mut ScopeCounters) {
        let load = |c: &AtomicU64| c.load(Ordering::Relaxed);
        counters.store_errors = load(&self.stats.store_errors);
        counters.store_unavailable = load(&self.stats.rejected_unavailable);
        counters.fallback_admissions = load(&self.stats.fallback_admissions);
        counters.settlements_failed = load(&self.stats.settlements_failed);
        counters.refunded_reservations += load(&self.stats.refunded_in_flight);
        counters.holds_expired = load(&self.stats.holds_expired);
        counters.gap_requests = counters
            .gap_requests
            .saturating_add(load(&self.stats.gap_requests));
        counters.gap_tokens = counters
            .gap_tokens
            .saturating_add(load(&self.stats.gap_tokens));
    }

    /// Wakes the turn's holder: quota came back, or admission stopped.
    pub(crate) fn wake(&self) {
        self.room.notify_waiters();
    }
}

/// The waiting line of a scope's turn: the holder of the turn is the head
/// of the queue, so `capacity` queued calls are the holder and
/// `capacity - 1` in line.
fn waiting_line(capacity: usize, overflow: Overflow) -> usize {
    match overflow {
        Overflow::Reject => capacity.saturating_sub(1),
        Overflow::Wait => usize::MAX,
    }
}

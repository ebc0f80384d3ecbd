//! A circuit breaker per upstream endpoint (SPEC CB-1..CB-4).
//!
//! ```text
//!            failure_threshold consecutive failures
//!   Closed ─────────────────────────────────────────▶ Open
//!     ▲                                                │ recovery_time
//!     │ success of a probe of this half-open period    ▼
//!     └──────────────────────────────────────────── HalfOpen
//!                      failure ──▶ Open (again)   (at most half_open_calls probes)
//! ```
//!
//! The unit is the logical call: a call that exhausted its retries counts
//! once, and so does a normal response or a normal stream EOF. A streaming
//! probe keeps its half-open slot until EOF or failure; its first chunk
//! proves nothing (CB-4).
//!
//! # Periods
//!
//! Every transition (Closed → Open, Open → HalfOpen, HalfOpen → Open,
//! HalfOpen → Closed) starts a new *period*, numbered under the state lock.
//! Each [`Probe`] carries the period it was admitted in, and its report
//! counts only while that period is still the current one (SPEC CB-2):
//!
//! * a success closes the circuit only when reported by a half-open probe
//!   of the current half-open period; a success of the current closed
//!   period resets its failure count;
//! * a failure counts only toward the period it was admitted in;
//! * a neutral end gives back a half-open slot only of its own period.
//!
//! So a late outcome of a call admitted before the circuit opened (or
//! during an earlier half-open period) changes nothing: it can neither
//! close an open circuit, nor end a newer half-open period, nor free a
//! probe slot it does not hold, nor count as a failure of a newer period.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;

use crate::clock::{Instant, SharedClock, TokioClock};
use crate::config::ConfigError;

/// Breaker settings (defaults 5 / 30 s / 1, SPEC CB-1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CircuitConfig {
    /// Consecutive failed calls that open the circuit (at least 1).
    pub failure_threshold: u32,
    /// How long it stays open before letting probes through.
    pub recovery_time: Duration,
    /// Probes allowed at once while half-open (at least 1).
    pub half_open_calls: u32,
}

impl Default for CircuitConfig {
    fn default() -> Self {
        CircuitConfig {
            failure_threshold: 5,
            recovery_time: Duration::from_secs(30),
            half_open_calls: 1,
        }
    }
}

impl CircuitConfig {
    /// Checks every field (SPEC CFG-2).
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.failure_threshold == 0 {
            return Err(ConfigError::new(
                "circuit.failure_threshold",
                "must be at least 1",
            ));
        }
        if self.half_open_calls == 0 {
            return Err(ConfigError::new(
                "circuit.half_open_calls",
                "must be at least 1",
            ));
        }
        Ok(())
    }
}

/// The breaker's state, for snapshots and metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CircuitState {
    /// Calls pass.
    Closed,
    /// Calls fail at once with `CircuitOpen`.
    Open,
    /// A limited number of probe calls pass.
    HalfOpen,
}

impl CircuitState {
    /// `closed`, `open` or `half_open`.
    pub const fn as_str(self) -> &'static str {
        match self {
            CircuitState::Closed => "closed",
            CircuitState::Open => "open",
            CircuitState::HalfOpen => "half_open",
        }
    }
}

#[derive(Debug, Clone, Copy)]
enum State {
    Closed { failures: u32 },
    Open { until: Instant },
    HalfOpen { probes: u32 },
}

/// The circuit is open: no transport attempt is made (SPEC CB-3).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the circuit of this upstream is open")]
pub struct CircuitOpen {
    /// When probes will be let through again, if known.
    pub retry_at: Option<Instant>,
}

/// The state and the number of its period (see the module documentation).
#[derive(Debug, Clone, Copy)]
struct Machine {
    state: State,
    /// Bumped on every transition; wraps (never reached in practice).
    period: u64,
}

impl Machine {
    /// Moves to `state`, starting a new period.
    fn enter(&mut self, state: State) {
        self.state = state;
        self.period = self.period.wrapping_add(1);
    }
}

struct Shared {
    config: CircuitConfig,
    clock: SharedClock,
    machine: Mutex<Machine>,
}

/// See the module documentation. Cloning shares the breaker.
#[derive(Clone)]
pub struct CircuitBreaker {
    shared: Arc<Shared>,
}

impl fmt::Debug for CircuitBreaker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CircuitBreaker")
            .field("state", &self.state())
            .finish_non_exhaustive()
    }
}

impl CircuitBreaker {
    /// A closed breaker on tokio's clock.
    pub fn new(config: CircuitConfig) -> Result<Self, ConfigError> {
        Self::with_clock(config, Arc::new(TokioClock))
    }

    /// A closed breaker reading time from `clock`.
    pub fn with_clock(config: CircuitConfig, clock: SharedClock) -> Result<Self, ConfigError> {
        config.validate()?;
        Ok(CircuitBreaker {
            shared: Arc::new(Shared {
                config,
                clock,
                machine: Mutex::new(Machine {
                    state: State::Closed { failures: 0 },
                    period: 0,
                }),
            }),
        })
    }

    /// The current state (an open circuit past its recovery time reads as
    /// half-open).
    pub fn state(&self) -> CircuitState {
        let now = self.shared.clock.now();
        match self.shared.machine.lock().state {
            State::Closed { .. } => CircuitState::Closed,
            State::Open { until } if until > now => CircuitState::Open,
            State::Open { .. } | State::HalfOpen { .. } => CircuitState::HalfOpen,
        }
    }

    /// Admits one logical call, or fails with `CircuitOpen` (SPEC CB-3).
    pub fn try_acquire(&self) -> Result<Probe, CircuitOpen> {
        let now = self.shared.clock.now();
        let mut m = self.shared.machine.lock();
        match m.state {
            State::Closed { .. } => Ok(self.probe(m.period, false)),
            State::Open { until } if until > now => Err(CircuitOpen {
                retry_at: Some(until),
            }),
            State::Open { .. } => {
                m.enter(State::HalfOpen { probes: 1 });
                Ok(self.probe(m.period, true))
            }
            State::HalfOpen { probes } if probes < self.shared.config.half_open_calls => {
                m.state = State::HalfOpen { probes: probes + 1 };
                Ok(self.probe(m.period, true))
            }
            State::HalfOpen { .. } => Err(CircuitOpen { retry_at: None }),
        }
    }

    /// Whether a call admitted in `period` may still make a transport
    /// attempt (SPEC CB-3): yes in its own period, or once the circuit is
    /// closed again; not while it is open, nor in a later half-open period
    /// (whose probes were counted without it).
    fn allows(&self, period: u64) -> Result<(), CircuitOpen> {
        let now = self.shared.clock.now();
        let m = self.shared.machine.lock();
        match m.state {
            _ if m.period == period => Ok(()),
            State::Closed { .. } => Ok(()),
            State::Open { until } if until > now => Err(CircuitOpen {
                retry_at: Some(until),
            }),
            State::Open { .. } | State::HalfOpen { .. } => Err(CircuitOpen { retry_at: None }),
        }
    }

    fn probe(&self, period: u64, half_open: bool) -> Probe {
        Probe {
            breaker: Some(self.clone()),
            period,
            half_open,
        }
    }

    /// Applies one report of a probe admitted in `period`.
    fn record(&self, period: u64, outcome: Outcome) {
        let now = self.shared.clock.now();
        let config = self.shared.config;
        let mut m = self.shared.machine.lock();
        if m.period != period {
            // Admitted in an earlier period (before the circuit opened, or
            // in an earlier half-open period): its outcome is stale (CB-2).
            return;
        }
        let open = State::Open {
            until: now.checked_add(config.recovery_time).unwrap_or(now),
        };
        match (m.state, outcome) {
            // Closed: a success resets the count of consecutive failures;
            // the threshold-th failure opens the circuit.
            (State::Closed { .. }, Outcome::Success) => m.state = State::Closed { failures: 0 },
            (State::Closed { failures }, Outcome::Failure) => {
                let failures = failures.saturating_add(1);
                if failures >= config.failure_threshold {
                    m.enter(open);
                } else {
                    m.state = State::Closed { failures };
                }
            }
            // Half-open: a probe of this period closes or reopens it, or
            // gives its slot back.
            (State::HalfOpen { .. }, Outcome::Success) => m.enter(State::Closed { failures: 0 }),
            (State::HalfOpen { .. }, Outcome::Failure) => m.enter(open),
            (State::HalfOpen { probes }, Outcome::Neutral) => {
                m.state = State::HalfOpen {
                    probes: probes.saturating_sub(1),
                };
            }
            // A closed call that ended neutrally changes nothing; no probe
            // is ever admitted during an open period.
            (State::Closed { .. }, Outcome::Neutral) | (State::Open { .. }, _) => {}
        }
    }
}

#[derive(Debug, Clone, Copy)]
enum Outcome {
    Success,
    Failure,
    Neutral,
}

/// A call admitted by the breaker; report how it ended exactly once.
/// Dropping it unreported is neutral: a half-open slot is given back.
#[must_use = "report the call's outcome to the breaker"]
pub struct Probe {
    breaker: Option<CircuitBreaker>,
    /// The breaker's period when the call was admitted.
    period: u64,
    half_open: bool,
}

impl fmt::Debug for Probe {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Probe")
            .field("period", &self.period)
            .field("half_open", &self.half_open)
            .finish()
    }
}

impl Probe {
    /// Whether this call is a half-open probe.
    pub fn is_half_open(&self) -> bool {
        self.half_open
    }

    /// Whether the call may make its next transport attempt: `CircuitOpen`
    /// if the circuit opened since it was admitted (SPEC CB-3), as a retry
    /// or a call that waited for its quota after the check at its start
    /// would otherwise reach an upstream known to be failing.
    pub fn check(&self) -> Result<(), CircuitOpen> {
        match &self.breaker {
            Some(b) => b.allows(self.period),
            None => Ok(()),
        }
    }

    /// The call ended normally (response or stream EOF). Closes a
    /// half-open circuit only if this probe belongs to the current
    /// half-open period; a late success changes nothing (SPEC CB-2).
    pub fn success(mut self) {
        self.finish(Outcome::Success);
    }

    /// The call failed in a way that says the upstream is unhealthy.
    pub fn failure(mut self) {
        self.finish(Outcome::Failure);
    }

    /// The call ended without telling anything about the upstream.
    pub fn neutral(mut self) {
        self.finish(Outcome::Neutral);
    }

    fn finish(&mut self, outcome: Outcome) {
        if let Some(b) = self.breaker.take() {
            b.record(self.period, outcome);
        }
    }
}

impl Drop for Probe {
    fn drop(&mut self) {
        self.finish(Outcome::Neutral);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::ManualClock;

    fn breaker(clock: &ManualClock) -> CircuitBreaker {
        CircuitBreaker::with_clock(
            CircuitConfig {
                failure_threshold: 3,
                recovery_time: Duration::from_secs(30),
                half_open_calls: 1,
            },
            Arc::new(clock.clone()),
        )
        .unwrap()
    }

    // proves: CB-1, CB-3 (closed → open after N consecutive failures → half
    // open after recovery → closed on success / open on failure)
    #[test]
    fn state_machine() {
        let clock = ManualClock::new(Instant::now());
        let b = breaker(&clock);
        b.try_acquire().unwrap().failure();
        b.try_acquire().unwrap().failure();
        b.try_acquire().unwrap().success();
        assert_eq!(
            b.state(),
            CircuitState::Closed,
            "a success resets the count"
        );
        for _ in 0..3 {
            b.try_acquire().unwrap().failure();
        }
        assert_eq!(b.state(), CircuitState::Open);
        assert!(b.try_acquire().is_err());
        clock.advance(Duration::from_secs(30));
        let probe = b.try_acquire().unwrap();
        assert!(probe.is_half_open());
        assert!(b.try_acquire().is_err(), "one probe at a time");
        probe.failure();
        assert_eq!(b.state(), CircuitState::Open);
        clock.advance(Duration::from_secs(30));
        b.try_acquire().unwrap().success();
        assert_eq!(b.state(), CircuitState::Closed);
    }

    // proves: CB-4 (a probe holds its slot until it reports; dropping it is
    // neutral and frees the slot)
    #[test]
    fn probe_slot_is_held_until_reported() {
        let clock = ManualClock::new(Instant::now());
        let b = breaker(&clock);
        for _ in 0..3 {
            b.try_acquire().unwrap().failure();
        }
        clock.advance(Duration::from_secs(31));
        let probe = b.try_acquire().unwrap();
        assert!(b.try_acquire().is_err());
        drop(probe);
        assert_eq!(b.state(), CircuitState::HalfOpen);
        b.try_acquire().unwrap().success();
        assert_eq!(b.state(), CircuitState::Closed);
    }

    // proves: CB-2 (a late success of a call admitted while closed, reported
    // after the circuit opened, leaves it open; so does a late failure or a
    // late neutral end: none of them touches the open period)
    #[test]
    fn late_outcomes_from_before_the_open_change_nothing() {
        let clock = ManualClock::new(Instant::now());
        let b = breaker(&clock);
        let late_success = b.try_acquire().unwrap();
        let late_failure = b.try_acquire().unwrap();
        let late_neutral = b.try_acquire().unwrap();
        for _ in 0..3 {
            b.try_acquire().unwrap().failure();
        }
        assert_eq!(b.state(), CircuitState::Open);
        late_success.success();
        late_failure.failure();
        late_neutral.neutral();
        assert_eq!(b.state(), CircuitState::Open);
        assert!(b.try_acquire().is_err(), "still open");
    }

    // proves: CB-2 (a probe of an earlier half-open period can neither
    // close, reopen nor free a slot of a newer half-open period)
    #[test]
    fn stale_half_open_probes_change_nothing() {
        let clock = ManualClock::new(Instant::now());
        let b = CircuitBreaker::with_clock(
            CircuitConfig {
                failure_threshold: 1,
                recovery_time: Duration::from_secs(30),
                half_open_calls: 4,
            },
            Arc::new(clock.clone()),
        )
        .unwrap();
        b.try_acquire().unwrap().failure();
        clock.advance(Duration::from_secs(30));
        let old_success = b.try_acquire().unwrap();
        let old_failure = b.try_acquire().unwrap();
        let old_neutral = b.try_acquire().unwrap();
        // The fourth probe of that period fails: open again.
        b.try_acquire().unwrap().failure();
        assert_eq!(b.state(), CircuitState::Open);
        clock.advance(Duration::from_secs(30));
        let new: Vec<Probe> = (0..4).map(|_| b.try_acquire().unwrap()).collect();
        assert!(b.try_acquire().is_err(), "the new period's slots are full");
        old_neutral.neutral();
        assert!(b.try_acquire().is_err(), "a stale report frees no slot");
        old_failure.failure();
        assert_eq!(b.state(), CircuitState::HalfOpen, "stale failure ignored");
        old_success.success();
        assert_eq!(b.state(), CircuitState::HalfOpen, "stale success ignored");
        let mut new = new.into_iter();
        new.next().unwrap().success();
        assert_eq!(b.state(), CircuitState::Closed);
        // The other probes of that period are stale now.
        new.next().unwrap().failure();
        drop(new);
        assert_eq!(b.state(), CircuitState::Closed);
    }

    // proves: CB-1, CB-2 (with a threshold of 3: two failures then a success
    // reset the count; three consecutive failures open)
    #[test]
    fn a_success_resets_the_consecutive_count() {
        let clock = ManualClock::new(Instant::now());
        let b = breaker(&clock);
        for _ in 0..2 {
            b.try_acquire().unwrap().failure();
        }
        b.try_acquire().unwrap().success();
        for _ in 0..2 {
            b.try_acquire().unwrap().failure();
        }
        assert_eq!(b.state(), CircuitState::Closed, "2 after the reset");
        b.try_acquire().unwrap().neutral();
        assert_eq!(b.state(), CircuitState::Closed, "neutral counts nothing");
        b.try_acquire().unwrap().failure();
        assert_eq!(b.state(), CircuitState::Open);
    }
}

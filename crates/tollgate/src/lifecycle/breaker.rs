//! A circuit breaker per upstream endpoint (SPEC CB-1..CB-4).
//!
//! ```text
//!            failure_threshold consecutive failures
//!   Closed ─────────────────────────────────────────▶ Open
//!     ▲                                                │ recovery_time
//!     │ success                                        ▼
//!     └──────────────────────────────────────────── HalfOpen
//!                      failure ──▶ Open (again)   (at most half_open_calls probes)
//! ```
//!
//! The unit is the logical call: a call that exhausted its retries counts
//! once, and so does a normal response or a normal stream EOF. A streaming
//! probe keeps its half-open slot until EOF or failure; its first chunk
//! proves nothing (CB-4).

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

struct Shared {
    config: CircuitConfig,
    clock: SharedClock,
    state: Mutex<State>,
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
                state: Mutex::new(State::Closed { failures: 0 }),
            }),
        })
    }

    /// The current state (an open circuit past its recovery time reads as
    /// half-open).
    pub fn state(&self) -> CircuitState {
        let now = self.shared.clock.now();
        match *self.shared.state.lock() {
            State::Closed { .. } => CircuitState::Closed,
            State::Open { until } if until > now => CircuitState::Open,
            State::Open { .. } | State::HalfOpen { .. } => CircuitState::HalfOpen,
        }
    }

    /// Admits one logical call, or fails with `CircuitOpen` (SPEC CB-3).
    pub fn try_acquire(&self) -> Result<Probe, CircuitOpen> {
        let now = self.shared.clock.now();
        let mut state = self.shared.state.lock();
        match *state {
            State::Closed { .. } => Ok(self.probe(false)),
            State::Open { until } if until > now => Err(CircuitOpen {
                retry_at: Some(until),
            }),
            State::Open { .. } => {
                *state = State::HalfOpen { probes: 1 };
                Ok(self.probe(true))
            }
            State::HalfOpen { probes } if probes < self.shared.config.half_open_calls => {
                *state = State::HalfOpen { probes: probes + 1 };
                Ok(self.probe(true))
            }
            State::HalfOpen { .. } => Err(CircuitOpen { retry_at: None }),
        }
    }

    fn probe(&self, half_open: bool) -> Probe {
        Probe {
            breaker: Some(self.clone()),
            half_open,
        }
    }

    fn record(&self, half_open: bool, outcome: Outcome) {
        let now = self.shared.clock.now();
        let config = self.shared.config;
        let mut state = self.shared.state.lock();
        let open = || State::Open {
            until: now.checked_add(config.recovery_time).unwrap_or(now),
        };
        *state = match (*state, outcome) {
            (_, Outcome::Success) => State::Closed { failures: 0 },
            (State::Closed { failures }, Outcome::Failure) => {
                if failures + 1 >= config.failure_threshold {
                    open()
                } else {
                    State::Closed {
                        failures: failures + 1,
                    }
                }
            }
            (State::HalfOpen { .. }, Outcome::Failure) if half_open => open(),
            (State::HalfOpen { probes }, Outcome::Neutral) if half_open => State::HalfOpen {
                probes: probes.saturating_sub(1),
            },
            // A late result from before the circuit opened changes nothing.
            (s, _) => s,
        };
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
    half_open: bool,
}

impl fmt::Debug for Probe {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Probe")
            .field("half_open", &self.half_open)
            .finish()
    }
}

impl Probe {
    /// Whether this call is a half-open probe.
    pub fn is_half_open(&self) -> bool {
        self.half_open
    }

    /// The call ended normally (response or stream EOF).
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
            b.record(self.half_open, outcome);
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
}

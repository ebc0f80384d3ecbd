//! When to try again (SPEC RT-1, RT-3, RT-4, RT-5, RT-6).

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;

use super::provider::ProviderError;
use crate::clock::Instant;
use crate::config::ConfigError;
use crate::deadline::Deadline;

/// Retry settings of a call (SPEC RT-1).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AttemptPolicy {
    /// Attempts in all, the first included (default 3, at least 1).
    pub max_attempts: u32,
    /// Delay before the second attempt (default 1 s).
    pub base_delay: Duration,
    /// Growth per attempt (default 2, at least 1).
    pub factor: f64,
    /// Cap on the computed delay (default 60 s).
    pub max_delay: Duration,
    /// Random spread of the computed delay, `± jitter` of it (default 0.2,
    /// between 0 and 1). Server hints are never jittered.
    pub jitter: f64,
    /// Longest delay worth waiting for: a longer one fails at once with the
    /// last provider error (SPEC RT-4; default 60 s).
    pub max_wait: Duration,
}

impl Default for AttemptPolicy {
    fn default() -> Self {
        AttemptPolicy {
            max_attempts: 3,
            base_delay: Duration::from_secs(1),
            factor: 2.0,
            max_delay: Duration::from_secs(60),
            jitter: 0.2,
            max_wait: Duration::from_secs(60),
        }
    }
}

/// Why a failed call is not tried again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GiveUp {
    /// The error class is not retryable (SPEC RT-2).
    NotRetryable,
    /// The call is not idempotent (SPEC RT-5).
    NotIdempotent,
    /// Every attempt was used (SPEC RT-1).
    Exhausted,
    /// The needed delay exceeds `max_wait` (SPEC RT-4).
    WaitTooLong,
    /// The needed delay does not fit in the remaining deadline (RT-4, RT-6).
    Deadline,
}

impl GiveUp {
    /// A stable lower-case name for telemetry.
    pub const fn as_str(self) -> &'static str {
        match self {
            GiveUp::NotRetryable => "not_retryable",
            GiveUp::NotIdempotent => "not_idempotent",
            GiveUp::Exhausted => "exhausted",
            GiveUp::WaitTooLong => "wait_too_long",
            GiveUp::Deadline => "deadline",
        }
    }
}

/// The verdict after a failed attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// Sleep this long, then attempt again.
    Retry(Duration),
    /// Fail with the last provider error.
    GiveUp(GiveUp),
}

impl AttemptPolicy {
    /// No retries at all.
    pub fn none() -> Self {
        AttemptPolicy {
            max_attempts: 1,
            ..Self::default()
        }
    }

    /// Checks every field (SPEC CFG-2).
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.max_attempts == 0 {
            return Err(ConfigError::new("retry.max_attempts", "must be at least 1"));
        }
        if !(self.factor.is_finite() && self.factor >= 1.0) {
            return Err(ConfigError::new("retry.factor", "must be a number >= 1"));
        }
        if !(self.jitter.is_finite() && (0.0..=1.0).contains(&self.jitter)) {
            return Err(ConfigError::new("retry.jitter", "must be between 0 and 1"));
        }
        if self.max_delay < self.base_delay {
            return Err(ConfigError::new(
                "retry.max_delay",
                "must be at least retry.base_delay",
            ));
        }
        Ok(())
    }

    /// The delay after failed attempt `attempt` (1-based): `base *
    /// factor^(attempt-1)` capped at `max_delay`, jittered by `sample` in
    /// `[-1, 1]`, and never below the server's hint (SPEC RT-1, RT-3).
    pub fn delay(&self, attempt: u32, hint: Option<Duration>, sample: f64) -> Duration {
        let exp = i32::try_from(attempt.saturating_sub(1)).unwrap_or(i32::MAX);
        let computed = self.base_delay.as_secs_f64() * self.factor.powi(exp);
        let capped = computed.min(self.max_delay.as_secs_f64());
        let spread = 1.0 + self.jitter * sample.clamp(-1.0, 1.0);
        let jittered = Duration::try_from_secs_f64(capped * spread).unwrap_or(self.max_delay);
        hint.map_or(jittered, |h| jittered.max(h))
    }

    /// What to do after attempt `attempt` failed with `error` (SPEC RT-1,
    /// RT-2, RT-4, RT-5, RT-6).
    pub fn decide(
        &self,
        attempt: u32,
        error: &ProviderError,
        idempotent: bool,
        now: Instant,
        deadline: Deadline,
        sample: f64,
    ) -> Decision {
        if !error.is_retryable() {
            return Decision::GiveUp(GiveUp::NotRetryable);
        }
        if !idempotent {
            return Decision::GiveUp(GiveUp::NotIdempotent);
        }
        if attempt >= self.max_attempts {
            return Decision::GiveUp(GiveUp::Exhausted);
        }
        let delay = self.delay(attempt, error.retry_after, sample);
        if delay > self.max_wait {
            return Decision::GiveUp(GiveUp::WaitTooLong);
        }
        if let Some(remaining) = deadline.remaining(now)
            && delay >= remaining
        {
            return Decision::GiveUp(GiveUp::Deadline);
        }
        Decision::Retry(delay)
    }
}

/// Where jitter samples come from (injectable for deterministic tests).
pub trait Jitter: fmt::Debug + Send + Sync + 'static {
    /// A sample in `[-1, 1]`.
    fn sample(&self) -> f64;
}

/// Random jitter from a generator seeded once.
#[derive(Debug)]
pub struct SeededJitter(Mutex<fastrand::Rng>);

impl SeededJitter {
    /// A generator with `seed`: the same seed gives the same delays.
    pub fn new(seed: u64) -> Self {
        SeededJitter(Mutex::new(fastrand::Rng::with_seed(seed)))
    }

    /// A generator seeded from the operating system.
    pub fn random() -> Self {
        SeededJitter(Mutex::new(fastrand::Rng::new()))
    }
}

impl Jitter for SeededJitter {
    fn sample(&self) -> f64 {
        self.0.lock().f64() * 2.0 - 1.0
    }
}

/// No jitter: every delay is exactly the computed one.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoJitter;

impl Jitter for NoJitter {
    fn sample(&self) -> f64 {
        0.0
    }
}

/// A shared jitter source.
pub type SharedJitter = Arc<dyn Jitter>;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lifecycle::ErrorKind;

    fn err(kind: ErrorKind) -> ProviderError {
        ProviderError::new(kind, "x")
    }

    // proves: RT-1 (capped exponential backoff; jitter only on the computed
    // delay; server hints are floors, RT-3)
    #[test]
    fn backoff_shape() {
        let p = AttemptPolicy {
            base_delay: Duration::from_secs(1),
            factor: 2.0,
            max_delay: Duration::from_secs(5),
            jitter: 0.5,
            ..AttemptPolicy::default()
        };
        assert_eq!(p.delay(1, None, 0.0), Duration::from_secs(1));
        assert_eq!(p.delay(2, None, 0.0), Duration::from_secs(2));
        assert_eq!(p.delay(4, None, 0.0), Duration::from_secs(5));
        assert_eq!(p.delay(2, None, 1.0), Duration::from_secs(3));
        assert_eq!(p.delay(2, None, -1.0), Duration::from_secs(1));
        assert_eq!(
            p.delay(1, Some(Duration::from_secs(9)), 1.0),
            Duration::from_secs(9)
        );
        assert_eq!(
            p.delay(3, Some(Duration::from_millis(10)), 0.0),
            Duration::from_secs(4)
        );
    }

    // proves: RT-1, RT-2, RT-4, RT-5, RT-6 (the decision table)
    #[test]
    fn decisions() {
        let p = AttemptPolicy {
            jitter: 0.0,
            ..AttemptPolicy::default()
        };
        let now = Instant::now();
        let far = Deadline::NONE;
        assert_eq!(
            p.decide(1, &err(ErrorKind::Server), true, now, far, 0.0),
            Decision::Retry(Duration::from_secs(1))
        );
        assert_eq!(
            p.decide(1, &err(ErrorKind::Client), true, now, far, 0.0),
            Decision::GiveUp(GiveUp::NotRetryable)
        );
        assert_eq!(
            p.decide(1, &err(ErrorKind::Server), false, now, far, 0.0),
            Decision::GiveUp(GiveUp::NotIdempotent)
        );
        assert_eq!(
            p.decide(3, &err(ErrorKind::Server), true, now, far, 0.0),
            Decision::GiveUp(GiveUp::Exhausted)
        );
        let hour = err(ErrorKind::RateLimited).with_retry_after(Some(Duration::from_secs(3600)));
        assert_eq!(
            p.decide(1, &hour, true, now, far, 0.0),
            Decision::GiveUp(GiveUp::WaitTooLong)
        );
        let short = Deadline::at(now + Duration::from_millis(500));
        assert_eq!(
            p.decide(1, &err(ErrorKind::Timeout), true, now, short, 0.0),
            Decision::GiveUp(GiveUp::Deadline)
        );
    }

    // proves: RT-1 (seeded jitter is reproducible)
    #[test]
    fn seeded_jitter_repeats() {
        let (a, b) = (SeededJitter::new(7), SeededJitter::new(7));
        for _ in 0..10 {
            let s = a.sample();
            assert_eq!(s, b.sample());
            assert!((-1.0..=1.0).contains(&s));
        }
    }

    #[test]
    fn validation_names_fields() {
        let bad = AttemptPolicy {
            max_attempts: 0,
            ..AttemptPolicy::default()
        };
        assert_eq!(bad.validate().unwrap_err().field, "retry.max_attempts");
        let bad = AttemptPolicy {
            jitter: 2.0,
            ..AttemptPolicy::default()
        };
        assert_eq!(bad.validate().unwrap_err().field, "retry.jitter");
    }
}

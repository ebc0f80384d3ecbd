//! One absolute deadline per call (SPEC DL-1..DL-6).
//!
//! A relative timeout becomes a [`Deadline`] exactly once, at the outermost
//! boundary ([`Deadline::after`], or [`Deadline::from_timeout`] with an
//! injected clock's instant); every inner stage receives the same
//! absolute instant and caps its own local timeout with
//! [`Deadline::cap`], so time spent queueing is never handed back as a fresh
//! allowance.

use std::fmt;
use std::time::Duration;

use crate::clock::Instant;

/// The phase of a call in which a deadline expired (SPEC DL-6).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Phase {
    /// Waiting in the bounded FIFO queue (or for a queue slot).
    Queue,
    /// Waiting for a scope's coordinated cooldown to end.
    Cooldown,
    /// Waiting at the head of the queue for request/token quota.
    Rate,
    /// Waiting for a concurrency permit.
    Concurrency,
    /// Running a pre- or post-call hook.
    Hook,
    /// Sleeping between two attempts.
    RetryDelay,
    /// One transport attempt (connect, headers, body).
    Transport,
    /// Consuming a stream.
    Stream,
}

impl Phase {
    /// The phase's stable lower-case name, as used in errors and metrics.
    pub const fn as_str(self) -> &'static str {
        match self {
            Phase::Queue => "queue",
            Phase::Cooldown => "cooldown",
            Phase::Rate => "rate",
            Phase::Concurrency => "concurrency",
            Phase::Hook => "hook",
            Phase::RetryDelay => "retry_delay",
            Phase::Transport => "transport",
            Phase::Stream => "stream",
        }
    }

    /// Every phase, in lifecycle order.
    pub const ALL: [Phase; 8] = [
        Phase::Queue,
        Phase::Cooldown,
        Phase::Rate,
        Phase::Concurrency,
        Phase::Hook,
        Phase::RetryDelay,
        Phase::Transport,
        Phase::Stream,
    ];
}

impl fmt::Display for Phase {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An absolute monotonic deadline, or none.
///
/// `Deadline::NONE` removes only the caller's deadline; local caps of hooks
/// and transports still apply.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Deadline(Option<Instant>);

impl Deadline {
    /// No caller deadline.
    pub const NONE: Deadline = Deadline(None);

    /// A deadline at `instant`.
    pub const fn at(instant: Instant) -> Self {
        Deadline(Some(instant))
    }

    /// A deadline `timeout` from now, reading tokio's monotonic clock (which
    /// honours `tokio::time::pause`).
    ///
    /// This is the conversion SPEC DL-1 asks for at the outermost boundary
    /// (a library caller, a batch item's start, a request's arrival): call
    /// it once per call and hand the resulting absolute deadline to every
    /// inner stage, never the duration. When the controller runs on an
    /// injected [`Clock`](crate::clock::Clock), use
    /// [`from_timeout`](Deadline::from_timeout) with that clock's `now`.
    /// A huge `timeout` saturates to a deadline that never fires in practice.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tollgate::Deadline;
    ///
    /// # // proves: DL-1 (one absolute deadline from a duration, at the boundary)
    /// let deadline = Deadline::after(Duration::from_secs(30));
    /// let left = deadline.remaining(tokio::time::Instant::now());
    /// assert!(left.is_some_and(|l| l <= Duration::from_secs(30)));
    /// ```
    pub fn after(timeout: Duration) -> Self {
        Deadline::from_timeout(Some(timeout), Instant::now())
    }

    /// Converts a relative timeout into an absolute deadline (SPEC DL-1).
    ///
    /// `None` means no deadline. A zero timeout yields a deadline of `now`,
    /// which is already expired: the call fails in its first phase without
    /// any provider work (SPEC DL-5).
    pub fn from_timeout(timeout: Option<Duration>, now: Instant) -> Self {
        match timeout {
            None => Deadline::NONE,
            Some(t) => Deadline(Some(now.checked_add(t).unwrap_or_else(|| far_future(now)))),
        }
    }

    /// The absolute instant, if any.
    pub const fn instant(self) -> Option<Instant> {
        self.0
    }

    /// Time left at `now`: `None` when there is no deadline, zero once expired.
    pub fn remaining(self, now: Instant) -> Option<Duration> {
        self.0.map(|d| d.saturating_duration_since(now))
    }

    /// Whether the deadline is at or before `now`.
    pub fn is_expired(self, now: Instant) -> bool {
        matches!(self.0, Some(d) if d <= now)
    }

    /// Fails with `phase` when the deadline has passed (SPEC DL-5).
    pub fn check(self, now: Instant, phase: Phase) -> Result<(), DeadlineExceeded> {
        if self.is_expired(now) {
            Err(DeadlineExceeded { phase })
        } else {
            Ok(())
        }
    }

    /// A stage's local timeout clipped by the remaining time (SPEC DL-4).
    pub fn cap(self, local: Option<Duration>, now: Instant) -> Option<Duration> {
        match (local, self.remaining(now)) {
            (Some(l), Some(r)) => Some(l.min(r)),
            (l, r) => l.or(r),
        }
    }

    /// The earlier of this deadline and `other`.
    pub fn min(self, other: Deadline) -> Deadline {
        match (self.0, other.0) {
            (Some(a), Some(b)) => Deadline(Some(a.min(b))),
            (a, b) => Deadline(a.or(b)),
        }
    }

    /// Whether `instant` lies after the deadline.
    pub fn is_before(self, instant: Instant) -> bool {
        matches!(self.0, Some(d) if d < instant)
    }
}

/// An instant so far away that it never fires in practice (about 30 years).
pub(crate) fn far_future(now: Instant) -> Instant {
    now.checked_add(Duration::from_secs(86_400 * 365 * 30))
        .unwrap_or(now)
}

/// The deadline passed while the call was in `phase`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("deadline exceeded while in phase {phase}")]
pub struct DeadlineExceeded {
    /// Where the time ran out.
    pub phase: Phase,
}

#[cfg(test)]
mod tests {
    use super::*;

    // proves: DL-1
    #[test]
    fn from_timeout_none_is_no_deadline() {
        let now = Instant::now();
        assert_eq!(Deadline::from_timeout(None, now), Deadline::NONE);
        assert_eq!(Deadline::NONE.remaining(now), None);
        assert!(!Deadline::NONE.is_expired(now));
    }

    // proves: DL-5
    #[test]
    fn zero_timeout_is_already_expired() {
        let now = Instant::now();
        let d = Deadline::from_timeout(Some(Duration::ZERO), now);
        assert_eq!(
            d.check(now, Phase::Queue),
            Err(DeadlineExceeded {
                phase: Phase::Queue
            })
        );
    }

    // proves: DL-4
    #[test]
    fn cap_takes_the_smaller_of_local_and_remaining() {
        let now = Instant::now();
        let d = Deadline::from_timeout(Some(Duration::from_secs(3)), now);
        let later = now + Duration::from_millis(2_800);
        // 2.8 s spent queueing leaves 0.2 s, not a fresh 10 s allowance.
        assert_eq!(
            d.cap(Some(Duration::from_secs(10)), later),
            Some(Duration::from_millis(200))
        );
        assert_eq!(
            d.cap(Some(Duration::from_millis(50)), later),
            Some(Duration::from_millis(50))
        );
        assert_eq!(Deadline::NONE.cap(None, later), None);
        assert_eq!(d.cap(None, later), Some(Duration::from_millis(200)));
    }

    // proves: DL-1
    #[test]
    fn huge_timeout_saturates_instead_of_panicking() {
        let now = Instant::now();
        let d = Deadline::from_timeout(Some(Duration::MAX), now);
        assert!(!d.is_expired(now));
    }

    #[test]
    fn min_prefers_the_earlier_deadline() {
        let now = Instant::now();
        let a = Deadline::at(now + Duration::from_secs(1));
        let b = Deadline::at(now + Duration::from_secs(2));
        assert_eq!(a.min(b), a);
        assert_eq!(Deadline::NONE.min(b), b);
        assert_eq!(a.min(Deadline::NONE), a);
    }

    #[test]
    fn phase_names_are_stable() {
        let names: Vec<_> = Phase::ALL.iter().map(|p| p.as_str()).collect();
        assert_eq!(
            names,
            [
                "queue",
                "cooldown",
                "rate",
                "concurrency",
                "hook",
                "retry_delay",
                "transport",
                "stream"
            ]
        );
    }
}

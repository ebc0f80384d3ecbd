//! Monotonic time, injectable for tests (SPEC DL-2).
//!
//! Every timing decision in tollgate reads the time through a [`Clock`].
//! The default, [`TokioClock`], reads tokio's monotonic clock, so tests that
//! run on tokio's paused clock (`#[tokio::test(start_paused = true)]`,
//! `tokio::time::advance`) control every deadline, refill and backoff without
//! sleeping in real time. Waiting is done with tokio's timer, so a clock given
//! to a component that sleeps must agree with tokio's notion of "now";
//! [`ManualClock`] is for components that never sleep (quota arithmetic,
//! circuit breaker, retry planning) and are driven by explicit instants.
//!
//! Calendar windows (a limit per day or per month) and persisted quota
//! state need the wall-clock time too: a clock also tells, through
//! [`Clock::wall`], which UTC instant its monotonic instants stand for (see
//! [`WallClock`]).

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
pub use tokio::time::Instant;
pub use wall::{AnchoredClock, WallClock};
pub(crate) use wall::{UtcNanos, from_nanos, utc_nanos};

mod wall;

/// A source of monotonic instants.
pub trait Clock: fmt::Debug + Send + Sync + 'static {
    /// The current instant.
    fn now(&self) -> Instant;

    /// The mapping between this clock's instants and UTC: by default the
    /// system's wall clock at this clock's current instant. Read once per
    /// controller, so boundaries of calendar windows follow the monotonic
    /// clock from then on (a later step of the system clock is not
    /// followed; see `docs/design.md`, "Wall clock").
    fn wall(&self) -> WallClock {
        WallClock::system_at(self.now())
    }
}

/// Reads tokio's monotonic clock (which honours `tokio::time::pause`).
#[derive(Debug, Clone, Copy, Default)]
pub struct TokioClock;

impl Clock for TokioClock {
    #[inline]
    fn now(&self) -> Instant {
        Instant::now()
    }
}

/// A clock that only moves when told to. Cloning shares the same time.
#[derive(Debug, Clone)]
pub struct ManualClock {
    now: Arc<Mutex<Instant>>,
}

impl ManualClock {
    /// A manual clock starting at `start`.
    pub fn new(start: Instant) -> Self {
        Self {
            now: Arc::new(Mutex::new(start)),
        }
    }

    /// Moves the clock forward by `by`.
    pub fn advance(&self, by: Duration) {
        let mut now = self.now.lock();
        *now += by;
    }

    /// Sets the clock to `to` if that is later than the current instant.
    pub fn set(&self, to: Instant) {
        let mut now = self.now.lock();
        if to > *now {
            *now = to;
        }
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Instant {
        *self.now.lock()
    }
}

/// A shared, type-erased clock.
pub type SharedClock = Arc<dyn Clock>;

#[cfg(test)]
mod tests {
    use super::*;

    // proves: DL-2
    #[tokio::test(start_paused = true)]
    async fn tokio_clock_follows_paused_time() {
        let clock = TokioClock;
        let start = clock.now();
        tokio::time::advance(Duration::from_secs(5)).await;
        assert_eq!(clock.now() - start, Duration::from_secs(5));
    }

    // proves: DL-2
    #[test]
    fn manual_clock_only_moves_forward() {
        let start = Instant::now();
        let clock = ManualClock::new(start);
        clock.advance(Duration::from_millis(10));
        clock.set(start);
        assert_eq!(clock.now() - start, Duration::from_millis(10));
    }
}

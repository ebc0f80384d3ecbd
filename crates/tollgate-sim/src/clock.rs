//! The clock the referee reads. The default follows tokio's clock, so the
//! simulator runs on paused time along with the code under test; tests that
//! use real sockets can drive a [`ManualClock`] instead and never depend on
//! tokio's auto-advance.

use std::fmt::Debug;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use tokio::time::Instant;

/// A source of monotonic instants for the referee's windows.
///
/// Latency and fault delays always use `tokio::time` sleeps; only window
/// accounting reads this clock.
pub trait Clock: Send + Sync + Debug + 'static {
    /// The current instant.
    fn now(&self) -> Instant;
}

/// tokio's clock: real time, or the paused test clock under
/// `tokio::time::pause`.
#[derive(Debug, Clone, Copy, Default)]
pub struct TokioClock;

impl Clock for TokioClock {
    fn now(&self) -> Instant {
        Instant::now()
    }
}

/// A clock that moves only when told to. Clones share the same time.
#[derive(Debug, Clone)]
pub struct ManualClock {
    now: Arc<Mutex<Instant>>,
}

impl ManualClock {
    /// A manual clock starting at tokio's current instant.
    pub fn new() -> Self {
        Self {
            now: Arc::new(Mutex::new(Instant::now())),
        }
    }

    /// Moves the clock forward by `by`.
    pub fn advance(&self, by: Duration) {
        let mut now = self.now.lock();
        // Keeps the old instant should the addition ever overflow.
        if let Some(next) = now.checked_add(by) {
            *now = next;
        }
    }
}

impl Default for ManualClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Instant {
        *self.now.lock()
    }
}

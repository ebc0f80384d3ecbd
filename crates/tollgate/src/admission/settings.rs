//! The controller-wide settings a reconfiguration changes in place
//! (`reconfigure.rs`): read without a lock on the paths that need them,
//! written only by a reconfiguration.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use parking_lot::Mutex;

use crate::config::{ControllerConfig, CooldownConfig, Overflow};

/// An optional duration read and written atomically (nanoseconds;
/// `u64::MAX` stands for none, and longer durations saturate just below).
#[derive(Debug)]
pub(crate) struct AtomicDuration(AtomicU64);

impl AtomicDuration {
    const NONE: u64 = u64::MAX;

    pub(crate) fn new(value: Option<Duration>) -> Self {
        AtomicDuration(AtomicU64::new(Self::encode(value)))
    }

    fn encode(value: Option<Duration>) -> u64 {
        value.map_or(Self::NONE, |d| {
            u64::try_from(d.as_nanos()).map_or(Self::NONE - 1, |n| n.min(Self::NONE - 1))
        })
    }

    pub(crate) fn get(&self) -> Option<Duration> {
        match self.0.load(Ordering::Relaxed) {
            Self::NONE => None,
            n => Some(Duration::from_nanos(n)),
        }
    }

    pub(crate) fn set(&self, value: Option<Duration>) {
        self.0.store(Self::encode(value), Ordering::Relaxed);
    }
}

/// See the module documentation.
#[derive(Debug)]
pub(crate) struct Settings {
    /// Default waiting calls per scope (scopes may set their own).
    queue_capacity: AtomicUsize,
    /// Whether a full queue refuses ([`Overflow::Reject`]) or lets the
    /// producer wait for a slot.
    reject: AtomicBool,
    max_wait: AtomicDuration,
    /// Read when a provider's 429 starts a cooldown (a cold path).
    cooldown: Mutex<CooldownConfig>,
}

impl Settings {
    pub(crate) fn new(config: &ControllerConfig) -> Self {
        Settings {
            queue_capacity: AtomicUsize::new(config.queue_capacity),
            reject: AtomicBool::new(config.overflow == Overflow::Reject),
            max_wait: AtomicDuration::new(config.max_wait),
            cooldown: Mutex::new(config.cooldown),
        }
    }

    /// Takes `config`'s settings (a reconfiguration).
    pub(crate) fn set(&self, config: &ControllerConfig) {
        self.queue_capacity
            .store(config.queue_capacity, Ordering::Relaxed);
        self.reject
            .store(config.overflow == Overflow::Reject, Ordering::Relaxed);
        self.max_wait.set(config.max_wait);
        *self.cooldown.lock() = config.cooldown;
    }

    pub(crate) fn queue_capacity(&self) -> usize {
        self.queue_capacity.load(Ordering::Relaxed)
    }

    pub(crate) fn overflow(&self) -> Overflow {
        if self.reject.load(Ordering::Relaxed) {
            Overflow::Reject
        } else {
            Overflow::Wait
        }
    }

    pub(crate) fn max_wait(&self) -> Option<Duration> {
        self.max_wait.get()
    }

    pub(crate) fn cooldown(&self) -> CooldownConfig {
        *self.cooldown.lock()
    }
}

//! Counters shared by the workers, the progress display and the summary.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tollgate::lifecycle::ErrorKind;

use crate::config::ErrorClass;

/// Live counters of a run.
#[derive(Debug, Default)]
pub struct Stats {
    /// Items to run this time.
    pub pending: AtomicU64,
    /// Items recorded as succeeded.
    pub succeeded: AtomicU64,
    /// Items recorded as failed.
    pub failed: AtomicU64,
    /// Items taken by a worker and not finished.
    pub in_flight: AtomicU64,
    /// Most items in progress at once (at most the concurrency: ADM-8).
    pub max_in_flight: AtomicU64,
    /// Provider attempts made.
    pub attempts: AtomicU64,
    /// Attempts beyond an item's first.
    pub retries: AtomicU64,
    /// Attempts that drew a 429.
    pub rate_limited: AtomicU64,
    /// Tokens the provider reported for finished items.
    pub tokens_reported: AtomicU64,
    failures: Mutex<BTreeMap<ErrorClass, u64>>,
    attempt_failures: Mutex<BTreeMap<&'static str, u64>>,
    quota_waits: Mutex<Vec<Duration>>,
    starts: Mutex<Vec<(Duration, u64)>>,
}

impl Stats {
    pub(crate) fn attempt(&self, number: u32) {
        self.attempts.fetch_add(1, Ordering::Relaxed);
        if number > 1 {
            self.retries.fetch_add(1, Ordering::Relaxed);
        }
    }

    pub(crate) fn attempt_failed(&self, kind: ErrorKind) {
        if kind == ErrorKind::RateLimited {
            self.rate_limited.fetch_add(1, Ordering::Relaxed);
        }
        *lock(&self.attempt_failures)
            .entry(kind.as_str())
            .or_default() += 1;
    }

    pub(crate) fn succeeded(&self, quota_wait: Duration, reported: Option<u64>) {
        self.succeeded.fetch_add(1, Ordering::Relaxed);
        if let Some(r) = reported {
            self.tokens_reported.fetch_add(r, Ordering::Relaxed);
        }
        lock(&self.quota_waits).push(quota_wait);
    }

    pub(crate) fn failed(&self, class: ErrorClass) {
        self.failed.fetch_add(1, Ordering::Relaxed);
        *lock(&self.failures).entry(class).or_default() += 1;
    }

    /// Records an attempt that started `at` (since the run began) and the
    /// tokens it was charged (reported, else its estimate).
    pub(crate) fn started(&self, at: Duration, tokens: u64) {
        lock(&self.starts).push((at, tokens));
    }

    /// Every attempt's start (since the run began) and tokens, sorted.
    pub fn starts(&self) -> Vec<(Duration, u64)> {
        let mut v = lock(&self.starts).clone();
        v.sort_unstable();
        v
    }

    /// Items finished (recorded) in this run.
    pub fn done(&self) -> u64 {
        self.succeeded.load(Ordering::Relaxed) + self.failed.load(Ordering::Relaxed)
    }

    /// Recorded failures by class.
    pub fn failures(&self) -> BTreeMap<ErrorClass, u64> {
        lock(&self.failures).clone()
    }

    /// Failed attempts (retried or not) by RT-2 class.
    pub fn attempt_failures(&self) -> BTreeMap<&'static str, u64> {
        lock(&self.attempt_failures).clone()
    }

    /// The quota waits of succeeded items (their last attempt's), sorted.
    pub fn quota_waits(&self) -> Vec<Duration> {
        let mut v = lock(&self.quota_waits).clone();
        v.sort_unstable();
        v
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

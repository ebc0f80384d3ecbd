//! A scope's counted state in wall-clock time, for persistence across
//! restarts (SPEC DQ-8).
//!
//! The engine keeps no files: a front end (the gateway, the batch runner)
//! asks each controller for what its long windows count
//! ([`AdmissionController::save_quota`]), writes it where it likes, and
//! hands it back to a new controller after a restart
//! ([`AdmissionController::restore_quota`]). Times are UTC, because the
//! monotonic clock starts over with the process; a controller maps them
//! through its [`WallClock`](crate::clock::WallClock).
//!
//! Only leased amounts are saved: a pending reservation's attempt has not
//! started, and after a restart nobody holds it. Restoring is never
//! shorter than the truth: an amount is counted until the UTC time it was
//! counted until (believed up to one window plus the larger of one window
//! and the arrival cap from now: an amount recounted ahead, SPEC Q-15), a
//! fixed or calendar window's count is added to the window in progress,
//! and a limit whose window or algorithm changed while the process was
//! down is seeded with everything the saved limit of its dimension still
//! counts, as admitted at the restart (an amount counted ahead, at its
//! instant); a saved fixed or calendar window that ended less than the new
//! limit's window ago seeds it with its whole count (a calendar day become
//! a rolling day, restarted after midnight: the evening's spending is
//! within the rolling day).
//!
//! [`AdmissionController::save_quota`]: crate::AdmissionController::save_quota
//! [`AdmissionController::restore_quota`]: crate::AdmissionController::restore_quota

use std::time::SystemTime;

use crate::config::Limit;

/// The saved state of a scope's limits.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SavedScope {
    /// One entry per saved limit.
    pub limits: Vec<SavedLimit>,
}

/// What one limit counted when it was saved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SavedLimit {
    /// The limit as configured (its identity: dimension, window, calendar).
    pub limit: Limit,
    /// What it counted.
    pub counted: Counted,
}

/// What a limit counts, by the kind of its arithmetic.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Counted {
    /// A sliding window: amounts, each counted until a UTC time, ordered
    /// by that time.
    Until(Vec<(SystemTime, u64)>),
    /// A fixed or calendar window: the window `[start, end)` in UTC and
    /// what it counts.
    Window {
        /// The window's first instant.
        start: SystemTime,
        /// The next window's first instant.
        end: SystemTime,
        /// What it counts.
        used: u64,
        /// Amounts the provider may count as late as a later window (an
        /// attempt cancelled before its arrival bound, SPEC Q-15), each
        /// with that instant: counted in every window up to its own, and
        /// in `used` already.
        ahead: Vec<(SystemTime, u64)>,
    },
    /// A token bucket: the units missing from a full bucket at a UTC time
    /// (rounded up).
    Taken {
        /// When.
        at: SystemTime,
        /// Units missing.
        taken: u64,
    },
}

impl Counted {
    /// Everything it still counts at `now` (UTC), refill of a bucket
    /// aside: what a limit seeded from it takes.
    pub fn total_at(&self, now: SystemTime) -> u64 {
        match self {
            Counted::Until(entries) => entries
                .iter()
                .filter(|(until, _)| *until > now)
                .map(|(_, a)| *a)
                .fold(0u64, u64::saturating_add),
            Counted::Window {
                start,
                end,
                used,
                ahead,
            } => {
                if *end > now {
                    *used
                } else {
                    // The window ended; what is kept ahead is counted until
                    // the later window holding its instant ends: no later
                    // than one window after that instant.
                    let window = end.duration_since(*start).unwrap_or_default();
                    ahead
                        .iter()
                        .filter(|(at, _)| at.checked_add(window).is_none_or(|e| e > now))
                        .map(|(_, a)| *a)
                        .fold(0u64, u64::saturating_add)
                }
            }
            Counted::Taken { taken, .. } => *taken,
        }
    }

    /// The amounts among [`total_at`](Self::total_at) the provider may
    /// count as late as an instant after `now` (SPEC Q-15), each with that
    /// instant; `window` is the saved limit's (a sliding amount's instant
    /// is one window before its expiry).
    pub(crate) fn ahead_at(
        &self,
        now: SystemTime,
        window: std::time::Duration,
    ) -> Vec<(SystemTime, u64)> {
        match self {
            Counted::Until(entries) => entries
                .iter()
                .filter_map(|&(until, a)| Some((until.checked_sub(window)?, a)))
                .filter(|(at, _)| *at > now)
                .collect(),
            Counted::Window { ahead, .. } => {
                ahead.iter().copied().filter(|(at, _)| *at > now).collect()
            }
            Counted::Taken { .. } => Vec::new(),
        }
    }

    /// Whether it counts nothing any more at `now`: not worth keeping.
    pub fn is_spent(&self, now: SystemTime) -> bool {
        match self {
            Counted::Taken { taken, .. } => *taken == 0,
            _ => self.total_at(now) == 0,
        }
    }
}

//! Saving a scope's long windows and restoring them after a restart
//! (SPEC DQ-8; see `quota/saved.rs` for what is kept and how it comes
//! back).

use super::{LocalQuota, nanos};
use crate::clock::{Instant, from_nanos, utc_nanos};
use crate::config::Limit;
use crate::quota::Nanos;
use crate::quota::limit::LimitState;
use crate::quota::saved::{Counted, SavedLimit, SavedScope};
use std::time::{Duration, SystemTime};

impl LocalQuota {
    /// A number that changes whenever what the scope counts may have
    /// changed (other than by time passing): an unchanged number means an
    /// unchanged [`save`](Self::save).
    pub fn version(&self) -> u64 {
        self.version
    }

    /// What the limits `keep` selects count at `now`, in UTC. Limits the
    /// provider taught (SPEC Q-14) and the old limits a reconfiguration
    /// keeps for a while are left out: neither is configured.
    pub fn save(&mut self, now: Instant, keep: fn(&Limit) -> bool) -> SavedScope {
        let t = self.tick(now);
        self.advance(t);
        SavedScope {
            limits: self
                .limits
                .iter()
                .filter(|l| !l.learned && !l.is_transitional() && keep(&l.config))
                .map(|l| SavedLimit {
                    limit: l.config,
                    counted: l.save(self.epoch_utc),
                })
                .collect(),
        }
    }

    /// Counts what `saved` (a save of this scope before a restart) still
    /// counts, at `now`: each limit takes the saved limit of its window
    /// (dimension, window or calendar period, arithmetic) as it was, or,
    /// when the configuration changed meanwhile, is seeded with what the
    /// saved limits of its dimension still count (the one whose window
    /// covers it best), as admitted now (an amount the provider may count
    /// as late as an instant ahead, SPEC Q-15: at that instant). Returns
    /// whether anything was counted.
    pub fn restore(&mut self, saved: &SavedScope, now: Instant) -> bool {
        let t = self.tick(now);
        self.advance(t);
        let now_utc = from_nanos(self.epoch_utc + i128::from(t));
        let mut restored = false;
        for l in self.limits.iter_mut().filter(|l| !l.is_transitional()) {
            let same = saved.limits.iter().find(|s| {
                s.limit.dimension == l.config.dimension
                    && s.limit.window == l.config.window
                    && s.limit.calendar == l.config.calendar
            });
            if let Some(s) = same
                && l.restore(&s.counted, t, self.epoch_utc)
            {
                restored |= !s.counted.is_spent(now_utc);
                continue;
            }
            if let Some(s) = source(&saved.limits, l) {
                // A window that ended counts nothing at `now`, but what it
                // counted may lie within the new limit's window (a calendar
                // day become a rolling one, a restart after midnight).
                let total =
                    s.counted
                        .total_at(now_utc)
                        .max(ended_within(&s.counted, l.window(), now_utc));
                if total > 0 {
                    // An instant ahead is believed as far as a restored
                    // window believes it (see `SlidingWindow::restore`).
                    let horizon = t.saturating_add(
                        nanos(s.limit.window).max(nanos(crate::lifecycle::ARRIVAL_CAP)),
                    );
                    let ahead: Vec<(Nanos, u64)> = s
                        .counted
                        .ahead_at(now_utc, s.limit.window)
                        .into_iter()
                        .map(|(at, a)| {
                            let tick = utc_nanos(at) - self.epoch_utc;
                            (u64::try_from(tick).unwrap_or(0).clamp(t, horizon), a)
                        })
                        .collect();
                    l.seed(total, 0, &ahead, t, 0);
                    restored = true;
                }
            }
        }
        if restored {
            self.version = self.version.wrapping_add(1);
        }
        restored
    }
}

/// What a fixed or calendar window that ended before `now` counted, if
/// it ended less than `window` (the new limit's) before `now`: admitted
/// within the new limit's window, as far as it knows (0 otherwise).
fn ended_within(counted: &Counted, window: Duration, now: SystemTime) -> u64 {
    match counted {
        Counted::Window { end, used, .. }
            if *end <= now && now.duration_since(*end).is_ok_and(|d| d < window) =>
        {
            *used
        }
        _ => 0,
    }
}

/// The saved limit a changed `limit` is seeded from: of its dimension, the
/// shortest window covering the new one, else the longest (as a reload
/// does, see `reconfigure.rs`).
fn source<'a>(saved: &'a [SavedLimit], limit: &LimitState) -> Option<&'a SavedLimit> {
    let window = nanos(limit.window());
    let same = || {
        saved
            .iter()
            .filter(move |s| s.limit.dimension == limit.dimension())
    };
    same()
        .filter(|s| nanos(s.limit.window) >= window)
        .min_by_key(|s| s.limit.window)
        .or_else(|| same().max_by_key(|s| s.limit.window))
}

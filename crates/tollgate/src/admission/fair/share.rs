//! What each class was admitted over the last window, for `min_share`
//! (SPEC FAIR-2).
//!
//! The window is cut into [`BUCKETS`] buckets; the record adds each grant's
//! cost to the current bucket and forgets buckets as they age out, so its
//! memory is fixed and an addition is one comparison of instants and one
//! add. The sum covers between `15/16` of the window and the whole window
//! before the current instant.

use std::time::Duration;

use crate::clock::Instant;
use crate::flow::Priority;

/// Buckets per window.
pub(crate) const BUCKETS: usize = 16;

const CLASSES: usize = Priority::ALL.len();

/// See the module documentation.
#[derive(Debug, Clone)]
pub(crate) struct ShareRecord {
    /// One bucket's length (`None`: no window, nothing recorded).
    width: Option<Duration>,
    /// Where the current bucket began.
    start: Option<Instant>,
    /// Where it ends (`start + width`, kept so that an addition compares
    /// one instant and does no arithmetic).
    end: Option<Instant>,
    current: usize,
    costs: [[u64; CLASSES]; BUCKETS],
    /// Everything ever recorded, per class.
    pub(crate) total: [u64; CLASSES],
}

impl ShareRecord {
    /// A record over `window` (the scope's share window; `None` for a scope
    /// without limits, which never queues).
    pub(crate) fn new(window: Option<Duration>) -> Self {
        let width = window.map(|w| (w / BUCKETS as u32).max(Duration::from_nanos(1)));
        ShareRecord {
            width,
            start: None,
            end: None,
            current: 0,
            costs: [[0; CLASSES]; BUCKETS],
            total: [0; CLASSES],
        }
    }

    /// Measures over `window` from now on: unchanged when its buckets are
    /// the same, else the window starts empty (totals are kept).
    pub(crate) fn rewindow(&mut self, window: Option<Duration>) {
        let fresh = ShareRecord::new(window);
        if fresh.width != self.width {
            *self = ShareRecord {
                total: self.total,
                ..fresh
            };
        }
    }

    /// Starts the window empty, with the same buckets (a new cost unit);
    /// totals are kept.
    pub(crate) fn restart(&mut self) {
        self.start = None;
        self.end = None;
        self.current = 0;
        self.costs = [[0; CLASSES]; BUCKETS];
    }

    /// Counts `cost` admitted to `class` at `now` (every grant, the fast
    /// path's too: always inlined there).
    #[inline(always)]
    pub(crate) fn add(&mut self, class: Priority, cost: u64, now: Instant) {
        let i = class.index();
        self.total[i] = self.total[i].saturating_add(cost);
        if self.width.is_none() {
            return;
        }
        if self.end.is_none_or(|end| now >= end) {
            self.advance(now);
        }
        let bucket = &mut self.costs[self.current][i];
        *bucket = bucket.saturating_add(cost);
    }

    /// Moves the current bucket up to `now`, forgetting what aged out.
    fn advance(&mut self, now: Instant) {
        let Some(width) = self.width else { return };
        let Some(start) = self.start else {
            self.start = Some(now);
            self.end = now.checked_add(width);
            return;
        };
        // An instant before the current bucket's end (a late clock read
        // included) counts in it.
        if self.end.is_none_or(|end| now < end) {
            return;
        }
        let steps = (now - start).as_nanos() / width.as_nanos().max(1);
        if steps >= BUCKETS as u128 {
            self.costs = [[0; CLASSES]; BUCKETS];
            self.current = 0;
            self.start = Some(now);
            self.end = now.checked_add(width);
            return;
        }
        for _ in 0..steps {
            self.current = (self.current + 1) % BUCKETS;
            self.costs[self.current] = [0; CLASSES];
        }
        // `steps < BUCKETS`, so this fits in u32.
        let moved = width.saturating_mul(u32::try_from(steps).unwrap_or(u32::MAX));
        let start = start.checked_add(moved).unwrap_or(now);
        self.start = Some(start);
        self.end = start.checked_add(width);
    }

    /// What each class was admitted over the last window.
    pub(crate) fn window(&mut self, now: Instant) -> [u64; CLASSES] {
        self.advance(now);
        let mut sums = [0u64; CLASSES];
        for bucket in &self.costs {
            for (s, c) in sums.iter_mut().zip(bucket) {
                *s = s.saturating_add(*c);
            }
        }
        sums
    }

    /// Whether `class` received less than `percent` % of everything
    /// admitted over the last window (never when nothing was admitted).
    pub(crate) fn below(sums: &[u64; CLASSES], class: Priority, percent: u8) -> bool {
        let total: u128 = sums.iter().map(|&s| u128::from(s)).sum();
        u128::from(sums[class.index()]) * 100 < u128::from(percent) * total
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // proves: FAIR-2 (the record covers the last window and forgets what
    // aged out)
    #[test]
    fn keeps_the_last_window_only() {
        let t0 = Instant::now();
        let w = Duration::from_secs(16);
        let mut r = ShareRecord::new(Some(w));
        r.add(Priority::Standard, 90, t0);
        r.add(Priority::Batch, 10, t0 + Duration::from_millis(500));
        let sums = r.window(t0 + Duration::from_secs(3));
        assert_eq!(sums, [0, 90, 10]);
        assert!(!ShareRecord::below(&sums, Priority::Batch, 5));
        assert!(ShareRecord::below(&sums, Priority::Batch, 11));
        assert!(!ShareRecord::below(&[0, 0, 0], Priority::Batch, 5));
        // Bucket of t0 ages out once the window has passed it.
        r.add(Priority::Interactive, 5, t0 + Duration::from_secs(15));
        assert_eq!(r.window(t0 + Duration::from_secs(15)), [5, 90, 10]);
        assert_eq!(r.window(t0 + Duration::from_secs(17)), [5, 0, 0]);
        assert_eq!(r.window(t0 + Duration::from_secs(100)), [0, 0, 0]);
        assert_eq!(r.total, [5, 90, 10]);
    }
}

//! An exact sliding window kept as a log of `(arrival, amount)` entries.
//!
//! # Semantics
//!
//! An amount recorded at instant `a` occupies the window during `[a, a + W)`:
//! at `a + W` it has left. So at instant `t` the window holds every entry with
//! `t - W < a <= t`, and "admit `n` at `t` under limit `L`" means
//! `used(t) + n <= L`. This is the same as saying that every half-open
//! interval of length `W` holds at most `L`.
//!
//! # Implementation notes
//!
//! * Entries are appended in arrival order, so the oldest is always at the
//!   front and pruning pops from the front (amortised O(1)).
//! * `used` is the running sum of the entries in the log; it changes only in
//!   [`SlidingWindow::record`] (add) and in `prune` (subtract).
//! * Each entry also stores `cumulative`: the total amount ever recorded up to
//!   and including it. Cumulative values strictly increase along the log when
//!   amounts are positive (and never decrease), which lets
//!   [`SlidingWindow::wait_for`] find by binary search the first entry whose
//!   departure frees enough room. A unit test checks it against a plain
//!   linear scan.
//! * [`SlidingWindow::record_entry`] always logs an entry (even of amount 0)
//!   and returns its [`EntryId`]: the number of entries logged before it.
//!   Its position in the log is that id minus the number of entries pruned,
//!   so [`SlidingWindow::adjust`] finds it in O(1) and rewrites its amount,
//!   shifting the `cumulative` of the entries after it (O(entries logged
//!   since), which keeps the cumulative values non-decreasing).
//! * Instants must not go backwards; an earlier `now` than the newest entry is
//!   treated as that entry's instant (the caller reads the clock under the
//!   same lock that records, so this does not happen in practice).

use std::collections::VecDeque;
use std::time::Duration;

use tokio::time::Instant;

#[derive(Debug, Clone, Copy)]
struct Entry {
    at: Instant,
    amount: u64,
    /// Total amount recorded since the window was created, up to and
    /// including this entry.
    cumulative: u64,
}

/// Identifies an entry logged by [`SlidingWindow::record_entry`], for a
/// later [`SlidingWindow::adjust`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EntryId(u64);

/// When an amount fits under a limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fit {
    /// It fits now.
    Now,
    /// It fits from this instant on (if nothing else is recorded meanwhile).
    At(Instant),
    /// It is larger than the limit itself: waiting cannot help.
    Never,
}

/// A strict sliding window over one dimension (requests or tokens).
#[derive(Debug, Clone)]
pub struct SlidingWindow {
    window: Duration,
    log: VecDeque<Entry>,
    /// Sum of the amounts in `log`.
    used: u64,
    /// Sum of every amount ever recorded (the `cumulative` of the newest
    /// entry, kept even after that entry is pruned).
    total: u64,
    /// The largest `used` ever observed right after a record.
    max_used: u64,
    /// Entries ever pushed onto the log.
    pushed: u64,
    /// Entries ever removed from the front of the log (pruned or cleared).
    popped: u64,
}

impl SlidingWindow {
    /// An empty window of length `window`.
    pub fn new(window: Duration) -> Self {
        Self {
            window,
            log: VecDeque::new(),
            used: 0,
            total: 0,
            max_used: 0,
            pushed: 0,
            popped: 0,
        }
    }

    /// The window length.
    pub fn window(&self) -> Duration {
        self.window
    }

    /// Amount inside the window at `now`.
    pub fn used(&mut self, now: Instant) -> u64 {
        self.prune(now);
        self.used
    }

    /// The largest amount ever held inside one window (since creation or the
    /// last [`clear`](Self::clear)).
    pub fn max_used(&self) -> u64 {
        self.max_used
    }

    /// Whether `amount` fits under `limit` at `now`, and if not, from which
    /// instant it will.
    pub fn wait_for(&mut self, now: Instant, amount: u64, limit: u64) -> Fit {
        if amount > limit {
            return Fit::Never;
        }
        self.prune(now);
        let need = match self.used.saturating_add(amount).checked_sub(limit) {
            None | Some(0) => return Fit::Now,
            Some(need) => need,
        };
        // `need <= used` because `amount <= limit`, so some prefix of the log
        // frees at least `need`: the first entry whose cumulative amount,
        // counted from the front of the log, reaches `need`.
        let Some(front) = self.log.front() else {
            return Fit::Now; // unreachable: need > 0 implies used > 0
        };
        let base = front.cumulative.saturating_sub(front.amount);
        let target = base.saturating_add(need);
        let index = self.log.partition_point(|e| e.cumulative < target);
        match self.log.get(index) {
            Some(entry) => Fit::At(self.departure(entry.at)),
            None => Fit::Never, // unreachable, see above
        }
    }

    /// Time from `now` until the window is empty again.
    pub fn until_empty(&mut self, now: Instant) -> Duration {
        self.prune(now);
        match self.log.back() {
            Some(newest) => self.departure(newest.at).saturating_duration_since(now),
            None => Duration::ZERO,
        }
    }

    /// Records `amount` at `now` (no limit check: callers check first).
    pub fn record(&mut self, now: Instant, amount: u64) {
        let at = self.count(now, amount);
        if amount > 0 {
            self.push(at, amount);
        }
    }

    /// Prunes up to `now` and counts `amount`; returns the instant its
    /// entry is logged at (never before the newest entry).
    fn count(&mut self, now: Instant, amount: u64) -> Instant {
        self.prune(now);
        let at = match self.log.back() {
            Some(newest) if newest.at > now => newest.at,
            _ => now,
        };
        self.used = self.used.saturating_add(amount);
        self.total = self.total.saturating_add(amount);
        self.max_used = self.max_used.max(self.used);
        at
    }

    /// Records `amount` at `now` like [`record`](Self::record), but always
    /// logs an entry (even of amount 0) and returns its id, so that
    /// [`adjust`](Self::adjust) can rewrite it later.
    pub fn record_entry(&mut self, now: Instant, amount: u64) -> EntryId {
        let at = self.count(now, amount);
        let id = EntryId(self.pushed);
        self.push(at, amount);
        id
    }

    /// Replaces the amount of entry `id` by `amount`, keeping its instant
    /// (the entry still leaves the window at its own departure). Returns
    /// `false`, changing nothing, when the entry has already left the window
    /// (or was cleared). The window may end up above a limit: callers that
    /// settle after the fact accept that, as a provider that reconciles does.
    pub fn adjust(&mut self, now: Instant, id: EntryId, amount: u64) -> bool {
        self.prune(now);
        let Some(index) = id.0.checked_sub(self.popped) else {
            return false;
        };
        let Ok(index) = usize::try_from(index) else {
            return false;
        };
        let Some(entry) = self.log.get_mut(index) else {
            return false;
        };
        let old = entry.amount;
        entry.amount = amount;
        if amount >= old {
            let more = amount - old;
            for e in self.log.range_mut(index..) {
                e.cumulative = e.cumulative.saturating_add(more);
            }
            self.used = self.used.saturating_add(more);
            self.total = self.total.saturating_add(more);
            self.max_used = self.max_used.max(self.used);
        } else {
            let less = old - amount;
            for e in self.log.range_mut(index..) {
                e.cumulative = e.cumulative.saturating_sub(less);
            }
            // Invariant: `used` includes the entry's old amount.
            self.used = self.used.saturating_sub(less);
            self.total = self.total.saturating_sub(less);
        }
        true
    }

    fn push(&mut self, at: Instant, amount: u64) {
        self.log.push_back(Entry {
            at,
            amount,
            cumulative: self.total,
        });
        self.pushed += 1;
    }

    /// Forgets every entry and the maximum seen.
    pub fn clear(&mut self) {
        self.popped += self.log.len() as u64;
        self.log.clear();
        self.used = 0;
        self.max_used = 0;
    }

    /// The instant an entry recorded at `at` leaves the window.
    fn departure(&self, at: Instant) -> Instant {
        // The configured window is at most a year (validated), so the sum
        // cannot overflow; `at` is a harmless answer should it ever.
        at.checked_add(self.window).unwrap_or(at)
    }

    /// Drops the entries that have left the window at `now`.
    fn prune(&mut self, now: Instant) {
        while let Some(front) = self.log.front() {
            if now.saturating_duration_since(front.at) >= self.window {
                // `used` is the sum of the amounts in `log` (saturated at
                // `u64::MAX`, past which the window cannot count exactly).
                self.used = self.used.saturating_sub(front.amount);
                self.log.pop_front();
                self.popped += 1;
            } else {
                break;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const W: Duration = Duration::from_secs(60);

    fn secs(base: Instant, s: f64) -> Instant {
        base + Duration::from_secs_f64(s)
    }

    // proves: SIM-2
    #[test]
    fn an_entry_occupies_exactly_one_window() {
        let t0 = Instant::now();
        let mut w = SlidingWindow::new(W);
        w.record(t0, 5);
        assert_eq!(w.used(t0), 5);
        assert_eq!(w.used(t0 + W - Duration::from_nanos(1)), 5);
        assert_eq!(w.used(t0 + W), 0);
    }

    // proves: SIM-2
    #[test]
    fn rejects_exactly_the_first_amount_over_the_limit() {
        let t0 = Instant::now();
        let mut w = SlidingWindow::new(W);
        for i in 0..3 {
            let now = secs(t0, f64::from(i));
            assert_eq!(w.wait_for(now, 1, 3), Fit::Now);
            w.record(now, 1);
        }
        // Fourth request at t=10s: the first one leaves at t=60s.
        assert_eq!(w.wait_for(secs(t0, 10.0), 1, 3), Fit::At(t0 + W));
        // Needing two units waits for the second departure.
        assert_eq!(w.wait_for(secs(t0, 10.0), 2, 3), Fit::At(secs(t0, 61.0)));
        assert_eq!(w.wait_for(secs(t0, 10.0), 4, 3), Fit::Never);
        // At the departure instant it fits.
        assert_eq!(w.wait_for(t0 + W, 1, 3), Fit::Now);
        assert_eq!(w.max_used(), 3);
    }

    // proves: SIM-2
    #[test]
    fn token_amounts_free_up_in_arrival_order() {
        let t0 = Instant::now();
        let mut w = SlidingWindow::new(W);
        w.record(t0, 40);
        w.record(secs(t0, 1.0), 30);
        w.record(secs(t0, 2.0), 20);
        // used 90 of 100; 25 more needs 15 freed: the first entry (40).
        assert_eq!(w.wait_for(secs(t0, 5.0), 25, 100), Fit::At(t0 + W));
        // 60 more needs 50 freed: entries one and two (70).
        assert_eq!(w.wait_for(secs(t0, 5.0), 60, 100), Fit::At(secs(t0, 61.0)));
        assert_eq!(w.until_empty(secs(t0, 5.0)), Duration::from_secs(57));
        assert_eq!(w.until_empty(secs(t0, 62.0)), Duration::ZERO);
        assert_eq!(w.used(secs(t0, 62.0)), 0);
        assert_eq!(w.max_used(), 90);
    }

    // proves: SIM-2 (a reconciled entry keeps its instant; Q-16 settlement)
    #[test]
    fn adjusted_entries_keep_their_instant_and_the_search_stays_exact() {
        let t0 = Instant::now();
        let mut w = SlidingWindow::new(W);
        let a = w.record_entry(t0, 40);
        let b = w.record_entry(secs(t0, 1.0), 0);
        w.record(secs(t0, 2.0), 20);
        assert_eq!(w.used(secs(t0, 3.0)), 60);
        assert!(w.adjust(secs(t0, 3.0), a, 10));
        assert!(w.adjust(secs(t0, 3.0), b, 30));
        assert_eq!(w.used(secs(t0, 3.0)), 60);
        // 50 more under 100 needs 10 freed: entry a (10) at t0 + W.
        assert_eq!(w.wait_for(secs(t0, 3.0), 50, 100), Fit::At(t0 + W));
        // 60 more needs 20: a and b (40) at t0 + 61 s.
        assert_eq!(w.wait_for(secs(t0, 3.0), 60, 100), Fit::At(secs(t0, 61.0)));
        assert!(w.adjust(secs(t0, 3.0), b, 95));
        assert_eq!(w.max_used(), 125);
        // After a's departure, adjusting it is a no-op.
        assert!(!w.adjust(t0 + W, a, 1));
        assert_eq!(w.used(t0 + W), 115);
        assert_eq!(w.used(secs(t0, 61.0)), 20);
        w.clear();
        assert!(!w.adjust(secs(t0, 61.0), b, 1));
    }

    #[test]
    fn clear_forgets_everything() {
        let t0 = Instant::now();
        let mut w = SlidingWindow::new(W);
        w.record(t0, 7);
        w.clear();
        assert_eq!(w.used(t0), 0);
        assert_eq!(w.max_used(), 0);
        assert_eq!(w.wait_for(t0, 10, 10), Fit::Now);
    }

    /// The binary search agrees with the obvious linear scan on random logs.
    // proves: SIM-2
    #[test]
    fn binary_search_matches_a_linear_scan() {
        let mut rng = fastrand::Rng::with_seed(42);
        for _ in 0..200 {
            let t0 = Instant::now();
            let window = Duration::from_millis(rng.u64(1..2_000));
            let limit = rng.u64(1..500);
            let mut w = SlidingWindow::new(window);
            let mut now = t0;
            let mut naive: Vec<(Instant, u64)> = Vec::new();
            for _ in 0..100 {
                now += Duration::from_millis(rng.u64(0..100));
                let amount = rng.u64(1..=limit + 5);
                // Linear reference: entries alive at `now`, oldest first.
                let alive: Vec<(Instant, u64)> = naive
                    .iter()
                    .copied()
                    .filter(|(at, _)| now.saturating_duration_since(*at) < window)
                    .collect();
                let used: u64 = alive.iter().map(|(_, a)| a).sum();
                let expected = if amount > limit {
                    Fit::Never
                } else if used + amount <= limit {
                    Fit::Now
                } else {
                    let need = used + amount - limit;
                    let mut freed = 0;
                    let mut at = None;
                    for (t, a) in &alive {
                        freed += a;
                        if freed >= need {
                            at = Some(*t + window);
                            break;
                        }
                    }
                    Fit::At(at.expect("need <= used"))
                };
                assert_eq!(w.used(now), used);
                assert_eq!(w.wait_for(now, amount, limit), expected);
                if expected == Fit::Now {
                    w.record(now, amount);
                    naive.push((now, amount));
                }
            }
        }
    }
}

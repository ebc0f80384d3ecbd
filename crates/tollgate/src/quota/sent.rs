//! What tollgate sent, and by when the provider had certainly counted it
//! (SPEC ): the record a provider's remaining budget is compared
//! with.
//!
//! A provider's `x-ratelimit-remaining-*` is its state when it counted the
//! answered attempt `j`, on arrival. Arrival is known only within bounds:
//! after the attempt was leased (`sent`) and no later than its Q-15 bound
//! (`counted`: the response began, or the one-shot bound). Of tollgate's
//! own attempts, the provider's count then certainly held every `i` that
//! arrived before `j` was sent (`counted_i < sent_j`) and had not yet left
//! its window (`sent_i + W > counted_j`), and `j` itself. It may also have
//! held attempts in flight at the same time, and attempts whose window
//! tollgate already let go of (`counted_i + W` after `sent_j`).
//!
//! An attempt enters the record when its Q-15 bound is known (its
//! `recount`); attempts still in flight are not in it (tollgate's own
//! window counts them). The sums are kept per bucket of `W / 512` by the
//! instant each attempt was sent and the instant it was counted, so a
//! comparison reads a few hundred buckets whatever the rate; a bucket
//! boundary is always rounded to the safe side (what is certain can only
//! come out smaller, what is possible larger). Entries and buckets are kept
//! for two windows after they were counted; entries at most
//! [`MAX_ENTRIES`].

use std::collections::VecDeque;

use super::Nanos;
use super::demand::{Actual, Demand, Dimension};

/// The most entries kept: beyond it the oldest go first (an entry missing
/// from the record only makes what is certain smaller).
pub(crate) const MAX_ENTRIES: usize = 1 << 16;

/// Buckets per window.
const BUCKETS: u64 = 512;

type Amounts = [u64; 4];

/// One attempt as the provider may have counted it.
#[derive(Debug, Clone, Copy)]
struct Sent {
    /// When it was leased: it cannot have arrived earlier.
    sent: Nanos,
    /// Its Q-15 bound: it arrived by then.
    counted: Nanos,
    /// The least and the most the provider may have held of it in each
    /// dimension, in [`Dimension::RATE`] order: a provider that settles
    /// holds the estimate until the request completes and the reported
    /// usage after, so settlement lowers the least and raises the most; a
    /// refusal it did not charge zeroes both.
    least: Amounts,
    most: Amounts,
}

/// Sums of the entries sent, and counted, within one bucket: the least
/// amounts by send and by counting instant, the most by counting instant.
#[derive(Debug, Clone, Copy, Default)]
struct Bucket {
    sent: Amounts,
    counted: Amounts,
    counted_most: Amounts,
}

/// What tollgate knows of its own traffic when the provider counted an
/// answered attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Compared {
    /// The attempt's Q-15 instant.
    pub(crate) counted: Nanos,
    /// What the provider certainly held of tollgate's traffic.
    pub(crate) certain: u64,
    /// What tollgate's window let go of since the attempt was sent, which
    /// the provider may still have held.
    pub(crate) dropped: u64,
}

/// The record of one scope. Sequence numbers start at 1 (0 marks a
/// reservation that is in no record); when they would wrap around, the
/// record starts afresh (once every four billion attempts).
#[derive(Debug, Clone)]
pub(crate) struct SentLog {
    entries: VecDeque<Sent>,
    /// The sequence number of the front entry.
    first: u32,
    buckets: VecDeque<Bucket>,
    /// The number of `buckets[0]`; instants before it are counted in it.
    base: u64,
    /// Sums over every bucket.
    total: Bucket,
    /// The window compared with.
    window: Nanos,
    /// A bucket's span.
    res: Nanos,
    /// Whether older amounts were ever moved into the base bucket.
    carried: bool,
    /// The latest counting instant recorded: what is kept is measured
    /// from it, whatever the instants of a late entry.
    latest: Nanos,
}

/// The place of a dimension a provider counts in [`Amounts`]; `None` for
/// money, which no provider's limiter counts (SPEC BUD-2).
fn index(dimension: Dimension) -> Option<usize> {
    match dimension {
        Dimension::Requests => Some(0),
        Dimension::Tokens => Some(1),
        Dimension::InputTokens => Some(2),
        Dimension::OutputTokens => Some(3),
        Dimension::Cost => None,
    }
}

fn add(to: &mut Amounts, amounts: &Amounts) {
    for (t, a) in to.iter_mut().zip(amounts) {
        *t = t.saturating_add(*a);
    }
}

fn sub(from: &mut Amounts, amounts: &Amounts) {
    for (f, a) in from.iter_mut().zip(amounts) {
        *f = f.saturating_sub(*a);
    }
}

impl SentLog {
    /// A record compared over `window` (the scope's shortest; 0 keeps
    /// nothing).
    pub(crate) fn new(window: Nanos) -> Self {
        SentLog {
            entries: VecDeque::new(),
            first: 1,
            buckets: VecDeque::new(),
            base: 0,
            total: Bucket::default(),
            window,
            res: (window / BUCKETS).max(1),
            carried: false,
            latest: 0,
        }
    }

    /// A record compared over another `window` (a reconfiguration
    /// changed the scope's shortest window): afresh, its sequence numbers
    /// following this record's, so no reservation recorded here is ever
    /// found in it.
    pub(crate) fn rewindowed(&self, window: Nanos) -> Self {
        if window == self.window {
            return self.clone();
        }
        let len = u32::try_from(self.entries.len()).unwrap_or(u32::MAX);
        let mut fresh = SentLog::new(window);
        fresh.first = self.first.saturating_add(len).max(1);
        fresh
    }

    fn bucket(&self, t: Nanos) -> u64 {
        t / self.res
    }

    /// The slot of bucket number `b` (instants before the base count in
    /// the base bucket), if it exists.
    fn slot(&mut self, b: u64) -> Option<&mut Bucket> {
        let i = usize::try_from(b.saturating_sub(self.base)).ok()?;
        self.buckets.get_mut(i)
    }

    /// Adds (or with `remove`, takes away) an entry's amounts.
    fn account(&mut self, e: &Sent, remove: bool) {
        let (bs, bc) = (self.bucket(e.sent), self.bucket(e.counted));
        let apply = if remove { sub } else { add };
        if let Some(b) = self.slot(bs) {
            apply(&mut b.sent, &e.least);
        }
        if let Some(b) = self.slot(bc) {
            apply(&mut b.counted, &e.least);
            apply(&mut b.counted_most, &e.most);
        }
        apply(&mut self.total.sent, &e.least);
        apply(&mut self.total.counted, &e.least);
        apply(&mut self.total.counted_most, &e.most);
    }

    /// Drops what was counted more than two windows before `counted`;
    /// returns the first bucket kept.
    fn prune(&mut self, counted: Nanos) -> u64 {
        let horizon = self.bucket(counted.saturating_sub(self.window.saturating_mul(2)));
        while let Some(front) = self.entries.front().copied() {
            if self.bucket(front.counted) >= horizon && self.entries.len() < MAX_ENTRIES {
                break;
            }
            self.account(&front, true);
            self.entries.pop_front();
            match self.first.checked_add(1) {
                Some(first) => self.first = first,
                // Four billion attempts: start afresh.
                None => {
                    *self = SentLog::new(self.window);
                    return 0;
                }
            }
        }
        if self.entries.capacity() > 1024 && self.entries.len() < self.entries.capacity() / 4 {
            self.entries.shrink_to(self.entries.len() * 2);
        }
        if self.entries.is_empty() {
            // Nothing older is left anywhere.
            self.buckets.clear();
            self.total = Bucket::default();
            self.carried = false;
            self.base = self.base.max(horizon);
            return horizon;
        }
        // What older buckets still hold (entries recorded out of order)
        // moves to the new base: "at or before" it.
        let mut carried = Bucket::default();
        while self.base < horizon {
            let Some(b) = self.buckets.pop_front() else {
                self.base = horizon;
                break;
            };
            add(&mut carried.sent, &b.sent);
            add(&mut carried.counted, &b.counted);
            add(&mut carried.counted_most, &b.counted_most);
            self.base += 1;
        }
        let zero = Amounts::default();
        if carried.sent != zero || carried.counted != zero || carried.counted_most != zero {
            self.carried = true;
            if self.buckets.is_empty() {
                self.buckets.push_back(Bucket::default());
            }
            if let Some(b) = self.buckets.front_mut() {
                add(&mut b.sent, &carried.sent);
                add(&mut b.counted, &carried.counted);
                add(&mut b.counted_most, &carried.counted_most);
            }
        }
        horizon
    }

    /// Records an attempt leased at `sent` and counted by `counted`;
    /// returns its sequence number (0 when the record keeps nothing).
    pub(crate) fn record(&mut self, sent: Nanos, counted: Nanos, demand: &Demand) -> u32 {
        if self.window == 0 {
            return 0;
        }
        self.latest = self.latest.max(counted);
        let horizon = self.prune(self.latest);
        let len = u32::try_from(self.entries.len()).unwrap_or(u32::MAX);
        let Some(seq) = self.first.checked_add(len) else {
            *self = SentLog::new(self.window);
            return self.record(sent, counted, demand);
        };
        // Answers come in any order: open buckets back to this send, down
        // to the horizon (anything older counts in the base bucket).
        let first = self.bucket(sent).max(horizon);
        if self.buckets.is_empty() {
            self.base = first;
        }
        while first < self.base {
            self.buckets.push_front(Bucket::default());
            self.base -= 1;
        }
        if self.bucket(sent) < self.base || self.bucket(counted) < self.base {
            self.carried = true;
        }
        let last = self.bucket(counted.max(sent));
        while self.base + (self.buckets.len() as u64) <= last {
            self.buckets.push_back(Bucket::default());
        }
        let amounts = Dimension::RATE.map(|d| demand.amount(d));
        let e = Sent {
            sent,
            counted,
            least: amounts,
            most: amounts,
        };
        self.account(&e, false);
        self.entries.push_back(e);
        seq
    }

    fn position(&self, seq: u32) -> Option<usize> {
        usize::try_from(seq.checked_sub(self.first)?).ok()
    }

    /// Changes attempt `seq`'s amounts with `change`.
    fn update(&mut self, seq: u32, change: impl FnOnce(&mut Sent)) {
        let Some(i) = self.position(seq) else {
            return;
        };
        let Some(before) = self.entries.get(i).copied() else {
            return;
        };
        let mut after = before;
        change(&mut after);
        self.account(&before, true);
        self.account(&after, false);
        if let Some(e) = self.entries.get_mut(i) {
            *e = after;
        }
    }

    /// Settlement reported what the attempt used: the provider may have
    /// held the estimate or that.
    pub(crate) fn reconcile(&mut self, seq: u32, demand: &Demand, actual: &Actual) {
        self.update(seq, |e| {
            for (i, d) in Dimension::RATE.into_iter().enumerate() {
                if let Some(used) = actual.amount(d, demand) {
                    e.least[i] = e.least[i].min(used);
                    e.most[i] = e.most[i].max(used);
                }
            }
        });
    }

    /// A refusal the provider did not charge gave these dimensions back.
    pub(crate) fn release(&mut self, seq: u32, requests: bool, tokens: bool) {
        self.update(seq, |e| {
            for (i, d) in Dimension::RATE.into_iter().enumerate() {
                if if d.is_tokens() { tokens } else { requests } {
                    e.least[i] = 0;
                    e.most[i] = 0;
                }
            }
        });
    }

    /// Sums one dimension of `field` over the buckets numbered `from..=to`.
    fn sum(&self, from: u64, to: u64, d: usize, field: fn(&Bucket) -> &Amounts) -> u64 {
        let from = usize::try_from(from.saturating_sub(self.base)).unwrap_or(usize::MAX);
        let Some(to) = to.checked_sub(self.base) else {
            return 0;
        };
        let to = usize::try_from(to).unwrap_or(usize::MAX);
        if to < from {
            return 0;
        }
        self.buckets
            .iter()
            .skip(from)
            .take(to.saturating_sub(from).saturating_add(1))
            .fold(0u64, |sum, b| sum.saturating_add(field(b)[d]))
    }

    /// What tollgate knows of its own traffic in `dimension` when the
    /// provider counted attempt `seq` (see the module documentation), for
    /// a provider window of `window`, at `now`. `None` when `seq` is in no
    /// record, or the window is not the one the record keeps.
    pub(crate) fn compare(
        &self,
        seq: u32,
        dimension: Dimension,
        window: Nanos,
        now: Nanos,
    ) -> Option<Compared> {
        if window != self.window {
            return None;
        }
        let j = self.entries.get(self.position(seq)?)?;
        let d = index(dimension)?;
        let last = self.base + self.buckets.len() as u64;
        // Counted before j was sent: the buckets wholly before sent_j's.
        let before =
            self.total.counted[d]
                .saturating_sub(self.sum(self.bucket(j.sent), last, d, |b| &b.counted));
        // Sent at or before counted_j - W: possibly out of the provider's
        // window (up to the end of that bucket).
        // What was sent before the base bucket counts in it: when the
        // edge lies before the base, all of it may be out.
        let out = match j.counted.checked_sub(window).map(|e| self.bucket(e)) {
            Some(edge) if edge >= self.base || self.carried => {
                self.sum(0, edge.max(self.base), d, |b| &b.sent)
            }
            _ => 0,
        };
        let certain = before.saturating_sub(out).saturating_add(j.least[d]);
        // tollgate's window let them go in (sent_j, now]: counted in
        // (sent_j - W, now - W], widened to whole buckets.
        let dropped = if now >= window {
            self.sum(
                self.bucket(j.sent.saturating_sub(window)),
                self.bucket(now - window),
                d,
                |b| &b.counted_most,
            )
        } else {
            0
        };
        Some(Compared {
            counted: j.counted,
            certain,
            dropped,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A window of 1,024 ns: buckets of 2 ns.
    const W: Nanos = 1_024;

    fn one() -> Demand {
        Demand::new(10, 5)
    }

    fn certain(log: &SentLog, seq: u32, d: Dimension) -> u64 {
        log.compare(seq, d, W, 2_000).unwrap().certain
    }

    // proves: Q-14 (only attempts that certainly arrived before the
    // answered one was sent, and certainly had not left the provider's
    // window, count as certain; attempts in flight at the same time do
    // not)
    #[test]
    fn certain_counts_only_what_the_provider_surely_held() {
        let mut log = SentLog::new(W);
        let _old = log.record(0, 10, &one()); // left the window for sure
        let before = log.record(500, 520, &one());
        let _overlapping = log.record(1_090, 1_200, &one());
        let j = log.record(1_100, 1_150, &one());
        // Window of j's arrival: after 1_150 - W = 126; `old` was sent at 0.
        assert_eq!(certain(&log, j, Dimension::Requests), 2);
        assert_eq!(certain(&log, j, Dimension::Tokens), 30);
        // For `before`, counted by 520, `old` had not left yet.
        assert_eq!(certain(&log, before, Dimension::Requests), 2);
        assert_eq!(log.compare(99, Dimension::Requests, W, 2_000), None);
        assert_eq!(log.compare(j, Dimension::Requests, 2 * W, 2_000), None);
    }

    // proves: Q-14 (what tollgate's window let go of after the answered
    // attempt was sent is counted as possibly held)
    #[test]
    fn dropped_counts_what_left_the_window_since_the_send() {
        let mut log = SentLog::new(W);
        let _a = log.record(0, 100, &one()); // left at 1_124
        let _b = log.record(0, 300, &one()); // left at 1_324
        let j = log.record(1_110, 1_140, &one());
        let at = |now| log.compare(j, Dimension::Requests, W, now).unwrap().dropped;
        assert_eq!(at(1_140), 1);
        assert_eq!(at(1_400), 2);
    }

    // proves: Q-14, Q-16 (a refusal given back and a settled amount are
    // what the record compares)
    #[test]
    fn releases_and_settlements_change_the_record() {
        let mut log = SentLog::new(W);
        let a = log.record(0, 10, &one());
        let b = log.record(20, 30, &one());
        let j = log.record(40, 50, &one());
        log.release(a, false, true);
        log.reconcile(b, &one(), &Actual::split(3, 2));
        assert_eq!(certain(&log, j, Dimension::Requests), 3);
        assert_eq!(certain(&log, j, Dimension::Tokens), 20);
        assert_eq!(certain(&log, j, Dimension::InputTokens), 13);
    }

    // proves: Q-14 (bounded memory: entries and buckets older than two
    // windows go)
    #[test]
    fn old_entries_are_dropped() {
        let mut log = SentLog::new(W);
        let a = log.record(0, 10, &one());
        let b = log.record(3_000, 3_010, &one());
        assert_eq!(log.compare(a, Dimension::Requests, W, 3_010), None);
        assert_eq!(log.entries.len(), 1);
        assert!(log.buckets.len() as u64 <= 2 * BUCKETS + 2);
        assert_eq!(certain(&log, b, Dimension::Requests), 1);
    }

    mod prop {
        use super::*;
        use proptest::prelude::*;

        /// One attempt: sent at `sent`, arriving `delay` later, answered
        /// (response began) `lag` after its arrival; its token count.
        fn attempts() -> impl Strategy<Value = Vec<(Nanos, Nanos, Nanos, u64)>> {
            proptest::collection::vec((0..5 * W, 0..W / 3, 0..W / 2, 0..300u64), 1..80)
        }

        proptest! {
            // proves: Q-14 (whatever the arrival delays and orders, what
            // the record calls certain never exceeds what the provider
            // held of tollgate's traffic when it counted the answered
            // attempt, and certain plus tollgate's own count plus what it
            // let go of never falls short of it: the bracket of others'
            // holding always contains the truth)
            #[test]
            fn the_bracket_holds_what_the_provider_held(raw in attempts()) {
                // Distinct instants: each attempt's times get its own
                // offset, so no two arrivals tie.
                let n = raw.len() as u64;
                let w = W * 128;
                let at = |t: Nanos, i: usize| t * 128 + i as u64;
                let a: Vec<(Nanos, Nanos, Nanos, Demand)> = raw
                    .iter()
                    .enumerate()
                    .map(|(i, &(sent, delay, lag, tokens))| {
                        let arrival = sent + delay;
                        (at(sent, i), at(arrival, i), at(arrival + lag, i), Demand::new(tokens, 1))
                    })
                    .collect();
                // Recorded when the response began, in that order.
                let mut by_answer: Vec<usize> = (0..a.len()).collect();
                by_answer.sort_by_key(|&i| a[i].2);
                let mut log = SentLog::new(w);
                for &i in &by_answer {
                    let seq = log.record(a[i].0, a[i].2, &a[i].3);
                    let (arrival, now) = (a[i].1, a[i].2);
                    for d in [Dimension::Requests, Dimension::Tokens] {
                        // The provider's count when `i` arrived: every
                        // attempt that arrived in (arrival - W, arrival].
                        let held: u64 = a
                            .iter()
                            .filter(|x| x.1 <= arrival && x.1 + w > arrival)
                            .map(|x| x.3.amount(d))
                            .sum();
                        // tollgate's own window now: sent by now, and
                        // either not answered yet or answered less than a
                        // window ago.
                        let own: u64 = a
                            .iter()
                            .filter(|x| x.0 <= now && (x.2 > now || x.2 + w > now))
                            .map(|x| x.3.amount(d))
                            .sum();
                        let c = log.compare(seq, d, w, now).unwrap();
                        prop_assert!(c.certain <= held, "{d}: certain {} > {held} (n = {n})", c.certain);
                        prop_assert!(own + c.dropped >= held, "{d}: possible {} < {held}", own + c.dropped);
                    }
                }
            }
        }
    }
}

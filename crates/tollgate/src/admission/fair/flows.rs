//! The waiting calls of one scope, grouped by flow, and who is next
//! (SPEC FAIR-1..FAIR-5, ADM-4). See the notes in `fair/mod.rs`.

use std::collections::BTreeSet;
use std::time::Duration;

use super::Charged;
use super::share::ShareRecord;
use crate::admission::queue::{Lines, NumberMap};
use crate::clock::Instant;
use crate::flow::{Flow, FlowKey, Priority};

/// Counters are kept in units of `1 / SCALE` of a cost unit, so a cost
/// divided by a weight loses less than one such unit per grant.
pub(crate) const SCALE: u128 = 1 << 32;

/// Idle flows kept for their counters, at most (beyond, every idle flow is
/// forgotten: each loses at most what its last grants cost).
const MAX_IDLE: usize = 1024;

const CLASSES: usize = Priority::ALL.len();

/// One flow of a scope: its line of waiting calls carries this.
#[derive(Debug)]
pub(crate) struct FlowState {
    pub(crate) key: FlowKey,
    pub(crate) weight: u32,
    /// Weighted cost served so far (scaled by [`SCALE`]), as the virtual
    /// counter of FAIR-3.
    counter: u128,
    /// When it last became backlogged (breaks ties between equal counters:
    /// the earlier first).
    seq: u64,
}

impl FlowState {
    fn entry(&self, chain: u32) -> (u128, u64, u32) {
        (self.counter, self.seq, chain)
    }
}

#[derive(Debug, Default)]
struct Class {
    /// Backlogged flows by counter: (counter, seq, chain).
    backlogged: BTreeSet<(u128, u64, u32)>,
    /// The counter of the class's last grant when it was chosen (where a
    /// flow joining an idle class starts: SFQ's system virtual time).
    vtime: u128,
    /// The call chosen for this class: it holds the line against calls of
    /// its own and lower classes until it is granted (ADM-4).
    designated: Option<usize>,
}

impl Class {
    /// Where a flow becoming backlogged starts, at least (FAIR-3: no
    /// banked credit).
    fn floor(&self) -> u128 {
        self.backlogged.first().map_or(self.vtime, |e| e.0)
    }
}

/// A flow as the snapshot shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct FlowView {
    pub(crate) key: FlowKey,
    pub(crate) weight: u32,
    pub(crate) queued: usize,
}

/// See the module documentation.
#[derive(Debug)]
pub(crate) struct FairQueue<T> {
    lines: Lines<T, FlowState>,
    index: NumberMap<FlowKey, u32>,
    classes: [Class; CLASSES],
    /// The call at the head of the line: the one whose turn it is now.
    head: Option<usize>,
    joins: u64,
    /// Flows without waiting calls kept for their counters.
    idle: usize,
    /// `min_share` per class, in percent (FAIR-2).
    min_share: [u8; CLASSES],
    pub(crate) share: ShareRecord,
    /// The cost model counters are kept in (see [`Charged`]).
    model: u32,
}

impl<T> FairQueue<T> {
    /// A queue whose lower classes are owed `min_share` percent of the cost
    /// admitted over `window`.
    pub(crate) fn new(min_share: [u8; CLASSES], window: Option<Duration>) -> Self {
        FairQueue {
            lines: Lines::new(),
            index: NumberMap::default(),
            classes: Default::default(),
            head: None,
            joins: 0,
            idle: 0,
            min_share,
            share: ShareRecord::new(window),
            model: 0,
        }
    }

    /// Starts a new cost model (SPEC GW-15, FAIR-3, FAIR-4): counters in
    /// the old unit would hold a flow back for as many grants of the new
    /// unit as its last calls cost in the old one. Every backlogged flow
    /// starts again at zero, in the order it became backlogged; idle flows
    /// are forgotten; the cost admitted per class counts afresh (FAIR-2).
    /// Lines, the head and each class's chosen call stay.
    pub(crate) fn new_model(&mut self) {
        self.model = self.model.wrapping_add(1);
        for class in &mut self.classes {
            class.backlogged.clear();
            class.vtime = 0;
        }
        for chain in self.lines.chain_ids() {
            let Some(c) = self.lines.chain_mut(chain) else {
                continue;
            };
            c.meta.counter = 0;
            if c.len() > 0 {
                let entry = c.meta.entry(chain);
                self.classes[c.meta.key.priority.index()]
                    .backlogged
                    .insert(entry);
            } else {
                self.forget(chain);
            }
        }
        self.share.restart();
    }

    /// Takes a scope's new `min_share` per class and window (SPEC GW-15):
    /// lines, counters and the head stay; the cost admitted so far is kept
    /// (over a new window it is counted afresh).
    pub(crate) fn reconfigure(&mut self, min_share: [u8; CLASSES], window: Option<Duration>) {
        self.min_share = min_share;
        self.share.rewindow(window);
    }

    /// Waiting calls.
    pub(crate) fn len(&self) -> usize {
        self.lines.len()
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.lines.is_empty()
    }

    pub(crate) fn get(&self, key: usize) -> Option<&T> {
        self.lines.get(key)
    }

    pub(crate) fn get_mut(&mut self, key: usize) -> Option<&mut T> {
        self.lines.get_mut(key)
    }

    /// Keys of every waiting call.
    pub(crate) fn keys(&self) -> Vec<usize> {
        self.lines.keys()
    }

    /// Whether `key` is the head of the line.
    pub(crate) fn is_head(&self, key: usize) -> bool {
        self.head == Some(key)
    }

    /// The head, if one is chosen.
    pub(crate) fn current_head(&self) -> Option<usize> {
        self.head
    }

    /// The class of a waiting call.
    pub(crate) fn class_of(&self, key: usize) -> Option<Priority> {
        if !self.lines.is_linked(key) {
            return None;
        }
        let chain = self.lines.chain_of(key)?;
        Some(self.lines.chain(chain)?.meta.key.priority)
    }

    /// Calls of `flow` waiting.
    pub(crate) fn flow_len(&self, flow: FlowKey) -> usize {
        self.index
            .get(&flow)
            .and_then(|&c| self.lines.chain(c))
            .map_or(0, |c| c.len())
    }

    /// Flows with waiting calls.
    pub(crate) fn backlogged(&self) -> usize {
        self.classes.iter().map(|c| c.backlogged.len()).sum()
    }

    /// Links `value` at the tail of its flow's line (FAIR-1). A call of a
    /// class higher than the head's takes the head's turn away (it stays
    /// chosen in its own class): the caller then drains to choose again.
    pub(crate) fn push(&mut self, flow: Flow, value: T) -> Result<usize, T> {
        let key = flow.key();
        let chain = match self.index.get(&key) {
            Some(&c) => c,
            None => {
                let Some(c) = self.lines.open(FlowState {
                    key,
                    weight: flow.weight(),
                    counter: 0,
                    seq: 0,
                }) else {
                    return Err(value);
                };
                self.index.insert(key, c);
                // Counted as idle until it joins below.
                self.idle += 1;
                c
            }
        };
        let was_empty = self.lines.chain(chain).is_none_or(|c| c.len() == 0);
        let k = match self.lines.push_back(chain, value) {
            Ok(k) => k,
            Err(v) => {
                if was_empty {
                    self.forget_if_owed_nothing(chain);
                }
                return Err(v);
            }
        };
        if let Some(c) = self.lines.chain_mut(chain) {
            c.meta.weight = flow.weight();
        }
        if was_empty {
            self.idle = self.idle.saturating_sub(1);
            self.join(chain);
        }
        if let Some(h) = self.head
            && self.class_of(h).is_some_and(|c| flow.priority() < c)
        {
            self.head = None;
        }
        Ok(k)
    }

    /// `chain` became backlogged: it starts at no less than its class's
    /// floor (FAIR-3).
    fn join(&mut self, chain: u32) {
        let seq = self.joins;
        self.joins += 1;
        let Some(c) = self.lines.chain_mut(chain) else {
            return;
        };
        let class = &mut self.classes[c.meta.key.priority.index()];
        c.meta.counter = c.meta.counter.max(class.floor());
        c.meta.seq = seq;
        class.backlogged.insert(c.meta.entry(chain));
    }

    /// The head of the line, choosing one if none is (FAIR-2, FAIR-3).
    pub(crate) fn head(&mut self, now: Instant) -> Option<usize> {
        if let Some(h) = self.head {
            return Some(h);
        }
        if self.lines.is_empty() {
            return None;
        }
        let class = self.class_to_serve(now)?;
        let state = &self.classes[class.index()];
        let key = match state.designated {
            Some(k) => k,
            None => {
                let &(_, _, chain) = state.backlogged.first()?;
                self.lines.chain(chain)?.front()?
            }
        };
        self.classes[class.index()].designated = Some(key);
        self.head = Some(key);
        Some(key)
    }

    /// A backlogged class below its `min_share` first (the highest such),
    /// else the highest backlogged class (FAIR-2); never a class below one
    /// whose chosen call waits (ADM-4): when the owed class is below it,
    /// that chosen call goes first, so the owed class is next and no class
    /// starves behind a higher one's `min_share` of 0.
    fn class_to_serve(&mut self, now: Instant) -> Option<Priority> {
        let mut waiting = Priority::ALL
            .into_iter()
            .filter(|c| !self.classes[c.index()].backlogged.is_empty());
        let top = waiting.next()?;
        let mut lower = waiting.peekable();
        if lower.peek().is_none() {
            return Some(top);
        }
        let sums = self.share.window(now);
        // A chosen call that lost its turn to a higher class is not
        // overtaken by a lower class (ADM-4).
        let held = Priority::ALL
            .into_iter()
            .find(|c| self.classes[c.index()].designated.is_some());
        let owed = lower.find(|c| ShareRecord::below(&sums, *c, self.min_share[c.index()]));
        Some(match (owed, held) {
            // The owed class waits behind the call chosen above it.
            (Some(c), Some(h)) if c > h => h,
            (Some(c), _) => c,
            (None, _) => top,
        })
    }

    /// Takes a granted call out of its line and charges its flow `cost`
    /// (FAIR-3: the counter grows by cost / weight); returns how, for its
    /// corrections. The caller records the cost in [`share`](Self::share)
    /// once it is admitted.
    pub(crate) fn granted(&mut self, key: usize, cost: u64) -> Charged {
        // Weight 0: nothing was charged, so nothing is corrected.
        let mut charged = Charged {
            model: self.model,
            weight: 0,
        };
        let Some(chain) = self.take_out(key) else {
            return charged;
        };
        let Some(c) = self.lines.chain_mut(chain) else {
            return charged;
        };
        charged.weight = c.meta.weight.max(1);
        let class = &mut self.classes[c.meta.key.priority.index()];
        class.backlogged.remove(&c.meta.entry(chain));
        class.vtime = class.vtime.max(c.meta.counter);
        c.meta.counter = c.meta.counter.saturating_add(charge(cost, c.meta.weight));
        if c.len() > 0 {
            class.backlogged.insert(c.meta.entry(chain));
        } else {
            self.went_idle(chain);
        }
        charged
    }

    /// Corrects a flow's counter by what its granted call really cost
    /// (settlement, or a refund before the lease: `actual` 0), at the
    /// weight it was charged at. A flow no longer kept, or charged under
    /// another cost model, is not corrected.
    pub(crate) fn correct(&mut self, flow: FlowKey, charged: Charged, estimated: u64, actual: u64) {
        if estimated == actual || charged.model != self.model || charged.weight == 0 {
            return;
        }
        let Some(&chain) = self.index.get(&flow) else {
            return;
        };
        let Some(c) = self.lines.chain_mut(chain) else {
            return;
        };
        let class = &mut self.classes[c.meta.key.priority.index()];
        let backlogged = class.backlogged.remove(&c.meta.entry(chain));
        let weight = charged.weight;
        c.meta.counter = if actual > estimated {
            c.meta
                .counter
                .saturating_add(charge(actual - estimated, weight))
        } else {
            c.meta
                .counter
                .saturating_sub(charge(estimated - actual, weight))
        };
        if backlogged {
            class.backlogged.insert(c.meta.entry(chain));
        } else {
            self.forget_if_owed_nothing(chain);
        }
    }

    /// Unlinks a waiting call that leaves without a grant (cancelled,
    /// deadline, closed, displaced), keeping its storage.
    pub(crate) fn unlink(&mut self, key: usize) {
        let Some(chain) = self.take_out(key) else {
            return;
        };
        let Some(c) = self.lines.chain_mut(chain) else {
            return;
        };
        if c.len() == 0 {
            let class = &mut self.classes[c.meta.key.priority.index()];
            class.backlogged.remove(&c.meta.entry(chain));
            self.went_idle(chain);
        }
    }

    /// Unlinks `key` from its line; it is no longer the head or its
    /// class's chosen call. Returns its line, `None` if it was not linked.
    fn take_out(&mut self, key: usize) -> Option<u32> {
        let chain = self.lines.unlink(key)?;
        if self.head == Some(key) {
            self.head = None;
        }
        if let Some(c) = self.lines.chain(chain) {
            let class = &mut self.classes[c.meta.key.priority.index()];
            if class.designated == Some(key) {
                class.designated = None;
            }
        }
        Some(chain)
    }

    /// Unlinks (if needed) and frees `key`, returning its value.
    pub(crate) fn remove(&mut self, key: usize) -> Option<T> {
        self.unlink(key);
        self.lines.remove(key)
    }

    /// `chain` has no waiting call left: forget it unless it is owed less
    /// than its class's floor (then it keeps its counter, FAIR-3).
    fn went_idle(&mut self, chain: u32) {
        self.idle += 1;
        self.forget_if_owed_nothing(chain);
        if self.lines.is_empty() || self.idle > MAX_IDLE {
            // Nobody waits: a new backlog starts from equal counters.
            for id in self.lines.chain_ids() {
                self.forget(id);
            }
        }
    }

    /// Forgets an idle flow whose counter is at or below its class's
    /// floor: joining again would lift it there anyway.
    fn forget_if_owed_nothing(&mut self, chain: u32) {
        let Some(c) = self.lines.chain(chain) else {
            return;
        };
        if c.len() == 0 && c.meta.counter <= self.classes[c.meta.key.priority.index()].floor() {
            self.forget(chain);
        }
    }

    fn forget(&mut self, chain: u32) {
        if let Some(meta) = self.lines.close(chain) {
            self.index.remove(&meta.key);
            self.idle = self.idle.saturating_sub(1);
        }
    }

    /// The calls that certainly go before a new call of `flow`, in order
    /// (SPEC Q-11): the head if its class is not lower, the call chosen in
    /// the flow's class, and the flow's own line. `None` when there are
    /// more than `limit`.
    pub(crate) fn ahead_of(&self, flow: FlowKey, limit: usize) -> Option<Vec<usize>> {
        let mut keys = Vec::new();
        let class = flow.priority;
        if let Some(h) = self.head
            && self.class_of(h).is_some_and(|c| c <= class)
        {
            keys.push(h);
        }
        if let Some(d) = self.classes[class.index()].designated
            && !keys.contains(&d)
        {
            keys.push(d);
        }
        if let Some(&chain) = self.index.get(&flow) {
            let own = self.lines.chain(chain).map_or(0, |c| c.len());
            if keys.len() + own > limit {
                return None;
            }
            let first = keys.len();
            for (k, _) in self.lines.iter_chain(chain) {
                if !keys[..first].contains(&k) {
                    keys.push(k);
                }
            }
        }
        Some(keys)
    }

    /// The last call of the flow holding the most waiting calls, other
    /// than `flow` (FAIR-10); ties go to the lower class, then to the flow
    /// served most.
    pub(crate) fn largest_tail(&self, flow: FlowKey) -> Option<(usize, usize)> {
        self.lines
            .chains()
            .filter(|(_, c)| c.len() > 0 && c.meta.key != flow)
            .max_by_key(|(_, c)| (c.len(), c.meta.key.priority, c.meta.counter))
            .and_then(|(_, c)| Some((c.back()?, c.len())))
    }

    /// Every flow with waiting calls.
    pub(crate) fn flows(&self) -> Vec<FlowView> {
        self.lines
            .chains()
            .filter(|(_, c)| c.len() > 0)
            .map(|(_, c)| FlowView {
                key: c.meta.key,
                weight: c.meta.weight,
                queued: c.len(),
            })
            .collect()
    }
}

/// `cost / weight` in counter units.
fn charge(cost: u64, weight: u32) -> u128 {
    u128::from(cost) * SCALE / u128::from(weight.max(1))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t0() -> Instant {
        Instant::now()
    }

    fn flow(tenant: u32) -> Flow {
        Flow::new(tenant, Priority::Standard)
    }

    /// Grants the head `n` times at cost `cost`; returns the values.
    fn serve(q: &mut FairQueue<u32>, n: usize, cost: u64) -> Vec<u32> {
        let mut out = Vec::new();
        for _ in 0..n {
            let Some(h) = q.head(t0()) else { break };
            out.push(*q.get(h).unwrap());
            q.granted(h, cost);
            q.remove(h);
        }
        out
    }

    // proves: FAIR-1, ADM-4 (one flow is plain FIFO)
    #[test]
    fn a_single_flow_is_fifo() {
        let mut q = FairQueue::new([0, 5, 5], Some(Duration::from_secs(60)));
        for v in 0..5 {
            q.push(Flow::DEFAULT, v).unwrap();
        }
        assert_eq!(serve(&mut q, 5, 7), [0, 1, 2, 3, 4]);
        assert!(q.is_empty());
        assert_eq!(q.lines.chains().count(), 0, "idle flows are forgotten");
    }

    // proves: FAIR-3 (weights 3:1 share grants 3:1 by cost; FIFO within
    // each flow)
    #[test]
    fn weights_share_by_cost() {
        let mut q = FairQueue::new([0, 5, 5], None);
        for v in 0..40 {
            q.push(flow(1).with_weight(3), v).unwrap();
            q.push(flow(2), 100 + v).unwrap();
        }
        let served = serve(&mut q, 40, 10);
        let a: Vec<_> = served.iter().copied().filter(|v| *v < 100).collect();
        assert_eq!(a.len(), 30);
        assert_eq!(a, (0..30).collect::<Vec<_>>());
    }

    // proves: FAIR-2 (a higher class goes first; the chosen call of the
    // lower class stays chosen in its class)
    #[test]
    fn higher_classes_take_the_turn() {
        let mut q = FairQueue::new([0, 0, 0], None);
        let low = q.push(flow(1), 1).unwrap();
        assert_eq!(q.head(t0()), Some(low));
        q.push(flow(2), 2).unwrap();
        let hi = q.push(Flow::new(3, Priority::Interactive), 3).unwrap();
        assert_eq!(q.head(t0()), Some(hi));
        q.granted(hi, 1);
        q.remove(hi);
        assert_eq!(q.head(t0()), Some(low), "the chosen call keeps its turn");
    }

    // proves: FAIR-2 (min_share: a lower class below its share of the
    // window's cost is served first, until it has it)
    #[test]
    fn min_share_serves_a_lower_class() {
        let mut q = FairQueue::new([0, 0, 20], Some(Duration::from_secs(600)));
        let now = t0();
        for v in 0..50 {
            q.push(Flow::new(1, Priority::Interactive), v).unwrap();
            q.push(Flow::new(2, Priority::Batch), 100 + v).unwrap();
        }
        let mut served = Vec::new();
        for _ in 0..50 {
            let h = q.head(now).unwrap();
            let class = q.class_of(h).unwrap();
            served.push(class);
            q.granted(h, 1);
            q.share.add(class, 1, now);
            q.remove(h);
        }
        let batch = served.iter().filter(|c| **c == Priority::Batch).count();
        assert_eq!(batch, 10, "{served:?}");
    }

    // proves: FAIR-3 (a flow that becomes backlogged starts at the
    // smallest counter of the backlogged flows: idle time banks nothing)
    #[test]
    fn idle_time_banks_no_credit() {
        let mut q = FairQueue::new([0, 5, 5], None);
        for v in 0..10 {
            q.push(flow(1), v).unwrap();
        }
        serve(&mut q, 5, 10);
        q.push(flow(2), 100).unwrap();
        q.push(flow(2), 101).unwrap();
        // Flow 2 starts level with flow 1, not 50 units behind it.
        assert_eq!(serve(&mut q, 4, 10), [5, 100, 6, 101]);
    }
}

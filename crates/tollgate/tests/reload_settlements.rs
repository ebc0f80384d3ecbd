//! Settlements across a reload (GW-15 with) and a
//! restore (DQ-8), on `LocalQuota` directly: deterministic cases, then a
//! property test against a provider counting by each configuration.

use std::time::Duration;

use tokio::time::Instant;
use tollgate::config::{Algorithm, ScopeConfig};
use tollgate::quota::{Demand, Dimension, Hold, LimitSnapshot, LocalQuota, QuotaStore};

fn s(n: u64) -> Duration {
    Duration::from_secs(n)
}

// proves: GW-15, Q-15, Q-7 (an attempt a fixed window recounted to a later
// instant of its own window, 58 s, then a reload to a shorter sliding
// window: the new 5 s window counts it until 63 s)
#[test]
fn fixed_recount_ahead_within_its_window_reaches_the_reloaded_sliding_window() {
    let t0 = Instant::now();
    let old = ScopeConfig::new("m")
        .requests(100, s(60))
        .algorithm(Algorithm::FixedWindow);
    let new = ScopeConfig::new("m")
        .requests(1, s(5))
        .algorithm(Algorithm::SlidingWindow);
    let mut q = LocalQuota::new(&old, t0);
    // Leased at 49 s; cancelled at 50 s with an arrival bound of 9 s: the
    // provider may count it as late as 58 s (Q-15, within ARRIVAL_CAP).
    let mut a = q
        .reserve(&Demand::new(0, 0), t0 + s(49), Hold::Leased)
        .unwrap();
    q.recount(&mut a, t0 + s(58), t0 + s(50));
    q.reconfigure(&new, t0 + s(50));
    // At 60 s the new window (55 s, 60 s] may hold the attempt (58 s).
    let b = q.reserve(&Demand::new(0, 0), t0 + s(60), Hold::Leased);
    assert!(
        b.is_err(),
        "admitted at 60 s; the provider's 5 s window (55, 60] may hold the attempt counted at 58 s and this one: 2 > 1"
    );
}

// proves: GW-15, Q-15, Q-7 (the same with a reload to a shorter fixed
// window: the new window [50, 60) holds the attempt's instant, 54 s)
#[test]
fn fixed_recount_ahead_within_its_window_reaches_the_reloaded_fixed_window() {
    let t0 = Instant::now();
    let old = ScopeConfig::new("m")
        .requests(100, s(60))
        .algorithm(Algorithm::FixedWindow);
    let new = ScopeConfig::new("m")
        .requests(1, s(10))
        .algorithm(Algorithm::FixedWindow);
    let mut q = LocalQuota::new(&old, t0);
    let mut a = q
        .reserve(&Demand::new(0, 0), t0 + s(44), Hold::Leased)
        .unwrap();
    // Cancelled at 45 s, may arrive as late as 54 s.
    q.recount(&mut a, t0 + s(54), t0 + s(45));
    q.reconfigure(&new, t0 + s(45));
    let b = q.reserve(&Demand::new(0, 0), t0 + s(50), Hold::Leased);
    assert!(
        b.is_err(),
        "admitted at 50 s; the new fixed window [50, 60) may hold the attempt counted at 54 s and this one: 2 > 1"
    );
}

// ---------------------------------------------------------------------
// Property test: a provider counting by each configuration.
//
// Each admitted call is counted by the provider at some instant between
// its lease and the latest instant a recount gave it (with its reconciled
// tokens). After any sequence of reservations, leases, refunds, releases,
// reconciliations, recounts (behind now, up to the arrival cap ahead, or
// further), reloads across sliding, fixed and bucket windows, an input
// token limit learned from the provider, and restores of saves of
// this store or another configuration's (DQ-8), several at one instant:
// * the running configuration's window holding now never admits past its
//   amounts, counting every call the limits in force still knew at each
//   reload (a call an earlier window no longer counted at a reload may be
//   forgotten, as docs/design.md says);
// * while a replaced limit is transitional, its window holding calls from
//   before the reload never admits past its amounts;
// * the learned limit's window never admits past its amount, counting the
//   calls it took as its own (reserved or leased after it was learned);
// * once everything pending is refunded and every window passed, every
//   limit is whole again: nothing leaks.
// ---------------------------------------------------------------------

use proptest::prelude::*;
use tollgate::quota::{Actual, Reservation};

#[derive(Debug, Clone, Copy, PartialEq)]
enum Alg {
    Sliding,
    Fixed,
    Bucket,
}

#[derive(Debug, Clone, Copy)]
struct Cfg {
    alg: Alg,
    window_ms: u64,
    requests: u64,
    tokens: u64,
}

impl Cfg {
    fn scope(&self) -> ScopeConfig {
        let w = Duration::from_millis(self.window_ms);
        ScopeConfig::new("m")
            .requests(self.requests, w)
            .tokens(self.tokens, w)
            .algorithm(match self.alg {
                Alg::Sliding => Algorithm::SlidingWindow,
                Alg::Fixed => Algorithm::FixedWindow,
                Alg::Bucket => Algorithm::TokenBucket { burst: None },
            })
            // Input tokens are left to the provider (SPEC Q-14).
            .learn_limits(Duration::from_millis(LEARN_MS))
    }
    /// Window of this configuration holding `now` (ms): `(lo, hi)`, an
    /// entry whose interval `[a, e]` has `a <= now` is in it iff `e >= lo`
    /// (fixed: `lo` is the window start) / `e > lo` (sliding: `lo` is
    /// `now - W`).
    fn holds(&self, a: u64, e: u64, now: u64) -> bool {
        debug_assert!(a <= now);
        match self.alg {
            Alg::Sliding => e.saturating_add(self.window_ms) > now,
            Alg::Fixed => e >= now - now % self.window_ms,
            Alg::Bucket => unreachable!(),
        }
    }
    fn same_limit(&self, o: &Cfg) -> bool {
        self.alg == o.alg && self.window_ms == o.window_ms
    }
}

/// The window of limits learned from the provider.
const LEARN_MS: u64 = 5_000;

fn cfg() -> impl Strategy<Value = Cfg> {
    (
        prop_oneof![3 => Just(Alg::Sliding), 3 => Just(Alg::Fixed), 1 => Just(Alg::Bucket)],
        prop_oneof![Just(2_000u64), Just(5_000), Just(10_000), Just(30_000)],
        1u64..6,
        20u64..120,
    )
        .prop_map(|(alg, window_ms, requests, tokens)| Cfg {
            alg,
            window_ms,
            requests,
            tokens,
        })
}

#[derive(Debug, Clone)]
enum Op {
    Reserve {
        leased: bool,
        tokens: u64,
    },
    Lease(usize),
    Refund(usize),
    Reconcile {
        i: usize,
        pct: u64,
    },
    /// Recount to lease + `ahead` ms (possibly before now, possibly ahead).
    Recount {
        i: usize,
        delay: u64,
    },
    Advance(u64),
    Reload(Cfg),
    /// A refusal the provider did not charge (SPEC Q-16): a leased call
    /// given back in full.
    Release(usize),
    /// The provider advertises an input-token limit (SPEC Q-14).
    Learn(u64),
    /// Saves a copy of the running store.
    SaveCopy,
    /// Saves another configuration's store holding one call, recounted
    /// `ahead` ms ahead.
    SaveOther {
        c: Cfg,
        tokens: u64,
        ahead: u64,
    },
    /// Restores one of the saves on the running store (SPEC DQ-8).
    Restore(usize),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (any::<bool>(), 0u64..40).prop_map(|(leased, tokens)| Op::Reserve { leased, tokens }),
        2 => any::<usize>().prop_map(Op::Lease),
        1 => any::<usize>().prop_map(Op::Refund),
        2 => (any::<usize>(), 0u64..300).prop_map(|(i, pct)| Op::Reconcile { i, pct }),
        3 => (any::<usize>(), prop_oneof![0u64..12_000, 0u64..50, 0u64..70_000])
            .prop_map(|(i, delay)| Op::Recount { i, delay }),
        4 => prop_oneof![0u64..200, 0u64..3_000, 0u64..20_000].prop_map(Op::Advance),
        2 => cfg().prop_map(Op::Reload),
        1 => any::<usize>().prop_map(Op::Release),
        1 => (5u64..80).prop_map(Op::Learn),
        1 => Just(Op::SaveCopy),
        1 => (cfg(), 0u64..40, prop_oneof![Just(0u64), 0u64..10_000])
            .prop_map(|(c, tokens, ahead)| Op::SaveOther { c, tokens, ahead }),
        1 => any::<usize>().prop_map(Op::Restore),
    ]
}

#[derive(Debug, Clone)]
struct Entry {
    r: Reservation,
    reserved: u64,
    pending: bool,
    refunded: bool,
    reconciled: bool,
    /// Latest instant the provider may count it (leased).
    end: u64,
    tokens: u64,
    /// The first configuration (index) that does not know it.
    forgotten_from: Option<usize>,
    /// Its end as of each reload (index of the configuration it started).
    ends_at: Vec<(usize, u64)>,
    /// The configuration it was reserved under.
    under: usize,
    leased_at: Option<u64>,
    /// The operation that reserved it, and the one that leased it.
    seq: usize,
    lease_seq: Option<usize>,
}

impl Entry {
    /// The latest instant the provider may count it (pending: not yet).
    fn end_for(&self) -> u64 {
        if self.pending { u64::MAX } else { self.end }
    }
    fn known_by(&self, k: usize) -> bool {
        self.under >= k || self.forgotten_from.is_none_or(|f| f > k)
    }
}

struct World {
    t0: Instant,
    q: LocalQuota,
    now: u64,
    cfgs: Vec<(Cfg, u64)>,
    entries: Vec<Entry>,
    log: Vec<String>,
    /// The learned input-token limit: its amount, the algorithm it counts
    /// by, the operation that created it, and whether it is still the one
    /// created then (no reload changed its algorithm since).
    learned: Option<(u64, Alg, usize, bool)>,
    saves: Vec<tollgate::quota::SavedScope>,
}

impl World {
    fn at(&self, ms: u64) -> Instant {
        self.t0 + Duration::from_millis(ms)
    }

    /// (requests, tokens, any entry reserved before `before`) counted in
    /// configuration `k`'s window holding now.
    /// `before`: configuration index; entries reserved under an earlier
    /// one are "pre-reload".
    fn count(&self, k: usize, before: usize) -> (u64, u64, bool, bool) {
        let (c, _) = self.cfgs[k];
        let (mut r, mut t, mut pre, mut pre_t) = (0, 0, false, false);
        for e in &self.entries {
            if e.refunded || !e.known_by(k) {
                continue;
            }
            // A replaced configuration (P2): a pre-reload entry as known
            // at the reload (a later recount may find it drained).
            let mut end = e.end_for();
            if e.under < before {
                match e.ends_at.iter().find(|(i, _)| *i == k + 1) {
                    Some(&(_, at)) => end = at,
                    // Pending at the reload: as leased.
                    None => end = e.leased_at.unwrap_or(u64::MAX),
                }
                if e.forgotten_from == Some(k + 1) {
                    continue;
                }
            }
            if c.holds(e.reserved, end, self.now) {
                r += 1;
                t += e.tokens;
                pre |= e.under < before;
                pre_t |= e.under < before && e.tokens > 0;
            }
        }
        (r, t, pre, pre_t)
    }

    fn admits(&self, tokens: u64) -> bool {
        let mut copy = self.q.clone();
        copy.reserve(&Demand::new(tokens, 0), self.at(self.now), Hold::Leased)
            .is_ok()
    }

    fn check(&self) -> Result<(), TestCaseError> {
        let k = self.cfgs.len() - 1;
        let (cur, _) = self.cfgs[k];
        // P1: the running configuration's window.
        if cur.alg != Alg::Bucket {
            let (r, t, _, _) = self.count(k, 0);
            self.probe(
                Some(r),
                Some(t),
                cur.requests,
                cur.tokens,
                cur.tokens,
                "new",
                k,
            )?;
        }
        // P3: the learned limit's window holding now, counting calls it
        // took as its own (reserved after it, or leased after it).
        if let Some((amount, alg, born, true)) = self.learned
            && alg != Alg::Bucket
        {
            let c = Cfg {
                alg,
                window_ms: LEARN_MS,
                requests: u64::MAX,
                tokens: amount,
            };
            let mut t = 0;
            for e in &self.entries {
                if e.refunded {
                    continue;
                }
                let a = if e.seq > born {
                    e.reserved
                } else if e.lease_seq.is_some_and(|l| l > born) {
                    e.leased_at.unwrap()
                } else {
                    continue;
                };
                if c.holds(a, e.end_for(), self.now) {
                    t += e.tokens;
                }
            }
            let d = if t >= amount { 1 } else { amount - t + 1 };
            if t > 0 {
                let mut copy = self.q.clone();
                prop_assert!(
                    copy.reserve(&Demand::new(d, 0), self.at(self.now), Hold::Leased)
                        .is_err(),
                    "learned limit {amount} {alg:?}: window holds {t} input tokens, {d} more admitted at {} ms\n{}",
                    self.now,
                    self.log.join("\n")
                );
            }
        }
        // P2: windows of a replaced configuration holding admissions from
        // before the reload that replaced it, while it is transitional.
        for m in 0..k {
            let (c, _) = self.cfgs[m];
            let (next, reload) = self.cfgs[m + 1];
            let _ = reload;
            if c.alg == Alg::Bucket || c.same_limit(&next) || self.now >= reload + c.window_ms {
                continue;
            }
            let (r, t, pre, pre_t) = self.count(m, m + 1);
            self.probe(
                pre.then_some(r),
                pre_t.then_some(t),
                c.requests,
                c.tokens,
                cur.tokens,
                "old",
                m,
            )?;
        }
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    fn probe(
        &self,
        r: Option<u64>,
        t: Option<u64>,
        req_limit: u64,
        tok_limit: u64,
        cur_tokens: u64,
        what: &str,
        k: usize,
    ) -> Result<(), TestCaseError> {
        if let Some(r) = r
            && r >= req_limit
        {
            prop_assert!(
                !self.admits(0),
                "{what} config #{k} {:?}: window holds {r} requests of {req_limit}, one more admitted at {} ms\n{}",
                self.cfgs[k],
                self.now,
                self.log.join("\n")
            );
        }
        let Some(t) = t else { return Ok(()) };
        let d = if t >= tok_limit { 1 } else { tok_limit - t + 1 };
        if t > 0 && d <= cur_tokens {
            prop_assert!(
                !self.admits(d),
                "{what} config #{k} {:?}: window holds {t} tokens of {tok_limit}, {d} more admitted at {} ms\n{}",
                self.cfgs[k],
                self.now,
                self.log.join("\n")
            );
        }
        Ok(())
    }

    fn pick(&self, i: usize, f: impl Fn(&Entry) -> bool) -> Option<usize> {
        let v: Vec<usize> = (0..self.entries.len())
            .filter(|&j| f(&self.entries[j]))
            .collect();
        (!v.is_empty()).then(|| v[i % v.len()])
    }

    fn reload(&mut self, c: Cfg) {
        let k = self.cfgs.len();
        let (old, _) = self.cfgs[k - 1];
        let r = self.now;
        for e in &mut self.entries {
            if !e.pending {
                let end = e.end_for();
                e.ends_at.push((k, end));
            }
            if e.refunded || e.pending || e.forgotten_from.is_some() {
                continue;
            }
            let end = e.end_for();
            let known = match old.alg {
                Alg::Bucket => false,
                Alg::Sliding => end + old.window_ms > r,
                Alg::Fixed => end >= r - r % old.window_ms,
            };
            if !known {
                e.forgotten_from = Some(k);
                continue;
            }
        }
        self.q.reconfigure(&c.scope(), self.at(r));
        self.cfgs.push((c, r));
        if let Some(l) = &mut self.learned
            && l.1 != c.alg
        {
            l.3 = false;
        }
    }
}

fn run(first: Cfg, ops: Vec<Op>) -> Result<(), TestCaseError> {
    let t0 = Instant::now();
    let mut w = World {
        t0,
        q: LocalQuota::new(&first.scope(), t0),
        now: 0,
        cfgs: vec![(first, 0)],
        entries: Vec::new(),
        log: vec![format!("start {first:?}")],
        learned: None,
        saves: Vec::new(),
    };
    for (seq, op) in ops.into_iter().enumerate() {
        match op {
            Op::Reserve { leased, tokens } => {
                let hold = if leased { Hold::Leased } else { Hold::Pending };
                let Ok(r) = w.q.reserve(&Demand::new(tokens, 0), w.at(w.now), hold) else {
                    continue;
                };
                w.log.push(format!(
                    "{} ms: #{} reserve {tokens} {hold:?}",
                    w.now,
                    w.entries.len()
                ));
                w.entries.push(Entry {
                    r,
                    reserved: w.now,
                    pending: !leased,
                    refunded: false,
                    reconciled: false,
                    end: w.now,
                    tokens,
                    forgotten_from: None,
                    ends_at: Vec::new(),
                    under: w.cfgs.len() - 1,
                    leased_at: leased.then_some(w.now),
                    seq,
                    lease_seq: leased.then_some(seq),
                });
            }
            Op::Lease(i) => {
                let Some(j) = w.pick(i, |e| e.pending && !e.refunded) else {
                    continue;
                };
                let now = w.at(w.now);
                w.q.lease(&mut w.entries[j].r, now);
                let e = &mut w.entries[j];
                e.pending = false;
                e.end = w.now;
                e.leased_at = Some(w.now);
                e.lease_seq = Some(seq);
                w.log.push(format!("{} ms: lease #{j}", w.now));
            }
            Op::Refund(i) => {
                let Some(j) = w.pick(i, |e| e.pending && !e.refunded) else {
                    continue;
                };
                let now = w.at(w.now);
                w.q.refund(&w.entries[j].r, now);
                w.entries[j].refunded = true;
                w.log.push(format!("{} ms: refund #{j}", w.now));
            }
            Op::Reconcile { i, pct } => {
                let Some(j) = w.pick(i, |e| !e.pending && !e.refunded && !e.reconciled) else {
                    continue;
                };
                let e = &w.entries[j];
                let actual = e.tokens * pct / 100;
                let report = Actual {
                    tokens: actual,
                    input: Some(actual),
                    output: Some(0),
                    cost: None,
                };
                w.q.reconcile(&e.r, &report);
                let e = &mut w.entries[j];
                e.reconciled = true;
                e.tokens = actual;
                w.log
                    .push(format!("{} ms: reconcile #{j} to {actual}", w.now));
            }
            Op::Recount { i, delay } => {
                let Some(j) = w.pick(i, |e| !e.pending && !e.refunded && !e.reconciled) else {
                    continue;
                };
                let lease = w.entries[j].r.stamp;
                let lease_ms = u64::try_from((lease - t0).as_millis()).unwrap();
                let at = lease_ms.max(w.entries[j].end) + delay;
                // At most ARRIVAL_CAP ahead of now, unless a far bound.
                let at = if delay < 12_000 {
                    at.min(w.now + 10_000)
                } else {
                    at
                };
                let now = w.at(w.now);
                let at_i = w.at(at);
                w.q.recount(&mut w.entries[j].r, at_i, now);
                let e = &mut w.entries[j];
                e.end = e.end.max(at);
                w.log.push(format!("{} ms: recount #{j} to {at}", w.now));
            }
            Op::Advance(ms) => {
                w.now += ms;
            }
            Op::Reload(c) => {
                w.log.push(format!("{} ms: reload {c:?}", w.now));
                w.reload(c);
            }
            Op::Release(i) => {
                let Some(j) = w.pick(i, |e| !e.pending && !e.refunded && !e.reconciled) else {
                    continue;
                };
                w.q.release(&w.entries[j].r, true, true, false);
                w.entries[j].refunded = true;
                w.log.push(format!("{} ms: release #{j}", w.now));
            }
            Op::Learn(amount) => {
                use tollgate::quota::BudgetReport;
                let now = w.at(w.now);
                w.q.observe(
                    &BudgetReport {
                        dimension: Dimension::InputTokens,
                        limit: Some(amount),
                        remaining: None,
                        reset: None,
                    },
                    None,
                    now,
                    now,
                );
                let alg = w.cfgs.last().unwrap().0.alg;
                w.learned = match w.learned {
                    // A new amount for the limit in force.
                    Some((_, a, born, valid)) => Some((amount, a, born, valid)),
                    None => Some((amount, alg, seq, true)),
                };
                w.log
                    .push(format!("{} ms: learn {amount} input tokens", w.now));
            }
            Op::SaveCopy => {
                let saved = w.q.clone().save(w.at(w.now), |_| true);
                w.log
                    .push(format!("{} ms: save copy as save {}", w.now, w.saves.len()));
                w.saves.push(saved);
            }
            Op::SaveOther { c, tokens, ahead } => {
                let mut other = LocalQuota::new(&c.scope(), t0);
                let now = w.at(w.now);
                if let Ok(mut r) = other.reserve(&Demand::new(tokens, 0), now, Hold::Leased)
                    && ahead > 0
                {
                    other.recount(&mut r, w.at(w.now + ahead), now);
                }
                w.log.push(format!(
                    "{} ms: save other {c:?} with {tokens} ahead {ahead} as save {}",
                    w.now,
                    w.saves.len()
                ));
                w.saves.push(other.save(now, |_| true));
            }
            Op::Restore(i) => {
                if w.saves.is_empty() {
                    continue;
                }
                let k = i % w.saves.len();
                let saved = w.saves[k].clone();
                let now = w.at(w.now);
                w.q.restore(&saved, now);
                w.log.push(format!("{} ms: restore save {k}", w.now));
            }
        }
        w.check()?;
    }
    // Nothing leaks: pending refunded, every window passed.
    for j in 0..w.entries.len() {
        if w.entries[j].pending && !w.entries[j].refunded {
            let now = w.at(w.now);
            w.q.refund(&w.entries[j].r, now);
            w.entries[j].refunded = true;
        }
    }
    let far = w
        .entries
        .iter()
        .map(|e| e.end)
        .max()
        .unwrap_or(0)
        .max(w.now)
        + 100_000_000;
    let mut out = Vec::new();
    w.q.snapshot(w.at(far), &mut out);
    for l in out {
        prop_assert_eq!(
            l.available,
            l.capacity as i64,
            "leak in {:?}\n{}",
            l,
            w.log.join("\n")
        );
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2_000, ..ProptestConfig::default() })]
    // proves: GW-15, Q-7, Q-9, Q-15, Q-5 (see above)
    #[test]
    fn reload_never_over_admits(first in cfg(), ops in proptest::collection::vec(op(), 1..80)) {
        run(first, ops)?;
    }
}

// proves: GW-15, Q-5, Q-9 (a debt settled after a reload to another
// sliding window is counted from the call's own instant, before the
// reload; a reservation pending from before the reload is then refunded:
// the debt stays counted and the pending amount is given back, nothing
// leaks)
#[test]
fn a_pending_refund_after_a_reload_keeps_the_debt_counted() {
    let t0 = Instant::now();
    let scope = |w| ScopeConfig::new("m").tokens(20, s(w));
    let mut q = LocalQuota::new(&scope(2), t0);
    let a = q.reserve(&Demand::new(3, 0), t0, Hold::Leased).unwrap();
    let b = q
        .reserve(
            &Demand::new(5, 0),
            t0 + Duration::from_millis(10),
            Hold::Pending,
        )
        .unwrap();
    q.reconfigure(&scope(5), t0 + Duration::from_millis(20));
    // A used 4 tokens: 1 of debt, counted from A's instant (0).
    q.reconcile(&a, &Actual::total(4));
    q.refund(&b, t0 + Duration::from_millis(30));
    let mut out = Vec::new();
    q.snapshot(t0 + s(1), &mut out);
    let at_1s = out[0].available;
    out.clear();
    q.snapshot(t0 + s(100), &mut out);
    assert_eq!(
        (at_1s, out[0].available),
        (20 - 4, 20),
        "3 seeded + 1 of debt at 1 s; nothing once every window passed"
    );
}

// proves: DQ-8, Q-9 (a restore on a running scope: the restored amounts
// go into an empty log; a pending reservation whose slot aged out before
// is refunded from what it holds, not from them)
#[test]
fn a_carried_pending_amount_is_refunded_after_a_restore() {
    let t0 = Instant::now();
    let scope = ScopeConfig::new("m").tokens(20, s(10));
    // What to restore: 4 tokens counted for another 20 s.
    let mut before = LocalQuota::new(&scope, t0);
    before
        .reserve(&Demand::new(4, 0), t0 + s(5), Hold::Leased)
        .unwrap();
    let saved = before.save(t0 + s(5), |_| true);

    let mut q = LocalQuota::new(&scope, t0);
    let b = q
        .reserve(&Demand::new(5, 0), t0 + s(1), Hold::Pending)
        .unwrap();
    // Its slot ages out at 11 s; the pending amount moves to carry.
    let mut out = Vec::new();
    q.snapshot(t0 + s(12), &mut out);
    assert!(q.restore(&saved, t0 + s(12)));
    q.refund(&b, t0 + s(12));
    out.clear();
    q.snapshot(t0 + s(100), &mut out);
    assert_eq!(
        out[0].available, 20,
        "nothing counted once every window passed"
    );
}

// proves: GW-15, Q-5, Q-7 (a reload to a fixed window whose window in
// progress began before the reload: a call the old, shorter window no
// longer counted, so not in the seed, settles below its estimate; the new
// window gives nothing back of what it counts for another call)
#[test]
fn a_forgotten_call_gives_nothing_back_to_the_reloaded_fixed_window() {
    let t0 = Instant::now();
    let old = ScopeConfig::new("m").tokens(10_000, s(60));
    let new = ScopeConfig::new("m")
        .tokens(10_000, s(3_600))
        .algorithm(Algorithm::FixedWindow);
    let mut q = LocalQuota::new(&old, t0);
    // A long call: 5,000 tokens estimated, leased at 0.
    let a = q.reserve(&Demand::new(5_000, 0), t0, Hold::Leased).unwrap();
    // At 61 s (A has left the old minute) the hour window [0, 3600 s)
    // replaces it.
    q.reconfigure(&new, t0 + s(61));
    let b = q
        .reserve(&Demand::new(5_000, 0), t0 + s(61), Hold::Leased)
        .unwrap();
    let _ = b;
    // A ends: it used nothing.
    q.reconcile(&a, &Actual::total(0));
    let mut out = Vec::new();
    q.snapshot(t0 + s(62), &mut out);
    assert_eq!(
        out[0].available, 5_000,
        "B's 5,000 tokens are in the hour [0, 3600 s)"
    );
}

// proves: GW-15, Q-15, Q-7 (a reservation recounted to an instant after
// two reloads, through a token bucket that keeps no instants, and recounted
// again: a slot opened after the reload for a pending reservation gives
// nothing to it, and both stay counted)
#[test]
fn a_stamp_ahead_of_the_reload_takes_nothing_from_a_later_pending_slot() {
    let t0 = Instant::now();
    let ms = Duration::from_millis;
    let scope = |algorithm| ScopeConfig::new("m").requests(2, s(2)).algorithm(algorithm);
    let mut q = LocalQuota::new(&scope(Algorithm::SlidingWindow), t0);
    let mut a = q.reserve(&Demand::new(0, 0), t0, Hold::Leased).unwrap();
    // Cancelled at once: the provider may count it as late as 3.83 s.
    q.recount(&mut a, t0 + ms(3_830), t0);
    q.reconfigure(&scope(Algorithm::TokenBucket { burst: None }), t0);
    q.reconfigure(&scope(Algorithm::SlidingWindow), t0);
    let _b = q
        .reserve(&Demand::new(0, 0), t0 + ms(1), Hold::Pending)
        .unwrap();
    // A's response begins: counted by 3.831 s.
    q.recount(&mut a, t0 + ms(3_831), t0 + ms(1));
    // At 2.5 s B's slot (opened 1 ms) ages out: A (counted until 5.831 s)
    // and pending B fill the limit.
    let mut out = Vec::new();
    q.snapshot(t0 + ms(2_500), &mut out);
    assert_eq!(out[0].available, 0, "A counted until 5.831 s, B pending");
}

/// What the cost limit has available at `at`.
fn cost_available(q: &mut LocalQuota, at: Instant) -> i64 {
    let mut out: Vec<LimitSnapshot> = Vec::new();
    q.snapshot(at, &mut out);
    out.iter()
        .find(|l| l.dimension == Dimension::Cost)
        .expect("a cost limit")
        .available
}

// proves: GW-15, Q-9, BUD-2 (a fixed-window scope reloaded as a token-bucket
// scope: its budget becomes a sliding window (Limit::algorithm_in) and is
// seeded; a pending reservation from before the reload, taken in the same
// tick, and one taken after it are both leased and settled in full; once
// every window passed the budget is whole again)
#[test]
fn budget_of_a_reloaded_bucket_scope_is_whole_after_pending_settle() {
    let t0 = Instant::now();
    let old = ScopeConfig::new("m")
        .requests(100, s(60))
        .cost(1_000, s(60))
        .algorithm(Algorithm::FixedWindow);
    let new = ScopeConfig::new("m")
        .requests(100, s(60))
        .cost(1_000, s(60))
        .algorithm(Algorithm::TokenBucket { burst: None });
    let mut q = LocalQuota::new(&old, t0);
    let t = t0 + s(10);
    // Pending before the reload (cost 10), then the reload and a pending
    // reservation after it (cost 30), all in the same tick.
    let mut a = q
        .reserve(&Demand::new(0, 0).with_cost(10), t, Hold::Pending)
        .unwrap();
    q.reconfigure(&new, t);
    let mut b = q
        .reserve(&Demand::new(0, 0).with_cost(30), t, Hold::Pending)
        .unwrap();
    // Both start.
    q.lease(&mut a, t + s(1));
    q.lease(&mut b, t + s(1));
    // Long after every window: nothing is counted any more.
    assert_eq!(
        cost_available(&mut q, t + s(1_000)),
        1_000,
        "the budget never becomes whole again: a pending amount is stranded"
    );
}

// proves: DQ-8, Q-9 (a restore on a running scope whose window changed
// since the save seeds its limit; a reservation pending from before the
// restore, taken in the same tick, is leased: once every window passed
// nothing is counted any more)
#[test]
fn a_pending_reservation_of_the_restore_tick_is_found_after_a_seeded_restore() {
    let t0 = Instant::now();
    let saved_scope = ScopeConfig::new("m").tokens(20, s(30));
    let scope = ScopeConfig::new("m").tokens(20, s(10));
    let mut before = LocalQuota::new(&saved_scope, t0);
    before
        .reserve(&Demand::new(4, 0), t0 + s(5), Hold::Leased)
        .unwrap();
    let saved = before.save(t0 + s(5), |_| true);

    let mut q = LocalQuota::new(&scope, t0);
    let t = t0 + s(6);
    let mut b = q.reserve(&Demand::new(5, 0), t, Hold::Pending).unwrap();
    assert!(q.restore(&saved, t));
    q.lease(&mut b, t + s(1));
    let mut out: Vec<LimitSnapshot> = Vec::new();
    q.snapshot(t0 + s(1_000), &mut out);
    assert_eq!(
        out[0].available, 20,
        "nothing counted once every window passed"
    );
}

// proves: Q-14, Q-9 (a token limit learned from the provider while a
// reservation is pending: once every reservation is leased and every
// window passed, the learned limit counts nothing any more)
#[test]
fn a_learned_limit_is_whole_after_a_pending_reservation_from_before_it_leases() {
    use tollgate::quota::{Actual, BudgetReport};
    let t0 = Instant::now();
    let ms = Duration::from_millis;
    let scope = ScopeConfig::new("m")
        .requests(100, s(60))
        .learn_limits(s(60));
    let mut q = LocalQuota::new(&scope, t0);
    // L0 leased at 0, R pending at 0.5 ms (both before the provider
    // advertises a token limit).
    let l0 = q.reserve(&Demand::new(10, 0), t0, Hold::Leased).unwrap();
    let mut r = q
        .reserve(
            &Demand::new(5, 0),
            t0 + Duration::from_micros(500),
            Hold::Pending,
        )
        .unwrap();
    // At 1 ms an answer advertises 1,000 tokens per minute.
    q.observe(
        &BudgetReport {
            dimension: Dimension::Tokens,
            limit: Some(1_000),
            remaining: None,
            reset: None,
        },
        Some(&l0),
        t0 + ms(1),
        t0 + ms(1),
    );
    // L0 used 30 tokens: 20 of debt.
    q.reconcile(&l0, &Actual::total(30));
    // P pending at 2 ms; R then P start.
    let mut p = q
        .reserve(&Demand::new(8, 0), t0 + ms(2), Hold::Pending)
        .unwrap();
    q.lease(&mut r, t0 + ms(3));
    q.lease(&mut p, t0 + ms(4));
    let mut out: Vec<LimitSnapshot> = Vec::new();
    q.snapshot(t0 + s(1_000), &mut out);
    let tokens = out
        .iter()
        .find(|l| l.dimension == Dimension::Tokens)
        .expect("the learned limit");
    assert_eq!(
        tokens.available, 1_000,
        "nothing counted once every window passed"
    );
}

// ---------------------------------------------------------------------
// Reservations at the very tick a limit begins
// ---------------------------------------------------------------------

/// The provider advertises `amount` tokens per window at `at`.
fn learn_tokens(q: &mut LocalQuota, amount: u64, at: Instant) {
    let report = tollgate::quota::BudgetReport {
        dimension: Dimension::Tokens,
        limit: Some(amount),
        remaining: None,
        reset: None,
    };
    q.observe(&report, None, at, at);
}

// proves, Q-7 (a token limit learned at the very tick a call
// was leased: the call was never counted by the learned limit, so its
// settlement below its estimate must give nothing back there; it must not
// take back another call's amount)
#[test]
fn a_limit_learned_at_a_calls_tick_takes_nothing_back_from_a_later_one() {
    let t0 = Instant::now();
    let t = t0 + s(1);
    let scope = ScopeConfig::new("m")
        .requests(100, s(60))
        .learn_limits(s(60));
    let mut q = LocalQuota::new(&scope, t0);
    // E leased at t, before the provider advertised a token limit.
    let e = q.reserve(&Demand::new(10, 0), t, Hold::Leased).unwrap();
    // At the same instant an answer advertises 10 tokens per minute.
    learn_tokens(&mut q, 10, t);
    // L, leased at the same instant, fills the learned limit.
    let _l = q.reserve(&Demand::new(10, 0), t, Hold::Leased).unwrap();
    // E used nothing.
    q.reconcile(&e, &Actual::total(0));
    let m = q.reserve(&Demand::new(10, 0), t + s(1), Hold::Leased);
    assert!(
        m.is_err(),
        "admitted 10 more tokens at 2 s: the minute holds L (10) and M (10) = 20 > 10"
    );
}

// proves, Q-7 (the same with pending reservations: refunding
// one taken before the learned limit, at its very tick, must not give back
// a later pending reservation's room)
#[test]
fn a_limit_learned_at_a_calls_tick_keeps_a_later_pending_one_counted() {
    let t0 = Instant::now();
    let t = t0 + s(1);
    let scope = ScopeConfig::new("m")
        .requests(100, s(60))
        .learn_limits(s(60));
    let mut q = LocalQuota::new(&scope, t0);
    let e = q.reserve(&Demand::new(10, 0), t, Hold::Pending).unwrap();
    learn_tokens(&mut q, 10, t);
    let mut l = q.reserve(&Demand::new(10, 0), t, Hold::Pending).unwrap();
    q.refund(&e, t);
    let m = q.reserve(&Demand::new(10, 0), t + s(1), Hold::Leased);
    q.lease(&mut l, t + s(2));
    assert!(
        m.is_err(),
        "admitted M while L was pending: L and M both start within the minute, 20 > 10"
    );
}

// proves: GW-15, Q-5, Q-7 (a reload that adds a fixed-window token limit,
// at the very tick a call was leased: the new limit never counted the
// call, so its settlement below its estimate gives nothing back there)
#[test]
fn a_fixed_limit_added_at_a_calls_tick_takes_nothing_back() {
    let t0 = Instant::now();
    let t = t0 + s(1);
    let old = ScopeConfig::new("m")
        .requests(100, s(60))
        .algorithm(Algorithm::FixedWindow);
    let new = ScopeConfig::new("m")
        .requests(100, s(60))
        .tokens(10, s(60))
        .algorithm(Algorithm::FixedWindow);
    let mut q = LocalQuota::new(&old, t0);
    let e = q.reserve(&Demand::new(10, 0), t, Hold::Leased).unwrap();
    q.reconfigure(&new, t);
    let _l = q.reserve(&Demand::new(10, 0), t, Hold::Leased).unwrap();
    q.reconcile(&e, &Actual::total(0));
    let m = q.reserve(&Demand::new(10, 0), t + s(1), Hold::Leased);
    assert!(
        m.is_err(),
        "admitted 10 more tokens in the window [0, 60 s): it holds L (10) and M (10) = 20 > 10"
    );
}

// proves: DQ-8, Q-15, Q-7 (a restore on a running sliding window: an
// amount the provider may count as late as 8 s after the save is counted
// until one window after that instant, as it is into an empty log; not
// only one window after the restore)
#[test]
fn a_restore_into_a_running_log_keeps_an_amount_counted_ahead() {
    let t0 = Instant::now();
    let scope = ScopeConfig::new("m").tokens(10, s(10));
    let mut before = LocalQuota::new(&scope, t0);
    let mut a = before
        .reserve(&Demand::new(10, 0), t0, Hold::Leased)
        .unwrap();
    // Cancelled at once: the provider may count it as late as 8 s.
    before.recount(&mut a, t0 + s(8), t0);
    let saved = before.save(t0, |_| true);

    let mut q = LocalQuota::new(&scope, t0);
    // Something already counted: the log is running.
    q.reserve(&Demand::new(1, 0), t0, Hold::Leased).unwrap();
    assert!(q.restore(&saved, t0));
    // At 12 s the provider's window (2 s, 12 s] may hold A (counted at 8 s).
    let b = q.reserve(&Demand::new(10, 0), t0 + s(12), Hold::Leased);
    assert!(
        b.is_err(),
        "admitted 10 tokens at 12 s: the window (2, 12] may hold A's 10 counted at 8 s: 20 > 10"
    );
}

// proves: GW-15, Q-9, Q-7 (a token limit a reload added holds none of the
// reservations pending from before it; a second reload that changes its
// window seeds the new limit with the pending amount of the one it held.
// Refunding a reservation the first limit never held must not give that
// seed back: the reservation it stands for is still pending and holds its
// room until it starts)
#[test]
fn a_refund_the_replaced_limit_never_held_keeps_another_pending_amount_held() {
    let t0 = Instant::now();
    let tokens = |w| ScopeConfig::new("m").requests(100, s(60)).tokens(20, s(w));
    let mut q = LocalQuota::new(&ScopeConfig::new("m").requests(100, s(60)), t0);
    // X pending before any token limit.
    let x = q.reserve(&Demand::new(10, 0), t0, Hold::Pending).unwrap();
    // A token limit (20 per 10 s) is added; Y pending under it.
    q.reconfigure(&tokens(10), t0 + s(1));
    let mut y = q
        .reserve(&Demand::new(10, 0), t0 + s(2), Hold::Pending)
        .unwrap();
    // Its window becomes 20 s: the new limit is seeded with Y's 10 pending.
    q.reconfigure(&tokens(20), t0 + s(3));
    // X is given up.
    q.refund(&x, t0 + s(4));
    // Once the replaced 10 s limit is gone (13 s), Y still pending.
    let z = q.reserve(&Demand::new(20, 0), t0 + s(14), Hold::Leased);
    let admitted = z.is_ok();
    q.lease(&mut y, t0 + s(15));
    assert!(
        !admitted,
        "admitted 20 tokens while Y (10) was pending: Y then starts at 15 s, the 20 s window holds 30 > 20"
    );
}

/// What the token limit has available at `at`.
fn tokens_available(q: &mut LocalQuota, at: Instant) -> i64 {
    let mut out: Vec<LimitSnapshot> = Vec::new();
    q.snapshot(at, &mut out);
    out.iter()
        .find(|l| l.dimension == Dimension::Tokens)
        .expect("a token limit")
        .available
}

// proves: Q-15, GW-15, Q-9, Q-7 (a token bucket a reload added to a
// bucket scope, whose budget is a sliding window, and a call in flight at
// the reload that the provider counted after it: the budget takes the
// call as its own at the provider's instant and so does the bucket,
// which takes its estimate then, as the windows count it; a usage below
// the estimate or a refusal that charged nothing then gives back only
// what it took. Spent by another call, the bucket had 10 tokens
// available after the first call's usage of 0 or free refusal, never
// taken: 10 more than its rate allows; now 0)
#[test]
fn an_added_bucket_gives_back_only_what_it_took_of_a_call_from_before_it() {
    use tollgate::quota::Actual;
    let t0 = Instant::now();
    let old = ScopeConfig::new("m")
        .requests(100, s(60))
        .cost(1_000, s(60))
        .algorithm(Algorithm::TokenBucket { burst: None });
    let new = old.clone().tokens(100, s(60));
    let ms = Duration::from_millis;
    for refused in [false, true] {
        let mut q = LocalQuota::new(&old, t0);
        let t = t0 + s(10);
        // E in flight: 10 tokens estimated, its budget 10.
        let mut e = q
            .reserve(&Demand::new(10, 0).with_cost(10), t, Hold::Leased)
            .unwrap();
        // The reload adds 100 tokens per minute (a bucket, full), which
        // another call spends at once.
        q.reconfigure(&new, t + s(1));
        q.reserve(&Demand::new(100, 0), t + s(1), Hold::Leased)
            .unwrap();
        // The provider counted E after the reload: the bucket takes it as
        // its own.
        q.recount(&mut e, t + s(1) + ms(1), t + s(1) + ms(1));
        if refused {
            q.release(&e, true, true, true);
        } else {
            q.reconcile(&e, &Actual::total(0));
        }
        // 2 ms of refill: 0.003 tokens.
        assert_eq!(
            tokens_available(&mut q, t + s(1) + ms(2)),
            0,
            "refused: {refused}: the bucket gave back 10 tokens it never took"
        );
    }
}

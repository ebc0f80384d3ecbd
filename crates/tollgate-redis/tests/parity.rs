//! One property suite for both stores (SPEC DQ-1, DQ-2, Q-1, Q-7): the
//! same random operation sequences, run against the in-process
//! `LocalQuota` and the Redis store at identical instants, give the same
//! admissions, the same waits (to the microsecond) and the same
//! availability, for each algorithm, with one limit and with several, with
//! input-token and output-token limits beside or instead of the token
//! limit (SPEC Q-12), with a cost limit (a budget, SPEC BUD-2) beside
//! them; and an independent log of what was admitted never exceeds the
//! Q-7 bound of any limit.
//! Windows that are not whole microseconds (the store rounds them up) are
//! run against Redis alone: the Q-7 bound of the configured window holds.

mod common;

use std::time::Duration;

use proptest::prelude::*;
use proptest::test_runner::TestCaseError;
use tollgate::clock::Instant;
use tollgate::config::{Algorithm, ScopeConfig};
use tollgate::quota::{
    Actual, Demand, Dimension, Hold, HoldId, LocalQuota, OpId, QuotaStore, RemoteHold, RemoteQuota,
    Reservation,
};
use tollgate_redis::{RawReserve, RedisBackend, RedisQuota};

use common::BUDGET;

/// What the suite exercised (printed, and checked to be non-trivial).
static STATS: [std::sync::atomic::AtomicU64; 4] =
    [const { std::sync::atomic::AtomicU64::new(0) }; 4];
const GRANTED: usize = 0;
const REFUSED_AT: usize = 1;
const REFUSED_NONE: usize = 2;
const MOVED: usize = 3;

fn count(i: usize) {
    STATS[i].fetch_add(1, std::sync::atomic::Ordering::Relaxed);
}

/// Windows are multiples of 512 µs, so both stores' slot spans agree.
const W: u64 = 512_000;
/// Store time of the first operation of every case.
const T0: u64 = 1_000_000;

#[derive(Debug, Clone)]
enum Op {
    Reserve {
        input: u64,
        output: u64,
        /// The worst-case cost (taken only by cost limits).
        cost: u64,
        pending: bool,
    },
    Lease(usize),
    Refund(usize),
    Reconcile {
        index: usize,
        input: u64,
        output: u64,
        /// The provider split its usage (else only the total is known).
        split: bool,
        /// The priced usage (`None`: unknown, the worst case stays).
        cost: Option<u64>,
    },
    Release {
        index: usize,
        requests: bool,
        tokens: bool,
    },
    Recount {
        index: usize,
        ago: u64,
    },
    Advance(u64),
    /// Sleep until the instant the last refusal gave, and try again.
    Retry,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0..25u64, 0..15u64, 0..30u64, any::<bool>())
            .prop_map(|(input, output, cost, pending)| Op::Reserve { input, output, cost, pending }),
        2 => any::<usize>().prop_map(Op::Lease),
        1 => any::<usize>().prop_map(Op::Refund),
        2 => (any::<usize>(), 0..40u64, 0..20u64, any::<bool>(), proptest::option::of(0..45u64))
            .prop_map(|(index, input, output, split, cost)| {
                Op::Reconcile { index, input, output, split, cost }
            }),
        1 => (any::<usize>(), any::<bool>(), any::<bool>())
            .prop_map(|(index, requests, tokens)| Op::Release { index, requests, tokens }),
        1 => (any::<usize>(), 0..3_000u64).prop_map(|(index, ago)| Op::Recount { index, ago }),
        3 => (0..3_000u64).prop_map(Op::Advance),
        1 => (W / 4..W).prop_map(Op::Advance),
        2 => Just(Op::Retry),
    ]
}

#[derive(Debug, Clone, Copy)]
struct Case {
    algorithm: Algorithm,
    several: bool,
    /// Reconciliations above the estimate allowed (debt).
    debt: bool,
    /// Windows 333 ns longer than whole microseconds: Redis alone.
    odd: bool,
    /// Which token dimensions are limited (SPEC Q-12): 0 tokens only,
    /// 1 tokens, input and output, 2 input and output only.
    dims: u8,
    /// A cost limit too (SPEC BUD-2).
    cost: bool,
}

fn case() -> impl Strategy<Value = Case> {
    (
        0..4u8,
        any::<bool>(),
        any::<bool>(),
        0..4u8,
        0..3u8,
        any::<bool>(),
    )
        .prop_map(|(a, several, debt, odd, dims, cost)| Case {
            algorithm: match a {
                0 => Algorithm::SlidingWindow,
                1 => Algorithm::FixedWindow,
                2 => Algorithm::TokenBucket { burst: None },
                _ => Algorithm::TokenBucket {
                    burst: Some(Duration::from_micros(W / 4)),
                },
            },
            several,
            debt,
            odd: odd == 0,
            dims,
            cost,
        })
}

fn scope(name: &str, case: Case) -> ScopeConfig {
    let w = Duration::from_nanos(W * 1_000 + if case.odd { 333 } else { 0 });
    let mut s = ScopeConfig::new(name)
        .algorithm(case.algorithm)
        .requests(4, w);
    if case.dims < 2 {
        s = s.tokens(60, w);
    }
    if case.dims > 0 {
        s = s.input_tokens(40, w).output_tokens(25, w);
    }
    if case.cost {
        s = s.cost(50, w);
    }
    if case.several {
        s = s.requests(7, 2 * w);
        if case.cost {
            s = s.cost(90, 3 * w);
        }
        if case.dims < 2 {
            s = s.tokens(100, 3 * w);
        }
        if case.dims > 0 {
            s = s.input_tokens(70, 2 * w).output_tokens(45, 3 * w);
        }
    }
    s
}

/// One admitted reservation, as both stores and the log know it.
#[derive(Debug, Clone)]
struct Entry {
    local: Reservation,
    remote: Reservation,
    /// What it counts now per dimension, in the order of
    /// `Dimension::ALL` (the log's own view).
    counts: Counts,
    /// Store µs at which the attempt started (None: pending).
    start: Option<u64>,
    /// Reconciled or released: settled, only counted.
    settled: bool,
    /// A pending hold's name in Redis.
    id: Option<HoldId>,
}

/// What was taken from and given back to a limit, and when (the log).
#[derive(Debug, Default)]
struct Flow {
    /// Bucket only: (instant, amount) taken at an attempt's start.
    takes: Vec<(u64, u64)>,
    /// Bucket only: (instant, amount) given back.
    gives: Vec<(u64, u64)>,
}

struct Harness<'a> {
    case: Case,
    config: ScopeConfig,
    /// `None` with odd windows: Redis alone.
    local: Option<LocalQuota>,
    remote: &'a RedisQuota,
    /// Each limit's capacity, as the in-process store computes it.
    capacity: Vec<u64>,
    epoch: Instant,
    now: u64,
    entries: Vec<Entry>,
    flows: Vec<Flow>,
    /// The last refusal with an instant: demand, pending, wait (µs).
    refused: Option<(Demand, bool, u64)>,
    biggest: u64,
}

/// Amounts per dimension, in the order of `Dimension::ALL`.
type Counts = [u64; 5];

fn ix(d: Dimension) -> usize {
    Dimension::ALL
        .iter()
        .position(|x| *x == d)
        .expect("every dimension")
}

fn counts(demand: &Demand) -> Counts {
    Dimension::ALL.map(|d| demand.amount(d))
}

impl Harness<'_> {
    fn instant(&self) -> Instant {
        self.epoch + Duration::from_micros(self.now)
    }

    fn pick(&self, i: usize, want: impl Fn(&Entry) -> bool) -> Option<usize> {
        common::pick(&self.entries, i, want)
    }

    fn at(&self) {
        self.remote.set_store_time(Some(T0 + self.now));
    }

    /// Reserves `demand` now; on a refusal, remembers it for `Retry`.
    async fn reserve(&mut self, demand: Demand, pending: bool) -> Result<(), TestCaseError> {
        let now = self.instant();
        if self.remote.check(&demand).is_err() {
            return Ok(());
        }
        let hold = if pending { Hold::Pending } else { Hold::Leased };
        // Holds outlive every case: the in-process store has no expiry
        // (tests/store.rs proves the expiry on its own).
        let id = pending.then(HoldId::new);
        let remote_hold = match id {
            Some(id) => RemoteHold::Pending {
                id,
                ttl: Duration::from_secs(3_600),
            },
            None => RemoteHold::Leased,
        };
        let local = self.local.as_mut().map(|l| l.reserve(&demand, now, hold));
        let raw = self
            .remote
            .reserve_raw(demand, remote_hold, BUDGET)
            .await
            .map_err(common::fail)?;
        match (local, raw) {
            (Some(Ok(_)) | None, RawReserve::Granted { tick, tag }) => {
                prop_assert_eq!(tick, self.now, "store instant");
                count(GRANTED);
                self.bound_holds(&demand)?;
                let remote = Reservation {
                    stamp: now,
                    tick,
                    demand,
                    hold,
                    seq: tag,
                };
                let start = (!pending).then_some(self.now);
                if let Some(t) = start {
                    self.take(t, counts(&demand));
                }
                let local = match local {
                    Some(Ok(local)) => local,
                    _ => remote,
                };
                self.entries.push(Entry {
                    local,
                    remote,
                    counts: counts(&demand),
                    start,
                    settled: false,
                    id,
                });
            }
            (local @ (Some(Err(_)) | None), RawReserve::Refused { wait, limited_by }) => {
                if let Some(Err(local)) = local {
                    prop_assert_eq!(local.limited_by, limited_by);
                    let local_wait = local.at.map(|at| {
                        (at.saturating_duration_since(now).as_nanos()).div_ceil(1_000) as u64
                    });
                    prop_assert_eq!(local_wait, wait, "wait");
                }
                count(if wait.is_some() {
                    REFUSED_AT
                } else {
                    REFUSED_NONE
                });
                self.refused = wait.map(|w| (demand, pending, w));
            }
            (local, raw) => {
                prop_assert!(false, "stores disagree: local {:?}, redis {:?}", local, raw)
            }
        }
        Ok(())
    }

    async fn step(&mut self, op: Op) -> Result<(), TestCaseError> {
        self.at();
        let now = self.instant();
        match op {
            Op::Advance(dt) => self.now += dt,
            Op::Reserve {
                input,
                output,
                cost,
                pending,
            } => {
                let demand = Demand::new(input, output).with_cost(cost);
                self.reserve(demand, pending).await?;
            }
            Op::Retry => {
                // A waiter wakes at the instant it was told and tries
                // again: boundaries are hit exactly.
                if let Some((demand, pending, wait)) = self.refused.take() {
                    self.now += wait;
                    self.at();
                    self.reserve(demand, pending).await?;
                }
            }
            Op::Lease(i) => {
                let Some(k) = self.pick(i, |e| e.start.is_none()) else {
                    return Ok(());
                };
                let e = &mut self.entries[k];
                if let Some(l) = &mut self.local {
                    l.lease(&mut e.local, now);
                }
                let id = e.id.take().expect("a pending entry has a name");
                let leased = self.remote.lease(e.remote, id, BUDGET).await;
                e.remote = leased.map_err(common::fail)?.expect("the hold is there");
                prop_assert_eq!(e.remote.tick, self.now);
                e.start = Some(self.now);
                let c = e.counts;
                self.take(self.now, c);
            }
            Op::Refund(i) => {
                let Some(k) = self.pick(i, |e| !e.settled) else {
                    return Ok(());
                };
                let e = self.entries.remove(k);
                if let Some(l) = &mut self.local {
                    l.refund(&e.local, now);
                }
                match e.id {
                    Some(id) => {
                        let found = self.remote.forget(id, BUDGET).await.map_err(common::fail)?;
                        prop_assert!(found, "the hold is there");
                    }
                    None => self
                        .remote
                        .refund(e.remote, OpId::new(), BUDGET)
                        .await
                        .map_err(common::fail)?,
                }
                if e.start.is_some() {
                    self.give(e.counts);
                }
            }
            Op::Reconcile {
                index,
                input,
                output,
                split,
                cost,
            } => {
                let Some(k) = self.pick(index, |e| e.start.is_some() && !e.settled) else {
                    return Ok(());
                };
                let estimate = self.entries[k].local.demand;
                let (input, output, cost) = if self.case.debt {
                    (input, output, cost)
                } else {
                    (
                        input.min(estimate.input),
                        output.min(estimate.output),
                        cost.map(|c| c.min(estimate.cost)),
                    )
                };
                // A provider that reports only a total leaves the input
                // and output limits at their estimates (SPEC Q-12).
                let mut actual = if split {
                    Actual::split(input, output)
                } else {
                    Actual::total(input + output)
                };
                if let Some(cost) = cost {
                    actual = actual.with_cost(cost);
                }
                let e = &mut self.entries[k];
                if let Some(l) = &mut self.local {
                    l.reconcile(&e.local, &actual);
                }
                self.remote
                    .reconcile(e.remote, actual, OpId::new(), BUDGET)
                    .await
                    .map_err(common::fail)?;
                let before = e.counts;
                for d in Dimension::ALL {
                    if let Some(used) = actual.amount(d, &estimate) {
                        e.counts[ix(d)] = used;
                    }
                }
                let given = std::array::from_fn(|i| before[i].saturating_sub(e.counts[i]));
                e.settled = true;
                self.give(given);
            }
            Op::Release {
                index,
                requests,
                tokens,
            } => {
                let Some(k) = self.pick(index, |e| e.start.is_some() && !e.settled) else {
                    return Ok(());
                };
                let e = &mut self.entries[k];
                if let Some(l) = &mut self.local {
                    // The cost always goes back (SPEC BUD-5), as
                    // `Lease::refused` asks of both stores.
                    l.release(&e.local, requests, tokens, true);
                }
                self.remote
                    .release(e.remote, requests, tokens, OpId::new(), BUDGET)
                    .await
                    .map_err(common::fail)?;
                let given: Counts = std::array::from_fn(|i| {
                    let chosen = match Dimension::ALL[i] {
                        Dimension::Requests => requests,
                        Dimension::Cost => true,
                        _ => tokens,
                    };
                    if chosen { e.counts[i] } else { 0 }
                });
                for (c, g) in e.counts.iter_mut().zip(given) {
                    *c -= g;
                }
                e.settled = true;
                self.give(given);
            }
            Op::Recount { index, ago } => {
                let Some(k) = self.pick(index, |e| e.start.is_some() && !e.settled) else {
                    return Ok(());
                };
                let ago = ago.min(self.now);
                let at = now - Duration::from_micros(ago);
                let e = &mut self.entries[k];
                let exact = self.local.is_some();
                if let Some(l) = &mut self.local {
                    l.recount(&mut e.local, at, now);
                }
                e.remote = self
                    .remote
                    .recount(e.remote, Duration::from_micros(ago), OpId::new(), BUDGET)
                    .await
                    .map_err(common::fail)?;
                if exact {
                    prop_assert_eq!(e.local.tick, e.remote.tick * 1_000, "recounted stamp");
                }
                if Some(e.remote.tick) != e.start {
                    count(MOVED);
                }
                e.start = Some(e.remote.tick);
            }
        }
        self.same_availability().await
    }

    /// Both stores see the same availability in every limit.
    async fn same_availability(&mut self) -> Result<(), TestCaseError> {
        self.at();
        let remote = self.remote.snapshot(BUDGET).await.map_err(common::fail)?;
        let now = self.instant();
        let Some(store) = &mut self.local else {
            return Ok(());
        };
        let mut local = Vec::new();
        store.snapshot(now, &mut local);
        let view = |v: &[tollgate::LimitSnapshot]| -> Vec<(i64, u64)> {
            v.iter().map(|s| (s.available, s.capacity)).collect()
        };
        prop_assert_eq!(view(&local), view(&remote), "availability at {}", self.now);
        Ok(())
    }

    fn take(&mut self, at: u64, counts: Counts) {
        for (l, flow) in self.config.limits().iter().zip(&mut self.flows) {
            let a = counts[ix(l.dimension)];
            self.biggest = self.biggest.max(a);
            flow.takes.push((at, a));
        }
    }

    fn give(&mut self, counts: Counts) {
        for (l, flow) in self.config.limits().iter().zip(&mut self.flows) {
            flow.gives.push((self.now, counts[ix(l.dimension)]));
        }
    }

    /// SPEC Q-7, judged from the log alone, at the instant `demand` was
    /// admitted (it is not yet in the log).
    fn bound_holds(&self, demand: &Demand) -> Result<(), TestCaseError> {
        let now = self.now;
        for (i, l) in self.config.limits().iter().enumerate() {
            // Counted at `now` when started less than one configured
            // window before (in ns: the window need not be whole µs).
            let w_ns = l.window.as_nanos();
            let within = |start: u64| u128::from(now - start) * 1_000 < w_ns;
            let new = demand.amount(l.dimension);
            if new == 0 {
                // Nothing admitted in this limit (nothing always fits,
                // even in debt).
                continue;
            }
            let counted = |e: &Entry| e.counts[ix(l.dimension)];
            let pending: u64 = self
                .entries
                .iter()
                .filter(|e| e.start.is_none())
                .map(counted)
                .sum();
            match self.case.algorithm {
                Algorithm::SlidingWindow => {
                    // Every interval of one window ending now.
                    let live: u64 = self
                        .entries
                        .iter()
                        .filter(|e| e.start.is_some_and(within))
                        .map(counted)
                        .sum();
                    prop_assert!(
                        live + pending + new <= l.amount,
                        "sliding window over its limit at {now}: {live} + {pending} + {new} > {}",
                        l.amount
                    );
                }
                Algorithm::FixedWindow => {
                    // The store's own windows (rounded up to whole µs).
                    let w = w_ns.div_ceil(1_000) as u64;
                    let live: u64 = self
                        .entries
                        .iter()
                        .filter(|e| e.start.is_some_and(|s| s / w == now / w))
                        .map(counted)
                        .sum();
                    prop_assert!(
                        live + pending + new <= l.amount,
                        "fixed window over its limit at {now}"
                    );
                }
                Algorithm::TokenBucket { .. } if !self.case.debt => {
                    // Started in the window ending now (this one included)
                    // at most max(C, E_max) + limit, plus what was given
                    // back in it.
                    let c = self.capacity[i];
                    let flow = &self.flows[i];
                    let inside = |v: &[(u64, u64)]| -> u64 {
                        v.iter().filter(|(t, _)| within(*t)).map(|(_, a)| a).sum()
                    };
                    let started = inside(&flow.takes) + new;
                    let bound = c.max(self.biggest.max(new)) + l.amount + inside(&flow.gives);
                    prop_assert!(
                        started <= bound,
                        "bucket over its bound at {now}: {started} > {bound}"
                    );
                }
                Algorithm::TokenBucket { .. } => {}
            }
        }
        Ok(())
    }
}

async fn run_case(backend: &RedisBackend, case: Case, ops: Vec<Op>) -> Result<(), TestCaseError> {
    let config = scope(&common::unique("parity"), case);
    let remote = backend.open_scope(&config);
    let epoch = Instant::now();
    let flows = config.limits().iter().map(|_| Flow::default()).collect();
    let local = LocalQuota::new(&config, epoch);
    let mut snapshot = Vec::new();
    local.clone().snapshot(epoch, &mut snapshot);
    let mut h = Harness {
        case,
        local: (!case.odd).then_some(local),
        capacity: snapshot.iter().map(|s| s.capacity).collect(),
        config,
        remote: &remote,
        epoch,
        now: 0,
        entries: Vec::new(),
        flows,
        refused: None,
        biggest: 0,
    };
    // The first operation sets the store's epoch: both start at 0.
    h.same_availability().await?;
    for op in ops {
        h.step(op).await?;
    }
    Ok(())
}

// proves: DQ-1, DQ-2, Q-1, Q-7, Q-12 (the Redis scripts admit, refuse,
// wait, settle and count exactly as the in-process store, for every
// algorithm, with one limit and with several, with input and output token
// limits beside or instead of the token limit, settled from a split or a
// total-only report; the admitted log never exceeds the Q-7 bound of any
// limit)
// proves: BUD-2 (the same with cost limits: the worst case taken all or
// none with the other dimensions, a budget named as the short dimension,
// settled to the priced usage or kept when it is unknown, given back for
// a refused attempt)
#[test]
fn redis_store_matches_the_in_process_store() {
    let Some(server) = common::server("redis_store_matches_the_in_process_store") else {
        return;
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let backend = rt.block_on(async { common::backend(&server, "parity") });
    let mut runner = common::runner(file!(), 256);
    let strategy = (case(), proptest::collection::vec(op(), 1..80));
    let result = runner.run(&strategy, |(case, ops)| {
        rt.block_on(run_case(&backend, case, ops))
    });
    if let Err(e) = result {
        panic!("{e}");
    }
    let stats: Vec<u64> = STATS
        .iter()
        .map(|s| s.load(std::sync::atomic::Ordering::Relaxed))
        .collect();
    eprintln!(
        "parity: granted {}, refused with an instant {}, refused until a lease {}, recounts moved {}",
        stats[0], stats[1], stats[2], stats[3]
    );
    assert!(
        stats.iter().all(|&n| n > 0),
        "every outcome exercised: {stats:?}"
    );
}

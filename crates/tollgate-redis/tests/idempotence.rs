//! Operations retried after an unknown outcome (SPEC DQ-6): every script
//! that changes a scope, run twice in a row under one name (as a retry
//! after a lost answer, or a client's resend after a dropped connection,
//! runs it), leaves Redis exactly as running it once does.

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use proptest::prelude::*;
use proptest::test_runner::TestCaseError;
use tollgate::config::{Algorithm, ScopeConfig};
use tollgate::quota::{
    Actual, BudgetReport, Demand, Dimension, ForeignSettlement, HoldId, OpId, RemoteHold,
    RemoteQuota, Reservation,
};
use tollgate_redis::{RedisBackend, RedisQuota, RedisServer};

use common::BUDGET;

// proves: DQ-6 (the reproduction: a reconciliation sent a second
// time under its name, as the engine's retry after a lost answer sends it,
// gives nothing back twice: availability stays 6,700 of 10,000 instead of
// un-counting the reservation's real usage and its neighbour's)
#[tokio::test]
async fn a_reconcile_run_twice_gives_back_once() {
    let Some(server) = common::server("a_reconcile_run_twice_gives_back_once") else {
        return;
    };
    let config = ScopeConfig::new(common::unique("twice")).tokens(10_000, Duration::from_secs(60));
    let store = common::backend(&server, "twice").open_scope(&config);
    // Both at one store instant: one slot of the log holds both.
    store.set_store_time(Some(1_000_000));
    let reserve = |tokens| store.reserve(Demand::new(tokens, 0), RemoteHold::Leased, BUDGET);
    let ours = reserve(5_000).await.unwrap().unwrap();
    reserve(1_600).await.unwrap().unwrap();
    let available = || async { store.snapshot(BUDGET).await.unwrap()[0].available };
    assert_eq!(available().await, 3_400);
    let op = OpId::new();
    store
        .reconcile(ours, Actual::total(1_700), op, BUDGET)
        .await
        .unwrap();
    assert_eq!(available().await, 6_700);
    // The retry.
    store
        .reconcile(ours, Actual::total(1_700), op, BUDGET)
        .await
        .unwrap();
    assert_eq!(available().await, 6_700, "given back twice");
}

/// Windows are multiples of 512 µs (whole slots).
const W: u64 = 512_000;
/// Store time of the first operation of every case.
const T0: u64 = 1_000_000;

#[derive(Debug, Clone)]
enum Op {
    Reserve {
        tokens: u64,
        pending: bool,
    },
    Lease(usize),
    Forget(usize),
    Refund(usize),
    Reconcile {
        index: usize,
        actual: u64,
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
    Observe {
        index: usize,
        requests: u64,
        tokens: u64,
        ago: u64,
        reset: u64,
    },
    Cool {
        index: usize,
        length: u64,
    },
    /// A settlement of a call in flight at a reload, in limits an
    /// earlier handle (naming none of this one's) did not count it in:
    /// its debt, a recount, a move, a usage or a refusal (`kind`).
    Foreign {
        index: usize,
        actual: u64,
        kind: u8,
    },
    Advance(u64),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0..30u64, any::<bool>()).prop_map(|(tokens, pending)| Op::Reserve { tokens, pending }),
        2 => any::<usize>().prop_map(Op::Lease),
        1 => any::<usize>().prop_map(Op::Forget),
        1 => any::<usize>().prop_map(Op::Refund),
        3 => (any::<usize>(), 0..45u64).prop_map(|(index, actual)| Op::Reconcile { index, actual }),
        1 => (any::<usize>(), any::<bool>(), any::<bool>())
            .prop_map(|(index, requests, tokens)| Op::Release { index, requests, tokens }),
        1 => (any::<usize>(), 0..3_000u64).prop_map(|(index, ago)| Op::Recount { index, ago }),
        2 => (any::<usize>(), 0..5u64, 0..61u64, 0..3_000u64, 0..W)
            .prop_map(|(index, requests, tokens, ago, reset)| Op::Observe { index, requests, tokens, ago, reset }),
        1 => (any::<usize>(), 0..W).prop_map(|(index, length)| Op::Cool { index, length }),
        2 => (any::<usize>(), 0..60u64, 0..5u8)
            .prop_map(|(index, actual, kind)| Op::Foreign { index, actual, kind }),
        3 => (0..W / 2).prop_map(Op::Advance),
    ]
}

fn algorithm() -> impl Strategy<Value = Algorithm> {
    prop_oneof![
        Just(Algorithm::SlidingWindow),
        Just(Algorithm::TokenBucket { burst: None }),
        Just(Algorithm::FixedWindow),
    ]
}

fn config(name: &str, algorithm: Algorithm, several: bool) -> ScopeConfig {
    let w = Duration::from_micros(W);
    let mut s = ScopeConfig::new(name)
        .algorithm(algorithm)
        .requests(4, w)
        .tokens(60, w);
    if several {
        s = s.requests(7, 2 * w).tokens(100, 3 * w);
    }
    s
}

/// One reservation, as the scope run once (`once`) and the scope run
/// twice (`twice`) granted it.
#[derive(Debug, Clone)]
struct Entry {
    once: Reservation,
    twice: Reservation,
    /// A pending hold's name (the same in both scopes), until leased.
    id: Option<HoldId>,
    settled: bool,
}

/// Everything Redis holds for `store`'s scope, keyed by the key's name
/// without the scope's tag; the operations' markers (named at random) by
/// their answers.
async fn dump(
    raw: &mut redis::aio::MultiplexedConnection,
    store: &RedisQuota,
) -> BTreeMap<String, Vec<String>> {
    let meta = &store.keys()[0];
    let tag = &meta[..meta.len() - ":meta".len()];
    let names: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{}*", escape(tag)))
        .query_async(raw)
        .await
        .unwrap();
    let mut out = BTreeMap::new();
    let mut markers = Vec::new();
    for name in names {
        let kind: String = redis::cmd("TYPE")
            .arg(&name)
            .query_async(raw)
            .await
            .unwrap();
        let mut value: Vec<Vec<u8>> = match kind.as_str() {
            // The epoch, latest instant and cooldown; not when every key expires
            // (Redis's wall clock when each scope wrote it).
            "string" if name.ends_with(":meta") => {
                let m: Vec<i64> = redis::cmd("EVAL")
                    .arg(
                        "local m = cmsgpack.unpack(redis.call('GET', KEYS[1])) return {m[1], m[2], m[4] or -1, m[5] or -1}",
                    )
                    .arg(1)
                    .arg(&name)
                    .query_async(raw)
                    .await
                    .unwrap();
                vec![format!("{m:?}").into_bytes()]
            }
            "string" => vec![redis::cmd("GET").arg(&name).query_async(raw).await.unwrap()],
            "list" => redis::cmd("LRANGE")
                .arg(&name)
                .arg(0)
                .arg(-1)
                .query_async(raw)
                .await
                .unwrap(),
            "hash" => redis::cmd("HGETALL")
                .arg(&name)
                .query_async(raw)
                .await
                .unwrap(),
            "zset" => redis::cmd("ZRANGE")
                .arg(&name)
                .arg(0)
                .arg(-1)
                .arg("WITHSCORES")
                .query_async(raw)
                .await
                .unwrap(),
            other => panic!("{name}: unexpected type {other}"),
        };
        if kind == "hash" {
            // Field order is not part of the state.
            let mut pairs: Vec<Vec<u8>> = value.chunks(2).map(|p| p.concat()).collect();
            pairs.sort();
            value = pairs;
        }
        let value: Vec<String> = value.iter().map(|v| format!("{v:?}")).collect();
        let short = name[tag.len()..].to_owned();
        if short.starts_with(":op:") {
            markers.extend(value);
        } else {
            out.insert(short, value);
        }
    }
    markers.sort();
    out.insert(":op:*".to_owned(), markers);
    out
}

/// `s` with Redis glob characters escaped.
fn escape(s: &str) -> String {
    let mut out = String::new();
    for c in s.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

struct Harness<'a> {
    once: &'a RedisQuota,
    twice: &'a RedisQuota,
    raw: redis::aio::MultiplexedConnection,
    now: u64,
    entries: Vec<Entry>,
}

impl Harness<'_> {
    fn at(&self) {
        self.once.set_store_time(Some(T0 + self.now));
        self.twice.set_store_time(Some(T0 + self.now));
    }

    fn pick(&self, i: usize, want: impl Fn(&Entry) -> bool) -> Option<usize> {
        common::pick(&self.entries, i, want)
    }

    async fn step(&mut self, op: Op) -> Result<(), TestCaseError> {
        self.at();
        let (once, twice) = (self.once, self.twice);
        match op {
            Op::Advance(dt) => self.now += dt,
            Op::Reserve { tokens, pending } => {
                let demand = Demand::new(tokens, 0);
                let id = pending.then(HoldId::new);
                let hold = match id {
                    Some(id) => RemoteHold::Pending {
                        id,
                        ttl: Duration::from_secs(3_600),
                    },
                    None => RemoteHold::Leased,
                };
                let a = once
                    .reserve(demand, hold, BUDGET)
                    .await
                    .map_err(common::fail)?;
                let b = twice
                    .reserve(demand, hold, BUDGET)
                    .await
                    .map_err(common::fail)?;
                match (a, b) {
                    (Ok(once), Ok(twice)) => {
                        prop_assert_eq!((once.tick, once.seq), (twice.tick, twice.seq));
                        self.entries.push(Entry {
                            once,
                            twice,
                            id,
                            settled: false,
                        });
                    }
                    (Err(a), Err(b)) => prop_assert_eq!(a.limited_by, b.limited_by),
                    (a, b) => prop_assert!(false, "once {:?}, twice {:?}", a, b),
                }
            }
            Op::Lease(i) => {
                let Some(k) = self.pick(i, |e| e.id.is_some()) else {
                    return Ok(());
                };
                let e = &mut self.entries[k];
                let id = e.id.take().expect("pending");
                let a = once.lease(e.once, id, BUDGET).await.map_err(common::fail)?;
                let b = twice
                    .lease(e.twice, id, BUDGET)
                    .await
                    .map_err(common::fail)?;
                let (Some(a), Some(b)) = (a, b) else {
                    prop_assert!(false, "a live hold was not leased");
                    return Ok(());
                };
                prop_assert_eq!(a.tick, b.tick);
                (e.once, e.twice) = (a, b);
            }
            Op::Forget(i) => {
                let Some(k) = self.pick(i, |e| e.id.is_some()) else {
                    return Ok(());
                };
                let e = self.entries.remove(k);
                let id = e.id.expect("pending");
                prop_assert!(once.forget(id, BUDGET).await.map_err(common::fail)?);
                prop_assert!(twice.forget(id, BUDGET).await.map_err(common::fail)?);
            }
            Op::Refund(i) => {
                let Some(k) = self.pick(i, |e| e.id.is_none() && !e.settled) else {
                    return Ok(());
                };
                let e = self.entries.remove(k);
                once.refund(e.once, OpId::new(), BUDGET)
                    .await
                    .map_err(common::fail)?;
                twice
                    .refund(e.twice, OpId::new(), BUDGET)
                    .await
                    .map_err(common::fail)?;
            }
            Op::Reconcile { index, actual } => {
                let Some(k) = self.pick(index, |e| e.id.is_none() && !e.settled) else {
                    return Ok(());
                };
                let e = &mut self.entries[k];
                let actual = Actual::total(actual);
                once.reconcile(e.once, actual, OpId::new(), BUDGET)
                    .await
                    .map_err(common::fail)?;
                twice
                    .reconcile(e.twice, actual, OpId::new(), BUDGET)
                    .await
                    .map_err(common::fail)?;
                e.settled = true;
            }
            Op::Foreign {
                index,
                actual,
                kind,
            } => {
                let Some(k) = self.pick(index, |e| e.id.is_none()) else {
                    return Ok(());
                };
                let e = &self.entries[k];
                let settlement = |r: &Reservation| match kind {
                    0 => ForeignSettlement::Debt(Actual::total(actual)),
                    1 => ForeignSettlement::Recount {
                        adopts: actual % 2 == 0,
                    },
                    2 => ForeignSettlement::Move {
                        from: r.tick.saturating_sub(actual * 10),
                    },
                    3 => ForeignSettlement::Reconcile(Actual::total(actual)),
                    _ => ForeignSettlement::Release {
                        requests: actual % 2 == 0,
                        tokens: actual % 3 == 0,
                    },
                };
                let (a, b) = (settlement(&e.once), settlement(&e.twice));
                once.settle_foreign(Vec::new(), e.once, a, OpId::new(), BUDGET)
                    .await
                    .map_err(common::fail)?;
                twice
                    .settle_foreign(Vec::new(), e.twice, b, OpId::new(), BUDGET)
                    .await
                    .map_err(common::fail)?;
            }
            Op::Release {
                index,
                requests,
                tokens,
            } => {
                let Some(k) = self.pick(index, |e| e.id.is_none() && !e.settled) else {
                    return Ok(());
                };
                let e = &mut self.entries[k];
                once.release(e.once, requests, tokens, OpId::new(), BUDGET)
                    .await
                    .map_err(common::fail)?;
                twice
                    .release(e.twice, requests, tokens, OpId::new(), BUDGET)
                    .await
                    .map_err(common::fail)?;
                e.settled = true;
            }
            Op::Recount { index, ago } => {
                let Some(k) = self.pick(index, |e| e.id.is_none() && !e.settled) else {
                    return Ok(());
                };
                let e = &mut self.entries[k];
                let ago = Duration::from_micros(ago.min(self.now));
                e.once = once
                    .recount(e.once, ago, OpId::new(), BUDGET)
                    .await
                    .map_err(common::fail)?;
                e.twice = twice
                    .recount(e.twice, ago, OpId::new(), BUDGET)
                    .await
                    .map_err(common::fail)?;
                prop_assert_eq!(e.once.tick, e.twice.tick, "recounted stamp");
            }
            Op::Observe {
                index,
                requests,
                tokens,
                ago,
                reset,
            } => {
                let Some(k) = self.pick(index, |e| e.id.is_none()) else {
                    return Ok(());
                };
                let e = &self.entries[k];
                let report = |dimension, remaining| BudgetReport {
                    dimension,
                    limit: None,
                    remaining: Some(remaining),
                    reset: Some(Duration::from_micros(reset)),
                };
                let reports = vec![
                    report(Dimension::Requests, requests),
                    report(Dimension::Tokens, tokens),
                ];
                let ago = Duration::from_micros(ago.min(self.now));
                let a = once
                    .observe(reports.clone(), (e.once, e.once), ago, OpId::new(), BUDGET)
                    .await
                    .map_err(common::fail)?;
                let b = twice
                    .observe(reports, (e.twice, e.twice), ago, OpId::new(), BUDGET)
                    .await
                    .map_err(common::fail)?;
                prop_assert_eq!(a, b, "observed");
            }
            Op::Cool { index, length } => {
                let Some(k) = self.pick(index, |e| e.id.is_none()) else {
                    return Ok(());
                };
                let e = &self.entries[k];
                let length = Duration::from_micros(length);
                let a = once
                    .cool_down(e.once, length, OpId::new(), BUDGET)
                    .await
                    .map_err(common::fail)?;
                let b = twice
                    .cool_down(e.twice, length, OpId::new(), BUDGET)
                    .await
                    .map_err(common::fail)?;
                prop_assert_eq!(a, b, "cooldown");
            }
        }
        self.same_state().await
    }

    /// Both scopes hold the same: every key (and each operation's marker)
    /// and every limit's availability.
    async fn same_state(&mut self) -> Result<(), TestCaseError> {
        let a = dump(&mut self.raw, self.once).await;
        let b = dump(&mut self.raw, self.twice).await;
        prop_assert_eq!(a, b, "keys at {}", self.now);
        self.at();
        let view = |v: Vec<tollgate::LimitSnapshot>| -> Vec<i64> {
            v.iter().map(|s| s.available).collect()
        };
        let a = view(self.once.snapshot(BUDGET).await.map_err(common::fail)?);
        let b = view(self.twice.snapshot(BUDGET).await.map_err(common::fail)?);
        prop_assert_eq!(a, b, "availability at {}", self.now);
        Ok(())
    }
}

async fn run_case(
    server: &RedisServer,
    backend: &RedisBackend,
    (algorithm, several): (Algorithm, bool),
    ops: Vec<Op>,
) -> Result<(), TestCaseError> {
    let once = backend.open_scope(&config(&common::unique("once"), algorithm, several));
    let twice = backend.open_scope(&config(&common::unique("twice"), algorithm, several));
    // Both name every operation, as on a cluster; one runs each once.
    once.set_runs(1);
    twice.set_runs(2);
    let mut h = Harness {
        once: &once,
        twice: &twice,
        raw: common::raw(server).await,
        now: 0,
        entries: Vec::new(),
    };
    for op in ops {
        h.step(op).await?;
    }
    Ok(())
}

// proves: DQ-6 (for each algorithm, with one limit per dimension and with
// several: every operation's script run twice in a row under its name
// (reserve leased and pending, lease, forget, refund, reconcile, release,
// recount, the debt of a call in flight at a reload (GW-15), and DQ-9's
// observe and cooldown) leaves every key, every marker and every limit's availability
// exactly as running it once does, and answers the repeat as it answered
// the first run)
#[test]
fn every_operation_run_twice_changes_nothing_more() {
    let Some(server) = common::server("every_operation_run_twice_changes_nothing_more") else {
        return;
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let backend = rt.block_on(async { common::backend(&server, "twice") });
    let mut runner = common::runner(file!(), 32);
    let strategy = (
        (algorithm(), any::<bool>()),
        proptest::collection::vec(op(), 1..40),
    );
    let result = runner.run(&strategy, |(case, ops)| {
        rt.block_on(run_case(&server, &backend, case, ops))
    });
    if let Err(e) = result {
        panic!("{e}");
    }
}

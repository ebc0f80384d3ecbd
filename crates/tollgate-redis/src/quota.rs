//! [`RedisQuota`]: one scope's quota arithmetic in Redis.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

use redis::FromRedisValue;
use tokio::sync::Notify;
use tollgate::ExceedsLimit;
use tollgate::clock::Instant;
use tollgate::config::{Algorithm, ScopeConfig};
use tollgate::quota::{
    Actual, BudgetReport, Demand, Dimension, ForeignSettlement, Hold, HoldId, LimitSnapshot,
    LocalQuota, NotUntil, Observed, OpId, QuotaStore, RemoteHold, RemoteQuota, Reservation,
    StoreError, StoreFuture,
};

use crate::backend::Shared;
use crate::error::bounded;
use crate::keys::ScopeKeys;
use crate::limits::{Kind, LimitParams, MAX_EXACT, micros_down, micros_up, ttl_ms};
use crate::reply::{self, RawReserve};
use crate::scripts::Op;

/// No explicit store time: the scripts read Redis `TIME`.
const REDIS_TIME: u64 = u64::MAX;

/// The quota arithmetic of one scope, kept in Redis (SPEC DQ-1).
///
/// Every operation is one EVALSHA of its script: atomic across all
/// processes, on the store's clock (Redis `TIME`, SPEC DQ-5), bounded by
/// the budget it is given. The reservation's `tick` is the store's instant
/// in microseconds since the scope's epoch, its `seq` the epoch's tag (a
/// reservation granted before the scope's keys were lost settles nothing);
/// its `stamp` is the local instant at which the answer arrived.
///
/// Every operation that may reach Redis twice is named (SPEC DQ-6): a
/// settlement (which the engine retries) by the [`OpId`] its caller gives,
/// `forget` by one chosen per call, and on a cluster, whose client resends
/// a command after a dropped connection, `reserve` and `lease` too (a
/// single node's connection never resends, and the engine never retries
/// them: no marker on the hot path there). Its script records its answer
/// under that name (`{prefix:scope}:op:<id>`, kept a few minutes) and a
/// repeat of it returns that answer without changing anything.
///
/// A handle opened for other windows than the scope's previous handle in
/// this backend (a reload) carries the replaced limits along for one of
/// their windows and seeds the new ones from them (`carry.rs`).
#[derive(Debug)]
pub struct RedisQuota {
    shared: Arc<Shared>,
    keys: ScopeKeys,
    /// The scope's limits (the first `own`), then the transitional ones.
    limits: Vec<LimitParams>,
    own: usize,
    /// Until when each transitional limit is passed to the scripts.
    until: Vec<Instant>,
    /// Per limit of the scope's own: the limit (an index into `limits`:
    /// a kept one or a transitional one) its state is seeded from.
    sources: Vec<Option<usize>>,
    /// Per limit of the scope's own seeded from a replaced (transitional)
    /// limit: until when it counts at least what that one counts (the
    /// shorter of the two windows), so a key left from an earlier
    /// configuration, which missed what was admitted while no
    /// configuration had it, is not taken as seeded (see `common.lua`,
    /// Seeds).
    floor_until: Vec<Option<Instant>>,
    /// Whether a limit seeded from a kept one still waits for its first
    /// script: that one floors it to what its source counts, once (a key
    /// left from an earlier configuration is not taken as seeded), before
    /// this handle's first operation.
    floor_kept: AtomicBool,
    /// Whether a limit has a source and no script that seeds has run
    /// through this handle yet (see [`RemoteQuota::seed`]).
    unseeded: AtomicBool,
    algorithm: Algorithm,
    ttl_ms: u64,
    /// Judges `check` from the configuration, without a round trip.
    local: LocalQuota,
    notify: Arc<Notify>,
    /// An explicit store time for every script (tests only), or
    /// [`REDIS_TIME`].
    time: AtomicU64,
    /// How many times each script runs per operation (tests only: 1).
    runs: AtomicU32,
    /// Every operation is named, as on a cluster (tests only).
    name_all: AtomicBool,
}

impl RedisQuota {
    pub(crate) fn new(shared: Arc<Shared>, scope: &ScopeConfig, notify: Arc<Notify>) -> Self {
        let mut local = LocalQuota::new(scope, Instant::now());
        let (mut limits, algorithm) = LimitParams::of(scope, &mut local);
        let own = limits.len();
        let now = shared.settings.clock.now();
        let carried = shared.opened.open(scope.name(), &limits, now);
        // Indices into the new limits followed by the transitional ones:
        // `limits` below.
        let sources = carried.sources;
        let floor_until = sources
            .iter()
            .zip(&limits)
            .map(|(s, l)| {
                // A kept source seeds only (`common.lua`, Seeds).
                let source = &carried.transitional.get(s.filter(|&s| s >= own)? - own)?.0;
                now.checked_add(l.config_window.min(source.config_window))
            })
            .collect();
        let floor_kept = sources.iter().any(|s| s.is_some_and(|s| s < own));
        let unseeded = sources.iter().any(Option::is_some);
        let mut until = Vec::with_capacity(carried.transitional.len());
        for (params, end) in carried.transitional {
            limits.push(params);
            until.push(end);
        }
        let keys = ScopeKeys::new(&shared.settings.prefix, scope.name(), &limits);
        RedisQuota {
            ttl_ms: ttl_ms(&limits),
            shared,
            keys,
            limits,
            own,
            until,
            sources,
            floor_until,
            floor_kept: AtomicBool::new(floor_kept),
            unseeded: AtomicBool::new(unseeded),
            algorithm,
            local,
            notify,
            time: AtomicU64::new(REDIS_TIME),
            runs: AtomicU32::new(1),
            name_all: AtomicBool::new(false),
        }
    }

    /// The keys of this scope: the meta key, then each limit's state, slot
    /// log (only sliding windows write one), pending holds and their expiry
    /// instants.
    pub fn keys(&self) -> &[String] {
        &self.keys.keys
    }

    /// Runs the scripts at an explicit store time (microseconds on the
    /// store's clock) instead of Redis `TIME`; `None` goes back to `TIME`.
    /// For tests that drive this store and the in-process one at identical
    /// instants; never in production (it is not the shared clock).
    #[doc(hidden)]
    #[cfg(feature = "testing")]
    pub fn set_store_time(&self, micros: Option<u64>) {
        self.time
            .store(micros.unwrap_or(REDIS_TIME), Ordering::Relaxed);
    }

    /// Runs every script `runs` times in a row per operation, under one
    /// name (every operation named, as on a cluster), as a retry or a
    /// resend would (SPEC DQ-6); an answer of a repeat that differs from
    /// the first is an error. For tests of idempotence only.
    #[doc(hidden)]
    #[cfg(feature = "testing")]
    pub fn set_runs(&self, runs: u32) {
        self.runs.store(runs.max(1), Ordering::Relaxed);
        self.name_all.store(true, Ordering::Relaxed);
    }

    /// The name of a `reserve` or `lease`: only where a repeat can happen
    /// (see the type's notes).
    fn admission_name(&self) -> Option<OpId> {
        let repeated = self.shared.settings.cluster || self.name_all.load(Ordering::Relaxed);
        repeated.then(OpId::new)
    }

    /// The reserve script's answer in the store's units (tests compare it
    /// with the in-process store's).
    #[doc(hidden)]
    pub async fn reserve_raw(
        &self,
        demand: Demand,
        hold: RemoteHold,
        budget: Duration,
    ) -> Result<RawReserve, StoreError> {
        let extra = match hold {
            RemoteHold::Leased => vec!["l".to_owned()],
            RemoteHold::Pending { id, ttl } => {
                vec!["p".to_owned(), id.to_string(), num(micros_up(ttl))]
            }
        };
        let reply: Vec<i64> = self
            .run(
                Op::Reserve,
                |d| demand.amount(d),
                &extra,
                self.admission_name(),
                budget,
            )
            .await?;
        reply::reserve(&reply)
    }

    /// Runs `op`'s script with each limit's amount from `amount`, the
    /// operation's own arguments, and its marker when it is named.
    pub(crate) async fn run<T: FromRedisValue>(
        &self,
        op: Op,
        amount: impl Fn(Dimension) -> u64,
        extra: &[String],
        name: Option<OpId>,
        budget: Duration,
    ) -> Result<T, StoreError> {
        let mut budget = budget;
        if self.floor_kept.load(Ordering::Acquire) {
            // A snapshot always reads the clock and writes every state.
            // Both round trips share the operation's budget (SPEC DQ-5).
            let started = tokio::time::Instant::now();
            let _: redis::Value = self
                .run_on(&self.active(), Op::Snapshot, |_| 0, &[], None, budget)
                .await?;
            self.floor_kept.store(false, Ordering::Release);
            budget = budget.saturating_sub(started.elapsed());
        }
        self.run_on(&self.active(), op, amount, extra, name, budget)
            .await
    }

    /// [`run`](Self::run) with the limits `active` (indices into
    /// `limits`).
    async fn run_on<T: FromRedisValue>(
        &self,
        active: &[usize],
        op: Op,
        amount: impl Fn(Dimension) -> u64,
        extra: &[String],
        name: Option<OpId>,
        budget: Duration,
    ) -> Result<T, StoreError> {
        let mut args = Vec::with_capacity(4 + 8 * active.len() + extra.len());
        args.push(match self.time.load(Ordering::Relaxed) {
            REDIS_TIME => String::new(),
            t => t.to_string(),
        });
        args.push(self.ttl_ms.to_string());
        args.push(self.keys.channel.clone());
        args.push(active.len().to_string());
        for &i in active {
            let l = &self.limits[i];
            l.push_args(amount(l.dimension), self.source_arg(i, active), &mut args);
        }
        args.extend_from_slice(extra);
        let mut invocation = self.shared.scripts.get(op).prepare_invoke();
        invocation.key(&self.keys.keys[0]);
        for &i in active {
            for k in &self.keys.keys[1 + 4 * i..5 + 4 * i] {
                invocation.key(k);
            }
        }
        if let Some(name) = name {
            invocation.key(self.keys.marker(name));
        }
        for a in &args {
            invocation.arg(a);
        }
        let mut conn = self.shared.conn.clone();
        let first: redis::Value = bounded(budget, invocation.invoke_async(&mut conn)).await?;
        for _ in 1..self.runs.load(Ordering::Relaxed) {
            let again: redis::Value = bounded(budget, invocation.invoke_async(&mut conn)).await?;
            if again != first {
                return Err(crate::error::malformed("a repeat answered differently"));
            }
        }
        if op.seeds() {
            self.unseeded.store(false, Ordering::Release);
        }
        T::from_redis_value(first).map_err(|e| crate::error::malformed(&e.to_string()))
    }

    fn now(&self) -> Instant {
        self.shared.settings.clock.now()
    }

    /// Limit `i`'s source argument among the limits passed (`active`):
    /// its source's 1-based position there, plus [`FLOOR`] while that
    /// source also floors it; 0 for none; -1 for a transitional limit
    /// (`common.lua`, Seeds).
    fn source_arg(&self, i: usize, active: &[usize]) -> i64 {
        if i >= self.own {
            return -1;
        }
        let Some(source) = self.sources.get(i).copied().flatten() else {
            return 0;
        };
        let Some(at) = active.iter().position(|&a| a == source) else {
            return 0;
        };
        let floors = if source >= self.own {
            self.floor_until
                .get(i)
                .copied()
                .flatten()
                .is_some_and(|until| until > self.now())
        } else {
            self.floor_kept.load(Ordering::Acquire)
        };
        let at = i64::try_from(at + 1).unwrap_or(0);
        if floors { at + FLOOR } else { at }
    }

    /// The limits passed to the scripts now (indices into `limits`): the
    /// scope's own, then the transitional ones still in force.
    fn active(&self) -> Vec<usize> {
        let mut active: Vec<usize> = (0..self.own).collect();
        if !self.until.is_empty() {
            let now = self.now();
            active.extend(
                self.until
                    .iter()
                    .enumerate()
                    .filter(|&(_, &until)| until > now)
                    .map(|(k, _)| self.own + k),
            );
        }
        active
    }
}

/// `micros` after `at` (a wait or a move the store computed); an instant
/// beyond the clock's range is a malformed reply, not a panic.
pub(crate) fn later(at: Instant, micros: u64) -> Result<Instant, StoreError> {
    at.checked_add(Duration::from_micros(micros))
        .ok_or_else(|| crate::error::malformed("instant out of range"))
}

/// Added to a limit's source (1-based) while that source floors it.
const FLOOR: i64 = 1 << 20;

/// A store amount as a script argument.
pub(crate) fn num(v: u64) -> String {
    v.min(MAX_EXACT).to_string()
}

/// What `settlement` changes in limit `l` (one a reload added) for a
/// reservation of `demand`: the amount it counts at the reservation's
/// instant and the amount it counts there after (`debt.lua`), as the
/// in-process store's limits settle a reservation from before their
/// start (`LimitState::foreign`). A move changes neither: both are the
/// amount moved (none in a token bucket, which counts no instants; it
/// takes the estimate once, when it adopts the reservation,
/// `LimitState::adopt`).
fn foreign_change(l: &LimitParams, demand: &Demand, settlement: ForeignSettlement) -> (u64, u64) {
    let estimate = demand.amount(l.dimension);
    match settlement {
        // What it used beyond its estimate (an unknown cost keeps the
        // worst case: none).
        ForeignSettlement::Debt(actual) => {
            let used = actual.amount(l.dimension, demand);
            (0, used.map_or(0, |used| used.saturating_sub(estimate)))
        }
        // A token bucket counts a rate, not instants: the estimate once,
        // as its own, so that a usage below it or a refusal gives back
        // only what it took (SPEC ).
        ForeignSettlement::Recount { adopts } if l.kind == Kind::Bucket => {
            (0, if adopts { estimate } else { 0 })
        }
        ForeignSettlement::Move { .. } if l.kind == Kind::Bucket => (0, 0),
        ForeignSettlement::Recount { .. } => (0, estimate),
        ForeignSettlement::Move { .. } => (estimate, estimate),
        // Each token limit from its own figure (SPEC Q-12); an unknown
        // cost keeps the worst case.
        ForeignSettlement::Reconcile(actual) => (
            estimate,
            actual.amount(l.dimension, demand).unwrap_or(estimate),
        ),
        ForeignSettlement::Release { requests, tokens } => {
            // The cost always goes back (SPEC BUD-5).
            let chosen = match l.dimension {
                Dimension::Requests => requests,
                Dimension::Cost => true,
                _ => tokens,
            };
            if chosen { (estimate, 0) } else { (0, 0) }
        }
    }
}

impl RemoteQuota for RedisQuota {
    fn check(&self, demand: &Demand) -> Result<(), ExceedsLimit> {
        self.local.check(demand)
    }

    fn reserve(
        &self,
        demand: Demand,
        hold: RemoteHold,
        budget: Duration,
    ) -> StoreFuture<'_, Result<Result<Reservation, NotUntil>, StoreError>> {
        Box::pin(async move {
            let raw = self.reserve_raw(demand, hold, budget).await?;
            // Local instants are taken when the answer is here: a wait of
            // `d` from the store's now starts no earlier than that.
            let now = self.now();
            Ok(match raw {
                RawReserve::Granted { tick, tag } => Ok(Reservation {
                    stamp: now,
                    tick,
                    demand,
                    hold: hold.hold(),
                    seq: tag,
                }),
                RawReserve::Refused { wait, limited_by } => Err(NotUntil {
                    at: wait.map(|w| later(now, w)).transpose()?,
                    limited_by,
                }),
            })
        })
    }

    fn lease(
        &self,
        reservation: Reservation,
        id: HoldId,
        budget: Duration,
    ) -> StoreFuture<'_, Result<Option<Reservation>, StoreError>> {
        Box::pin(async move {
            if reservation.hold == Hold::Leased {
                return Ok(Some(reservation));
            }
            let demand = reservation.demand;
            // The amounts come from the hold itself.
            let answer: Vec<i64> = self
                .run(
                    Op::Lease,
                    |_| 0,
                    &[id.to_string()],
                    self.admission_name(),
                    budget,
                )
                .await?;
            let Some((tick, tag)) = reply::lease(&answer)? else {
                return Ok(None);
            };
            Ok(Some(Reservation {
                stamp: self.now(),
                tick,
                demand,
                hold: Hold::Leased,
                seq: tag,
            }))
        })
    }

    fn forget(&self, id: HoldId, budget: Duration) -> StoreFuture<'_, Result<bool, StoreError>> {
        Box::pin(async move {
            let found: i64 = self
                .run(
                    Op::Forget,
                    |_| 0,
                    &[id.to_string()],
                    Some(OpId::new()),
                    budget,
                )
                .await?;
            Ok(found == 1)
        })
    }

    fn refund(
        &self,
        reservation: Reservation,
        op: OpId,
        budget: Duration,
    ) -> StoreFuture<'_, Result<(), StoreError>> {
        Box::pin(async move {
            if reservation.hold == Hold::Pending {
                return Err(StoreError::Unavailable(
                    "a pending hold is given back by its id (forget)".into(),
                ));
            }
            let demand = reservation.demand;
            self.run::<i64>(
                Op::Refund,
                |d| demand.amount(d),
                &[num(reservation.tick), reservation.seq.to_string()],
                Some(op),
                budget,
            )
            .await
            .map(drop)
        })
    }

    fn reconcile(
        &self,
        reservation: Reservation,
        actual: Actual,
        op: OpId,
        budget: Duration,
    ) -> StoreFuture<'_, Result<(), StoreError>> {
        Box::pin(async move {
            let demand = reservation.demand;
            // Each limit's amount is its estimate; the script settles each
            // token limit from its own dimension's figure (SPEC Q-12) and
            // each cost limit from the priced usage, an unknown cost
            // keeping the worst case (SPEC BUD-2).
            let settled = |d: Dimension| actual.amount(d, &demand).unwrap_or(demand.amount(d));
            let dims = [
                Dimension::Tokens,
                Dimension::InputTokens,
                Dimension::OutputTokens,
                Dimension::Cost,
            ];
            if dims.iter().all(|&d| settled(d) == demand.amount(d)) {
                return Ok(());
            }
            let extra = [
                num(reservation.tick),
                num(settled(Dimension::Tokens)),
                num(settled(Dimension::InputTokens)),
                num(settled(Dimension::OutputTokens)),
                num(settled(Dimension::Cost)),
                reservation.seq.to_string(),
            ];
            self.run::<i64>(
                Op::Reconcile,
                |d| demand.amount(d),
                &extra,
                Some(op),
                budget,
            )
            .await
            .map(drop)
        })
    }

    fn release(
        &self,
        reservation: Reservation,
        requests: bool,
        tokens: bool,
        op: OpId,
        budget: Duration,
    ) -> StoreFuture<'_, Result<(), StoreError>> {
        Box::pin(async move {
            let demand = reservation.demand;
            if !requests && !tokens && demand.cost == 0 {
                return Ok(());
            }
            let amount = |d: Dimension| {
                // `tokens` stands for every token dimension (SPEC Q-16);
                // the cost always goes back (SPEC BUD-5).
                let chosen = match d {
                    Dimension::Requests => requests,
                    Dimension::Cost => true,
                    _ => tokens,
                };
                if chosen { demand.amount(d) } else { 0 }
            };
            let extra = [num(reservation.tick), reservation.seq.to_string()];
            self.run::<i64>(Op::Release, amount, &extra, Some(op), budget)
                .await
                .map(drop)
        })
    }

    fn limit_names(&self) -> Vec<String> {
        self.active()
            .into_iter()
            .map(|i| self.limits[i].key_suffix())
            .collect()
    }

    fn seed(&self, budget: Duration) -> StoreFuture<'_, Result<(), StoreError>> {
        Box::pin(async move {
            if !self.unseeded.load(Ordering::Acquire) {
                return Ok(());
            }
            // The first script's snapshot (see `run`): a kept source
            // floors the new limit there too.
            let _: redis::Value = self
                .run_on(&self.active(), Op::Snapshot, |_| 0, &[], None, budget)
                .await?;
            self.floor_kept.store(false, Ordering::Release);
            Ok(())
        })
    }

    fn settle_foreign(
        &self,
        earlier: Vec<String>,
        reservation: Reservation,
        settlement: ForeignSettlement,
        op: OpId,
        budget: Duration,
    ) -> StoreFuture<'_, Result<(), StoreError>> {
        Box::pin(async move {
            let changes: Vec<(u64, u64)> = self.limits[..self.own]
                .iter()
                .map(|l| {
                    if earlier.contains(&l.key_suffix()) {
                        (0, 0)
                    } else {
                        foreign_change(l, &reservation.demand, settlement)
                    }
                })
                .collect();
            // A move changes where an amount is counted, not how much.
            let moves = matches!(settlement, ForeignSettlement::Move { .. });
            if changes
                .iter()
                .all(|&(counted, to)| if moves { counted == 0 } else { counted == to })
            {
                return Ok(());
            }
            // Each limit's change, in the order of the scope's own limits
            // (the first passed to the scripts).
            let mut extra = Vec::with_capacity(3 + 2 * changes.len());
            extra.push(num(reservation.tick));
            extra.push(reservation.seq.to_string());
            extra.push(match settlement {
                ForeignSettlement::Move { from } => num(from),
                _ => "-1".to_owned(),
            });
            for (counted, to) in changes {
                extra.push(num(counted));
                extra.push(num(to));
            }
            self.run::<i64>(Op::Debt, |_| 0, &extra, Some(op), budget)
                .await
                .map(drop)
        })
    }

    fn recount(
        &self,
        reservation: Reservation,
        ago: Duration,
        op: OpId,
        budget: Duration,
    ) -> StoreFuture<'_, Result<Reservation, StoreError>> {
        Box::pin(async move {
            if reservation.hold != Hold::Leased {
                return Ok(reservation);
            }
            let demand = reservation.demand;
            // Rounded down: the instant is later, counted longer.
            let extra = [
                num(reservation.tick),
                num(micros_down(ago)),
                reservation.seq.to_string(),
            ];
            let moved: i64 = self
                .run(Op::Recount, |d| demand.amount(d), &extra, Some(op), budget)
                .await?;
            let moved = reply::instant(moved)?;
            if moved <= reservation.tick {
                return Ok(reservation);
            }
            Ok(Reservation {
                stamp: later(reservation.stamp, moved - reservation.tick)?,
                tick: moved,
                ..reservation
            })
        })
    }

    fn snapshot(
        &self,
        budget: Duration,
    ) -> StoreFuture<'_, Result<Vec<LimitSnapshot>, StoreError>> {
        Box::pin(async move {
            let active = self.active();
            let available: Vec<i64> = self
                .run_on(&active, Op::Snapshot, |_| 0, &[], None, budget)
                .await?;
            if available.len() != active.len() {
                return Err(crate::error::malformed("snapshot"));
            }
            Ok(active
                .iter()
                .map(|&i| &self.limits[i])
                .zip(available)
                .map(|(l, available)| LimitSnapshot {
                    dimension: l.dimension,
                    window: l.config_window,
                    calendar: None,
                    limit: l.limit,
                    capacity: l.capacity,
                    available,
                    algorithm: self.algorithm,
                })
                .collect())
        })
    }

    fn observe(
        &self,
        reports: Vec<BudgetReport>,
        answered: (Reservation, Reservation),
        ago: Duration,
        op: OpId,
        budget: Duration,
    ) -> StoreFuture<'_, Result<Vec<Observed>, StoreError>> {
        // From the lease's answer to the response (see `observe.lua`).
        let lead = self
            .now()
            .saturating_duration_since(answered.0.stamp)
            .saturating_sub(ago);
        Box::pin(self.observe_now(reports, answered, (ago, lead), op, budget))
    }

    fn cool_down(
        &self,
        answered: Reservation,
        length: Duration,
        op: OpId,
        budget: Duration,
    ) -> StoreFuture<'_, Result<Option<Duration>, StoreError>> {
        Box::pin(self.cool_down_now(answered, length, op, budget))
    }

    fn changes(&self) -> Option<Arc<Notify>> {
        Some(self.notify.clone())
    }
}

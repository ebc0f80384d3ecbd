//! TEST SUPPORT ONLY: an in-process stand-in for a shared quota store.
//!
//! `TestStore` plays the server several controllers ("replicas") share: the
//! quota of each scope is one `LocalQuota` behind a mutex, run on the
//! server's own clock (tokio's clock plus an offset, so the server's
//! instants never equal a replica's). Each replica reaches it through a
//! `TestBackend` whose calls are counted per operation. Faults are
//! injected on the server: latency, an outage that refuses at once or that
//! hangs until the operation's budget runs out.
//!
//! Every operation applies atomically at the end of its latency, and only
//! if that is within its budget, so an operation that fails never took
//! effect and one whose future is dropped before it answers did not either
//! (so a retried settlement never repeats one: its `OpId` is not needed).
//!
//! Beside the quota, an independent recorder keeps every attempt the store
//! admitted (server instant of its lease, request units, tokens as
//! settled), to check the rolling-window bound (SPEC Q-7, DQ-2) without
//! trusting the arithmetic under test. It is not a product feature: the
//! Redis store has tests of its own in `tollgate-redis`.
//!
//! # The server's clock (SPEC Q-13)
//!
//! Every operation reads the server's clock while it holds the scope's
//! lock and never goes back from the latest instant it handed the quota
//! (see [`ScopeServer::tick`]), so the recorder's instants are the quota's
//! own, in the order the quota saw them; `clock_mismatches` counts any
//! reservation the quota stamped elsewhere (none). Records are found by a
//! number of their own, which the store hands out as the reservation's
//! `seq` (the store's own number for it) and translates back to the
//! quota's, never by instant: several reservations may share one.
//!
//! Before, the clock was read before the lock, as the engine's callers do:
//! a thread that read it first and locked second handed the quota an
//! instant older than one it had seen. The quota counted that admission at
//! the newer instant (SPEC Q-13) while the recorder kept the older one, so
//! its window could hold an admission the quota had counted outside it
//! ("31 requests within 400ms ending at record 65 (limit 30)"). And
//! records were found by the quota's stamp: two reservations stamped at
//! one instant were confused, one record settled twice and the other kept
//! a request the quota had given back.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use parking_lot::Mutex;
use tokio::sync::Notify;
use tokio::time::Instant;
use tollgate::ExceedsLimit;
use tollgate::config::ScopeConfig;
use tollgate::quota::{
    Actual, BudgetReport, Demand, Hold, HoldId, LimitSnapshot, LimitedBy, LocalQuota, NotUntil,
    Observed, OpId, QuotaStore, RemoteBackend, RemoteHold, RemoteQuota, Reservation, StoreError,
    StoreFuture, Unavailable,
};

/// What the injected outage does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outage {
    /// The store answers.
    Up,
    /// Every operation fails at once (connection refused).
    Refuse,
    /// Every operation hangs until its budget runs out (a black hole).
    Hang,
}

/// One admitted attempt as the recorder saw it.
#[derive(Debug, Clone, Copy)]
pub struct Record {
    /// Server instant of its lease (`None` while pending).
    pub leased_at: Option<Instant>,
    /// The recorder's number for it (the `seq` the replicas see).
    id: u32,
    /// The quota's own `seq` for it.
    seq: u32,
    /// Request units counted.
    pub requests: u64,
    /// The estimate reserved.
    pub estimate: u64,
    /// Tokens reported, once reconciled.
    pub actual: Option<u64>,
    /// Tokens given back by a refusal.
    pub tokens_released: bool,
}

impl Record {
    /// Tokens this attempt charges, debt excluded (SPEC Q-7 counts debt
    /// as a loan the window pays back later, not as an admission).
    pub fn charged_tokens(&self) -> u64 {
        if self.tokens_released {
            return 0;
        }
        self.actual.map_or(self.estimate, |a| a.min(self.estimate))
    }
}

#[derive(Debug)]
struct ScopeServer {
    /// The instant the quota counts from (its epoch).
    epoch: Instant,
    /// The latest instant handed to the quota.
    latest: Instant,
    /// Reservations the quota stamped at another instant than the one
    /// it was handed (see [`TestStore::clock_mismatches`]).
    mismatches: u64,
    quota: LocalQuota,
    records: Vec<Record>,
    /// The number of the next record.
    next_id: u32,
    /// Pending holds by name, with their expiry (server clock); their
    /// reservation carries the record's number.
    holds: HashMap<HoldId, (Reservation, Instant)>,
    /// The scope's cooldown after a provider 429: (start, end), server
    /// clock (SPEC DQ-9).
    cooldown: Option<(Instant, Instant)>,
    /// The first answer of each named feedback operation (SPEC DQ-6).
    answered: HashMap<OpId, Answered>,
}

/// A named operation's first answer.
#[derive(Debug, Clone)]
enum Answered {
    Observed(Vec<Observed>),
    Cooled(Option<Duration>),
}

impl ScopeServer {
    fn new(scope: &ScopeConfig, now: Instant) -> Self {
        ScopeServer {
            epoch: now,
            latest: now,
            mismatches: 0,
            quota: LocalQuota::new(scope, now),
            records: Vec::new(),
            next_id: 1,
            holds: HashMap::new(),
            cooldown: None,
            answered: HashMap::new(),
        }
    }

    /// The instant of an operation, from `clock` read under the scope's
    /// lock: never before the latest one (the rule the quota applies
    /// itself, SPEC Q-13, here applied where the recorder sees it).
    fn tick(&mut self, clock: Instant) -> Instant {
        self.latest = self.latest.max(clock);
        self.latest
    }

    /// Checks that the quota stamped a reservation at `now` itself: its
    /// `tick` is the nanoseconds since the epoch of the instant it was
    /// handed (the in-process quota's encoding), so the recorder's instant
    /// is the quota's.
    fn stamped(&mut self, tick: u64, now: Instant) {
        if u128::from(tick) != (now - self.epoch).as_nanos() {
            self.mismatches += 1;
        }
    }

    /// Records a reservation the quota granted at `now`; returns it as
    /// the replica sees it (the record's number as its `seq`).
    fn admit(&mut self, r: Reservation, now: Instant) -> Reservation {
        self.stamped(r.tick, now);
        let id = self.next_id;
        self.next_id += 1;
        self.records.push(Record {
            leased_at: (r.hold == Hold::Leased).then_some(now),
            id,
            seq: r.seq,
            requests: r.demand.requests,
            estimate: r.demand.tokens(),
            actual: None,
            tokens_released: false,
        });
        Reservation { seq: id, ..r }
    }

    /// The record of a reservation a replica sent back, and the
    /// reservation as the quota knows it (its own `seq`).
    fn find(&mut self, r: &Reservation) -> (Option<&mut Record>, Reservation) {
        match self.records.iter_mut().find(|x| x.id == r.seq) {
            Some(rec) => {
                let seq = rec.seq;
                (Some(rec), Reservation { seq, ..*r })
            }
            // Refunded already: the quota finds nothing of it either.
            None => (None, Reservation { seq: 0, ..*r }),
        }
    }

    /// Forgets the record of a reservation given back.
    fn remove(&mut self, id: u32) {
        self.records.retain(|x| x.id != id);
    }

    /// Gives back pending hold `id` if held; whether it was.
    fn drop_hold(&mut self, id: HoldId, now: Instant) -> bool {
        let Some((r, _)) = self.holds.remove(&id) else {
            return false;
        };
        let (_, quota) = self.find(&r);
        self.quota.refund(&quota, now);
        self.remove(r.seq);
        true
    }

    /// Gives back every hold whose expiry has come.
    fn expire(&mut self, now: Instant) {
        let due: Vec<HoldId> = self
            .holds
            .iter()
            .filter(|(_, (_, expires))| *expires <= now)
            .map(|(id, _)| *id)
            .collect();
        for id in due {
            self.drop_hold(id, now);
        }
    }
}

/// The shared server. See the module documentation.
#[derive(Debug)]
pub struct TestStore {
    offset: Duration,
    scopes: Mutex<HashMap<String, ScopeServer>>,
    outage: AtomicU8,
    latency: Mutex<Duration>,
    notices: Mutex<Vec<Weak<Notify>>>,
}

impl TestStore {
    /// A server whose clock runs `offset` ahead of every replica's.
    pub fn new(offset: Duration) -> Arc<Self> {
        Arc::new(TestStore {
            offset,
            scopes: Mutex::new(HashMap::new()),
            outage: AtomicU8::new(0),
            latency: Mutex::new(Duration::ZERO),
            notices: Mutex::new(Vec::new()),
        })
    }

    /// The server's clock.
    pub fn now(&self) -> Instant {
        Instant::now() + self.offset
    }

    /// Sets the injected outage.
    pub fn set_outage(&self, outage: Outage) {
        let v = match outage {
            Outage::Up => 0,
            Outage::Refuse => 1,
            Outage::Hang => 2,
        };
        self.outage.store(v, Ordering::SeqCst);
    }

    fn outage(&self) -> Outage {
        match self.outage.load(Ordering::SeqCst) {
            0 => Outage::Up,
            1 => Outage::Refuse,
            _ => Outage::Hang,
        }
    }

    /// Sets the latency of every operation.
    pub fn set_latency(&self, latency: Duration) {
        *self.latency.lock() = latency;
    }

    /// A replica's connection: `timeout` per operation, `on_unavailable`.
    pub fn backend(
        self: &Arc<Self>,
        timeout: Duration,
        on_unavailable: Unavailable,
    ) -> TestBackend {
        TestBackend {
            store: Arc::clone(self),
            timeout,
            on_unavailable,
            calls: Arc::new(Calls::default()),
        }
    }

    /// Every attempt admitted on `scope` so far.
    pub fn records(&self, scope: &str) -> Vec<Record> {
        self.scopes
            .lock()
            .get(scope)
            .map(|s| s.records.clone())
            .unwrap_or_default()
    }

    /// Every limit of `scope` as the server sees it now.
    pub fn limits(&self, scope: &str) -> Vec<LimitSnapshot> {
        let mut out = Vec::new();
        if let Some(s) = self.scopes.lock().get_mut(scope) {
            let now = s.tick(self.now());
            s.quota.snapshot(now, &mut out);
        }
        out
    }

    /// Reservations and leases of `scope` that the quota stamped at another
    /// instant than the recorder's (zero: the recorder's instants are the
    /// quota's own).
    pub fn clock_mismatches(&self, scope: &str) -> u64 {
        self.scopes.lock().get(scope).map_or(0, |s| s.mismatches)
    }

    /// Reservations granted and neither leased nor refunded.
    pub fn pending(&self, scope: &str) -> usize {
        self.records(scope)
            .iter()
            .filter(|r| r.leased_at.is_none())
            .count()
    }

    fn notify(&self) {
        self.notices.lock().retain(|n| match n.upgrade() {
            Some(n) => {
                n.notify_waiters();
                true
            }
            None => false,
        });
    }

    /// [`run`](Self::run) for an operation that gives quota back: every
    /// replica is told (`RemoteQuota::changes`).
    async fn give_back(
        &self,
        scope: &str,
        budget: Duration,
        op: impl FnOnce(&mut ScopeServer, Instant),
    ) -> Result<(), StoreError> {
        self.run(scope, budget, op).await?;
        self.notify();
        Ok(())
    }

    /// Runs `op` on `scope` after the latency, if that fits in `budget`.
    async fn run<T>(
        &self,
        scope: &str,
        budget: Duration,
        op: impl FnOnce(&mut ScopeServer, Instant) -> T,
    ) -> Result<T, StoreError> {
        let latency = *self.latency.lock();
        match self.outage() {
            Outage::Refuse => {
                tokio::time::sleep(latency.min(budget)).await;
                return Err(StoreError::Unavailable("injected outage".into()));
            }
            Outage::Hang => {
                tokio::time::sleep(budget).await;
                return Err(StoreError::Timeout(budget));
            }
            Outage::Up => {}
        }
        if latency > budget {
            tokio::time::sleep(budget).await;
            return Err(StoreError::Timeout(budget));
        }
        tokio::time::sleep(latency).await;
        let mut scopes = self.scopes.lock();
        let Some(server) = scopes.get_mut(scope) else {
            return Err(StoreError::Unavailable("unknown scope".into()));
        };
        // Under the lock (see the module documentation).
        let now = server.tick(self.now());
        server.expire(now);
        Ok(op(server, now))
    }
}

/// Operations a replica sent, by kind.
#[derive(Debug, Default)]
pub struct Calls {
    pub reserve: AtomicU64,
    pub lease: AtomicU64,
    pub refund: AtomicU64,
    pub reconcile: AtomicU64,
    pub release: AtomicU64,
    pub recount: AtomicU64,
    pub snapshot: AtomicU64,
    pub observe: AtomicU64,
    pub cool_down: AtomicU64,
    /// The longest budget of a round trip an admission waits for
    /// (reserve, lease), in nanoseconds.
    pub admission_budget: AtomicU64,
}

impl Calls {
    /// The count of one kind.
    pub fn get(counter: &AtomicU64) -> u64 {
        counter.load(Ordering::SeqCst)
    }

    /// All round trips but snapshots (probes).
    pub fn round_trips(&self) -> u64 {
        [
            &self.reserve,
            &self.lease,
            &self.refund,
            &self.reconcile,
            &self.release,
            &self.recount,
            &self.observe,
            &self.cool_down,
        ]
        .iter()
        .map(|c| Calls::get(c))
        .sum()
    }

    /// The longest budget of a round trip an admission waited for.
    pub fn longest_admission_budget(&self) -> Duration {
        Duration::from_nanos(Calls::get(&self.admission_budget))
    }

    fn admission(&self, counter: &AtomicU64, budget: Duration) {
        bump(counter);
        let nanos = u64::try_from(budget.as_nanos()).unwrap_or(u64::MAX);
        self.admission_budget.fetch_max(nanos, Ordering::SeqCst);
    }
}

fn bump(counter: &AtomicU64) {
    counter.fetch_add(1, Ordering::SeqCst);
}

/// One replica's connection to a [`TestStore`].
#[derive(Debug, Clone)]
pub struct TestBackend {
    store: Arc<TestStore>,
    timeout: Duration,
    on_unavailable: Unavailable,
    /// Operations this replica sent.
    pub calls: Arc<Calls>,
}

impl RemoteBackend for TestBackend {
    fn open(&self, scope: &ScopeConfig) -> Arc<dyn RemoteQuota> {
        self.store
            .scopes
            .lock()
            .entry(scope.name().to_string())
            .or_insert_with(|| ScopeServer::new(scope, self.store.now()));
        let notice = Arc::new(Notify::new());
        self.store.notices.lock().push(Arc::downgrade(&notice));
        Arc::new(TestRemote {
            store: Arc::clone(&self.store),
            scope: scope.name().to_string(),
            // Only judges demands against the configuration: no instant.
            checker: LocalQuota::new(scope, Instant::now()),
            calls: Arc::clone(&self.calls),
            notice,
        })
    }

    fn timeout(&self) -> Duration {
        self.timeout
    }

    fn on_unavailable(&self) -> Unavailable {
        self.on_unavailable
    }

    fn name(&self) -> &'static str {
        "test"
    }
}

/// One scope of a [`TestStore`] as one replica sees it.
#[derive(Debug)]
struct TestRemote {
    store: Arc<TestStore>,
    scope: String,
    /// Judges `check` from the configuration, without a round trip.
    checker: LocalQuota,
    calls: Arc<Calls>,
    notice: Arc<Notify>,
}

/// The replica's local instant for a server instant: `local now` plus the
/// wait the server computed (never the server's instant itself).
fn local(at: Instant, server_now: Instant) -> Instant {
    Instant::now() + at.saturating_duration_since(server_now)
}

impl RemoteQuota for TestRemote {
    fn check(&self, demand: &Demand) -> Result<(), ExceedsLimit> {
        self.checker.check(demand)
    }

    fn reserve(
        &self,
        demand: Demand,
        remote_hold: RemoteHold,
        budget: Duration,
    ) -> StoreFuture<'_, Result<Result<Reservation, NotUntil>, StoreError>> {
        self.calls.admission(&self.calls.reserve, budget);
        let hold = remote_hold.hold();
        Box::pin(self.store.run(&self.scope, budget, move |s, now| {
            // A cooldown after a provider 429 pauses every replica.
            if let Some((_, end)) = s.cooldown
                && end > now
            {
                return Err(NotUntil {
                    at: Some(local(end, now)),
                    limited_by: LimitedBy::default(),
                });
            }
            match s.quota.reserve(&demand, now, hold) {
                Ok(r) => {
                    let r = s.admit(r, now);
                    if let RemoteHold::Pending { id, ttl } = remote_hold {
                        s.holds.insert(id, (r, now + ttl));
                    }
                    Ok(Reservation {
                        stamp: Instant::now(),
                        ..r
                    })
                }
                Err(n) => Err(NotUntil {
                    at: n.at.map(|at| local(at, now)),
                    ..n
                }),
            }
        }))
    }

    fn lease(
        &self,
        _reservation: Reservation,
        id: HoldId,
        budget: Duration,
    ) -> StoreFuture<'_, Result<Option<Reservation>, StoreError>> {
        self.calls.admission(&self.calls.lease, budget);
        Box::pin(self.store.run(&self.scope, budget, move |s, now| {
            let (held, _) = s.holds.remove(&id)?;
            let (_, mut r) = s.find(&held);
            s.quota.lease(&mut r, now);
            s.stamped(r.tick, now);
            if let (Some(rec), _) = s.find(&held) {
                rec.leased_at = Some(now);
            }
            Some(Reservation {
                stamp: Instant::now(),
                seq: held.seq,
                ..r
            })
        }))
    }

    fn forget(&self, id: HoldId, budget: Duration) -> StoreFuture<'_, Result<bool, StoreError>> {
        bump(&self.calls.refund);
        Box::pin(async move {
            let found = self
                .store
                .run(&self.scope, budget, move |s, now| s.drop_hold(id, now))
                .await?;
            if found {
                self.store.notify();
            }
            Ok(found)
        })
    }

    fn refund(
        &self,
        reservation: Reservation,
        _op: OpId,
        budget: Duration,
    ) -> StoreFuture<'_, Result<(), StoreError>> {
        bump(&self.calls.refund);
        Box::pin(self.store.give_back(&self.scope, budget, move |s, now| {
            let (_, quota) = s.find(&reservation);
            s.quota.refund(&quota, now);
            s.remove(reservation.seq);
        }))
    }

    fn reconcile(
        &self,
        reservation: Reservation,
        actual: Actual,
        _op: OpId,
        budget: Duration,
    ) -> StoreFuture<'_, Result<(), StoreError>> {
        bump(&self.calls.reconcile);
        Box::pin(self.store.give_back(&self.scope, budget, move |s, _| {
            let (rec, quota) = s.find(&reservation);
            if let Some(rec) = rec {
                rec.actual = Some(actual.tokens);
            }
            s.quota.reconcile(&quota, &actual);
        }))
    }

    fn release(
        &self,
        reservation: Reservation,
        requests: bool,
        tokens: bool,
        _op: OpId,
        budget: Duration,
    ) -> StoreFuture<'_, Result<(), StoreError>> {
        bump(&self.calls.release);
        Box::pin(self.store.give_back(&self.scope, budget, move |s, _| {
            let (rec, quota) = s.find(&reservation);
            if let Some(rec) = rec {
                if requests {
                    rec.requests = 0;
                }
                rec.tokens_released |= tokens;
            }
            s.quota.release(&quota, requests, tokens, true);
        }))
    }

    fn recount(
        &self,
        reservation: Reservation,
        ago: Duration,
        _op: OpId,
        budget: Duration,
    ) -> StoreFuture<'_, Result<Reservation, StoreError>> {
        bump(&self.calls.recount);
        Box::pin(self.store.run(&self.scope, budget, move |s, now| {
            let (_, mut r) = s.find(&reservation);
            let at = now.checked_sub(ago).unwrap_or(now);
            s.quota.recount(&mut r, at, now);
            // The quota may number it now (SPEC Q-14); the recorder keeps
            // its lease instant, which the quota only ever moves later.
            if let (Some(rec), _) = s.find(&reservation) {
                rec.seq = r.seq;
            }
            Reservation {
                stamp: Instant::now(),
                seq: reservation.seq,
                ..r
            }
        }))
    }

    fn snapshot(
        &self,
        budget: Duration,
    ) -> StoreFuture<'_, Result<Vec<LimitSnapshot>, StoreError>> {
        bump(&self.calls.snapshot);
        Box::pin(self.store.run(&self.scope, budget, |s, now| {
            let mut out = Vec::new();
            s.quota.snapshot(now, &mut out);
            out
        }))
    }

    fn observe(
        &self,
        reports: Vec<BudgetReport>,
        (answered, _): (Reservation, Reservation),
        ago: Duration,
        op: OpId,
        budget: Duration,
    ) -> StoreFuture<'_, Result<Vec<Observed>, StoreError>> {
        bump(&self.calls.observe);
        Box::pin(async move {
            let observed = self
                .store
                .run(&self.scope, budget, move |s, now| {
                    if let Some(Answered::Observed(first)) = s.answered.get(&op) {
                        return first.clone();
                    }
                    let (_, quota) = s.find(&answered);
                    let at = now.checked_sub(ago).unwrap_or(now);
                    let out: Vec<Observed> = reports
                        .iter()
                        .map(|r| s.quota.observe(r, Some(&quota), at, now))
                        .collect();
                    s.answered.insert(op, Answered::Observed(out.clone()));
                    out
                })
                .await?;
            if observed.iter().any(|o| o.freed > 0) {
                self.store.notify();
            }
            Ok(observed)
        })
    }

    fn cool_down(
        &self,
        answered: Reservation,
        length: Duration,
        op: OpId,
        budget: Duration,
    ) -> StoreFuture<'_, Result<Option<Duration>, StoreError>> {
        bump(&self.calls.cool_down);
        Box::pin(self.store.run(&self.scope, budget, move |s, now| {
            if let Some(Answered::Cooled(first)) = s.answered.get(&op) {
                return *first;
            }
            let sent = match s.find(&answered) {
                (Some(rec), _) => rec.leased_at.unwrap_or(now),
                (None, _) => now,
            };
            let left = |c: Option<(Instant, Instant)>| {
                c.and_then(|(_, end)| (end > now).then(|| end - now))
            };
            let stale = s.cooldown.is_some_and(|(start, _)| sent < start);
            let longer = s.cooldown.is_some_and(|(_, end)| end >= now + length);
            if !stale && !longer {
                s.cooldown = Some((now, now + length));
            }
            let out = left(s.cooldown);
            s.answered.insert(op, Answered::Cooled(out));
            out
        }))
    }

    fn changes(&self) -> Option<Arc<Notify>> {
        Some(Arc::clone(&self.notice))
    }
}

/// The leased records by instant: (instant, request units, tokens).
fn leased(records: &[Record]) -> Vec<(Instant, u64, u64)> {
    let mut leased: Vec<_> = records
        .iter()
        .filter_map(|r| r.leased_at.map(|at| (at, r.requests, r.charged_tokens())))
        .collect();
    leased.sort_by_key(|r| r.0);
    leased
}

/// For each leased record in order of instant, the request units and
/// tokens (debt excluded, see [`Record::charged_tokens`]) of the records
/// less than `window` before it, itself included.
fn window_sums(records: &[Record], window: Duration) -> Vec<(u64, u64)> {
    let leased = leased(records);
    let (mut start, mut req, mut tok) = (0, 0, 0);
    let mut sums = Vec::with_capacity(leased.len());
    for end in 0..leased.len() {
        req += leased[end].1;
        tok += leased[end].2;
        while leased[end].0 - leased[start].0 >= window {
            req -= leased[start].1;
            tok -= leased[start].2;
            start += 1;
        }
        sums.push((req, tok));
    }
    sums
}

/// The largest request and token sums of any interval of length `window`.
pub fn window_maxima(records: &[Record], window: Duration) -> (u64, u64) {
    window_sums(records, window)
        .into_iter()
        .fold((0, 0), |(r, t), (req, tok)| (r.max(req), t.max(tok)))
}

/// Checks the rolling-window bound on what `store` admitted on `scope`:
/// in every interval of length `window`, at most `requests` request units
/// and `tokens` tokens (debt excluded, see [`Record::charged_tokens`]).
/// Returns the largest sums seen.
#[track_caller]
pub fn assert_windows(
    records: &[Record],
    window: Duration,
    requests: u64,
    tokens: u64,
) -> (u64, u64) {
    for (end, (req, tok)) in window_sums(records, window).into_iter().enumerate() {
        assert!(
            req <= requests,
            "{req} requests within {window:?} ending at record {end} (limit {requests})"
        );
        assert!(
            tok <= tokens,
            "{tok} tokens within {window:?} ending at record {end} (limit {tokens})"
        );
    }
    window_maxima(records, window)
}

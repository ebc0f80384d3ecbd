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
//! effect and one whose future is dropped before it answers did not either.
//!
//! Beside the quota, an independent recorder keeps every attempt the store
//! admitted (server instant of its lease, request units, tokens as
//! settled), to check the rolling-window bound (SPEC Q-7, DQ-2) without
//! trusting the arithmetic under test. It is not a product feature: the
//! Redis store has tests of its own in `tollgate-redis`.

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
    Actual, Demand, Hold, HoldId, LimitSnapshot, LocalQuota, NotUntil, QuotaStore, RemoteBackend,
    RemoteHold, RemoteQuota, Reservation, StoreError, StoreFuture, Unavailable,
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
    tick: u64,
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
    quota: LocalQuota,
    records: Vec<Record>,
    /// Pending holds by name, with their expiry (server clock).
    holds: HashMap<HoldId, (Reservation, Instant)>,
}

impl ScopeServer {
    fn record(&mut self, tick: u64) -> Option<&mut Record> {
        self.records.iter_mut().find(|r| r.tick == tick)
    }

    /// Gives back pending hold `id` if held; whether it was.
    fn drop_hold(&mut self, id: HoldId, now: Instant) -> bool {
        let Some((r, _)) = self.holds.remove(&id) else {
            return false;
        };
        self.quota.refund(&r, now);
        if let Some(i) = self
            .records
            .iter()
            .position(|x| x.tick == r.tick && x.leased_at.is_none())
        {
            self.records.remove(i);
        }
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
        let now = self.now();
        let mut out = Vec::new();
        if let Some(s) = self.scopes.lock().get_mut(scope) {
            s.quota.snapshot(now, &mut out);
        }
        out
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
        let now = self.now();
        let mut scopes = self.scopes.lock();
        let Some(server) = scopes.get_mut(scope) else {
            return Err(StoreError::Unavailable("unknown scope".into()));
        };
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
        ]
        .iter()
        .map(|c| Calls::get(c))
        .sum()
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
        let now = self.store.now();
        self.store
            .scopes
            .lock()
            .entry(scope.name().to_string())
            .or_insert_with(|| ScopeServer {
                quota: LocalQuota::new(scope, now),
                records: Vec::new(),
                holds: HashMap::new(),
            });
        let notice = Arc::new(Notify::new());
        self.store.notices.lock().push(Arc::downgrade(&notice));
        Arc::new(TestRemote {
            store: Arc::clone(&self.store),
            scope: scope.name().to_string(),
            checker: LocalQuota::new(scope, now),
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
        bump(&self.calls.reserve);
        let hold = remote_hold.hold();
        Box::pin(self.store.run(&self.scope, budget, move |s, now| {
            match s.quota.reserve(&demand, now, hold) {
                Ok(r) => {
                    if let RemoteHold::Pending { id, ttl } = remote_hold {
                        s.holds.insert(id, (r, now + ttl));
                    }
                    s.records.push(Record {
                        leased_at: (hold == Hold::Leased).then_some(now),
                        tick: r.tick,
                        requests: demand.requests,
                        estimate: demand.tokens(),
                        actual: None,
                        tokens_released: false,
                    });
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
        bump(&self.calls.lease);
        Box::pin(self.store.run(&self.scope, budget, move |s, now| {
            let (mut r, _) = s.holds.remove(&id)?;
            let before = r.tick;
            s.quota.lease(&mut r, now);
            if let Some(rec) = s
                .records
                .iter_mut()
                .find(|x| x.tick == before && x.leased_at.is_none())
            {
                rec.leased_at = Some(now);
                rec.tick = r.tick;
            }
            Some(Reservation {
                stamp: Instant::now(),
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
        budget: Duration,
    ) -> StoreFuture<'_, Result<(), StoreError>> {
        bump(&self.calls.refund);
        Box::pin(self.store.give_back(&self.scope, budget, move |s, now| {
            s.quota.refund(&reservation, now);
            let leased = reservation.hold == Hold::Leased;
            if let Some(i) = s
                .records
                .iter()
                .position(|x| x.tick == reservation.tick && x.leased_at.is_some() == leased)
            {
                s.records.remove(i);
            }
        }))
    }

    fn reconcile(
        &self,
        reservation: Reservation,
        actual: Actual,
        budget: Duration,
    ) -> StoreFuture<'_, Result<(), StoreError>> {
        bump(&self.calls.reconcile);
        Box::pin(self.store.give_back(&self.scope, budget, move |s, _| {
            s.quota.reconcile(&reservation, &actual);
            if let Some(rec) = s.record(reservation.tick) {
                rec.actual = Some(actual.tokens);
            }
        }))
    }

    fn release(
        &self,
        reservation: Reservation,
        requests: bool,
        tokens: bool,
        budget: Duration,
    ) -> StoreFuture<'_, Result<(), StoreError>> {
        bump(&self.calls.release);
        Box::pin(self.store.give_back(&self.scope, budget, move |s, _| {
            s.quota.release(&reservation, requests, tokens, true);
            if let Some(rec) = s.record(reservation.tick) {
                if requests {
                    rec.requests = 0;
                }
                rec.tokens_released |= tokens;
            }
        }))
    }

    fn recount(
        &self,
        reservation: Reservation,
        ago: Duration,
        budget: Duration,
    ) -> StoreFuture<'_, Result<Reservation, StoreError>> {
        bump(&self.calls.recount);
        Box::pin(self.store.run(&self.scope, budget, move |s, now| {
            let mut r = reservation;
            let before = r.tick;
            let at = now.checked_sub(ago).unwrap_or(now);
            s.quota.recount(&mut r, at, now);
            if let Some(rec) = s.record(before) {
                rec.tick = r.tick;
            }
            Reservation {
                stamp: Instant::now(),
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

    fn changes(&self) -> Option<Arc<Notify>> {
        Some(Arc::clone(&self.notice))
    }
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
    let mut leased: Vec<(Instant, u64, u64)> = records
        .iter()
        .filter_map(|r| r.leased_at.map(|at| (at, r.requests, r.charged_tokens())))
        .collect();
    leased.sort_by_key(|r| r.0);
    let (mut start, mut req, mut tok, mut max_req, mut max_tok) = (0, 0, 0, 0, 0);
    for end in 0..leased.len() {
        req += leased[end].1;
        tok += leased[end].2;
        while leased[end].0 - leased[start].0 >= window {
            req -= leased[start].1;
            tok -= leased[start].2;
            start += 1;
        }
        max_req = max_req.max(req);
        max_tok = max_tok.max(tok);
        assert!(
            req <= requests,
            "{req} requests within {window:?} ending at record {end} (limit {requests})"
        );
        assert!(
            tok <= tokens,
            "{tok} tokens within {window:?} ending at record {end} (limit {tokens})"
        );
    }
    (max_req, max_tok)
}

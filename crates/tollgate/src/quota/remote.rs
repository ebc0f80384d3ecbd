//! The seam to a quota store shared by several processes (SPEC DQ-1..DQ-5).
//!
//! A [`QuotaStore`](super::QuotaStore) answers under the scope's lock in
//! nanoseconds; a shared store answers over the network. So a shared scope
//! is driven through this asynchronous interface instead: every operation
//! is one atomic round trip (one script) bounded by the time budget it is
//! given, and every instant is the store's own clock (Redis `TIME`), never
//! this process's. Instants in what it returns are local: a wait of `d`
//! computed by the store becomes `local now + d` when the answer arrives,
//! so replicas whose clocks disagree still agree on every wait.
//!
//! The controller keeps FIFO order within one process (SPEC DQ-4): one
//! reservation of a scope is in flight at a time, in arrival order.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

use tokio::sync::Notify;

use super::demand::{Actual, BudgetReport, Demand, Hold, NotUntil, Observed, Reservation};
use super::store::LimitSnapshot;
use crate::config::ScopeConfig;
use crate::error::ExceedsLimit;

/// What a settlement of a reservation taken before a reload (SPEC GW-15)
/// changes in a limit the reload added, which never counted its estimate
/// (see [`RemoteQuota::settle_foreign`]): what the in-process store's
/// limits do with a reservation from before their start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ForeignSettlement {
    /// Reconciled to this usage where it was counted: the limit counts
    /// what it used beyond its estimate from the reservation's instant,
    /// and gives nothing back (SPEC Q-5, BUD-2).
    Debt(Actual),
    /// Recounted (SPEC Q-15) to the reservation's instant (its `tick`, as
    /// the recount moved it): the limit counts its estimate from there. A
    /// token bucket, which counts a rate, not instants, takes it only
    /// when it `adopts` the reservation (the instant is the reload's or
    /// later): it then gives back only what it took.
    Recount {
        /// The limit takes the reservation as its own from now on.
        adopts: bool,
    },
    /// Recounted again, from instant `from` (a tick) to the reservation's,
    /// in a limit that took it as its own ([`Recount`](Self::Recount) at
    /// or after the reload): moved there as where it was counted (a
    /// token bucket: nothing).
    Move {
        /// The tick the limit counts it at now.
        from: u64,
    },
    /// Reconciled to this usage, in a limit that took it as its own: its
    /// estimate there becomes the usage, as where it was counted.
    Reconcile(Actual),
    /// Refused (SPEC Q-16), in a limit that took it as its own: the
    /// chosen dimensions give it back there, as where it was counted
    /// (`tokens` covers every token dimension; the cost always goes back,
    /// SPEC BUD-5).
    Release {
        /// The request unit goes back.
        requests: bool,
        /// The tokens go back.
        tokens: bool,
    },
}

/// A boxed, sendable future: what a shared store's operations return.
pub type StoreFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// Why a shared store did not answer (SPEC DQ-3, DQ-5).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StoreError {
    /// No answer within the operation's budget.
    #[error("quota store did not answer within {0:?}")]
    Timeout(Duration),
    /// The store cannot be reached or refused the operation.
    #[error("quota store unavailable: {0}")]
    Unavailable(String),
}

/// What a shared scope does while its store is unavailable (SPEC DQ-3).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Unavailable {
    /// Refuse at once (the gateway answers 503): never a wait, never a
    /// silent switch to per-process limits. The default.
    #[default]
    FailClosed,
    /// Admit from a local store holding `limit / replicas` of every limit
    /// until the shared store answers again.
    FailOpenLocal {
        /// How many processes share the budget (at least 1).
        replicas: u32,
    },
}

impl Unavailable {
    /// The configuration name: `fail_closed` or `fail_open_local`.
    pub const fn as_str(&self) -> &'static str {
        match self {
            Unavailable::FailClosed => "fail_closed",
            Unavailable::FailOpenLocal { .. } => "fail_open_local",
        }
    }
}

/// The name of a pending hold in a shared store (SPEC Q-9, DQ-5).
///
/// Chosen by the caller before the reserve round trip, so a hold whose
/// answer never arrived (a timeout, a call dropped meanwhile) can still be
/// given back, and giving it back twice is harmless: only the first
/// [`forget`](RemoteQuota::forget) finds it. Unique in practice: a random
/// 64-bit number per process and a counter.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct HoldId(u128);

impl HoldId {
    /// A new id, never returned before by this process.
    pub fn new() -> Self {
        HoldId(unique())
    }

    /// The id as a number (stores other than Redis may key on it).
    pub const fn as_u128(self) -> u128 {
        self.0
    }
}

impl Default for HoldId {
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Display for HoldId {
    /// 32 hexadecimal digits.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:032x}", self.0)
    }
}

/// A number never returned before by this process: a random 64-bit number
/// per process and a counter (unique across processes in practice).
///
/// A child made by `fork()` inherits the random number, the counter and
/// the random generator's state, and would otherwise name its settlements
/// as its parent (or a sibling, or an earlier child with the same process
/// id) names the next ones: each would read the other's as a repeat
/// (DQ-6). So the random number is drawn again, mixed with the clock,
/// whenever the process id changes, and the process id is mixed in too.
fn unique() -> u128 {
    static PID: AtomicU32 = AtomicU32::new(0);
    static RANDOM: AtomicU64 = AtomicU64::new(0);
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let pid = std::process::id();
    if PID.load(Ordering::Acquire) != pid {
        // Two threads may both draw here: either number serves, as the
        // counter alone keeps this process's numbers apart.
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        RANDOM.store(fastrand::u64(..) ^ nanos.rotate_left(32), Ordering::Release);
        PID.store(pid, Ordering::Release);
    }
    // Multiplying by an odd number is one-to-one on u64.
    let process =
        RANDOM.load(Ordering::Acquire) ^ u64::from(pid).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    (u128::from(process) << 64) | u128::from(n)
}

/// The name of one settlement sent to a shared store (SPEC DQ-6).
///
/// Chosen by the caller once per settlement and sent again with each of
/// its retries: a store applies a named operation once, and answers a
/// repeat of it (a retry after a lost answer, a client library resending
/// after a dropped connection) with the first answer, changing nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct OpId(u128);

impl OpId {
    /// A new name, never returned before by this process.
    pub fn new() -> Self {
        OpId(unique())
    }

    /// The name as a number.
    pub const fn as_u128(self) -> u128 {
        self.0
    }
}

impl Default for OpId {
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Display for OpId {
    /// 32 hexadecimal digits.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:032x}", self.0)
    }
}

/// How a shared store is to hold a reservation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RemoteHold {
    /// Counted from the store's now (the call holds its concurrency
    /// permit); ages out with its windows.
    Leased,
    /// Held for a call that still waits for its permit: counted, but not
    /// yet from a known instant, until [`lease`](RemoteQuota::lease)d or
    /// [`forget`](RemoteQuota::forget)ten. The store gives it back by
    /// itself once `ttl` has passed on its clock, so a hold whose call
    /// vanished costs nobody more than `ttl`.
    Pending {
        /// The hold's name.
        id: HoldId,
        /// How long the store keeps it unless leased or given back.
        ttl: Duration,
    },
}

impl RemoteHold {
    /// The engine's view of the hold.
    pub const fn hold(&self) -> Hold {
        match self {
            RemoteHold::Leased => Hold::Leased,
            RemoteHold::Pending { .. } => Hold::Pending,
        }
    }
}

/// The quota arithmetic of one scope, kept in a store shared by processes.
///
/// The same arithmetic as [`LocalQuota`](super::LocalQuota) (sliding
/// window with the bounded slot log, token bucket, fixed window; all
/// limits all-or-nothing, SPEC Q-1), but each operation is a round trip.
/// A [`Reservation`] returned here carries the store's instant in `tick`
/// (microseconds of the store's clock) and the local instant of the answer
/// in `stamp`; settling locates it by `tick` alone.
///
/// Every operation takes `budget`, the most it may take (its own timeout
/// already clipped by the call's deadline, SPEC DQ-5), and fails with
/// [`StoreError::Timeout`] rather than wait longer. An operation that
/// failed may or may not have taken effect; callers treat a failed
/// `reserve` as not granted (the store's TTLs and the window age out any
/// amount it took), and retry a failed settlement under its name.
///
/// # Idempotence (SPEC DQ-6)
///
/// Every operation that changes the store may reach it twice: the caller
/// retries a settlement whose answer was lost, and a client library may
/// resend a command after a dropped connection. So each is applied at most
/// once: a settlement (`refund`, `reconcile`, `release`, `recount`) by the
/// [`OpId`] its caller gives it, the same on every retry, which must
/// answer a repeat with the first answer and change nothing; `reserve`,
/// `lease` and `forget` by a name the store chooses per call (a repeat of
/// the same call), or by the hold's id. No settlement gives back more than
/// its reservation held.
///
/// # How the controller uses it
///
/// (See `docs/design.md`, "Shared quota stores".)
///
/// * An admitted call costs one `reserve` (`RemoteHold::Leased`) when a
///   concurrency permit was free, or `reserve` (`RemoteHold::Pending`) and
///   then `lease` when it had to wait for one. Reconciliation costs one
///   `reconcile` only when the reported usage differs from the estimate.
/// * Every returned future must resolve within its `budget` (the controller
///   does not add a timer of its own): a store that cannot answer in time
///   answers [`StoreError::Timeout`].
/// * A pending hold whose answer is unknown (its `reserve` or its `lease`
///   failed, or its call went away during either) is given back with
///   `forget`, retried a few times, which must be idempotent: a `lease`
///   that did run has removed the hold, so `forget` then changes nothing
///   and the leased amount ages out with its windows (counted, never over a
///   quota). A hold nobody forgets expires after its `ttl`.
/// * A `Hold::Leased` reservation that never started is given back with
///   `refund`: a leased `reserve` whose answer was lost is not refunded
///   (it ages out with its windows).
/// * A settlement that fails is retried a few times under one [`OpId`]
///   (applied once, however many of the attempts reach the store).
/// * `snapshot` is also the health probe of an unavailable store (at most
///   one in flight per scope, at most every 200 ms).
/// * The controller notifies the [`changes`](RemoteQuota::changes) notice
///   itself after its own refunds and settlements that give room back, so
///   the notice must be an object of this process (one per scope handle).
pub trait RemoteQuota: fmt::Debug + Send + Sync + 'static {
    /// Fails when `demand` can never fit, whatever the wait (SPEC Q-3);
    /// judged from the configuration, without a round trip.
    fn check(&self, demand: &Demand) -> Result<(), ExceedsLimit>;

    /// Takes `demand` from every limit, all or nothing, at the store's now,
    /// unless a cooldown the store keeps runs (see
    /// [`cool_down`](Self::cool_down)): then it fits no earlier than the
    /// cooldown's end. `Ok(Err(_))`: nothing changed; the demand fits no earlier than
    /// `NotUntil::at` (a local instant), or, with `at: None`, only once a
    /// pending reservation somewhere is leased or refunded.
    /// `Ok(Ok(r))` carries `hold.hold()` in `r.hold`.
    fn reserve(
        &self,
        demand: Demand,
        hold: RemoteHold,
        budget: Duration,
    ) -> StoreFuture<'_, Result<Result<Reservation, NotUntil>, StoreError>>;

    /// Turns pending hold `id` (granted as `reservation`) into a leased
    /// reservation at the store's now and returns it restamped; `Ok(None)`
    /// when the store no longer holds it (it expired or was given back):
    /// nothing was leased.
    fn lease(
        &self,
        reservation: Reservation,
        id: HoldId,
        budget: Duration,
    ) -> StoreFuture<'_, Result<Option<Reservation>, StoreError>>;

    /// Gives back pending hold `id` if the store still holds it (SPEC
    /// Q-9); `Ok(true)` if it did. Idempotent: safe to repeat when an
    /// answer is lost.
    fn forget(&self, id: HoldId, budget: Duration) -> StoreFuture<'_, Result<bool, StoreError>>;

    /// Restores a leased reservation whose attempt never started, in full
    /// (SPEC Q-9), once per `op`. Pending holds are given back with
    /// [`forget`](Self::forget).
    fn refund(
        &self,
        reservation: Reservation,
        op: OpId,
        budget: Duration,
    ) -> StoreFuture<'_, Result<(), StoreError>>;

    /// Replaces a started attempt's token estimate by what the provider
    /// reported (SPEC Q-5), each token limit from its own figure (SPEC
    /// Q-12, see [`QuotaStore::reconcile`](super::QuotaStore::reconcile)),
    /// once per `op`.
    fn reconcile(
        &self,
        reservation: Reservation,
        actual: Actual,
        op: OpId,
        budget: Duration,
    ) -> StoreFuture<'_, Result<(), StoreError>>;

    /// Gives back what a refused attempt took from the chosen dimensions
    /// (SPEC Q-16), once per `op`; `tokens` covers every token dimension.
    /// The reserved cost always goes back (no provider bills a refusal,
    /// SPEC BUD-5).
    fn release(
        &self,
        reservation: Reservation,
        requests: bool,
        tokens: bool,
        op: OpId,
        budget: Duration,
    ) -> StoreFuture<'_, Result<(), StoreError>>;

    /// Makes every limit of this handle seeded from another (a reload
    /// that changed a window, SPEC GW-15) take its seed now, if it has
    /// not yet: the controller calls it before it settles, through an
    /// earlier handle, a reservation taken before the reload, so that
    /// the seed holds what the old limit counted of it, as the in-process
    /// store seeds at the reload (a refusal or a refund there then leaves
    /// it in the new limit, as in process). The default does nothing (a
    /// store whose limits take their seed when the handle opens).
    fn seed(&self, budget: Duration) -> StoreFuture<'_, Result<(), StoreError>> {
        let _ = budget;
        Box::pin(async { Ok(()) })
    }

    /// Names of the states this handle counts a reservation in now (its
    /// scope's limits, and those of a replaced configuration it still
    /// bounds): a handle of the same scope opened for another
    /// configuration (a reload, SPEC GW-15) counts in a state of the same
    /// name the same way (a limit the reload kept), so a reservation
    /// taken through this handle is counted there. The controller passes
    /// them to [`settle_foreign`](Self::settle_foreign). The default
    /// names none.
    fn limit_names(&self) -> Vec<String> {
        Vec::new()
    }

    /// A reservation taken through an earlier handle of the same scope
    /// (before a reload, SPEC GW-15), which counts its own limits in the
    /// states `earlier` names (its [`limit_names`](Self::limit_names)),
    /// was settled there as `settlement` says: each limit of this
    /// handle's own that `earlier` does not name (a limit the reload
    /// added) counts it as the in-process store counts a reservation
    /// taken before one of its limits started (see [`ForeignSettlement`]).
    /// Once per `op`. The default counts nothing (a store that cannot).
    fn settle_foreign(
        &self,
        earlier: Vec<String>,
        reservation: Reservation,
        settlement: ForeignSettlement,
        op: OpId,
        budget: Duration,
    ) -> StoreFuture<'_, Result<(), StoreError>> {
        let _ = (earlier, reservation, settlement, op, budget);
        Box::pin(async { Ok(()) })
    }

    /// The provider counted a leased reservation no later than `ago` before
    /// the store's now (SPEC Q-15): it stays counted until one window after
    /// that instant. Returns the restamped reservation; a repeat of `op`
    /// returns the same one and moves nothing.
    fn recount(
        &self,
        reservation: Reservation,
        ago: Duration,
        op: OpId,
        budget: Duration,
    ) -> StoreFuture<'_, Result<Reservation, StoreError>>;

    /// Takes in what a provider's answer to the reservation `leased` (as
    /// it was leased) said about the shared budget (SPEC Q-14, DQ-9), once
    /// per `op`: the response began `ago` before the store's now, or no
    /// earlier than `recounted.tick` (the same reservation as its
    /// [`recount`](Self::recount) left it). Where the provider reports less left than the store's own
    /// log explains (another client of the account), the difference is
    /// counted in the scope's window until the provider's reset, for every
    /// process. Returns what each report changed, in order (a learned
    /// limit is never adopted here: `adopted` and `confirmed` stay
    /// `None`). A repeat of `op` returns the first answer and changes
    /// nothing. The default takes nothing in (a store that cannot).
    fn observe(
        &self,
        reports: Vec<BudgetReport>,
        (leased, recounted): (Reservation, Reservation),
        ago: Duration,
        op: OpId,
        budget: Duration,
    ) -> StoreFuture<'_, Result<Vec<Observed>, StoreError>> {
        let _ = (leased, recounted, ago, op, budget);
        Box::pin(async move { Ok(vec![Observed::default(); reports.len()]) })
    }

    /// A provider 429 answered the leased reservation `answered` (SPEC
    /// CD-1, CD-2, DQ-9): every process's reservations are refused until
    /// `length` after the store's now, unless a cooldown that started after
    /// `answered` was leased already runs (a late 429 of an earlier
    /// generation neither starts nor extends one), once per `op`. Returns
    /// how long the scope's cooldown runs from the store's now (`None`:
    /// none runs). The default keeps no cooldown.
    fn cool_down(
        &self,
        answered: Reservation,
        length: Duration,
        op: OpId,
        budget: Duration,
    ) -> StoreFuture<'_, Result<Option<Duration>, StoreError>> {
        let _ = (answered, length, op, budget);
        Box::pin(async { Ok(None) })
    }

    /// One entry per limit, as the store sees it now.
    fn snapshot(&self, budget: Duration)
    -> StoreFuture<'_, Result<Vec<LimitSnapshot>, StoreError>>;

    /// Notified whenever any process gives quota of this scope back
    /// (refund, release, reconciliation below the estimate), so a waiter
    /// can try again before the instant it was told. `None`: the store
    /// sends no such notices and waiters wake at their instants only.
    fn changes(&self) -> Option<Arc<Notify>> {
        None
    }
}

/// Opens the shared store of each scope (SPEC DQ-1).
pub trait RemoteBackend: fmt::Debug + Send + Sync + 'static {
    /// The shared store of `scope`.
    fn open(&self, scope: &ScopeConfig) -> Arc<dyn RemoteQuota>;

    /// The per-operation timeout, before clipping by a call's deadline.
    fn timeout(&self) -> Duration;

    /// What to do while the store is unavailable.
    fn on_unavailable(&self) -> Unavailable;

    /// The backend's name, for the snapshot (e.g. `"redis"`).
    fn name(&self) -> &'static str;
}

/// A shared backend handle.
pub type SharedRemote = Arc<dyn RemoteBackend>;

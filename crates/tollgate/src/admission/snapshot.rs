//! A redacted view of a controller (SPEC OBS-1).

use std::time::Duration;

use std::sync::atomic::Ordering;

use super::controller::AdmissionController;
use super::fair::FlowView;
use super::scope::ScopeCounters;
use super::shared::StoreMode;
use crate::call::{PoolId, ScopeId};
use crate::config::Overflow;
use crate::flow::Priority;
use crate::quota::{Dimension, LimitSnapshot, StoreError};

/// The state of a controller at one instant. Never contains payloads,
/// headers, keys, prompts, responses or caller identities.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Snapshot {
    /// Whether the controller was closed.
    pub closed: bool,
    /// Leased (active) calls.
    pub active: usize,
    /// The concurrency limit, if any.
    pub concurrency_limit: Option<u64>,
    /// Free concurrency permits, if limited.
    pub concurrency_available: Option<usize>,
    /// Every pool (the default pool first, when configured).
    pub pools: Vec<PoolSnapshot>,
    /// Default waiting calls per scope.
    pub queue_capacity: usize,
    /// Full-queue policy.
    pub overflow: Overflow,
    /// Where quota is kept (`local`, …).
    pub backend: &'static str,
    /// One entry per quota scope.
    pub scopes: Vec<ScopeSnapshot>,
}

/// The state of one concurrency pool.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolSnapshot {
    /// The pool's ordinal.
    pub id: PoolId,
    /// The configured name.
    pub name: String,
    /// Permits.
    pub limit: usize,
    /// Free permits.
    pub available: usize,
    /// Calls waiting for a permit.
    pub waiting: usize,
}

/// The state of one quota scope.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScopeSnapshot {
    /// The scope's ordinal.
    pub id: ScopeId,
    /// The configured name.
    pub name: String,
    /// Calls waiting in the queue.
    pub queued: usize,
    /// Producers waiting for a queue slot (overflow policy `wait`).
    pub waiting_for_slot: usize,
    /// The queue's capacity.
    pub queue_capacity: usize,
    /// Reservations granted but not yet leased (waiting for concurrency).
    pub pending: usize,
    /// Every limit, brought up to now.
    pub limits: Vec<LimitSnapshot>,
    /// Cooldowns started so far.
    pub cooldown_generation: u64,
    /// Time left in the running cooldown.
    pub cooldown_remaining: Option<Duration>,
    /// Totals since the controller started.
    pub counters: ScopeCounters,
    /// Where the scope's quota is taken from now, for a scope kept in a
    /// shared store (SPEC DQ-3); `None` for an in-process scope. A shared
    /// scope's `limits` list the local fallback share while it is in
    /// [`StoreMode::LocalFallback`] and is empty otherwise: the shared
    /// amounts are read with
    /// [`AdmissionController::shared_limits`].
    pub store: Option<StoreMode>,
    /// Every flow with waiting calls (SPEC FAIR-8), in no particular
    /// order. The tenant is the caller's own number; a shell maps it to a
    /// configured name before showing it.
    pub flows: Vec<FlowSnapshot>,
}

/// The waiting calls of one flow of a scope (SPEC FAIR-8).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FlowSnapshot {
    /// The tenant's number.
    pub tenant: u32,
    /// The class.
    pub priority: Priority,
    /// The weight of its latest call.
    pub weight: u32,
    /// Calls waiting (queued or waiting for a slot).
    pub queued: usize,
}

impl From<FlowView> for FlowSnapshot {
    fn from(v: FlowView) -> Self {
        FlowSnapshot {
            tenant: v.key.tenant,
            priority: v.key.priority,
            weight: v.weight,
            queued: v.queued,
        }
    }
}

impl Snapshot {
    /// The scope with ordinal `id`, if this controller has it.
    pub fn scope(&self, id: ScopeId) -> Option<&ScopeSnapshot> {
        self.scopes.iter().find(|s| s.id == id)
    }

    /// The scope configured as `name`, if any.
    pub fn scope_named(&self, name: &str) -> Option<&ScopeSnapshot> {
        self.scopes.iter().find(|s| s.name == name)
    }

    /// The pool with ordinal `id`, if this controller has it.
    pub fn pool(&self, id: PoolId) -> Option<&PoolSnapshot> {
        self.pools.iter().find(|p| p.id == id)
    }

    /// The pool configured as `name`, if any.
    pub fn pool_named(&self, name: &str) -> Option<&PoolSnapshot> {
        self.pools.iter().find(|p| p.name == name)
    }

    /// Whether nothing is queued, pending or active: every reservation and
    /// permit is back.
    pub fn is_idle(&self) -> bool {
        self.active == 0
            && self
                .pools
                .iter()
                .all(|p| p.available == p.limit && p.waiting == 0)
            && self
                .scopes
                .iter()
                .all(|s| s.queued == 0 && s.waiting_for_slot == 0 && s.pending == 0)
    }
}

impl ScopeSnapshot {
    /// The limit of `dimension` over `window`, if the scope has one.
    ///
    /// ```
    /// use tollgate::config::{MINUTE, ScopeConfig};
    /// use tollgate::{AdmissionController, Dimension};
    ///
    /// # // proves: OBS-1 (availability per dimension and window)
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let controller = AdmissionController::builder()
    ///     .scope(ScopeConfig::new("api").requests(60, MINUTE).tokens(10_000, MINUTE))
    ///     .build()?;
    /// let snapshot = controller.snapshot();
    /// let scope = snapshot.scope_named("api").ok_or("no scope")?;
    /// assert_eq!(scope.limit(Dimension::Tokens, MINUTE).map(|l| l.limit), Some(10_000));
    /// assert_eq!(scope.available(Dimension::Requests, MINUTE), Some(60));
    /// assert_eq!(scope.available(Dimension::Requests, 2 * MINUTE), None);
    /// # Ok(()) }
    /// ```
    pub fn limit(&self, dimension: Dimension, window: Duration) -> Option<&LimitSnapshot> {
        self.limits
            .iter()
            .find(|l| l.dimension == dimension && l.window == window)
    }

    /// What the limit of `dimension` over `window` has available now
    /// (negative while in debt, SPEC Q-5), if the scope has that limit.
    pub fn available(&self, dimension: Dimension, window: Duration) -> Option<i64> {
        self.limit(dimension, window).map(|l| l.available)
    }

    /// The least available across every limit of `dimension` (the tightest
    /// window binds), if the scope limits that dimension at all.
    pub fn min_available(&self, dimension: Dimension) -> Option<i64> {
        self.limits
            .iter()
            .filter(|l| l.dimension == dimension)
            .map(|l| l.available)
            .min()
    }
}

impl AdmissionController {
    /// Every limit of `scope` as its shared store sees it now, in one round
    /// trip bounded by the store's timeout (SPEC OBS-1 for DQ-1). `None`
    /// for an unknown scope or one kept in this process (see
    /// [`snapshot`](Self::snapshot)).
    pub async fn shared_limits(
        &self,
        scope: ScopeId,
    ) -> Option<Result<Vec<LimitSnapshot>, StoreError>> {
        let shared = self.inner.scopes.get(scope.index())?.shared.as_ref()?;
        let answer = shared.remote().snapshot(shared.timeout).await;
        match &answer {
            Ok(_) => shared.answered(),
            Err(e) => shared.failed(self.inner.clock.now(), e),
        }
        Some(answer)
    }

    /// The limits of one scope brought up to now, as
    /// [`snapshot`](Self::snapshot) lists them in that scope's entry,
    /// appended to `out`, without building the rest of the snapshot (one
    /// lock of one scope, no names copied): what a per-response reader
    /// such as rate-limit headers needs. Returns `false` for an unknown or
    /// retired scope.
    pub fn scope_limits(&self, scope: ScopeId, out: &mut Vec<LimitSnapshot>) -> bool {
        let inner = &*self.inner;
        let Some(scope) = inner.scopes.get(scope.index()).filter(|s| !s.is_retired()) else {
            return false;
        };
        let now = inner.clock.now();
        let mut st = scope.state.lock();
        let store = scope.shared.as_ref().map(|shared| {
            // As in `snapshot`: reading is when an idle scope finds out
            // that its store answers again.
            shared.usable(now);
            shared.mode()
        });
        if matches!(store, None | Some(StoreMode::LocalFallback)) {
            st.store.snapshot(now, out);
        }
        true
    }

    /// A redacted view of the controller (SPEC OBS-1): counts and
    /// availability only, never payloads or identities of callers.
    pub fn snapshot(&self) -> Snapshot {
        let inner = &*self.inner;
        let now = inner.clock.now();
        let scopes = inner
            .scopes
            .iter()
            .map(|(_, scope)| scope)
            .filter(|scope| !scope.is_retired())
            .map(|scope| {
                let mut st = scope.state.lock();
                let mut limits = Vec::new();
                let mut counters = st.counters;
                let mut waiting = st.queue.len();
                counters.served_cost = st.queue.share.total;
                let mut flows: Vec<FlowSnapshot> =
                    st.queue.flows().into_iter().map(Into::into).collect();
                let store = scope.shared.as_ref().map(|shared| {
                    // Reading the state is when an idle scope finds out that
                    // its store answers again.
                    shared.usable(now);
                    shared.count(&mut counters);
                    waiting = shared.queued();
                    let (turn_flows, served) = shared.turn.flows();
                    flows = turn_flows.into_iter().map(Into::into).collect();
                    counters.served_cost = served;
                    shared.mode()
                });
                if matches!(store, None | Some(StoreMode::LocalFallback)) {
                    st.store.snapshot(now, &mut limits);
                }
                ScopeSnapshot {
                    id: scope.id,
                    name: scope.name.to_string(),
                    queued: waiting.min(scope.capacity()),
                    waiting_for_slot: waiting.saturating_sub(scope.capacity()),
                    queue_capacity: scope.capacity(),
                    pending: st.pending,
                    limits,
                    cooldown_generation: st.cooldown.generation,
                    cooldown_remaining: st.cooldown.active(now).map(|u| u - now),
                    counters,
                    store,
                    flows,
                }
            })
            .collect();
        Snapshot {
            closed: inner.closed.load(Ordering::Acquire),
            active: inner.active(),
            concurrency_limit: inner
                .pools
                .get(inner.pools.default_pool())
                .map(|p| p.permits.limit() as u64),
            concurrency_available: inner
                .pools
                .get(inner.pools.default_pool())
                .map(|p| p.permits.available()),
            pools: inner
                .pools
                .pools
                .iter()
                .filter(|(_, p)| !p.retired.load(Ordering::Relaxed))
                .map(|(i, p)| PoolSnapshot {
                    id: PoolId(u32::try_from(i).unwrap_or(u32::MAX)),
                    name: p.name.to_string(),
                    limit: p.permits.limit(),
                    available: p.permits.available(),
                    waiting: p.permits.waiting(),
                })
                .collect(),
            queue_capacity: inner.settings.queue_capacity(),
            overflow: inner.settings.overflow(),
            backend: inner.backend,
            scopes,
        }
    }
}

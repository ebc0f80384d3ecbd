//! Building a controller: its scopes, pools, clock and quota backend.

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use parking_lot::Mutex;
use tokio_util::sync::CancellationToken;

use super::controller::{AdmissionController, Inner};
use super::permits::Permits;
use super::pool_set::{PoolEntry, PoolSet};
use super::scope::Scope;
use super::settings::Settings;
use super::shared::{FallbackQuota, SharedScope};
use crate::call::ScopeId;
use crate::clock::{Instant, SharedClock, TokioClock, WallClock};
use crate::config::{ConfigError, ControllerConfig, Overflow, ScopeConfig};
use crate::quota::{LocalBackend, QuotaStore, SharedBackend, SharedRemote, Unavailable};

/// Builds an [`AdmissionController`]; see [`ControllerConfig`] for defaults.
#[derive(Debug, Default)]
#[must_use]
pub struct ControllerBuilder {
    config: ControllerConfig,
    clock: Option<SharedClock>,
    backend: Option<SharedBackend>,
    remote: Option<SharedRemote>,
}

impl ControllerBuilder {
    /// Adds a quota scope; scopes get ordinals in the order they are added.
    pub fn scope(mut self, scope: ScopeConfig) -> Self {
        self.config.scopes.push(scope);
        self
    }

    /// Waiting calls per scope (default 1024).
    pub fn queue_capacity(mut self, capacity: usize) -> Self {
        self.config.queue_capacity = capacity;
        self
    }

    /// Full-queue policy (default [`Overflow::Wait`]).
    pub fn overflow(mut self, overflow: Overflow) -> Self {
        self.config.overflow = overflow;
        self
    }

    /// At most `limit` active calls (default unlimited).
    pub fn concurrency(mut self, limit: u64) -> Self {
        self.config.concurrency = Some(limit);
        self
    }

    /// Adds a named concurrency pool (ordinals in the order added, after
    /// the default pool).
    pub fn pool(mut self, pool: crate::config::PoolConfig) -> Self {
        self.config.pools.push(pool);
        self
    }

    /// Fail early with `QuotaWaitTooLong` when quota is further away.
    pub fn max_wait(mut self, max_wait: Duration) -> Self {
        self.config.max_wait = Some(max_wait);
        self
    }

    /// Replaces the whole configuration.
    pub fn config(mut self, config: ControllerConfig) -> Self {
        self.config = config;
        self
    }

    /// Reads time from `clock` (default: tokio's clock).
    pub fn clock(mut self, clock: SharedClock) -> Self {
        self.clock = Some(clock);
        self
    }

    /// Keeps quota in `backend` (default: in-process).
    pub fn backend(mut self, backend: SharedBackend) -> Self {
        self.backend = Some(backend);
        self
    }

    /// Keeps every scope's quota in a store shared by several processes
    /// (SPEC DQ-1): each scope opens its store with
    /// [`RemoteBackend::open`](crate::quota::RemoteBackend::open). What
    /// belongs to one process stays local: the FIFO order (within this
    /// process only, DQ-4), concurrency permits, call ids, close and idle.
    /// A provider's budget reports and the cooldown after a provider 429
    /// are kept in the store too, for every process (DQ-9). While the store does not answer, a scope follows
    /// [`RemoteBackend::on_unavailable`](crate::quota::RemoteBackend::on_unavailable)
    /// (DQ-3). Scopes that learn their limits from the provider
    /// (`learn_limits`, Q-14) are refused: learned limits are per process.
    pub fn shared_store(mut self, remote: SharedRemote) -> Self {
        self.remote = Some(remote);
        self
    }

    /// Validates the configuration (SPEC CFG-1..3) and builds the controller.
    pub fn build(self) -> Result<AdmissionController, ConfigError> {
        let ControllerBuilder {
            mut config,
            clock,
            backend,
            remote,
        } = self;
        config.validate()?;
        if let Some(remote) = &remote {
            validate_shared(&config, remote.as_ref(), backend.is_some())?;
        }
        if config.scopes.is_empty() {
            config.scopes.push(ScopeConfig::new("default"));
        }
        let clock = clock.unwrap_or_else(|| Arc::new(TokioClock));
        let backend = backend.unwrap_or_else(|| Arc::new(LocalBackend));
        let now = clock.now();
        let wall = clock.wall();
        let pools = Arc::new(build_pools(&config));
        let parts = Parts {
            clock: &clock,
            wall,
            backend: &backend,
            remote: remote.as_ref(),
            pools: &pools,
            overflow: config.overflow,
        };
        let scopes = boxcar::Vec::new();
        for s in &config.scopes {
            let capacity = s.queue_capacity.unwrap_or(config.queue_capacity);
            scopes.push_with(|i| {
                parts.scope(
                    ScopeId(u32::try_from(i).unwrap_or(u32::MAX)),
                    s,
                    capacity,
                    now,
                )
            });
        }
        let backend_name = remote.as_ref().map_or(backend.name(), |r| r.name());
        Ok(AdmissionController {
            inner: Arc::new(Inner {
                clock,
                wall,
                scopes,
                pools,
                settings: Settings::new(&config),
                quota_backend: backend,
                remote,
                reconfiguring: Mutex::new(()),
                closed: AtomicBool::new(false),
                shutdown: CancellationToken::new(),
                ids: Mutex::new(HashSet::new()),
                backend: backend_name,
            }),
        })
    }
}

/// What a new scope is built from.
pub(crate) struct Parts<'a> {
    pub(crate) clock: &'a SharedClock,
    pub(crate) wall: WallClock,
    pub(crate) backend: &'a SharedBackend,
    pub(crate) remote: Option<&'a SharedRemote>,
    pub(crate) pools: &'a Arc<PoolSet>,
    pub(crate) overflow: Overflow,
}

impl Parts<'_> {
    /// Scope `id` of `s`, its store opened at `now`: in process, or in the
    /// shared store with its local fallback share.
    pub(crate) fn scope(
        &self,
        id: ScopeId,
        s: &ScopeConfig,
        capacity: usize,
        now: Instant,
    ) -> Scope {
        let Some(remote) = self.remote else {
            return Scope::new(
                id,
                s,
                capacity,
                self.backend.open(s, now, self.wall),
                self.pools.clone(),
            );
        };
        let replicas = match remote.on_unavailable() {
            Unavailable::FailOpenLocal { replicas } => replicas,
            Unavailable::FailClosed => 1,
        };
        let fallback: Box<dyn QuotaStore> = Box::new(FallbackQuota::new(s, replicas, now));
        let shared = SharedScope::new(
            s,
            remote.open(s),
            remote.timeout(),
            remote.on_unavailable(),
            capacity,
            self.overflow,
            Arc::clone(self.clock),
        );
        Scope::new(id, s, capacity, fallback, self.pools.clone()).with_shared(shared)
    }
}

/// The pool of `limit` permits and `waiting` waiters at most.
pub(crate) fn permits(limit: u64, waiting: Option<usize>) -> Permits {
    let limit = usize::try_from(limit).unwrap_or(usize::MAX);
    Permits::bounded(limit, waiting.unwrap_or(usize::MAX))
}

fn build_pools(config: &ControllerConfig) -> PoolSet {
    let mut pools = Vec::new();
    let mut default = None;
    if let Some(limit) = config.concurrency {
        default = Some(0);
        pools.push(PoolEntry::new(DEFAULT_POOL, permits(limit, None), None));
    }
    for p in &config.pools {
        pools.push(PoolEntry::new(
            &p.name,
            permits(p.limit, p.max_waiting),
            p.max_wait,
        ));
    }
    PoolSet::new(pools, default)
}

/// The name of the pool of `concurrency`.
pub(crate) const DEFAULT_POOL: &str = "default";

/// What a shared store needs of the configuration (SPEC CFG-3, DQ-3).
pub(crate) fn validate_shared(
    config: &ControllerConfig,
    remote: &dyn crate::quota::RemoteBackend,
    backend: bool,
) -> Result<(), ConfigError> {
    if backend {
        return Err(ConfigError::new(
            "quota_store",
            "a controller keeps quota either in a backend or in a shared store, not both",
        ));
    }
    if remote.timeout().is_zero() {
        return Err(ConfigError::new(
            "quota_store.timeout",
            "must be longer than zero",
        ));
    }
    if remote.on_unavailable() == (Unavailable::FailOpenLocal { replicas: 0 }) {
        return Err(ConfigError::new(
            "quota_store.replicas",
            "must be at least 1",
        ));
    }
    // The store keeps one state per dimension, arithmetic and window (to
    // the microsecond, rounded up), a calendar window as a sliding window
    // of its longest period: two such limits of one scope would share it.
    for s in &config.scopes {
        let limits = s.limits();
        let counted = |k: &crate::config::Limit| {
            let (algorithm, window) = k.without_calendar(s.algorithm);
            (
                k.dimension,
                std::mem::discriminant(&algorithm),
                window.as_nanos().div_ceil(1_000),
            )
        };
        for (j, l) in limits.iter().enumerate() {
            let same = |k: &crate::config::Limit| counted(k) == counted(l);
            if let Some(i) = limits[..j].iter().position(same) {
                return Err(ConfigError::new(
                    format!("scopes.{}.limits[{j}]", s.name()),
                    format!(
                        "has the same dimension and window as limits[{i}]; a shared quota \
                         store keeps one count per dimension and window (keep the lower amount)"
                    ),
                ));
            }
        }
    }
    if let Some(s) = config.scopes.iter().find(|s| s.learns().is_some()) {
        return Err(ConfigError::new(
            format!("scopes.{}.learn_limits", s.name()),
            "cannot be used with a shared quota store: limits learned from one \
             process's responses would not be shared (configure the limits)",
        ));
    }
    Ok(())
}

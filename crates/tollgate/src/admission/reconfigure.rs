//! A new configuration for a running controller, applied in place
//! (SPEC GW-15; see `docs/design.md`, "Reload").
//!
//! Nothing is rebuilt: every scope and pool the new configuration names
//! (matched by name) is the running one, reconfigured under its own lock,
//! so whatever it holds carries over: the quota store's state (admissions
//! in the window, pending reservations, debts, what the provider's answers
//! taught), the cooldown and its generation, the FIFO queue with every
//! waiter in its place, the grants waiting for a permit, the permits held
//! and the pools' waiting lines. Leases taken before settle where they
//! were taken.
//!
//! * A scope's limits change as `QuotaStore::reconfigure` says (for the
//!   in-process store, `quota/local/reconfigure.rs`: what is counted stays
//!   counted). Queued calls whose demand no longer fits a whole limit fail
//!   at once with `EstimateExceedsLimit` (SPEC Q-3), the others are judged
//!   against the new limits in their order; a head waiting for room is
//!   re-armed for its new instant.
//! * A pool takes its new size in place: permits held count against it; a
//!   size below them admits nothing new until enough come back.
//! * Settings (`queue_capacity`, `overflow`, `max_wait`, `cooldown`) apply
//!   from now on; a running cooldown keeps its end.
//! * A scope or pool the configuration no longer names is *retired*: no
//!   longer found by name nor shown in snapshots, while calls that hold its
//!   ordinal finish (and settle) there. One that comes back later is the
//!   same scope again. New ones are appended: ordinals stay valid for the
//!   controller's life.
//! * A scope kept in a shared store takes a new store handle for its new
//!   limits (the store keeps the state of every limit whose algorithm,
//!   dimension and window are unchanged); reservations already taken
//!   settle through the handle they were taken with, and what one used
//!   beyond its estimate also counts, through the new handle, in the
//!   limits the reload added (`shared/settle.rs`, as a local scope's new
//!   limits count it).

use std::sync::atomic::Ordering;

use super::builder::{DEFAULT_POOL, Parts, permits, validate_shared};
use super::controller::{AdmissionController, Inner};
use super::pool_set::PoolEntry;
use super::scope::{Scope, ScopeState};
use crate::call::ScopeId;
use crate::clock::Instant;
use crate::config::{ConfigError, ControllerConfig, ScopeConfig};

/// A checked new configuration of a controller, applied by
/// [`apply`](Reconfiguration::apply). Checking first lets a caller prepare
/// several controllers and apply all of them or none.
#[derive(Debug)]
#[must_use = "nothing changes until it is applied"]
pub struct Reconfiguration {
    controller: AdmissionController,
    config: ControllerConfig,
}

impl AdmissionController {
    /// Checks `config` as a new configuration of this controller (the same
    /// checks as [`build`](crate::ControllerBuilder::build), SPEC CFG-1..3)
    /// without changing anything.
    pub fn prepare(&self, mut config: ControllerConfig) -> Result<Reconfiguration, ConfigError> {
        config.validate()?;
        if let Some(remote) = &self.inner.remote {
            validate_shared(&config, remote.as_ref(), false)?;
        }
        if config.scopes.is_empty() {
            config.scopes.push(ScopeConfig::new("default"));
        }
        Ok(Reconfiguration {
            controller: self.clone(),
            config,
        })
    }

    /// Applies `config` to the running controller in place, keeping every
    /// scope's quota state, cooldown, queue and calls in flight (SPEC
    /// GW-15): [`prepare`](Self::prepare) then
    /// [`apply`](Reconfiguration::apply). On error nothing changed.
    pub fn reconfigure(&self, config: ControllerConfig) -> Result<(), ConfigError> {
        self.prepare(config)?.apply();
        Ok(())
    }
}

impl Reconfiguration {
    /// Applies the configuration (see the module documentation). Cannot
    /// fail; reconfigurations of one controller apply one at a time.
    pub fn apply(self) {
        let inner = &*self.controller.inner;
        let config = &self.config;
        let _one = inner.reconfiguring.lock();
        let now = inner.clock.now();
        inner.settings.set(config);
        reconfigure_pools(inner, config);
        let parts = Parts {
            clock: &inner.clock,
            wall: inner.wall,
            backend: &inner.quota_backend,
            remote: inner.remote.as_ref(),
            pools: &inner.pools,
            overflow: config.overflow,
        };
        for s in &config.scopes {
            let capacity = s.queue_capacity.unwrap_or(config.queue_capacity);
            let running = inner
                .scopes
                .iter()
                .find(|(_, scope)| &*scope.name == s.name());
            match running {
                Some((_, scope)) => reconfigure_scope(inner, scope, s, capacity, config, now),
                None => {
                    let i = inner.scopes.push_with(|i| {
                        parts.scope(
                            ScopeId(u32::try_from(i).unwrap_or(u32::MAX)),
                            s,
                            capacity,
                            now,
                        )
                    });
                    if inner.closed.load(Ordering::Acquire)
                        && let Some(scope) = inner.scopes.get(i)
                    {
                        scope.state.lock().closed = true;
                    }
                }
            }
        }
        for (_, scope) in inner.scopes.iter() {
            if !config.scopes.iter().any(|s| s.name() == &*scope.name) {
                scope.retired.store(true, Ordering::Relaxed);
            }
        }
    }
}

/// Resizes, appends and retires the pools of `config` (the default pool of
/// `concurrency` first).
fn reconfigure_pools(inner: &Inner, config: &ControllerConfig) {
    let pools = &inner.pools;
    let default = config.concurrency.map(|limit| {
        let p = crate::config::PoolConfig::new(DEFAULT_POOL, limit);
        (p, true)
    });
    let wanted: Vec<_> = default
        .into_iter()
        .chain(config.pools.iter().map(|p| (p.clone(), false)))
        .collect();
    let mut default_id = None;
    for (p, is_default) in &wanted {
        let waiting = p.max_waiting.unwrap_or(usize::MAX);
        let limit = usize::try_from(p.limit).unwrap_or(usize::MAX);
        let running = pools.pools.iter().find(|(_, e)| *e.name == *p.name);
        let id = match running {
            Some((i, entry)) => {
                entry.permits.resize(limit, waiting);
                entry.max_wait.set(p.max_wait);
                entry.retired.store(false, Ordering::Relaxed);
                i
            }
            None => pools.pools.push(PoolEntry::new(
                &p.name,
                permits(p.limit, p.max_waiting),
                p.max_wait,
            )),
        };
        if *is_default {
            default_id = u32::try_from(id).ok();
        }
    }
    pools.set_default(default_id);
    for (_, entry) in pools.pools.iter() {
        if !wanted.iter().any(|(p, _)| *p.name == *entry.name) {
            entry.retired.store(true, Ordering::Relaxed);
        }
    }
}

/// Reconfigures one running scope under its lock (see the module
/// documentation).
fn reconfigure_scope(
    inner: &Inner,
    scope: &Scope,
    config: &ScopeConfig,
    capacity: usize,
    controller: &ControllerConfig,
    now: Instant,
) {
    scope.retired.store(false, Ordering::Relaxed);
    scope.capacity.store(capacity, Ordering::Relaxed);
    scope
        .needs_estimate
        .store(config.needs_estimate(), Ordering::Relaxed);
    scope
        .needs_price
        .store(config.has_cost_limit(), Ordering::Relaxed);
    // A scope that learns finds out at the next answer whether it still
    // waits for its first one (a cheap check when it does not).
    scope
        .learning
        .store(config.learns().is_some(), Ordering::Release);
    // Before the shared store's limits change: a call that starts
    // reserving after them sees what they need (SPEC Q-3, BUD-1).
    scope.state.lock().needs = super::scope::Needs {
        estimate: config.needs_estimate(),
        price: config.has_cost_limit(),
    };
    if let (Some(shared), Some(remote)) = (&scope.shared, &inner.remote) {
        shared.reconfigure(config, remote.open(config), capacity, controller.overflow);
    }
    let mut st = scope.state.lock();
    if !st.store.reconfigure(config, now) {
        st.store = inner.quota_backend.open(config, now, inner.wall);
    }
    st.reconfigure_flows(config);
    st.reconfigured(now);
}

impl ScopeState {
    /// After its store took new limits: the queued calls whose demand can
    /// never fit fail now (SPEC Q-3; a call already granted keeps its
    /// grant) and the head, armed for an instant of the old limits, is
    /// judged again, and the head the fair scheduler picks (SPEC FAIR-1;
    /// maybe of another flow) is armed for its instant under the new
    /// limits. The one place a reconfiguration touches the queue: every
    /// waiter keeps its place in its flow's line.
    fn reconfigured(&mut self, now: Instant) {
        self.invalidate_projection();
        self.head_armed = None;
        self.ready_at = None;
        self.recheck_at = None;
        if !self.closed {
            self.fail_unfit(now);
        }
    }
}

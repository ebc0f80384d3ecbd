//! Concurrency pools of a controller (SPEC ADM-7, POOL-1, POOL-3).
//!
//! A controller owns a set of pools, each a fair (FIFO) counting
//! semaphore with an optional waiting bound and maximum wait. Every
//! attempt takes one permit from its call's pool (or the controller's
//! default pool, when a controller-wide concurrency limit is configured),
//! after its quota reservation and in the order reservations were granted;
//! between flows, a freed permit goes to the waiting flow holding the
//! fewest (SPEC FAIR-6, `permits.rs`). A reconfiguration resizes pools in
//! place, appends new ones and retires removed ones (`reconfigure.rs`): an
//! ordinal stays valid for the controller's life.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering};

use super::idle::Idle;
use super::permits::{Permits, Refused, TryAcquire};
use super::settings::AtomicDuration;
use crate::call::PoolId;
use crate::error::AdmissionError;

/// One pool of a controller.
#[derive(Debug)]
pub(crate) struct PoolEntry {
    pub(crate) name: Arc<str>,
    pub(crate) permits: Arc<Permits>,
    pub(crate) max_wait: AtomicDuration,
    /// Removed by a reconfiguration: no longer found by name; calls that
    /// hold its ordinal finish there.
    pub(crate) retired: AtomicBool,
}

impl PoolEntry {
    pub(crate) fn new(name: &str, permits: Permits, max_wait: Option<std::time::Duration>) -> Self {
        PoolEntry {
            name: Arc::from(name),
            permits: Arc::new(permits),
            max_wait: AtomicDuration::new(max_wait),
            retired: AtomicBool::new(false),
        }
    }
}

/// All pools of a controller, shared with its scopes.
///
/// Every permit that comes back, by whatever path, comes back through
/// [`release`](Self::release) or [`cancel`](Self::cancel), which wake
/// whoever waits for the controller to be idle (see `idle.rs`).
#[derive(Debug, Default)]
pub(crate) struct PoolSet {
    pub(crate) pools: boxcar::Vec<PoolEntry>,
    /// The pool of calls that name none (`u32::MAX`: none).
    default: AtomicU32,
    /// Leases without a pool (a pool's permits count the others).
    unpooled: AtomicUsize,
    idle: Idle,
}

impl PoolSet {
    pub(crate) fn new(pools: Vec<PoolEntry>, default: Option<u32>) -> Self {
        PoolSet {
            pools: pools.into_iter().collect(),
            default: AtomicU32::new(default.unwrap_or(u32::MAX)),
            unpooled: AtomicUsize::new(0),
            idle: Idle::default(),
        }
    }

    /// The pool of calls that name none.
    pub(crate) fn default_pool(&self) -> Option<u32> {
        match self.default.load(Ordering::Relaxed) {
            u32::MAX => None,
            p => Some(p),
        }
    }

    /// Sets the pool of calls that name none (a reconfiguration).
    pub(crate) fn set_default(&self, pool: Option<u32>) {
        self.default
            .store(pool.unwrap_or(u32::MAX), Ordering::Relaxed);
    }

    /// The ordinal of the pool called `name` (retired pools excluded).
    pub(crate) fn find(&self, name: &str) -> Option<u32> {
        self.pools
            .iter()
            .find(|(_, p)| &*p.name == name && !p.retired.load(Ordering::Relaxed))
            .and_then(|(i, _)| u32::try_from(i).ok())
    }

    /// Capacity held: permits taken from any pool (a permit is only ever
    /// held on the way to a lease or by one) plus unpooled leases.
    pub(crate) fn active(&self) -> usize {
        let pooled: usize = self.pools.iter().map(|(_, p)| p.permits.held()).sum();
        pooled + self.unpooled.load(Ordering::SeqCst)
    }

    /// Resolves once no capacity is held.
    pub(crate) async fn idle(&self) {
        self.idle.wait(|| self.active()).await;
    }

    /// A lease without a pool begins.
    #[inline]
    pub(crate) fn hold_unpooled(&self) {
        self.unpooled.fetch_add(1, Ordering::SeqCst);
    }

    /// A lease without a pool ends.
    #[inline]
    pub(crate) fn release_unpooled(&self) {
        self.unpooled.fetch_sub(1, Ordering::SeqCst);
        self.idle.released(|| self.active());
    }

    pub(crate) fn get(&self, pool: Option<u32>) -> Option<&PoolEntry> {
        self.pools.get(pool? as usize)
    }

    /// The pool a call uses.
    #[inline]
    pub(crate) fn resolve(&self, pool: Option<PoolId>) -> Result<Option<u32>, AdmissionError> {
        match pool {
            None => Ok(self.default_pool()),
            Some(p) if (p.0 as usize) < self.pools.count() => Ok(Some(p.0)),
            Some(p) => Err(AdmissionError::UnknownPool(p)),
        }
    }

    /// Takes a permit for `holder` without waiting (`true` when the call
    /// has no pool).
    #[inline]
    pub(crate) fn try_acquire(
        &self,
        pool: Option<u32>,
        holder: u64,
    ) -> Result<bool, AdmissionError> {
        match self.get(pool) {
            None => Ok(true),
            Some(p) => match p.permits.try_acquire_for(holder) {
                Ok(()) => Ok(true),
                Err(TryAcquire::NoPermits) => Ok(false),
                Err(TryAcquire::Closed) => Err(AdmissionError::Closed),
            },
        }
    }

    /// Returns a permit `holder` held.
    #[inline]
    pub(crate) fn release(&self, pool: Option<u32>, holder: u64) {
        if let Some(p) = self.get(pool) {
            p.permits.release_for(holder);
            self.idle.released(|| self.active());
        }
    }

    /// Joins the pool's queue for `holder` (see `Permits::register`).
    /// `Ok(None)`: a permit is held now (or the call has no pool).
    pub(crate) fn register(
        &self,
        pool: Option<u32>,
        holder: u64,
    ) -> Result<Option<usize>, AdmissionError> {
        match self.get(pool) {
            None => Ok(None),
            Some(p) => p
                .permits
                .register_for(holder)
                .map_err(|why| refused(why, pool)),
        }
    }

    /// Withdraws from a pool's queue.
    pub(crate) fn cancel(&self, pool: Option<u32>, key: usize) {
        if let Some(p) = self.get(pool) {
            p.permits.cancel(key);
            self.idle.released(|| self.active());
        }
    }

    pub(crate) fn close(&self) {
        for (_, p) in self.pools.iter() {
            p.permits.close();
        }
    }
}

/// The admission error for a refused permit.
pub(crate) fn refused(why: Refused, pool: Option<u32>) -> AdmissionError {
    match (why, pool) {
        (Refused::Full, Some(p)) => AdmissionError::PoolFull { pool: PoolId(p) },
        _ => AdmissionError::Closed,
    }
}

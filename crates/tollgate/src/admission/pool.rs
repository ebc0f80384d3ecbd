//! A standalone fair pool with a waiting bound (SPEC POOL-1..POOL-5), for
//! per-call permits such as a gateway tenant's: acquired once per call,
//! held across retries and fallbacks, released exactly once.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::time::Sleep;

use super::permits::{Permits, Refused, TryAcquire};
use super::snapshot::PoolSnapshot;
use crate::call::PoolId;
use crate::clock::{Instant, SharedClock, TokioClock};
use crate::config::{ConfigError, PoolConfig};
use crate::deadline::{Deadline, Phase};
use crate::error::AdmissionError;

struct Shared {
    id: PoolId,
    name: Arc<str>,
    permits: Permits,
    max_wait: Option<Duration>,
    clock: SharedClock,
}

/// A fair (FIFO) pool of permits with a finite waiting bound; the wait of
/// each caller is bounded by `min(max_wait, remaining deadline)`.
/// Cloning shares the pool.
#[derive(Clone)]
pub struct Pool {
    shared: Arc<Shared>,
}

impl fmt::Debug for Pool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Pool")
            .field("id", &self.shared.id)
            .field("name", &self.shared.name)
            .finish_non_exhaustive()
    }
}

impl Pool {
    /// A pool from `config` with id `id`, on tokio's clock.
    pub fn new(id: PoolId, config: &PoolConfig) -> Result<Self, ConfigError> {
        Self::with_clock(id, config, Arc::new(TokioClock))
    }

    /// A pool reading time from `clock`.
    pub fn with_clock(
        id: PoolId,
        config: &PoolConfig,
        clock: SharedClock,
    ) -> Result<Self, ConfigError> {
        config.validate()?;
        let limit = usize::try_from(config.limit).unwrap_or(usize::MAX);
        Ok(Pool {
            shared: Arc::new(Shared {
                id,
                name: Arc::from(config.name.as_str()),
                permits: Permits::bounded(limit, config.max_waiting.unwrap_or(usize::MAX)),
                max_wait: config.max_wait,
                clock,
            }),
        })
    }

    /// The pool's id.
    pub fn id(&self) -> PoolId {
        self.shared.id
    }

    /// Takes a permit if one is free and nobody waits.
    pub fn try_acquire(&self) -> Option<PoolPermit> {
        self.shared
            .permits
            .try_acquire()
            .ok()
            .map(|()| self.permit())
    }

    fn permit(&self) -> PoolPermit {
        PoolPermit {
            shared: Some(Arc::clone(&self.shared)),
        }
    }

    /// Waits for a permit in FIFO order. Fails at once with `PoolFull` when
    /// the waiting bound is reached, with `DeadlineExceeded { phase:
    /// concurrency }` when the deadline or the pool's `max_wait` runs out
    /// first, with `Closed` after [`close`](Self::close).
    ///
    /// # Cancel safety
    ///
    /// Dropping the future leaves the queue; a permit handed to it meanwhile
    /// passes to the next waiter.
    pub fn acquire(&self, deadline: Deadline) -> PoolAcquire<'_> {
        PoolAcquire {
            pool: self,
            deadline,
            started: None,
            key: None,
            timer: None,
        }
    }

    /// Refuses new waiters and wakes the current ones with `Closed`.
    pub fn close(&self) {
        self.shared.permits.close();
    }

    /// Limit, free permits and waiters.
    pub fn snapshot(&self) -> PoolSnapshot {
        let p = &self.shared.permits;
        PoolSnapshot {
            id: self.shared.id,
            name: self.shared.name.to_string(),
            limit: p.limit(),
            available: p.available(),
            waiting: p.waiting(),
        }
    }
}

/// The future returned by [`Pool::acquire`].
#[must_use = "futures do nothing unless polled"]
pub struct PoolAcquire<'a> {
    pool: &'a Pool,
    deadline: Deadline,
    started: Option<Instant>,
    key: Option<usize>,
    timer: Option<Pin<Box<Sleep>>>,
}

impl fmt::Debug for PoolAcquire<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PoolAcquire")
            .field("queued", &self.key.is_some())
            .finish_non_exhaustive()
    }
}

impl Future for PoolAcquire<'_> {
    type Output = Result<PoolPermit, AdmissionError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        let shared = &this.pool.shared;
        let now = shared.clock.now();
        let started = *this.started.get_or_insert(now);
        if this.key.is_none() {
            match shared.permits.try_acquire() {
                Ok(()) => return Poll::Ready(Ok(this.pool.permit())),
                Err(TryAcquire::Closed) => return Poll::Ready(Err(AdmissionError::Closed)),
                Err(TryAcquire::NoPermits) => {}
            }
            // A deadline already past fails before any wait (DL-5).
            this.deadline.check(now, Phase::Concurrency)?;
        }
        match shared.permits.poll_acquire(cx, &mut this.key) {
            Poll::Ready(Ok(())) => return Poll::Ready(Ok(this.pool.permit())),
            Poll::Ready(Err(Refused::Full)) => {
                return Poll::Ready(Err(AdmissionError::PoolFull { pool: shared.id }));
            }
            Poll::Ready(Err(Refused::Closed)) => return Poll::Ready(Err(AdmissionError::Closed)),
            Poll::Pending => {}
        }
        let local = shared.max_wait.and_then(|w| started.checked_add(w));
        let until = match (local, this.deadline.instant()) {
            (Some(l), Some(d)) => l.min(d),
            (Some(l), None) => l,
            (None, Some(d)) => d,
            (None, None) => return Poll::Pending,
        };
        let timer = this
            .timer
            .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(until)));
        if timer.deadline() != until {
            timer.as_mut().reset(until);
        }
        if until > now && timer.as_mut().poll(cx).is_pending() {
            return Poll::Pending;
        }
        if let Some(key) = this.key.take() {
            // A permit handed over at this very moment is passed on.
            shared.permits.cancel(key);
        }
        Poll::Ready(Err(AdmissionError::DeadlineExceeded {
            phase: Phase::Concurrency,
            retry_at: None,
        }))
    }
}

impl Drop for PoolAcquire<'_> {
    fn drop(&mut self) {
        if let Some(key) = self.key.take() {
            self.pool.shared.permits.cancel(key);
        }
    }
}

/// A permit of a [`Pool`], returned on drop or by
/// [`release`](PoolPermit::release), exactly once.
#[must_use = "dropping the permit releases it at once"]
pub struct PoolPermit {
    shared: Option<Arc<Shared>>,
}

impl PoolPermit {
    /// Returns the permit. Idempotent; also done on drop.
    pub fn release(&mut self) {
        if let Some(shared) = self.shared.take() {
            shared.permits.release();
        }
    }

    /// The pool it belongs to.
    pub fn pool(&self) -> Option<PoolId> {
        self.shared.as_ref().map(|s| s.id)
    }
}

impl fmt::Debug for PoolPermit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PoolPermit")
            .field("pool", &self.pool())
            .finish()
    }
}

impl Drop for PoolPermit {
    fn drop(&mut self) {
        self.release();
    }
}

//! Waiting until a controller holds no capacity (SPEC LC-7).
//!
//! A controller is idle when no permit of any pool is taken and no unpooled
//! lease is held. Permits come back by many paths: a lease released, a
//! waiter that gives back a grant it never collected, a preempted attempt,
//! a permit handed to a waiter that was dropped. Every one of them goes
//! through [`PoolSet`](super::pool_set::PoolSet), which calls
//! [`Idle::released`] afterwards, so no path can forget to wake a waiter.
//!
//! # Why no wake-up is lost
//!
//! The check "is anybody waiting?" on the release side and the check "is
//! anything still held?" on the waiting side form the classic store/load
//! pair: each side writes one location and reads the other. All of them
//! are sequentially consistent (the permit counters' read-modify-writes,
//! the waiter count, and the loads of both), so in their single total order
//! either the releaser sees the waiter (and wakes it, its `Notified` being
//! enabled before it counted), or the waiter's count sees the release.
//! On x86 these are the same instructions as acquire/release ones, so the
//! hot path pays nothing for it.

use std::pin::pin;
use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::sync::Notify;

/// Wakes idle waiters when the last held capacity comes back.
#[derive(Debug, Default)]
pub(crate) struct Idle {
    waiters: AtomicUsize,
    notify: Notify,
}

impl Idle {
    /// Called after capacity came back; `active` counts what is still held.
    #[inline]
    pub(crate) fn released(&self, active: impl FnOnce() -> usize) {
        if self.waiters.load(Ordering::SeqCst) > 0 {
            self.wake_if_idle(active);
        }
    }

    #[cold]
    fn wake_if_idle(&self, active: impl FnOnce() -> usize) {
        if active() == 0 {
            self.notify.notify_waiters();
        }
    }

    /// Resolves once `active` reads zero.
    pub(crate) async fn wait(&self, active: impl Fn() -> usize) {
        let _counted = Counted::new(&self.waiters);
        loop {
            let mut notified = pin!(self.notify.notified());
            notified.as_mut().enable();
            if active() == 0 {
                return;
            }
            notified.await;
        }
    }
}

/// Counts a waiter for as long as it waits (cancel safe).
struct Counted<'a>(&'a AtomicUsize);

impl<'a> Counted<'a> {
    fn new(waiters: &'a AtomicUsize) -> Self {
        waiters.fetch_add(1, Ordering::SeqCst);
        Counted(waiters)
    }
}

impl Drop for Counted<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

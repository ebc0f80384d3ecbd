//! How a supervised stream's close reaches the `__anext__` in flight and
//! how the close waits for it (SPEC LC-5, POOL-1): [`Closed`] tells the
//! `__anext__` to drop the engine's stream at its next turn,
//! [`or_closed`] races what it awaits against that, and [`Holder`] /
//! [`Holding`] let the close wait until it has let go of the stream.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::Poll;

use tokio::sync::Notify;

/// The iterator was closed; wakes an `__anext__` in flight.
#[derive(Default)]
pub(super) struct Closed {
    set: AtomicBool,
    notify: Notify,
}

impl Closed {
    pub(super) fn close(&self) {
        self.set.store(true, Ordering::Release);
        self.notify.notify_one();
    }

    pub(super) fn is_set(&self) -> bool {
        self.set.load(Ordering::Acquire)
    }
}

/// Whether an `__anext__` holds the engine's stream (the state is
/// `Busy`), and the wake-up of those waiting for it to let go.
#[derive(Default)]
pub(super) struct Holder {
    held: AtomicBool,
    released: Notify,
}

impl Holder {
    /// Until no `__anext__` holds the stream.
    pub(super) async fn let_go(&self) {
        loop {
            let released = self.released.notified();
            let mut released = std::pin::pin!(released);
            released.as_mut().enable();
            if !self.held.load(Ordering::Acquire) {
                return;
            }
            released.await;
        }
    }
}

/// An `__anext__`'s hold on the stream, taken under the state's lock as
/// the state turns `Busy`; dropped after the stream it held (declared
/// before it), when the future ends or is dropped.
pub(super) struct Holding(Arc<Holder>);

impl Holding {
    pub(super) fn take(holder: &Arc<Holder>) -> Self {
        holder.held.store(true, Ordering::Release);
        Holding(Arc::clone(holder))
    }
}

impl Drop for Holding {
    fn drop(&mut self) {
        self.0.held.store(false, Ordering::Release);
        self.0.released.notify_waiters();
    }
}

/// `future`'s output, or `None` as soon as the stream is closed (the
/// future is then dropped by the caller, cancelling what it ran).
pub(super) async fn or_closed<F: Future>(closed: &Closed, future: F) -> Option<F::Output> {
    let notified = closed.notify.notified();
    let mut notified = std::pin::pin!(notified);
    let mut future = std::pin::pin!(future);
    std::future::poll_fn(|cx| {
        if closed.is_set() || notified.as_mut().poll(cx).is_ready() {
            return Poll::Ready(None);
        }
        future.as_mut().poll(cx).map(Some)
    })
    .await
}

//! Waking an asyncio task from any thread without touching the GIL inside
//! `wake` (SPEC PY-2).
//!
//! A future polled on an event loop's thread gets a [`LoopWake`] as its
//! waker. When the future returns `Pending`, the awaitable yields an asyncio
//! future to the task and installs it as the wake's target. `wake` may run
//! on any thread, including under one of the engine's locks, so it never
//! calls Python: it hands the target to one notifier thread, which takes
//! the GIL and resolves it through `loop.call_soon_threadsafe`. A target
//! whose task was cancelled is already done and is left alone; a target
//! whose loop has closed makes `call_soon_threadsafe` raise, and that error
//! is dropped, so a late wake prints nothing.
//!
//! One exception: the done callback of an awaited Python task (see
//! `pyawait.rs`) runs on the loop's own thread, holding the GIL and no
//! engine lock; its wake resolves the target at once ([`direct`]).

use std::cell::Cell;
use std::sync::Arc;
use std::task::Wake;

use parking_lot::Mutex;
use pyo3::prelude::*;

thread_local! {
    /// Set while a wake may resolve its target on this thread directly.
    static DIRECT: Cell<bool> = const { Cell::new(false) };
}

/// Runs `f` (which wakes a waker) with direct wakes allowed: only call it
/// on an event loop's thread, holding the GIL, with no engine lock held.
pub(crate) fn direct<T>(f: impl FnOnce() -> T) -> T {
    with_direct(true, f)
}

/// Runs `f` (which may wake wakers) with direct wakes forbidden, even
/// inside [`direct`]: for code that may run engine code, which wakes
/// under its locks (a lease released by the garbage collector).
pub(crate) fn indirect<T>(f: impl FnOnce() -> T) -> T {
    with_direct(false, f)
}

fn with_direct<T>(allowed: bool, f: impl FnOnce() -> T) -> T {
    let before = DIRECT.with(|d| d.replace(allowed));
    let out = f();
    DIRECT.with(|d| d.set(before));
    out
}

/// The waker of one awaited future.
#[derive(Default)]
pub(crate) struct LoopWake {
    state: Mutex<WakeState>,
}

#[derive(Default)]
struct WakeState {
    /// Set by `wake`, cleared before each poll.
    woken: bool,
    /// The asyncio future the task waits on, while it waits.
    target: Option<Py<PyAny>>,
}

impl LoopWake {
    /// Clears the woken flag before a poll.
    pub(crate) fn reset(&self) {
        let mut st = self.state.lock();
        st.woken = false;
        st.target = None;
    }

    /// Whether a wake came since the last [`reset`](Self::reset).
    pub(crate) fn woken(&self) -> bool {
        self.state.lock().woken
    }

    /// Installs `target` to be resolved by the next wake. `false` when a
    /// wake already came (the caller resolves `target` itself).
    pub(crate) fn install(&self, target: Py<PyAny>) -> Result<(), Py<PyAny>> {
        let mut st = self.state.lock();
        if st.woken {
            return Err(target);
        }
        st.target = Some(target);
        Ok(())
    }

    /// Forgets the target (the awaiting task went away).
    pub(crate) fn clear(&self) {
        self.state.lock().target = None;
    }
}

impl Wake for LoopWake {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        let target = {
            let mut st = self.state.lock();
            st.woken = true;
            st.target.take()
        };
        if let Some(target) = target {
            if crate::gil::held() && DIRECT.with(Cell::get) {
                // On the target's loop thread, outside any engine lock.
                Python::attach(|py| crate::notifier::wake_now(py, target.bind(py)));
            } else {
                // Possibly under an engine lock: no Python here, not even
                // with the GIL held (Python may hand the GIL to a thread
                // that then waits for that lock).
                crate::notifier::send(crate::notifier::Job::Wake(target));
            }
        }
    }
}

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

use std::sync::mpsc::{Receiver, Sender, channel};
use std::sync::{Arc, OnceLock};
use std::task::Wake;

use parking_lot::Mutex;
use pyo3::prelude::*;

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
            notify(target);
        }
    }
}

/// Sends `target` to the notifier thread.
fn notify(target: Py<PyAny>) {
    static NOTIFIER: OnceLock<std::sync::Mutex<Sender<Py<PyAny>>>> = OnceLock::new();
    let sender = NOTIFIER.get_or_init(|| {
        let (tx, rx) = channel();
        std::thread::Builder::new()
            .name("tollgate-notify".into())
            .spawn(move || run_notifier(rx))
            .expect("the notifier thread starts");
        std::sync::Mutex::new(tx)
    });
    if let Ok(tx) = sender.lock() {
        // The receiver lives as long as the process.
        let _ = tx.send(target);
    }
}

/// Resolves targets, in batches: one GIL acquisition for all the wakes
/// that arrived meanwhile.
fn run_notifier(rx: Receiver<Py<PyAny>>) {
    while let Ok(first) = rx.recv() {
        let mut batch = vec![first];
        batch.extend(rx.try_iter());
        Python::attach(|py| {
            for target in batch {
                let _ = resolve_soon(py, target.bind(py));
            }
        });
    }
}

/// `target.get_loop().call_soon_threadsafe(_wake, target)`.
fn resolve_soon(py: Python<'_>, target: &Bound<'_, PyAny>) -> PyResult<()> {
    let event_loop = target.call_method0(pyo3::intern!(py, "get_loop"))?;
    let wake = wake_function(py)?;
    event_loop.call_method1(pyo3::intern!(py, "call_soon_threadsafe"), (wake, target))?;
    Ok(())
}

/// The callback that resolves a target on its loop, unless its task
/// already went away.
fn wake_function(py: Python<'_>) -> PyResult<&Bound<'_, PyAny>> {
    static WAKE: pyo3::sync::PyOnceLock<Py<PyAny>> = pyo3::sync::PyOnceLock::new();
    WAKE.get_or_try_init(py, || {
        Ok::<_, PyErr>(wrap_pyfunction!(wake_target, py)?.into_any().unbind())
    })
    .map(|f| f.bind(py))
}

#[pyfunction]
fn wake_target(target: &Bound<'_, PyAny>) -> PyResult<()> {
    if !target.call_method0("done")?.is_truthy()? {
        target.call_method1("set_result", (target.py().None(),))?;
    }
    Ok(())
}

//! Python awaitables awaited from Rust futures (SPEC PY-3, PY-4).
//!
//! The supervised calls run the engine's `Supervisor` future on the
//! awaiting loop's thread (`driver.rs`); its provider attempts call Python:
//! an SDK coroutine, an httpx transport, an async iterator's `__anext__`.
//! [`PyAwait`] runs such an awaitable as an asyncio task on the loop that
//! polls it, and completes when the task does:
//!
//! * the task is created at the first poll, on the polling thread's
//!   running loop (the supervised call's own loop);
//! * its done callback marks the outcome taken (so asyncio never prints
//!   "exception was never retrieved") and wakes the Rust waker on the
//!   loop's thread, which resolves the awaiting task's future directly
//!   (`waker::direct`), without the notifier thread;
//! * dropping a `PyAwait` whose task still runs cancels the task: at once
//!   when the GIL is held here (a drop on the loop's thread), else through
//!   the notifier thread (a drop on a tokio worker, e.g. a stream's
//!   watchdog ending it at its deadline). A coroutine never started is
//!   closed, so Python does not warn that it was never awaited.
//!
//! [`Mode::Blocking`] is the synchronous counterpart (the sync httpx
//! transport): the Python call returns its value directly.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll, Waker};

use parking_lot::Mutex;
use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;

use tollgate::Lease;

use crate::gil;
use crate::notifier::{self, Job};
use crate::process::Made;

/// How the Python side of a call runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    /// On an event loop: Python calls return awaitables, run as tasks.
    Async,
    /// On a thread: Python calls return their value (they may block).
    Blocking,
}

impl Mode {
    /// Calls `f` with the GIL and, in [`Mode::Async`], awaits the
    /// awaitable it returns (a value that is not awaitable is the result
    /// as it is, e.g. a plain function given to `limiter.call`).
    pub(crate) async fn run(
        self,
        f: impl FnOnce(Python<'_>) -> PyResult<Py<PyAny>>,
    ) -> PyResult<Py<PyAny>> {
        self.run_tracked(f, None).await
    }

    /// [`run`](Self::run), its task added to `stragglers` if it is
    /// dropped while the task still runs.
    pub(crate) async fn run_tracked(
        self,
        f: impl FnOnce(Python<'_>) -> PyResult<Py<PyAny>>,
        stragglers: Option<&Stragglers>,
    ) -> PyResult<Py<PyAny>> {
        let value = Python::attach(|py| {
            let value = f(py)?;
            let awaitable =
                self == Mode::Async && value.bind(py).hasattr(pyo3::intern!(py, "__await__"))?;
            Ok::<_, PyErr>((value, awaitable))
        });
        match value? {
            (value, true) => {
                let mut awaiting = PyAwait::new(value);
                awaiting.stragglers = stragglers.cloned();
                awaiting.await
            }
            (value, false) => Ok(value),
        }
    }
}

/// The tasks of a call's attempts, each added when it starts: the call
/// waits for the ones its attempts left running (cut by a deadline, an
/// attempt timeout) to end before it answers, so no attempt runs on after
/// its error or result is returned (SPEC DL-6), and a cut attempt's lease
/// is parked on them, its permit returned only when they have ended
/// (SPEC POOL-1, ADM-7; see [`hold`](Self::hold)). Clones share the list.
#[derive(Default, Clone)]
pub(crate) struct Stragglers(Arc<Mutex<Vec<Arc<Slot>>>>);

impl Stragglers {
    /// Adds a task that just started (forgetting the ones that ended).
    fn add(&self, slot: &Arc<Slot>) {
        let mut slots = self.0.lock();
        slots.retain(|s| !s.done.load(Ordering::Acquire));
        slots.push(Arc::clone(slot));
    }

    /// Keeps a cut attempt's `lease` until every task added so far has
    /// ended (the cut attempt's, cancelled when its future was dropped):
    /// the last one's done callback drops it, returning its permit
    /// (SPEC POOL-1). Released here at once when none still runs. Never
    /// blocks. A task that never ends (it swallows its cancellation and
    /// goes on) keeps the permit for as long as it runs; a task destroyed
    /// without ending (its loop closed) gives it back.
    pub(crate) fn hold(&self, lease: Lease) {
        self.park(Parked {
            lease: Some(lease),
            ended: None,
        });
    }

    /// Until every task added so far has ended (cancelled, or finished
    /// anyway, or destroyed with its loop). Waits through the tasks' done
    /// callbacks, as a parked lease does, so any number of waiters may
    /// wait at once, and the tasks stay listed (a lease may still be
    /// parked on them meanwhile). A lease parked before this call is
    /// released before it returns.
    pub(crate) async fn wait(&self) {
        if self.0.lock().iter().all(|s| s.done.load(Ordering::Acquire)) {
            // Nothing runs (every call's end passes here): no signal needed.
            return;
        }
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        self.park(Parked {
            lease: None,
            ended: Some(tx),
        });
        // Nothing is ever sent: the sender dropped is the signal.
        let _ = rx.await;
    }

    /// Parks `parked` on every task still running; dropped here at once
    /// when none runs.
    fn park(&self, parked: Parked) {
        let parked = Arc::new(parked);
        let slots: Vec<Arc<Slot>> = self.0.lock().clone();
        for slot in slots {
            // Under the lock the done callback takes the holds under, after
            // it set `done`: a hold added here is taken by it or not added.
            let mut holds = slot.holds.lock();
            if !slot.done.load(Ordering::Acquire) {
                // Waiters that went away (a close given up on) leave
                // nothing behind on a task that runs on.
                holds.retain(|p| !p.abandoned());
                holds.push(Arc::clone(&parked));
            }
        }
        // The last reference: dropped now if no task holds it.
        drop(parked);
    }
}

/// What waits on the tasks still running, dropped with the last
/// reference: a cut attempt's lease (its permit returned) and an
/// [`Stragglers::wait`] waiter's signal, in that order.
struct Parked {
    lease: Option<Lease>,
    ended: Option<tokio::sync::oneshot::Sender<()>>,
}

impl Parked {
    /// A [`Stragglers::wait`] waiter's signal nobody waits for any more.
    fn abandoned(&self) -> bool {
        self.lease.is_none() && self.ended.as_ref().is_none_or(|s| s.is_closed())
    }
}

impl Drop for Parked {
    fn drop(&mut self) {
        if let Some(lease) = self.lease.take() {
            // Possibly on the loop's thread (the done callback): the
            // release may need the runtime's context.
            let _runtime = crate::runtime::enter();
            drop(lease);
        }
        drop(self.ended.take());
    }
}

/// An awaitable run as an asyncio task and awaited from Rust; see the
/// module documentation.
pub(crate) struct PyAwait {
    state: State,
    /// Where its task goes if it is dropped while the task runs.
    stragglers: Option<Stragglers>,
}

enum State {
    /// Not polled yet: the awaitable.
    Start(Py<PyAny>),
    /// Its task runs (or ran).
    Running { task: Py<PyAny>, slot: Arc<Slot> },
    /// The outcome was taken.
    Finished,
}

/// What the task's done callback shares with the Rust side.
struct Slot {
    done: AtomicBool,
    waker: Mutex<Option<Waker>>,
    /// Cut attempts' leases waiting for the task's end
    /// ([`Stragglers::hold`]).
    holds: Mutex<Vec<Arc<Parked>>>,
}

impl PyAwait {
    /// Awaits `awaitable` (a coroutine or any object with `__await__`).
    pub(crate) fn new(awaitable: Py<PyAny>) -> Self {
        PyAwait {
            state: State::Start(awaitable),
            stragglers: None,
        }
    }
}

impl Future for PyAwait {
    type Output = PyResult<Py<PyAny>>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        loop {
            match &this.state {
                State::Start(awaitable) => {
                    let started = Python::attach(|py| start(py, awaitable.bind(py)));
                    match started {
                        Ok((task, slot)) => {
                            if let Some(s) = &this.stragglers {
                                s.add(&slot);
                            }
                            this.state = State::Running { task, slot };
                        }
                        Err(e) => {
                            this.state = State::Finished;
                            return Poll::Ready(Err(e));
                        }
                    }
                }
                State::Running { task, slot } => {
                    // The waker first, then the flag: a callback between
                    // the two finds the waker.
                    {
                        let mut waker = slot.waker.lock();
                        match &*waker {
                            Some(w) if w.will_wake(cx.waker()) => {}
                            _ => *waker = Some(cx.waker().clone()),
                        }
                    }
                    if !slot.done.load(Ordering::Acquire) {
                        return Poll::Pending;
                    }
                    let out = Python::attach(|py| {
                        task.bind(py)
                            .call_method0(pyo3::intern!(py, "result"))
                            .map(Bound::unbind)
                    });
                    this.state = State::Finished;
                    return Poll::Ready(out);
                }
                State::Finished => {
                    return Poll::Ready(Err(PyRuntimeError::new_err(
                        "a Python awaitable was polled after it completed",
                    )));
                }
            }
        }
    }
}

impl Drop for PyAwait {
    fn drop(&mut self) {
        match std::mem::replace(&mut self.state, State::Finished) {
            State::Finished => {}
            State::Running { slot, .. } if slot.done.load(Ordering::Acquire) => {}
            // Its task was added to the stragglers when it started.
            State::Running { task, .. } => notifier::submit(Job::Cancel(task)),
            // A coroutine never started is closed where it is (no loop
            // needed), so Python does not warn that it was never awaited.
            State::Start(awaitable) => notifier::submit(Job::Close {
                event_loop: None,
                objects: vec![awaitable],
            }),
        }
    }
}

/// The `__anext__()` of an async iterator, in flight across polls.
#[derive(Default)]
pub(crate) struct AsyncNext {
    pending: Option<PyAwait>,
    /// Where each `__anext__()` task is added when it starts.
    stragglers: Option<Stragglers>,
}

impl AsyncNext {
    /// Its `__anext__()` tasks added to `stragglers` when they start.
    pub(crate) fn tracked(stragglers: Stragglers) -> Self {
        AsyncNext {
            pending: None,
            stragglers: Some(stragglers),
        }
    }

    /// Polls for `iterator`'s next item: the item, or what it raised
    /// (`StopAsyncIteration` at its end).
    pub(crate) fn poll(
        &mut self,
        iterator: &Py<PyAny>,
        cx: &mut Context<'_>,
    ) -> Poll<PyResult<Py<PyAny>>> {
        let next = match &mut self.pending {
            Some(next) => next,
            None => {
                let anext = Python::attach(|py| {
                    iterator
                        .bind(py)
                        .call_method0(pyo3::intern!(py, "__anext__"))
                        .map(Bound::unbind)
                });
                match anext {
                    Ok(awaitable) => {
                        let mut next = PyAwait::new(awaitable);
                        next.stragglers = self.stragglers.clone();
                        self.pending.insert(next)
                    }
                    Err(e) => return Poll::Ready(Err(e)),
                }
            }
        };
        let poll = Pin::new(next).poll(cx);
        if poll.is_ready() {
            self.pending = None;
        }
        poll
    }

    /// Drops the `__anext__()` in flight (its task is cancelled).
    pub(crate) fn cancel(&mut self) {
        self.pending = None;
    }
}

/// Creates the task of `awaitable` on the running loop and hooks its done
/// callback.
fn start(py: Python<'_>, awaitable: &Bound<'_, PyAny>) -> PyResult<(Py<PyAny>, Arc<Slot>)> {
    let task = ensure_future(py)?.call1((awaitable,))?;
    let slot = Arc::new(Slot {
        done: AtomicBool::new(false),
        waker: Mutex::new(None),
        holds: Mutex::new(Vec::new()),
    });
    let hooked = Py::new(py, Done::new(Some(Arc::clone(&slot)))).and_then(|callback| {
        task.call_method1(pyo3::intern!(py, "add_done_callback"), (callback,))
    });
    if let Err(e) = hooked {
        // Scheduled but never tracked: cancelled, so no work runs on
        // detached (SPEC DL-6).
        let _ = task.call_method0(pyo3::intern!(py, "cancel"));
        return Err(e);
    }
    Ok((task.unbind(), slot))
}

/// Runs `awaitable` as a task nobody awaits (a close after the consumer
/// left), its outcome taken when done so nothing is printed.
pub(crate) fn detach_task(py: Python<'_>, awaitable: &Bound<'_, PyAny>) -> PyResult<()> {
    let task = ensure_future(py)?.call1((awaitable,))?;
    task.call_method1(
        pyo3::intern!(py, "add_done_callback"),
        (Py::new(py, Done::new(None))?,),
    )?;
    Ok(())
}

fn ensure_future(py: Python<'_>) -> PyResult<&Bound<'_, PyAny>> {
    static F: PyOnceLock<Py<PyAny>> = PyOnceLock::new();
    F.get_or_try_init(py, || {
        Ok::<_, PyErr>(py.import("asyncio")?.getattr("ensure_future")?.unbind())
    })
    .map(|f| f.bind(py))
}

/// The done callback of an awaited task.
#[pyclass(frozen, module = "tollgate._tollgate")]
struct Done {
    slot: Option<Arc<Slot>>,
    /// The process the task was made in.
    made: Made,
}

impl Done {
    fn new(slot: Option<Arc<Slot>>) -> Self {
        Done {
            slot,
            made: Made::current(),
        }
    }
}

#[pymethods]
impl Done {
    fn __call__(&self, task: &Bound<'_, PyAny>) -> PyResult<()> {
        let py = task.py();
        let _held = gil::Held::enter(py);
        // Take the outcome: the Rust side may be gone, and asyncio would
        // print an exception nobody retrieved.
        if !task
            .call_method0(pyo3::intern!(py, "cancelled"))?
            .is_truthy()?
        {
            let _ = task.call_method0(pyo3::intern!(py, "exception"));
        }
        if let Some(slot) = &self.slot {
            // On the loop's thread: the waiting future is resolved here.
            slot.end(|waker| crate::waker::direct(|| waker.wake()));
        }
        Ok(())
    }
}

impl Drop for Done {
    /// A task destroyed without ending (its loop closed, the task
    /// collected) never calls back: it ends here, so the leases parked on
    /// it go back and those waiting for it go on. This may be the garbage
    /// collector inside any Python call, even one made while a wake-up
    /// runs directly on the loop's thread; releasing a lease runs engine
    /// code that wakes waiters under its locks, so every wake-up from here
    /// goes through the notifier ([`waker::indirect`]). (No engine lock is
    /// held here: Python, and so the collector, never runs under one.) In
    /// a forked child the parent's task is left alone.
    ///
    /// [`waker::indirect`]: crate::waker::indirect
    fn drop(&mut self) {
        let Some(slot) = self.slot.take() else {
            return;
        };
        if self.made.keeps(&slot) || slot.done.load(Ordering::Acquire) {
            return;
        }
        let _runtime = crate::runtime::enter();
        crate::waker::indirect(|| slot.end(Waker::wake));
    }
}

impl Slot {
    /// The task ended: marks it done, releases the cut attempts' leases
    /// parked on it (outside any engine lock; their waiters are woken
    /// through the notifier), then wakes those waiting for it ([`wait`]
    /// signals after the leases: a waiter on another thread finds the
    /// permits back when it wakes), then the future awaiting it, through
    /// `wake`.
    ///
    /// [`wait`]: Stragglers::wait
    fn end(&self, wake: impl FnOnce(Waker)) {
        self.done.store(true, Ordering::Release);
        let holds = std::mem::take(&mut *self.holds.lock());
        let (leases, signals): (Vec<_>, Vec<_>) =
            holds.into_iter().partition(|p| p.lease.is_some());
        drop(leases);
        drop(signals);
        let waker = self.waker.lock().take();
        if let Some(waker) = waker {
            wake(waker);
        }
    }
}

//! Rust futures awaited from asyncio, polled on the awaiting loop's thread
//! (SPEC PY-2, Q-9).
//!
//! An awaitable of this package implements the iterator protocol a
//! coroutine delegates to with `await`: each `__next__` polls the Rust
//! future on the event loop's thread, inside the tokio runtime's context.
//! `Ready` ends the iteration with the value; `Pending` yields an asyncio
//! future that the future's waker resolves (see `waker.rs`). So:
//!
//! * the fast path (quota and permit free) completes inside the first
//!   `__next__`, with no thread hop and no asyncio future at all;
//! * cancelling the task (`task.cancel()`, `asyncio.wait_for`'s timeout)
//!   throws `CancelledError` into `throw`, which drops the Rust future on
//!   the spot: the engine's own cancel safety gives back its queue place,
//!   reservation and permit before the task sees the exception;
//! * an awaitable dropped without being awaited to the end (its task
//!   garbage-collected, its loop closed) drops its future in `Drop`, the
//!   same way;
//! * nothing runs detached on another thread, so no result can arrive
//!   after its loop closed.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};

use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;

use crate::process::Made;
use crate::runtime;
use crate::waker::LoopWake;

/// A boxed future polled from Python.
pub(crate) type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

/// Polls after which a future that keeps waking itself yields to the loop.
const SELF_WAKES: usize = 16;

/// What one step of an awaitable did.
pub(crate) enum Step<T> {
    /// Ready: the iteration ends with this.
    Done(T),
    /// Pending: yield this asyncio future to the task.
    Yield(Py<PyAny>),
}

/// A Rust future and its waker.
pub(crate) struct Driver<T> {
    future: Option<BoxFuture<T>>,
    wake: Arc<LoopWake>,
    waker: Waker,
    /// The process the awaitable was made in: polled or dropped only
    /// there (`process.rs`).
    made: Made,
}

impl<T> Driver<T> {
    /// Drives `future`.
    pub(crate) fn new(future: BoxFuture<T>) -> Self {
        let wake = Arc::new(LoopWake::default());
        let waker = Waker::from(Arc::clone(&wake));
        Driver {
            future: Some(future),
            wake,
            waker,
            made: Made::current(),
        }
    }

    /// Polls the future once or a few times; see the module documentation.
    pub(crate) fn step(&mut self, py: Python<'_>) -> PyResult<Step<T>> {
        self.made.check("awaitable")?;
        let Some(future) = self.future.as_mut() else {
            return Err(PyRuntimeError::new_err(
                "this awaitable was already awaited to its end or cancelled",
            ));
        };
        let _runtime = runtime::enter();
        let _held = crate::gil::Held::enter(py);
        let mut cx = Context::from_waker(&self.waker);
        for _ in 0..SELF_WAKES {
            self.wake.reset();
            if let Poll::Ready(out) = future.as_mut().poll(&mut cx) {
                self.future = None;
                return Ok(Step::Done(out));
            }
            if self.wake.woken() {
                continue;
            }
            let target = new_future(py)?;
            match self.wake.install(target.clone_ref(py)) {
                Ok(()) => return Ok(Step::Yield(blocking(py, target)?)),
                // Woken between the check and the install: poll again.
                Err(_) => continue,
            }
        }
        // It keeps waking itself: let the loop run other tasks first.
        let target = new_future(py)?;
        target.call_method1(py, "set_result", (py.None(),))?;
        Ok(Step::Yield(blocking(py, target)?))
    }

    /// Drops the future (cancellation) on a thread holding the GIL: the
    /// engine gives back what it held, Python work it awaited is
    /// cancelled at once.
    pub(crate) fn cancel_held(&mut self, py: Python<'_>) {
        let _held = crate::gil::Held::enter(py);
        self.cancel();
    }

    /// Drops the future (cancellation): the engine gives back what it held.
    pub(crate) fn cancel(&mut self) {
        // A forked child's copy of the parent's awaitable: its future holds
        // the parent's state, never dropped there (`drop_here`).
        if self.made.is_here() {
            self.wake.clear();
        }
        if let Some(future) = self.future.take() {
            self.made.drop_here(future);
        }
    }
}

impl<T> Drop for Driver<T> {
    fn drop(&mut self) {
        self.cancel();
    }
}

/// `asyncio.get_running_loop().create_future()`.
fn new_future(py: Python<'_>) -> PyResult<Py<PyAny>> {
    static GET_LOOP: PyOnceLock<Py<PyAny>> = PyOnceLock::new();
    let get_loop = GET_LOOP.get_or_try_init(py, || {
        Ok::<_, PyErr>(py.import("asyncio")?.getattr("get_running_loop")?.unbind())
    })?;
    let event_loop = get_loop.call0(py)?;
    event_loop.call_method0(py, pyo3::intern!(py, "create_future"))
}

/// Marks `future` as awaited by the yielding coroutine, as
/// `asyncio.Future.__await__` does, so the task waits on it.
fn blocking(py: Python<'_>, future: Py<PyAny>) -> PyResult<Py<PyAny>> {
    future.setattr(py, pyo3::intern!(py, "_asyncio_future_blocking"), true)?;
    Ok(future)
}

/// The exception to raise for `throw(typ, val, tb)`.
pub(crate) fn thrown(typ: &Bound<'_, PyAny>, val: Option<&Bound<'_, PyAny>>) -> PyErr {
    let made = match val.filter(|v| !v.is_none()) {
        Some(val) if val.is_instance_of::<pyo3::exceptions::PyBaseException>() => {
            return PyErr::from_value(val.clone());
        }
        Some(val) => typ.call1((val,)),
        None if typ.is_instance_of::<pyo3::exceptions::PyBaseException>() => {
            return PyErr::from_value(typ.clone());
        }
        None => typ.call0(),
    };
    match made {
        Ok(e) => PyErr::from_value(e),
        Err(e) => e,
    }
}

/// An awaitable of any Rust future whose output becomes a Python value.
#[pyclass(frozen, module = "tollgate._tollgate", name = "Pending")]
pub(crate) struct Pending {
    driver: parking_lot::Mutex<Driver<Output>>,
}

/// How a finished future becomes a Python value (or exception).
pub(crate) type Output = Box<dyn FnOnce(Python<'_>) -> PyResult<Py<PyAny>> + Send>;

impl Pending {
    /// An awaitable of `future`.
    pub(crate) fn new(future: BoxFuture<Output>) -> Self {
        Pending {
            driver: parking_lot::Mutex::new(Driver::new(future)),
        }
    }

    /// An awaitable that gives `None` once `future` has completed.
    pub(crate) fn none_after(future: impl Future<Output = ()> + Send + 'static) -> Self {
        Pending::new(Box::pin(async move {
            future.await;
            let out: Output = Box::new(|py| Ok(py.None()));
            out
        }))
    }
}

/// Steps `driver` and maps its step to the iterator protocol.
pub(crate) fn iterate<T>(
    py: Python<'_>,
    driver: &parking_lot::Mutex<Driver<T>>,
    finish: impl FnOnce(Python<'_>, T) -> PyResult<Py<PyAny>>,
) -> PyResult<Py<PyAny>> {
    let step = {
        let Some(mut driver) = driver.try_lock() else {
            return Err(PyRuntimeError::new_err(
                "this awaitable is already being awaited",
            ));
        };
        driver.step(py)?
    };
    match step {
        Step::Yield(future) => Ok(future),
        Step::Done(out) => {
            let value = finish(py, out)?;
            Err(pyo3::exceptions::PyStopIteration::new_err((value,)))
        }
    }
}

#[pymethods]
impl Pending {
    fn __await__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    fn __iter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    fn __next__(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        iterate(py, &self.driver, |py, out| out(py))
    }

    fn send(&self, py: Python<'_>, _value: &Bound<'_, PyAny>) -> PyResult<Py<PyAny>> {
        self.__next__(py)
    }

    #[pyo3(signature = (typ, val = None, _tb = None))]
    fn throw(
        &self,
        typ: &Bound<'_, PyAny>,
        val: Option<&Bound<'_, PyAny>>,
        _tb: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Py<PyAny>> {
        self.driver.lock().cancel_held(typ.py());
        Err(thrown(typ, val))
    }

    fn close(&self, py: Python<'_>) {
        self.driver.lock().cancel_held(py);
    }
}

/// An awaitable that is already done (e.g. `__aexit__`'s).
#[pyclass(frozen, module = "tollgate._tollgate", name = "Ready")]
pub(crate) struct Ready {
    value: Py<PyAny>,
}

impl Ready {
    /// An awaitable of `value`.
    pub(crate) fn new(value: Py<PyAny>) -> Self {
        Ready { value }
    }

    /// The shared awaitable of `None`.
    pub(crate) fn none(py: Python<'_>) -> PyResult<Py<Ready>> {
        static NONE: PyOnceLock<Py<Ready>> = PyOnceLock::new();
        NONE.get_or_try_init(py, || Py::new(py, Ready::new(py.None())))
            .map(|r| r.clone_ref(py))
    }
}

#[pymethods]
impl Ready {
    fn __await__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    fn __iter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    fn __next__(&self, py: Python<'_>) -> PyResult<()> {
        Err(pyo3::exceptions::PyStopIteration::new_err((self
            .value
            .clone_ref(py),)))
    }

    fn send(&self, py: Python<'_>, _value: &Bound<'_, PyAny>) -> PyResult<()> {
        self.__next__(py)
    }

    #[pyo3(signature = (typ, val = None, _tb = None))]
    fn throw(
        &self,
        typ: &Bound<'_, PyAny>,
        val: Option<&Bound<'_, PyAny>>,
        _tb: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        Err(thrown(typ, val))
    }

    fn close(&self) {}
}

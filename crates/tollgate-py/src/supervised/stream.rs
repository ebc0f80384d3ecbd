//! `Limiter.stream(...)`: a supervised stream as an async iterator
//! (SPEC PY-3, LC-3..LC-5).
//!
//! The first `__anext__` runs admission and the attempts up to the first
//! item (retried like a one-shot call); after it the retry window is
//! closed for good and a failure is raised from the next `__anext__`.
//! Leaving early (`aclose()`, `async with` exit, `break` then garbage
//! collection, a cancelled task) drops the engine's stream: the upstream
//! iteration is cancelled and closed, the lease settled with the usage seen
//! so far (or its estimate) and its permit returned (LC-5).

use std::pin::Pin;
use std::sync::Arc;

use futures_core::Stream;
use parking_lot::Mutex;
use pyo3::exceptions::{PyRuntimeError, PyStopAsyncIteration};
use pyo3::prelude::*;
use pyo3::types::{PyString, PyTuple};
use tollgate::lifecycle::{CallOptions, CallStream, Supervisor};

use super::closing::{Closed, Holder, Holding, or_closed};
use super::{CallProvider, CallRequest, LastFailure, call_error};
use crate::driver::{Output, Pending, Ready};
use crate::process::Made;
use crate::pyawait::Stragglers;
use crate::runtime;

enum State {
    /// Not started: the first `__anext__` opens it.
    Ready {
        supervisor: Supervisor<CallProvider>,
        request: CallRequest,
        options: CallOptions,
    },
    /// Delivering items.
    Open {
        stream: CallStream<CallProvider>,
        failure: LastFailure,
        /// The call's tasks (its `__anext__()` ones included).
        stragglers: Stragglers,
    },
    /// An `__anext__` is running.
    Busy,
    /// Ended, failed or closed.
    Done,
}

/// The async iterator of `Limiter.stream`.
#[pyclass(frozen, module = "tollgate._tollgate", name = "SupervisedStream")]
pub(crate) struct SupervisedStream {
    state: Arc<Mutex<State>>,
    /// Set by `aclose()` / `__aexit__`: an `__anext__` in flight, which
    /// holds the engine's stream, drops it and ends the iteration.
    closed: Arc<Closed>,
    /// Whether an `__anext__` holds the engine's stream: `aclose()`
    /// returns once it has let go of it.
    holder: Arc<Holder>,
    /// The call's tasks: `aclose()` returns once those its close cut have
    /// ended (SPEC POOL-1).
    stragglers: Stragglers,
    scope: Py<PyString>,
    /// The process the stream was made in: read or dropped only there.
    made: Made,
}

impl SupervisedStream {
    pub(crate) fn new(
        supervisor: Supervisor<CallProvider>,
        request: CallRequest,
        options: CallOptions,
        scope: Py<PyString>,
    ) -> Self {
        SupervisedStream {
            holder: Arc::default(),
            stragglers: request.stragglers.clone(),
            state: Arc::new(Mutex::new(State::Ready {
                supervisor,
                request,
                options,
            })),
            closed: Arc::default(),
            scope,
            made: Made::current(),
        }
    }

    /// Ends the stream now (on a thread holding the GIL); an `__anext__`
    /// in flight ends it as soon as its loop runs it again (SPEC LC-5).
    fn end(&self, py: Python<'_>) {
        if !self.made.is_here() {
            // A forked child's copy: the stream is the parent's, left
            // alone (closing it here does nothing).
            return;
        }
        self.closed.close();
        let taken = std::mem::replace(&mut *self.state.lock(), State::Done);
        let _runtime = runtime::enter();
        let _held = crate::gil::Held::enter(py);
        drop(taken);
    }

    /// Ends the stream (see [`end`](Self::end)): an awaitable that completes
    /// once an `__anext__` in flight has let go of the stream and the tasks
    /// the close cut (an upstream read, an opening attempt) have ended,
    /// the permit returned with them (SPEC LC-5, POOL-1).
    fn close_awaitable(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        if !self.made.is_here() {
            // A forked child's copy: left alone, as in `end`.
            return Ok(Ready::none(py)?.into_any());
        }
        self.end(py);
        let stragglers = self.stragglers.clone();
        let holder = Arc::clone(&self.holder);
        let pending = Pending::none_after(async move {
            // An `__anext__` in flight drops the stream at its loop's next
            // turn; the tasks it cut then hold what goes back when they end.
            holder.let_go().await;
            stragglers.wait().await;
        });
        Ok(Py::new(py, pending)?.into_any())
    }
}

impl Drop for SupervisedStream {
    fn drop(&mut self) {
        if self.made.keeps(&self.state) {
            // A forked child's copy: the stream is the parent's.
            return;
        }
        // Dropping the engine's stream may release a lease: in the runtime.
        let _runtime = runtime::enter();
        let taken = std::mem::replace(&mut *self.state.lock(), State::Done);
        drop(taken);
    }
}

/// Leaves the state `Done` if an `__anext__` ends without setting it.
struct DoneIfBusy(Arc<Mutex<State>>);

impl Drop for DoneIfBusy {
    fn drop(&mut self) {
        let mut state = self.0.lock();
        if matches!(*state, State::Busy) {
            *state = State::Done;
        }
    }
}

fn stop() -> Output {
    Box::new(|_py| Err(PyStopAsyncIteration::new_err(())))
}

#[pymethods]
impl SupervisedStream {
    fn __aiter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    /// The next item: an awaitable.
    fn __anext__(&self, py: Python<'_>) -> PyResult<Pending> {
        self.made.check("stream")?;
        let state = Arc::clone(&self.state);
        let closed = Arc::clone(&self.closed);
        let scope = self.scope.bind(py).to_string();
        let holder = Arc::clone(&self.holder);
        Ok(Pending::new(Box::pin(async move {
            let (taken, holding) = {
                let mut st = state.lock();
                match &*st {
                    State::Ready { .. } | State::Open { .. } => {
                        let holding = Holding::take(&holder);
                        (std::mem::replace(&mut *st, State::Busy), Some(holding))
                    }
                    State::Busy => (State::Busy, None),
                    State::Done => (State::Done, None),
                }
            };
            // Cancelled while running (the awaiting task went away): the
            // stream it held is dropped with it, and the iterator is done.
            // `holding` (declared before the stream) is dropped after it.
            let _done_if_dropped = holding.as_ref().map(|_| DoneIfBusy(Arc::clone(&state)));
            let (mut stream, failure, stragglers) = match taken {
                State::Ready {
                    supervisor,
                    request,
                    options,
                } => {
                    let failure = Arc::clone(&request.failure);
                    // Closed while it opens (`aclose()` from another
                    // task): the opening goes now, its attempt cancelled,
                    // and the iteration ends (LC-5).
                    let Some(opened) =
                        or_closed(&closed, supervisor.stream(&request, options)).await
                    else {
                        *state.lock() = State::Done;
                        return stop();
                    };
                    // No attempt runs on after the stream answers: an
                    // opening cut by the deadline raises once its task has
                    // ended (DL-6), as `Limiter.call` does.
                    request.stragglers.wait().await;
                    match opened {
                        Ok(stream) => (stream, failure, request.stragglers.clone()),
                        Err(e) => {
                            *state.lock() = State::Done;
                            let out: Output =
                                Box::new(move |py| Err(call_error(py, &e, &scope, &failure)));
                            return out;
                        }
                    }
                }
                State::Open {
                    stream,
                    failure,
                    stragglers,
                } => (stream, failure, stragglers),
                State::Busy => {
                    let out: Output = Box::new(|_py| {
                        Err(PyRuntimeError::new_err(
                            "another __anext__ of this stream is still running",
                        ))
                    });
                    return out;
                }
                State::Done => return stop(),
            };
            // Closed meanwhile (`aclose()` from another task): the stream
            // goes now, with its permit, and the iteration ends (LC-5).
            let next = or_closed(
                &closed,
                std::future::poll_fn(|cx| Pin::new(&mut stream).poll_next(cx)),
            )
            .await;
            let Some(next) = next else {
                *state.lock() = State::Done;
                drop(stream);
                return stop();
            };
            match next {
                Some(Ok(item)) => {
                    // Put back under the lock `end()` takes after setting
                    // `closed`: a close is never undone.
                    let mut st = state.lock();
                    if closed.is_set() {
                        *st = State::Done;
                        drop(st);
                        drop(stream);
                        return stop();
                    }
                    *st = State::Open {
                        stream,
                        failure,
                        stragglers,
                    };
                    let out: Output = Box::new(move |_py| Ok(item));
                    out
                }
                Some(Err(e)) => {
                    *state.lock() = State::Done;
                    drop(stream);
                    // No `__anext__()` runs on after the error is raised
                    // (DL-6): the one the deadline cut has ended.
                    stragglers.wait().await;
                    Box::new(move |py| Err(call_error(py, &e, &scope, &failure)))
                }
                None => {
                    *state.lock() = State::Done;
                    stop()
                }
            }
        })))
    }

    /// Leaves the stream: the upstream is cancelled and closed, the lease
    /// settled and released (SPEC LC-5); returns once an upstream read in
    /// flight (another task's `__anext__`) has unwound. Idempotent.
    fn aclose(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        self.close_awaitable(py)
    }

    fn __aenter__(slf: Bound<'_, Self>) -> Ready {
        Ready::new(slf.into_any().unbind())
    }

    #[pyo3(signature = (*_args))]
    fn __aexit__(&self, py: Python<'_>, _args: &Bound<'_, PyTuple>) -> PyResult<Py<PyAny>> {
        self.close_awaitable(py)
    }
}

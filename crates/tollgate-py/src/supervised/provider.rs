//! A Python callable as the engine's provider (SPEC PY-3): each attempt
//! calls it; what it returns (or raises) is the attempt's outcome.

use std::collections::VecDeque;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use futures_core::Stream;
use parking_lot::Mutex;
use pyo3::exceptions::PyStopAsyncIteration;
use pyo3::prelude::*;
use pyo3::types::PyTuple;
use tollgate::lifecycle::{AttemptContext, ErrorKind, Provider, ProviderError, Reply, StreamEvent};
use tollgate::{Lease, TokenEstimate, Usage};

use crate::classify;
use crate::notifier::{self, Job};
use crate::pyawait::{AsyncNext, Mode, Stragglers};
use crate::usage;

/// An exception an attempt raised.
pub(crate) struct Failure {
    /// The exception.
    pub(crate) err: PyErr,
    /// Whether it is not a provider failure (re-raised as it is).
    pub(crate) foreign: bool,
}

/// The last attempt's exception, shared by a call and its stream.
pub(crate) type LastFailure = Arc<Mutex<Option<Failure>>>;

/// One supervised call of a Python callable.
pub(crate) struct CallRequest {
    pub(crate) func: Py<PyAny>,
    pub(crate) args: Py<PyTuple>,
    /// `usage=`: reads a result's (or a stream item's) usage.
    pub(crate) usage: Option<Py<PyAny>>,
    /// Reserved for every attempt (SPEC Q-8: the same request, the same
    /// estimate, a fresh reservation).
    pub(crate) estimate: Option<TokenEstimate>,
    /// The loop the call runs on (a stream left early is closed on it).
    pub(crate) event_loop: Py<PyAny>,
    pub(crate) failure: LastFailure,
    /// The tasks of its attempts: the call answers once the ones cut
    /// while they ran (a deadline, an attempt timeout) have ended (SPEC
    /// DL-6), and a cut attempt's permit goes back only then (POOL-1).
    pub(crate) stragglers: Stragglers,
}

impl CallRequest {
    /// Classifies an attempt's exception and keeps it (the `__cause__` of
    /// the error raised if the call gives up, or re-raised as it is).
    fn fail(&self, err: PyErr) -> ProviderError {
        fail(&self.failure, err)
    }

    fn call_func(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        self.func
            .bind(py)
            .call1(self.args.bind(py))
            .map(Bound::unbind)
    }
}

/// See [`CallRequest::fail`].
pub(crate) fn fail(failure: &LastFailure, err: PyErr) -> ProviderError {
    let (error, foreign) = Python::attach(|py| match classify::provider_error(py, &err) {
        Some(e) => (e, false),
        None => {
            // Not the provider's doing: no retry, no circuit failure.
            let name = err
                .get_type(py)
                .name()
                .map(|n| n.to_string())
                .unwrap_or_default();
            let e = ProviderError::new(ErrorKind::Client, format!("the function raised {name}"));
            (e, true)
        }
    });
    *failure.lock() = Some(Failure { err, foreign });
    error
}

/// Calls Python callables; stateless (everything is in the request).
pub(crate) struct CallProvider;

impl Provider for CallProvider {
    type Request = CallRequest;
    type Response = Py<PyAny>;
    type Chunk = Py<PyAny>;
    type Stream = Items;

    async fn call(
        &self,
        request: &CallRequest,
        _attempt: AttemptContext,
    ) -> Result<Reply<Py<PyAny>>, ProviderError> {
        *request.failure.lock() = None;
        let result = Mode::Async
            .run_tracked(|py| request.call_func(py), Some(&request.stragglers))
            .await;
        match result {
            Ok(value) => {
                let usage = Python::attach(|py| {
                    let extractor = request.usage.as_ref().map(|u| u.bind(py));
                    usage::reported(value.bind(py), extractor).unwrap_or(Usage::UNKNOWN)
                });
                Ok(Reply::new(value, usage))
            }
            Err(e) => Err(request.fail(e)),
        }
    }

    async fn stream(
        &self,
        request: &CallRequest,
        _attempt: AttemptContext,
    ) -> Result<Items, ProviderError> {
        *request.failure.lock() = None;
        let iterable = Mode::Async
            .run_tracked(|py| request.call_func(py), Some(&request.stragglers))
            .await
            .map_err(|e| request.fail(e))?;
        Python::attach(|py| {
            let value = iterable.bind(py);
            if !value
                .hasattr(pyo3::intern!(py, "__aiter__"))
                .unwrap_or(false)
            {
                let kind = value
                    .get_type()
                    .name()
                    .map(|n| n.to_string())
                    .unwrap_or_default();
                return Err(request.fail(pyo3::exceptions::PyTypeError::new_err(format!(
                    "the function given to Limiter.stream must return an async iterable \
                     (or an awaitable of one), got {kind}"
                ))));
            }
            let iterator = value
                .call_method0(pyo3::intern!(py, "__aiter__"))
                .map_err(|e| request.fail(e))?;
            Ok(Items {
                iterator: Some(iterator.unbind()),
                iterable: Some(iterable),
                event_loop: Some(request.event_loop.clone_ref(py)),
                usage: request.usage.as_ref().map(|u| u.clone_ref(py)),
                failure: Arc::clone(&request.failure),
                next: AsyncNext::tracked(request.stragglers.clone()),
                stragglers: request.stragglers.clone(),
                pending: VecDeque::new(),
                ended: false,
            })
        })
    }

    /// A cut attempt's permit goes back once its task has ended (SPEC
    /// POOL-1, ADM-7): the task was only asked to cancel.
    fn cut(&self, request: &CallRequest, lease: Lease) {
        request.stragglers.hold(lease);
    }

    /// A stream let go (its consumer left, its deadline, a close) returns
    /// its permit once the `__anext__()` it cancels has ended (SPEC
    /// POOL-1, LC-5, ADM-7).
    fn stream_cut(&self, stream: Items, lease: Lease) {
        let stragglers = stream.stragglers.clone();
        drop(stream);
        stragglers.hold(lease);
    }
}

/// The items of the async iterable a streaming attempt returned, with the
/// usage they report (SPEC Q-5): an item with usage is preceded by a
/// usage event. Dropped before its end, it closes the iterator and the
/// iterable (`aclose()` / `close()`, on their loop).
pub(crate) struct Items {
    iterator: Option<Py<PyAny>>,
    iterable: Option<Py<PyAny>>,
    event_loop: Option<Py<PyAny>>,
    usage: Option<Py<PyAny>>,
    failure: LastFailure,
    /// The `__anext__()` in flight.
    next: AsyncNext,
    /// The call's tasks, its `__anext__()` ones included: a stream let go
    /// returns its permit once they have ended (SPEC POOL-1, LC-5).
    stragglers: Stragglers,
    pending: VecDeque<StreamEvent<Py<PyAny>>>,
    ended: bool,
}

impl Stream for Items {
    type Item = Result<StreamEvent<Py<PyAny>>, ProviderError>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        loop {
            if let Some(event) = this.pending.pop_front() {
                return Poll::Ready(Some(Ok(event)));
            }
            if this.ended {
                return Poll::Ready(None);
            }
            let Some(iterator) = &this.iterator else {
                this.ended = true;
                continue;
            };
            let result = match this.next.poll(iterator, cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(result) => result,
            };
            match result {
                Ok(item) => {
                    let reported = Python::attach(|py| {
                        let extractor = this.usage.as_ref().map(|u| u.bind(py));
                        usage::reported(item.bind(py), extractor)
                    });
                    if let Some(u) = reported {
                        this.pending.push_back(StreamEvent::Usage(u));
                    }
                    this.pending.push_back(StreamEvent::Chunk(item));
                }
                Err(e) => {
                    let stop = Python::attach(|py| e.is_instance_of::<PyStopAsyncIteration>(py));
                    if stop {
                        this.ended = true;
                        this.iterator = None;
                        this.iterable = None;
                        return Poll::Ready(None);
                    }
                    return Poll::Ready(Some(Err(this.end_with(e))));
                }
            }
        }
    }
}

impl Items {
    /// The iterator raised: the stream ends with that failure.
    fn end_with(&mut self, err: PyErr) -> ProviderError {
        self.ended = true;
        fail(&self.failure, err)
    }
}

impl Drop for Items {
    fn drop(&mut self) {
        // The item in flight first (its task is cancelled), then the
        // iterator and the iterable, on their loop.
        self.next.cancel();
        let objects: Vec<Py<PyAny>> = [self.iterator.take(), self.iterable.take()]
            .into_iter()
            .flatten()
            .collect();
        if !objects.is_empty() {
            notifier::submit(Job::Close {
                event_loop: self.event_loop.take(),
                objects,
            });
        }
    }
}

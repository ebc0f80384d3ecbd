//! The body of a streamed answer, read by the SDK (SPEC PY-4, LC-3..5).
//!
//! The SDK iterates the response's byte stream; each step polls the
//! engine's supervised stream, which reads the provider's events through
//! the relay's SSE reader (the usage chunk the SDK did not ask for is
//! left out). A failure after the first chunk is raised from the
//! iteration (`UpstreamError`, `DeadlineExceeded` with phase `stream`),
//! never replayed. Closing the response early (the SDK's `close()`, a
//! `break`) drops the stream: the upstream is closed and the call is
//! cancelled, its lease keeping its estimate (LC-5, Q-5). An SDK closes
//! the response as soon as it has read the last event: the output is
//! complete then and its usage known, so closing a stream whose every item
//! is out first reads the end of its body (at most the relay's short
//! grace), which completes the call and settles it with that usage.

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::Poll;

use bytes::Bytes;
use futures_core::Stream;
use parking_lot::Mutex;
use pyo3::prelude::*;
use pyo3::types::PyBytes;
use tollgate::lifecycle::{CallError, CallStream};

use super::provider::HttpxProvider;
use crate::driver::{Output, Pending};
use crate::process::Made;
use crate::pyawait::Stragglers;
use crate::supervised::{LastFailure, call_error};
use crate::{gil, runtime};

type Shared = Arc<Mutex<Option<CallStream<HttpxProvider>>>>;

/// A streamed answer's body: `next()` (async) or `next_blocking()` give
/// the next bytes, `None` at the end.
#[pyclass(frozen, module = "tollgate._tollgate", name = "ResponseBody")]
pub(crate) struct ResponseBody {
    stream: Shared,
    scope: String,
    failure: LastFailure,
    /// Whether every item of the provider's stream is out.
    finished: Arc<AtomicBool>,
    /// The call's tasks (its body's `__anext__()` ones included): a
    /// failure is raised once the read it cut has ended (DL-6).
    stragglers: Stragglers,
    /// The process the body was made in: read or dropped only there.
    made: Made,
}

impl ResponseBody {
    pub(crate) fn new(
        stream: CallStream<HttpxProvider>,
        scope: String,
        failure: LastFailure,
        finished: Arc<AtomicBool>,
        stragglers: Stragglers,
    ) -> Self {
        ResponseBody {
            stream: Arc::new(Mutex::new(Some(stream))),
            scope,
            failure,
            finished,
            stragglers,
            made: Made::current(),
        }
    }

    /// Whether closing now should first read the stream's end.
    fn complete_on_close(&self) -> bool {
        self.finished.load(Ordering::Acquire)
    }
}

/// Reads the rest of a stream whose every item is out, so that it
/// completes (and settles) instead of being cancelled.
async fn finish(stream: Shared) {
    while let Some(Ok(_)) = next(Arc::clone(&stream)).await {}
}

/// The next item; the stream is dropped once it has ended or failed.
async fn next(stream: Shared) -> Option<Result<Bytes, CallError>> {
    std::future::poll_fn(move |cx| {
        let mut guard = stream.lock();
        let Some(s) = guard.as_mut() else {
            return Poll::Ready(None);
        };
        match Pin::new(s).poll_next(cx) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(item @ (None | Some(Err(_)))) => {
                *guard = None;
                Poll::Ready(item)
            }
            Poll::Ready(item) => Poll::Ready(item),
        }
    })
    .await
}

impl ResponseBody {
    fn convert(
        py: Python<'_>,
        item: Option<Result<Bytes, CallError>>,
        scope: &str,
        failure: &LastFailure,
    ) -> PyResult<Py<PyAny>> {
        match item {
            None => Ok(py.None()),
            Some(Ok(bytes)) => Ok(PyBytes::new(py, &bytes).into_any().unbind()),
            Some(Err(e)) => Err(call_error(py, &e, scope, failure)),
        }
    }
}

#[pymethods]
impl ResponseBody {
    /// An awaitable of the next bytes (`None` at the end).
    fn next(&self) -> PyResult<Pending> {
        self.made.check("response body")?;
        let stream = Arc::clone(&self.stream);
        let scope = self.scope.clone();
        let failure = Arc::clone(&self.failure);
        let stragglers = self.stragglers.clone();
        Ok(Pending::new(Box::pin(async move {
            let item = next(stream).await;
            if let Some(Err(_)) = item {
                // No body read runs on after the error is raised (DL-6):
                // the one the deadline cut has ended (the stream, dropped,
                // parked its lease on it first).
                stragglers.wait().await;
            }
            let out: Output = Box::new(move |py| Self::convert(py, item, &scope, &failure));
            out
        })))
    }

    /// The next bytes (`None` at the end), waiting on this thread without
    /// the GIL.
    fn next_blocking(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        self.made.check("response body")?;
        let item = crate::blocking::block_on(py, next(Arc::clone(&self.stream)))?;
        Self::convert(py, item, &self.scope, &self.failure)
    }

    /// The SDK closed the response (async): an awaitable that ends the
    /// stream (see the module documentation) and completes once a read it
    /// cut has unwound. Idempotent.
    fn aclose(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        if !self.made.is_here() {
            // A forked child's copy: the stream is the parent's, left
            // alone (closing it here does nothing).
            return Ok(crate::driver::Ready::none(py)?.into_any());
        }
        if self.complete_on_close() {
            let stream = Arc::clone(&self.stream);
            let pending = Pending::none_after(finish(stream));
            return Ok(Py::new(py, pending)?.into_any());
        }
        self.drop_now(py);
        // Returns once the read the drop cut, if one was in flight (another
        // task's `next()`), has ended, its permit with it (POOL-1).
        let stragglers = self.stragglers.clone();
        let pending = Pending::none_after(async move { stragglers.wait().await });
        Ok(Py::new(py, pending)?.into_any())
    }

    /// The SDK closed the response (sync): ends the stream (see the module
    /// documentation). Idempotent.
    fn close(&self, py: Python<'_>) -> PyResult<()> {
        if !self.made.is_here() {
            // A forked child's copy: left alone, as in `aclose`.
            return Ok(());
        }
        if self.complete_on_close() {
            crate::blocking::block_on(py, finish(Arc::clone(&self.stream)))?;
        }
        self.drop_now(py);
        Ok(())
    }
}

impl ResponseBody {
    /// Drops the stream now (cancelling the call if it still runs).
    fn drop_now(&self, py: Python<'_>) {
        let stream = Arc::clone(&self.stream);
        let taken = gil::detach(py, move || stream.lock().take());
        let _runtime = runtime::enter();
        let _held = gil::Held::enter(py);
        drop(taken);
    }
}

impl Drop for ResponseBody {
    fn drop(&mut self) {
        if self.made.keeps(&self.stream) {
            // A forked child's copy: the stream is the parent's.
            return;
        }
        let _runtime = runtime::enter();
        let taken = self.stream.lock().take();
        drop(taken);
    }
}

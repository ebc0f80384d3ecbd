//! The wrapped httpx transport as the engine's provider (SPEC PY-4): each
//! attempt sends the SDK's request through it; its answer is read the way
//! the gateway reads an upstream's (RT-2 classes, RT-3 hints, Q-6 usage,
//! Q-14 budget reports, the stream dialects' final usage).

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use futures_core::Stream;
use parking_lot::Mutex;
use pyo3::exceptions::{PyStopAsyncIteration, PyStopIteration};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList};
use tollgate::Lease;
use tollgate::lifecycle::{AttemptContext, Budgets, Provider, ProviderError, Reply};
use tollgate_openai::RateLimitHints;
use tollgate_openai::provider::{
    ChunkItem, ChunkStream, DEFAULT_END_GRACE, Endpoint, answer_error, answer_usage,
};

use crate::classify;
use crate::notifier::{self, Job};
use crate::pyawait::{AsyncNext, Mode, Stragglers};
use crate::supervised::LastFailure;

/// What the Python side hands over for one module (httpx or httpx2): its
/// `Request` and `Response` classes, the byte-stream class that wraps a
/// supervised stream, and the transport requests go through.
pub(crate) struct Kit {
    pub(crate) request: Py<PyAny>,
    pub(crate) response: Py<PyAny>,
    pub(crate) body: Py<PyAny>,
    pub(crate) inner: Py<PyAny>,
}

impl Kit {
    /// Reads the kit object's attributes.
    pub(crate) fn of(kit: &Bound<'_, PyAny>) -> PyResult<Kit> {
        Ok(Kit {
            request: kit.getattr("Request")?.unbind(),
            response: kit.getattr("Response")?.unbind(),
            body: kit.getattr("Body")?.unbind(),
            inner: kit.getattr("inner")?.unbind(),
        })
    }
}

/// A provider's answer kept for the SDK: status, headers (name, value)
/// and decoded body.
pub(crate) struct Answer {
    pub(crate) status: u16,
    pub(crate) headers: Vec<(String, String)>,
    pub(crate) content: Py<PyBytes>,
}

/// An opened stream's status and headers, and whether every item is out
/// (only the end of its body is being read).
pub(crate) struct Head {
    pub(crate) status: u16,
    pub(crate) headers: Vec<(String, String)>,
    pub(crate) finished: Arc<AtomicBool>,
}

/// One SDK request, sent by every attempt.
pub(crate) struct HttpxRequest {
    pub(crate) kit: Kit,
    pub(crate) mode: Mode,
    pub(crate) method: Py<PyAny>,
    pub(crate) url: Py<PyAny>,
    /// Sent as they are (minus `content-length` and `transfer-encoding`,
    /// the body being sent whole, and `x-request-timeout`, read by the
    /// transport).
    pub(crate) headers: Vec<(String, String)>,
    pub(crate) body: Py<PyBytes>,
    pub(crate) extensions: Py<PyDict>,
    pub(crate) endpoint: Endpoint,
    pub(crate) forward_usage: bool,
    pub(crate) estimate: tollgate::TokenEstimate,
    /// The last attempt's answer when it failed (a non-2xx status, a
    /// declared error): what the SDK gets if the call gives up.
    pub(crate) answer: Mutex<Option<Answer>>,
    /// The status and headers of the stream that opened, and its
    /// "finished" flag.
    pub(crate) head: Mutex<Option<Head>>,
    /// The last attempt's exception (the inner transport raised).
    pub(crate) failure: LastFailure,
    /// The loop the request runs on (async mode).
    pub(crate) event_loop: Option<Py<PyAny>>,
    /// The tasks of its attempts (async mode): the SDK gets its answer
    /// once the ones cut while they ran (a deadline, an attempt timeout)
    /// have ended (SPEC DL-6), and a cut attempt's permit goes back only
    /// then (POOL-1), as `Limiter.call`'s.
    pub(crate) stragglers: Stragglers,
}

impl HttpxRequest {
    /// The httpx request of one attempt: the SDK's, with its timeouts
    /// capped by the attempt's (SPEC DL-4).
    fn attempt<'py>(&self, py: Python<'py>, ctx: &AttemptContext) -> PyResult<Bound<'py, PyAny>> {
        let extensions = self.extensions.bind(py).copy()?;
        if let Some(cap) = ctx.timeout {
            cap_timeouts(&extensions, cap)?;
        }
        let kwargs = PyDict::new(py);
        kwargs.set_item("headers", PyList::new(py, &self.headers)?)?;
        kwargs.set_item("content", self.body.bind(py))?;
        kwargs.set_item("extensions", extensions)?;
        self.kit
            .request
            .bind(py)
            .call((self.method.bind(py), self.url.bind(py)), Some(&kwargs))
    }

    /// Sends one attempt through the inner transport: the response (status
    /// and headers; its body unread).
    async fn send(&self, ctx: &AttemptContext) -> Result<Py<PyAny>, ProviderError> {
        *self.answer.lock() = None;
        *self.failure.lock() = None;
        let method = match self.mode {
            Mode::Async => "handle_async_request",
            Mode::Blocking => "handle_request",
        };
        self.mode
            .run_tracked(
                |py| {
                    let request = self.attempt(py, ctx)?;
                    self.kit
                        .inner
                        .bind(py)
                        .call_method1(method, (request,))
                        .map(Bound::unbind)
                },
                Some(&self.stragglers),
            )
            .await
            .map_err(|e| self.fail(e))
    }

    /// Reads a response's whole (decoded) body.
    async fn read(&self, response: &Py<PyAny>) -> Result<Py<PyAny>, ProviderError> {
        let method = match self.mode {
            Mode::Async => "aread",
            Mode::Blocking => "read",
        };
        self.mode
            .run_tracked(
                |py| response.bind(py).call_method0(method).map(Bound::unbind),
                Some(&self.stragglers),
            )
            .await
            .map_err(|e| self.fail(e))
    }

    /// An exception of the inner transport as an attempt failure (an
    /// exception that is not a transport failure is re-raised as it is).
    fn fail(&self, err: PyErr) -> ProviderError {
        crate::supervised::fail(&self.failure, err)
    }
}

/// Caps every timeout of an httpx `timeout` extension at `cap`.
fn cap_timeouts(extensions: &Bound<'_, PyDict>, cap: Duration) -> PyResult<()> {
    let py = extensions.py();
    let cap = cap.as_secs_f64();
    let capped = PyDict::new(py);
    let given = extensions
        .get_item("timeout")?
        .filter(|t| t.is_instance_of::<PyDict>());
    for key in ["connect", "read", "write", "pool"] {
        let value: Option<f64> = match &given {
            Some(t) => t.get_item(key).ok().and_then(|v| v.extract().ok()),
            None => None,
        };
        capped.set_item(key, value.map_or(cap, |v| v.min(cap)))?;
    }
    extensions.set_item("timeout", capped)
}

/// Header (name, value) pairs.
pub(crate) type Pairs = Vec<(String, String)>;

/// Status and headers of an httpx response, as pairs and as a map.
fn head(response: &Bound<'_, PyAny>) -> PyResult<(u16, Pairs, http::HeaderMap)> {
    let status: u16 = response.getattr("status_code")?.extract()?;
    let pairs: Vec<(String, String)> = response
        .getattr("headers")?
        .call_method0("multi_items")?
        .extract()?;
    let map = classify::headers_of(response);
    Ok((status, pairs, map))
}

/// The headers passed to the SDK with a body already decoded: no
/// `content-length` (recomputed) nor `content-encoding` or
/// `transfer-encoding` (they described the wire).
pub(crate) fn decoded_headers(headers: Vec<(String, String)>) -> Vec<(String, String)> {
    headers
        .into_iter()
        .filter(|(n, _)| {
            !["content-length", "content-encoding", "transfer-encoding"]
                .iter()
                .any(|h| n.eq_ignore_ascii_case(h))
        })
        .collect()
}

/// What a response's headers say about the provider's budget (SPEC Q-14).
fn budgets(headers: &http::HeaderMap) -> Budgets {
    // The wall clock only turns absolute resets into durations.
    RateLimitHints::from_headers(headers, SystemTime::now()).budgets()
}

impl HttpxRequest {
    /// Reads a response whole: the answer and its headers as a map.
    async fn answer(
        &self,
        response: &Py<PyAny>,
    ) -> Result<(Answer, http::HeaderMap), ProviderError> {
        let content = self.read(response).await?;
        Python::attach(|py| {
            let (status, headers, map) = head(response.bind(py)).map_err(|e| self.fail(e))?;
            let content = content
                .bind(py)
                .cast::<PyBytes>()
                .map_err(|e| self.fail(e.into()))?
                .clone()
                .unbind();
            Ok((
                Answer {
                    status,
                    headers,
                    content,
                },
                map,
            ))
        })
    }

    /// A non-2xx answer: read, kept for the SDK, classified.
    async fn refused(&self, response: &Py<PyAny>) -> Result<ProviderError, ProviderError> {
        let (answer, map) = self.answer(response).await?;
        let error = Python::attach(|py| {
            answer_error(
                http::StatusCode::from_u16(answer.status).unwrap_or(http::StatusCode::BAD_GATEWAY),
                &map,
                Some(answer.content.bind(py).as_bytes()),
            )
        });
        *self.answer.lock() = Some(answer);
        Ok(error)
    }
}

/// Sends SDK requests through the wrapped transport; stateless.
pub(crate) struct HttpxProvider;

impl Provider for HttpxProvider {
    type Request = HttpxRequest;
    type Response = Answer;
    type Chunk = Bytes;
    type Stream = HttpxStream;

    async fn call(
        &self,
        request: &HttpxRequest,
        attempt: AttemptContext,
    ) -> Result<Reply<Answer>, ProviderError> {
        let response = request.send(&attempt).await?;
        let ok = Python::attach(|py| {
            head(response.bind(py))
                .map(|(s, _, _)| (200..300).contains(&s))
                .map_err(|e| request.fail(e))
        })?;
        if !ok {
            return Err(request.refused(&response).await?);
        }
        let (answer, map) = request.answer(&response).await?;
        let usage = Python::attach(|py| {
            answer_usage(
                answer.content.bind(py).as_bytes(),
                answer.status,
                request.endpoint,
            )
        });
        match usage {
            Ok(usage) => Ok(Reply::new(answer, usage).with_budget(budgets(&map))),
            Err(e) => {
                *request.answer.lock() = Some(answer);
                Err(e.with_budget(budgets(&map)))
            }
        }
    }

    async fn stream(
        &self,
        request: &HttpxRequest,
        attempt: AttemptContext,
    ) -> Result<HttpxStream, ProviderError> {
        let response = request.send(&attempt).await?;
        let opened = Python::attach(|py| {
            let r = response.bind(py);
            let (status, headers, map) = head(r).map_err(|e| request.fail(e))?;
            if !(200..300).contains(&status) {
                return Ok(None);
            }
            let method = match request.mode {
                Mode::Async => "aiter_bytes",
                Mode::Blocking => "iter_bytes",
            };
            let iterator = r.call_method0(method).map_err(|e| request.fail(e))?;
            let finished = Arc::new(AtomicBool::new(false));
            *request.head.lock() = Some(Head {
                status,
                headers: decoded_headers(headers),
                finished: Arc::clone(&finished),
            });
            let body = PyBody {
                iterator: Some(iterator.unbind()),
                response: Some(response.clone_ref(py)),
                event_loop: request.event_loop.as_ref().map(|l| l.clone_ref(py)),
                mode: request.mode,
                // Its `__anext__()` tasks join the request's: a stream cut
                // mid-way returns its permit once they have ended.
                next: AsyncNext::tracked(request.stragglers.clone()),
            };
            let chunks = ChunkStream::new(body, request.forward_usage)
                .with_endpoint(request.endpoint)
                .with_end_grace(DEFAULT_END_GRACE);
            Ok(Some(HttpxStream {
                chunks,
                budget: budgets(&map),
                finished,
                stragglers: request.stragglers.clone(),
            }))
        })?;
        match opened {
            Some(stream) => Ok(stream),
            None => Err(request.refused(&response).await?),
        }
    }

    fn stream_finished(&self, stream: &HttpxStream) -> bool {
        stream.chunks.is_finished()
    }

    fn stream_budget(&self, stream: &HttpxStream) -> Budgets {
        stream.budget
    }

    /// A cut attempt's permit goes back once its tasks have ended (SPEC
    /// POOL-1, ADM-7): they were only asked to cancel.
    fn cut(&self, request: &HttpxRequest, lease: Lease) {
        request.stragglers.hold(lease);
    }

    /// A stream let go (its consumer closed it, its deadline, a close)
    /// returns its permit once the body read it cancels has ended (SPEC
    /// POOL-1, LC-5, ADM-7): dropping it cancels its `__anext__()` task,
    /// whose done callback drops the lease.
    fn stream_cut(&self, stream: HttpxStream, lease: Lease) {
        let stragglers = stream.stragglers.clone();
        drop(stream);
        stragglers.hold(lease);
    }
}

/// An opened stream: the relay's SSE reader over the response's bytes.
pub(crate) struct HttpxStream {
    chunks: ChunkStream<PyBody>,
    budget: Budgets,
    /// Set once every item is out (see [`Head`]).
    finished: Arc<AtomicBool>,
    /// The request's tasks, its body's `__anext__()` ones included.
    stragglers: Stragglers,
}

impl Stream for HttpxStream {
    type Item = ChunkItem;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<ChunkItem>> {
        let this = self.get_mut();
        let poll = Pin::new(&mut this.chunks).poll_next(cx);
        this.finished
            .store(this.chunks.is_finished(), Ordering::Release);
        poll
    }
}

/// A failure reading a response body (the message of the exception).
#[derive(Debug)]
pub(crate) struct BodyError(String);

impl std::fmt::Display for BodyError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for BodyError {}

/// The decoded bytes of an httpx response (`aiter_bytes()` /
/// `iter_bytes()`). Dropped before its end, it closes the response (its
/// connection), on its loop.
pub(crate) struct PyBody {
    iterator: Option<Py<PyAny>>,
    response: Option<Py<PyAny>>,
    event_loop: Option<Py<PyAny>>,
    mode: Mode,
    next: AsyncNext,
}

impl PyBody {
    fn ended(&mut self) {
        self.iterator = None;
        self.response = None;
    }

    /// The outcome of one `next()`: bytes, the end, or a failure.
    fn item(&mut self, result: PyResult<Py<PyAny>>) -> Option<Result<Bytes, BodyError>> {
        Python::attach(|py| match result {
            Ok(chunk) => match chunk.bind(py).cast::<PyBytes>() {
                Ok(b) => Some(Ok(Bytes::copy_from_slice(b.as_bytes()))),
                Err(_) => Some(Err(BodyError(
                    "the response body yielded a non-bytes chunk".into(),
                ))),
            },
            Err(e)
                if e.is_instance_of::<PyStopAsyncIteration>(py)
                    || e.is_instance_of::<PyStopIteration>(py) =>
            {
                self.ended();
                None
            }
            Err(e) => Some(Err(BodyError(e.to_string()))),
        })
    }
}

impl Stream for PyBody {
    type Item = Result<Bytes, BodyError>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        let Some(iterator) = &this.iterator else {
            return Poll::Ready(None);
        };
        match this.mode {
            Mode::Blocking => {
                let result = Python::attach(|py| {
                    iterator
                        .bind(py)
                        .call_method0(pyo3::intern!(py, "__next__"))
                        .map(Bound::unbind)
                });
                Poll::Ready(this.item(result))
            }
            Mode::Async => match this.next.poll(iterator, cx) {
                Poll::Pending => Poll::Pending,
                Poll::Ready(result) => Poll::Ready(this.item(result)),
            },
        }
    }
}

impl Drop for PyBody {
    fn drop(&mut self) {
        self.next.cancel();
        self.iterator = None;
        if let Some(response) = self.response.take() {
            // Async: `aclose()` on its loop; blocking: `close()`.
            notifier::submit(Job::Close {
                event_loop: self.event_loop.take(),
                objects: vec![response],
            });
        }
    }
}

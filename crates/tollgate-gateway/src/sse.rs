//! The streaming response body (SPEC GW-5, GW-6, LC-3, LC-5).
//!
//! Chunks are forwarded as they arrive, byte for byte. A stream that fails
//! after output began ends with one OpenAI-style error event and then an
//! aborted body (the HTTP/1.1 chunked encoding is not terminated), so a
//! client can never mistake it for a normal completion. When the client
//! goes away the body is dropped, which drops the supervised stream: the
//! upstream request is cancelled and every permit returned at once.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use futures_core::Stream;
use tollgate::clock::Instant;
use tollgate::lifecycle::CallStream;
use tollgate::{Lease, Usage};
use tollgate_openai::ErrorResponse;

use crate::error::ApiError;
use crate::metrics::Metrics;
use crate::provider::GatewayProvider;

enum State {
    Streaming,
    /// The error event went out; the body aborts next.
    Failed,
    Done,
}

/// See the module documentation.
pub struct SseBody {
    stream: CallStream<GatewayProvider>,
    /// The tenant's per-call lease: held for the stream's whole life
    /// (SPEC POOL-1, POOL-4).
    tenant: Option<Lease>,
    state: State,
    metrics: Metrics,
    model: std::sync::Arc<str>,
}

impl SseBody {
    /// A body streaming `stream` while holding `tenant`.
    pub fn new(
        stream: CallStream<GatewayProvider>,
        tenant: Lease,
        metrics: Metrics,
        model: std::sync::Arc<str>,
    ) -> Self {
        SseBody {
            stream,
            tenant: Some(tenant),
            state: State::Streaming,
            metrics,
            model,
        }
    }

    fn settle_tenant(&mut self) {
        if let Some(mut lease) = self.tenant.take() {
            let _ = lease.reconcile(self.stream.usage().unwrap_or(Usage::UNKNOWN));
        }
    }
}

/// One SSE event carrying an OpenAI error body.
pub fn error_event(body: &ErrorResponse) -> Bytes {
    let json = serde_json::to_string(body)
        .unwrap_or_else(|_| "{\"error\":{\"message\":\"stream failed\"}}".into());
    Bytes::from(format!("data: {json}\n\n"))
}

impl Stream for SseBody {
    type Item = Result<Bytes, io::Error>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        match this.state {
            State::Done => Poll::Ready(None),
            State::Failed => {
                this.state = State::Done;
                Poll::Ready(Some(Err(io::Error::other("upstream stream failed"))))
            }
            State::Streaming => match Pin::new(&mut this.stream).poll_next(cx) {
                Poll::Pending => Poll::Pending,
                Poll::Ready(Some(Ok(chunk))) => Poll::Ready(Some(Ok(chunk))),
                Poll::Ready(Some(Err(e))) => {
                    this.settle_tenant();
                    let api = ApiError::from_call(&e, Instant::now());
                    this.metrics.stream_failed(&this.model, api.reason());
                    this.state = State::Failed;
                    Poll::Ready(Some(Ok(error_event(&api.body))))
                }
                Poll::Ready(None) => {
                    this.settle_tenant();
                    this.state = State::Done;
                    Poll::Ready(None)
                }
            },
        }
    }
}

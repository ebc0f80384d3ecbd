//! The streaming response body (SPEC GW-5, GW-6, LC-3, LC-5).
//!
//! Chunks are forwarded as they arrive, byte for byte: everything the
//! upstream already delivered goes out in one write. A stream that fails
//! after output began ends with one OpenAI-style error event (the
//! provider's own, when it declared the error in the stream; the gateway's
//! otherwise) and then an aborted body (the HTTP/1.1 chunked encoding is
//! not terminated), so a client can never mistake it for a normal
//! completion. When the client goes away the body is dropped, which drops
//! the supervised stream: the upstream request is cancelled and every
//! permit returned at once.
//!
//! A client that stays connected but stops reading is handled outside the
//! body, since hyper then stops polling it (SPEC GW-17): the supervised
//! stream's watchdog ends the call at its deadline (the tenant's lease is
//! held by the stream, so it comes back too), and the body's
//! [`CloseAt`] registration makes the server drop the connection shortly
//! after.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::{Bytes, BytesMut};
use futures_core::Stream;
use tollgate::clock::Instant;
use tollgate::lifecycle::{CallError, CallStream, ErrorKind};

use crate::access_log::{AccessLog, Record};
use crate::connection::CloseAt;
use crate::error::{ApiError, Dialect};
use crate::metrics::Metrics;
use crate::provider::GatewayProvider;
use crate::router::InFlightGuard;

enum State {
    Streaming,
    /// The error event was handed to hyper; the body yields once (so that
    /// hyper flushes the event: an abort discards what it still buffers),
    /// then aborts.
    Failed {
        /// Whether the one pending poll happened.
        yielded: bool,
    },
    Done,
}

/// See the module documentation.
pub struct SseBody {
    /// The supervised stream; it also holds the tenant's per-call lease
    /// for its whole life (SPEC POOL-1, POOL-4).
    stream: CallStream<GatewayProvider>,
    state: State,
    /// The end seen while a batch was being filled, handled next poll.
    deferred: Option<End>,
    metrics: Metrics,
    model: std::sync::Arc<str>,
    /// The connection's drop instant, cleared once the body ended.
    close: Option<CloseAt>,
    /// Counts the stream in flight on its deployment (SPEC GW-11).
    _in_flight: InFlightGuard,
    /// The access-log line, written when the body ends or is dropped.
    log: Option<StreamLog>,
    /// The format of the error event that ends a failed stream.
    dialect: Dialect,
}

/// A stream's access-log line (SPEC GW-14), completed when the body ends:
/// the usage the upstream reported, what the call cost, the total time, a
/// failure's code.
pub struct StreamLog {
    /// What the request did up to the first chunk.
    pub record: Record,
    /// Where the line goes.
    pub log: AccessLog,
    /// When the request's head was read.
    pub arrived: Instant,
    /// Where the call's cost is counted (SPEC BUD-6).
    pub spend: crate::spend::Spend,
    /// What the attempts before the stream's may have cost, charged to the
    /// tenant with it (SPEC BUD-2, BUD-5), in micro-dollars.
    pub charged_before: u64,
}

impl SseBody {
    /// A body streaming `stream`; `close` (if any) is the connection's
    /// drop instant, kept until the body ends.
    pub fn new(
        stream: CallStream<GatewayProvider>,
        metrics: Metrics,
        model: std::sync::Arc<str>,
        close: Option<CloseAt>,
        in_flight: InFlightGuard,
        log: StreamLog,
        dialect: Dialect,
    ) -> Self {
        SseBody {
            stream,
            state: State::Streaming,
            deferred: None,
            metrics,
            model,
            close,
            _in_flight: in_flight,
            log: Some(log),
            dialect,
        }
    }
}

/// Whether the stream failed because the provider declared an error in
/// it: its error event then already reached the client (SPEC LC-4).
fn upstream_error_event_sent(e: &CallError) -> bool {
    matches!(e, CallError::Stream { error } if error.kind == ErrorKind::Declared)
}

/// Largest batch of ready events written at once.
const MAX_BATCH: usize = 64 * 1024;

/// How the upstream stream ended: `None` normally, or with an error.
type End = Option<Result<Bytes, tollgate::lifecycle::CallError>>;

impl SseBody {
    /// Handles the end of the supervised stream.
    fn end(&mut self, end: End, cx: &mut Context<'_>) -> Poll<Option<Result<Bytes, io::Error>>> {
        match end {
            // A chunk is never deferred (it is part of a batch).
            Some(Ok(chunk)) => Poll::Ready(Some(Ok(chunk))),
            Some(Err(e)) => {
                let api = ApiError::from_call(&e, Instant::now());
                self.metrics.stream_failed(&self.model, api.reason());
                if let Some(log) = &mut self.log {
                    log.record.error = Some(format!("stream_failed:{}", api.reason()));
                }
                if upstream_error_event_sent(&e) {
                    // The provider's own error event (with the real cause)
                    // was the last chunk out: no second one; yield once for
                    // it to be flushed, then abort.
                    self.state = State::Failed { yielded: true };
                    cx.waker().wake_by_ref();
                    return Poll::Pending;
                }
                self.state = State::Failed { yielded: false };
                Poll::Ready(Some(Ok(self.dialect.event(&api))))
            }
            None => {
                self.state = State::Done;
                self.close = None;
                Poll::Ready(None)
            }
        }
    }
}

impl Stream for SseBody {
    type Item = Result<Bytes, io::Error>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        if let Some(end) = this.deferred.take() {
            return this.end(end, cx);
        }
        match this.state {
            State::Done => Poll::Ready(None),
            State::Failed { yielded: false } => {
                this.state = State::Failed { yielded: true };
                cx.waker().wake_by_ref();
                Poll::Pending
            }
            State::Failed { yielded: true } => {
                this.state = State::Done;
                this.close = None;
                Poll::Ready(Some(Err(io::Error::other("upstream stream failed"))))
            }
            State::Streaming => {
                // What the upstream already delivered goes out in one write:
                // ready events are not flushed one by one. The stream's
                // upstream connection is driven by this very poll (the
                // provider's stream path), so `Pending` means nothing more
                // has arrived: the batch leaves at once.
                let mut batch = Batch::Empty;
                let end = loop {
                    match Pin::new(&mut this.stream).poll_next(cx) {
                        Poll::Ready(Some(Ok(chunk))) => {
                            if batch.push(chunk) >= MAX_BATCH {
                                break None;
                            }
                        }
                        Poll::Pending => break None,
                        Poll::Ready(other) => break Some(other),
                    }
                };
                match (batch.take(), end) {
                    (Some(b), end) => {
                        this.deferred = end;
                        Poll::Ready(Some(Ok(b)))
                    }
                    (None, None) => Poll::Pending,
                    (None, Some(end)) => this.end(end, cx),
                }
            }
        }
    }
}

/// Chunks read in one poll: one is passed on as it is, several are joined.
enum Batch {
    Empty,
    One(Bytes),
    Many(BytesMut),
}

impl Batch {
    /// Adds `chunk`; the batch's length after it.
    fn push(&mut self, chunk: Bytes) -> usize {
        match std::mem::replace(self, Batch::Empty) {
            Batch::Empty => {
                let len = chunk.len();
                *self = Batch::One(chunk);
                len
            }
            Batch::One(first) => {
                let mut joined = BytesMut::with_capacity((first.len() + chunk.len()) * 4);
                joined.extend_from_slice(&first);
                joined.extend_from_slice(&chunk);
                let len = joined.len();
                *self = Batch::Many(joined);
                len
            }
            Batch::Many(mut joined) => {
                joined.extend_from_slice(&chunk);
                let len = joined.len();
                *self = Batch::Many(joined);
                len
            }
        }
    }

    fn take(self) -> Option<Bytes> {
        match self {
            Batch::Empty => None,
            Batch::One(chunk) => Some(chunk),
            Batch::Many(joined) => Some(joined.freeze()),
        }
    }
}

impl Drop for SseBody {
    fn drop(&mut self) {
        if let Some(mut log) = self.log.take() {
            let usage = self.stream.usage();
            log.record.tokens_reported = usage.and_then(|u| u.total());
            log.record.usage = usage;
            // What the tenant is charged when the stream's leases settle
            // (SPEC BUD-5): the priced usage the provider reported, else
            // the worst case reserved, and the attempts before it.
            if let Some(cost) = usage
                .and_then(|u| u.cost())
                .or(log.record.cost_reserved)
                .map(|c| c.saturating_add(log.charged_before))
            {
                log.record.cost = Some(cost);
                if let (Some(tenant), Some(model)) = (&log.record.tenant, &log.record.model) {
                    log.spend.record(tenant, model, cost);
                }
            }
            log.record.total = log.arrived.elapsed();
            if log.record.error.is_none() && !matches!(self.state, State::Done) {
                // The client went away before the end (SPEC GW-6).
                log.record.error = Some("client_disconnected".to_owned());
            }
            log.log.write(&log.record);
            // The stream's span ends with its last event or its error
            // (SPEC OBS-5).
            if let Some(trace) = log.record.trace.take() {
                trace.finish(&log.record.call_end());
            }
        }
    }
}

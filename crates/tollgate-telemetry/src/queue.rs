//! The export queue: ended spans wait in a bounded channel and a task on
//! the process's runtime sends them in batches (SPEC OBS-5).
//!
//! A call never waits for telemetry: ending a span is one `try_send`; a
//! full queue (a slow or unreachable collector) drops the span, and a
//! failed or timed-out export drops its batch. Both are counted in
//! `tollgate_telemetry_spans_dropped_total`. The SDK's own batch processor
//! drops alike but does not expose the count, hence this one.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use opentelemetry::Context;
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::trace::{Span, SpanData, SpanProcessor};
use tokio::sync::{mpsc, oneshot};

use crate::export::OtlpHttp;

/// The metric counting spans never exported.
pub const DROPPED_METRIC: &str = "tollgate_telemetry_spans_dropped_total";

enum Message {
    Span(Box<SpanData>),
    /// Export everything queued before it, then answer.
    Flush(oneshot::Sender<()>),
}

/// Spans dropped so far; clones share the count.
#[derive(Debug, Clone)]
pub(super) struct Dropped {
    count: Arc<AtomicU64>,
    metric: metrics::Counter,
}

impl Dropped {
    fn new() -> Self {
        Dropped {
            count: Arc::default(),
            metric: metrics::counter!(DROPPED_METRIC),
        }
    }

    fn add(&self, n: usize) {
        self.count.fetch_add(n as u64, Ordering::Relaxed);
        self.metric.increment(n as u64);
    }

    pub(super) fn get(&self) -> u64 {
        self.count.load(Ordering::Relaxed)
    }
}

/// How batches are formed and sent.
#[derive(Debug, Clone, Copy)]
pub(super) struct Batching {
    pub queue_size: usize,
    pub batch_size: usize,
    pub delay: Duration,
    pub timeout: Duration,
}

/// The span processor: the sending end of the queue.
#[derive(Debug, Clone)]
pub(super) struct Queue {
    tx: mpsc::Sender<Message>,
    dropped: Dropped,
}

impl Queue {
    /// The queue and its export task, spawned on `runtime`.
    pub(super) fn spawn(
        exporter: OtlpHttp,
        batching: Batching,
        runtime: &tokio::runtime::Handle,
    ) -> Self {
        let (tx, rx) = mpsc::channel(batching.queue_size);
        let dropped = Dropped::new();
        runtime.spawn(export_loop(exporter, rx, batching, dropped.clone()));
        Queue { tx, dropped }
    }

    pub(super) fn dropped(&self) -> &Dropped {
        &self.dropped
    }

    /// Exports every span ended before the call; `false` if the export
    /// task is gone.
    pub(super) async fn flush(&self) -> bool {
        let (done, wait) = oneshot::channel();
        if self.tx.send(Message::Flush(done)).await.is_err() {
            return false;
        }
        wait.await.is_ok()
    }
}

impl SpanProcessor for Queue {
    fn on_start(&self, _span: &mut Span, _cx: &Context) {}

    fn on_end(&self, span: SpanData) {
        if self.tx.try_send(Message::Span(Box::new(span))).is_err() {
            self.dropped.add(1);
        }
    }

    fn force_flush(&self) -> OTelSdkResult {
        // Synchronous callers cannot wait on the runtime; `Telemetry::flush`
        // is the asynchronous flush.
        Ok(())
    }

    fn shutdown_with_timeout(&self, _timeout: Duration) -> OTelSdkResult {
        Ok(())
    }
}

/// Collects spans and sends a batch when it is full, when the oldest span
/// waited `delay`, at a flush, and when the queue closes.
async fn export_loop(
    mut exporter: OtlpHttp,
    mut rx: mpsc::Receiver<Message>,
    batching: Batching,
    dropped: Dropped,
) {
    let mut batch: Vec<SpanData> = Vec::with_capacity(batching.batch_size);
    let mut due: Option<tokio::time::Instant> = None;
    loop {
        let message = match due {
            None => rx.recv().await,
            Some(at) => match tokio::time::timeout_at(at, rx.recv()).await {
                Ok(m) => m,
                Err(_) => {
                    send(&mut exporter, &mut batch, batching.timeout, &dropped).await;
                    due = None;
                    continue;
                }
            },
        };
        match message {
            None => {
                send(&mut exporter, &mut batch, batching.timeout, &dropped).await;
                return;
            }
            Some(Message::Span(span)) => {
                if batch.is_empty() {
                    due = Some(tokio::time::Instant::now() + batching.delay);
                }
                batch.push(*span);
                if batch.len() >= batching.batch_size {
                    send(&mut exporter, &mut batch, batching.timeout, &dropped).await;
                    due = None;
                }
            }
            Some(Message::Flush(done)) => {
                send(&mut exporter, &mut batch, batching.timeout, &dropped).await;
                due = None;
                let _ = done.send(());
            }
        }
    }
}

/// Sends `batch` (emptied), counting its spans dropped if the export fails
/// or takes longer than `timeout`.
async fn send(
    exporter: &mut OtlpHttp,
    batch: &mut Vec<SpanData>,
    timeout: Duration,
    dropped: &Dropped,
) {
    if batch.is_empty() {
        return;
    }
    let n = batch.len();
    let sent = tokio::time::timeout(timeout, exporter.export(batch)).await;
    // The batch's memory is kept for the next one.
    batch.clear();
    match sent {
        Ok(Ok(())) => {}
        Ok(Err(e)) => {
            tracing::debug!(error = %e, spans = n, "trace export failed; spans dropped");
            dropped.add(n);
        }
        Err(_) => {
            tracing::debug!(spans = n, "trace export timed out; spans dropped");
            dropped.add(n);
        }
    }
}

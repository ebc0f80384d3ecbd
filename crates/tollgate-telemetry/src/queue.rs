//! The export queue (SPEC OBS-5): ended spans wait in a bounded buffer
//! and a task on the process's runtime sends them in batches.
//!
//! A call never waits for telemetry and never wakes the export task for
//! one span: ending a span is a push under a short lock. The task wakes
//! when a batch is full (`batch_size`), when the oldest waiting span has
//! waited `schedule_delay`, at a flush, and when the telemetry is dropped
//! (it then sends what it holds and ends). A full buffer (`queue_size`
//! spans: a slow or unreachable collector) drops the span, and a failed
//! or timed-out export drops its batch. Both are counted in
//! `tollgate_telemetry_spans_dropped_total` and [`Telemetry::dropped`](crate::Telemetry::dropped).

#![allow(
    clippy::vec_box,
    reason = "a span's record moves from its call to the export as a pointer and is recycled whole"
)]

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use parking_lot::Mutex;
use tokio::sync::{Notify, mpsc, oneshot};
use tokio::time::Instant;

use crate::span::Record;

/// Bytes for the attributes a span ends with in most cases (a gateway
/// call span's 20 take about 700), so that its buffer seldom grows.
pub(crate) const ATTRIBUTES: usize = 1024;
/// Room for the copies of a span's name and error (the model a client
/// asked for, an error's text) in most cases.
const TEXT: usize = 64;

/// What sends a batch: the OTLP/HTTP exporter (or a test's stand-in).
pub(crate) trait Export: Send + 'static {
    /// Sends `spans` once.
    fn export(&mut self, spans: &[Box<Record>]) -> impl Future<Output = Result<(), String>> + Send;
}

/// The metric counting spans never exported.
pub const DROPPED_METRIC: &str = "tollgate_telemetry_spans_dropped_total";

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

/// The spans waiting for export.
#[derive(Debug)]
struct Pending {
    /// Oldest first: a batch is taken from the front without moving the
    /// rest.
    records: VecDeque<Box<Record>>,
    /// When the oldest of `records` was pushed.
    since: Option<Instant>,
    /// The telemetry was dropped: nothing more is taken.
    closed: bool,
}

/// Where ended spans go; shared by the telemetry, every call's spans and
/// the export task.
#[derive(Debug)]
pub(crate) struct Buffer {
    pending: Mutex<Pending>,
    queue_size: usize,
    batch_size: usize,
    /// Wakes the task: a batch is full.
    full: Notify,
    dropped: Dropped,
    /// Exported spans' records, their attribute lists and text buffers
    /// emptied, for new spans: no allocation per span on the request
    /// path, no free of a request path's allocation on the export task,
    /// and a span moves as a pointer from its call to the export.
    spare: Mutex<Vec<Box<Record>>>,
    /// The most kept in `spare`.
    spare_max: usize,
}

impl Buffer {
    /// Queues an ended span for export; drops it (counted) if
    /// `queue_size` spans already wait. Wakes the export task only when
    /// this span fills a batch.
    pub(crate) fn push(&self, record: Box<Record>) {
        let mut p = self.pending.lock();
        if p.closed {
            // Ended after the telemetry was dropped: nothing exports it
            // any more; counted like any span never exported.
            drop(p);
            self.dropped.add(1);
            return;
        }
        if p.records.len() >= self.queue_size {
            drop(p);
            self.dropped.add(1);
            return;
        }
        if p.records.is_empty() {
            p.since = Some(Instant::now());
        }
        p.records.push_back(record);
        let full = p.records.len() == self.batch_size;
        drop(p);
        if full {
            self.full.notify_one();
        }
    }

    /// A record for a new span: an exported one's, its attribute list
    /// and text buffer empty (its other fields are the old span's, for
    /// the caller to overwrite).
    pub(crate) fn record(&self) -> Box<Record> {
        let spare = self.spare.lock().pop();
        spare.unwrap_or_else(|| Box::new(Record::empty(ATTRIBUTES, TEXT)))
    }

    /// Empties `batch` (sent), keeping its spans' records for new spans
    /// (up to `spare_max`); `parts` is the task's own vector.
    fn recycle(&self, batch: &mut Vec<Box<Record>>, parts: &mut Vec<Box<Record>>) {
        let room = self.spare_max.saturating_sub(self.spare.lock().len());
        for (i, mut record) in batch.drain(..).enumerate() {
            // A span with unusually long values (a batch item's id from
            // its input file) does not keep its large buffers alive.
            let small = record.attributes.capacity() <= 4 * ATTRIBUTES
                && record.text.capacity() <= 4 * TEXT;
            if i < room && small {
                record.attributes.clear();
                record.text.clear();
                // Nothing shared outlives its span.
                record.trace_state = None;
                record.model = None;
                record.error = None;
                parts.push(record);
            }
        }
        let mut spare = self.spare.lock();
        let room = self.spare_max.saturating_sub(spare.len());
        spare.extend(parts.drain(..).take(room));
    }

    /// Moves the next batch into `batch` (empty): a full one, or if `any`
    /// whatever waits, at most `batch_size`. Whether it took any.
    fn take(&self, batch: &mut Vec<Box<Record>>, any: bool) -> bool {
        let mut p = self.pending.lock();
        let n = p.records.len();
        if n == 0 || (!any && n < self.batch_size) {
            return false;
        }
        batch.extend(p.records.drain(..n.min(self.batch_size)));
        // What is left waits at most one more delay from now: under a
        // steady load, at most one partial batch per delay (as the SDK's
        // batch processor sends), never a run of small ones.
        p.since = (!p.records.is_empty()).then(Instant::now);
        true
    }

    /// When the oldest waiting span is due, if one waits.
    fn due(&self, delay: Duration) -> Option<Instant> {
        self.pending.lock().since.map(|s| s + delay)
    }

    fn close(&self) {
        self.pending.lock().closed = true;
    }
}

/// The telemetry's end of the queue. Dropping it ends the export task
/// once it has sent what it holds.
#[derive(Debug)]
pub(super) struct Queue {
    buffer: Arc<Buffer>,
    flushes: mpsc::UnboundedSender<oneshot::Sender<()>>,
}

impl Queue {
    /// The queue and its export task, spawned on `runtime`.
    pub(super) fn spawn(
        exporter: impl Export,
        batching: Batching,
        runtime: &tokio::runtime::Handle,
    ) -> Self {
        let buffer = Arc::new(Buffer {
            pending: Mutex::new(Pending {
                records: VecDeque::new(),
                since: None,
                closed: false,
            }),
            queue_size: batching.queue_size,
            // A batch is at most the queue (as the gateway's settings
            // cap it), else a full batch would never be reached.
            batch_size: batching.batch_size.clamp(1, batching.queue_size.max(1)),
            full: Notify::new(),
            dropped: Dropped::new(),
            spare: Mutex::new(Vec::new()),
            spare_max: batching.queue_size.min(2 * batching.batch_size.max(1)),
        });
        let (flushes, rx) = mpsc::unbounded_channel();
        runtime.spawn(export_loop(exporter, Arc::clone(&buffer), rx, batching));
        Queue { buffer, flushes }
    }

    /// Where spans are pushed.
    pub(super) fn buffer(&self) -> &Arc<Buffer> {
        &self.buffer
    }

    pub(super) fn dropped(&self) -> &Dropped {
        &self.buffer.dropped
    }

    /// Exports every span ended before the call; `false` if the export
    /// task is gone.
    pub(super) async fn flush(&self) -> bool {
        let (done, wait) = oneshot::channel();
        if self.flushes.send(done).is_err() {
            return false;
        }
        wait.await.is_ok()
    }
}

/// Sends a batch when one is full, when the oldest span waited `delay`,
/// at a flush, and, before it ends, when the telemetry is dropped.
async fn export_loop(
    exporter: impl Export,
    buffer: Arc<Buffer>,
    mut flushes: mpsc::UnboundedReceiver<oneshot::Sender<()>>,
    batching: Batching,
) {
    let mut out = Outbox {
        exporter,
        buffer: Arc::clone(&buffer),
        batch: Vec::new(),
        parts: Vec::new(),
        timeout: batching.timeout,
    };
    loop {
        while out.send_next(false).await {}
        let due = buffer.due(batching.delay);
        if due.is_some_and(|at| at <= Instant::now()) {
            out.send_next(true).await;
            continue;
        }
        // Idle, the task looks again after `delay`: a span pushed meanwhile
        // did not wake it.
        // (At least a millisecond: a zero delay must not spin.)
        let idle = batching.delay.max(Duration::from_millis(1));
        let wake = due.unwrap_or_else(|| Instant::now() + idle);
        tokio::select! {
            biased;
            flush = flushes.recv() => {
                if flush.is_none() {
                    buffer.close();
                }
                while out.send_next(true).await {}
                match flush {
                    Some(done) => {
                        let _ = done.send(());
                    }
                    None => return,
                }
            }
            () = buffer.full.notified() => {}
            () = tokio::time::sleep_until(wake) => {}
        }
    }
}

/// The export task's sending side: the exporter and the memory it reuses
/// from batch to batch.
struct Outbox<E> {
    exporter: E,
    buffer: Arc<Buffer>,
    batch: Vec<Box<Record>>,
    parts: Vec<Box<Record>>,
    timeout: Duration,
}

impl<E: Export> Outbox<E> {
    /// Takes the next batch (a full one, or if `any` whatever waits) and
    /// sends it; whether there was one.
    async fn send_next(&mut self, any: bool) -> bool {
        if !self.buffer.take(&mut self.batch, any) {
            return false;
        }
        send(
            &mut self.exporter,
            &mut self.batch,
            &mut self.parts,
            self.timeout,
            &self.buffer,
        )
        .await;
        true
    }
}

/// Sends `batch` (emptied), counting its spans dropped if the export fails
/// or takes longer than `timeout`.
async fn send(
    exporter: &mut impl Export,
    batch: &mut Vec<Box<Record>>,
    parts: &mut Vec<Box<Record>>,
    timeout: Duration,
    buffer: &Buffer,
) {
    if batch.is_empty() {
        return;
    }
    let n = batch.len();
    let sent = tokio::time::timeout(timeout, exporter.export(batch)).await;
    // The batch's memory is kept for the next one, its spans' for new
    // spans.
    buffer.recycle(batch, parts);
    let dropped = &buffer.dropped;
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

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use tokio::sync::{Semaphore, mpsc};
    use tokio::time::Instant;

    use super::{Batching, Export, Queue};
    use crate::span::{Kind, Record};

    /// A stand-in collector: reports each batch's size and when it came;
    /// waits for a permit of `gate` first if there is one; fails if told.
    struct Fake {
        batches: mpsc::UnboundedSender<(Instant, usize)>,
        gate: Option<Arc<Semaphore>>,
        fail: bool,
        /// How long each export takes.
        latency: Duration,
    }

    impl Export for Fake {
        async fn export(&mut self, spans: &[Box<Record>]) -> Result<(), String> {
            tokio::time::sleep(self.latency).await;
            if let Some(gate) = &self.gate {
                gate.acquire().await.map_err(|e| e.to_string())?.forget();
            }
            let _ = self.batches.send((Instant::now(), spans.len()));
            if self.fail {
                Err("refused".to_owned())
            } else {
                Ok(())
            }
        }
    }

    fn record(i: u8) -> Box<Record> {
        Box::new(Record {
            trace_id: [i; 16],
            span_id: [i; 8],
            parent_id: [0; 8],
            parent_remote: false,
            flags: 1,
            trace_state: None,
            kind: Kind::Internal,
            operation: "chat",
            model: None,
            start: 1,
            end: 2,
            attributes: Vec::new(),
            error: None,
            text: String::new(),
        })
    }

    struct Setup {
        queue: Queue,
        batches: mpsc::UnboundedReceiver<(Instant, usize)>,
    }

    fn setup(
        queue_size: usize,
        batch_size: usize,
        gate: Option<Arc<Semaphore>>,
        fail: bool,
    ) -> Setup {
        let batching = Batching {
            queue_size,
            batch_size,
            delay: Duration::from_secs(1),
            timeout: Duration::from_secs(10),
        };
        spawn(batching, Duration::ZERO, gate, fail)
    }

    /// A queue exporting to a [`Fake`] whose exports take `latency`.
    fn spawn(
        batching: Batching,
        latency: Duration,
        gate: Option<Arc<Semaphore>>,
        fail: bool,
    ) -> Setup {
        let (tx, batches) = mpsc::unbounded_channel();
        let fake = Fake {
            batches: tx,
            gate,
            fail,
            latency,
        };
        let queue = Queue::spawn(fake, batching, &tokio::runtime::Handle::current());
        Setup { queue, batches }
    }

    /// proves: OBS-5 (a full batch is exported at once, without waiting
    /// for the schedule delay; spans short of a batch wait for it)
    #[tokio::test(start_paused = true)]
    async fn a_full_batch_is_exported_at_once() {
        let mut s = setup(100, 4, None, false);
        let t0 = Instant::now();
        for i in 0..3 {
            s.queue.buffer().push(record(i));
        }
        // Three of four: nothing before the delay.
        assert!(
            tokio::time::timeout(Duration::from_millis(900), s.batches.recv())
                .await
                .is_err()
        );
        s.queue.buffer().push(record(3));
        let (at, n) = s.batches.recv().await.expect("a batch");
        assert_eq!(n, 4);
        assert_eq!(
            at - t0,
            Duration::from_millis(900),
            "sent when full, not at the delay"
        );
        // Nine more: two full batches at once, one left for the delay.
        for i in 0..9 {
            s.queue.buffer().push(record(i));
        }
        let t1 = Instant::now();
        for _ in 0..2 {
            let (at, n) = s.batches.recv().await.expect("a batch");
            assert_eq!((at, n), (t1, 4));
        }
        let (at, n) = s.batches.recv().await.expect("the rest");
        assert_eq!((at - t1, n), (Duration::from_secs(1), 1));
        assert_eq!(s.queue.dropped().get(), 0);
    }

    /// proves: OBS-5 (under a steady load and a slow collector, spans go
    /// in full batches, with at most one partial batch per schedule
    /// delay: the export task does not fall into sending a run of small
    /// batches once the oldest span's delay has passed)
    #[tokio::test(start_paused = true)]
    async fn a_steady_load_is_sent_in_full_batches() {
        let batching = Batching {
            queue_size: 1000,
            batch_size: 50,
            delay: Duration::from_secs(1),
            timeout: Duration::from_secs(10),
        };
        let Setup { queue, mut batches } = spawn(batching, Duration::from_millis(100), None, false);
        // A span, then after 0.9 s one every 30 ms for 6 s, each export
        // taking 100 ms: spans keep arriving while the first one's delay
        // passes and while every export is under way.
        queue.buffer().push(record(0));
        tokio::time::sleep(Duration::from_millis(900)).await;
        for i in 1..=200_u32 {
            queue.buffer().push(record((i % 250) as u8));
            tokio::time::sleep(Duration::from_millis(30)).await;
        }
        assert!(queue.flush().await);
        let mut sizes = Vec::new();
        while let Ok((_, n)) = batches.try_recv() {
            sizes.push(n);
        }
        assert_eq!(sizes.iter().sum::<usize>(), 201);
        // One partial batch per delay over the 7 s, plus the flush's.
        assert!(sizes.len() <= 8, "{} batches: {sizes:?}", sizes.len());
    }

    /// proves: OBS-5 (a span short of a batch waits `schedule_delay`
    /// from when it ended, no longer)
    #[tokio::test(start_paused = true)]
    async fn a_partial_batch_is_exported_after_the_delay() {
        let mut s = setup(100, 512, None, false);
        tokio::time::sleep(Duration::from_millis(300)).await;
        let t0 = Instant::now();
        s.queue.buffer().push(record(1));
        tokio::time::sleep(Duration::from_millis(500)).await;
        s.queue.buffer().push(record(2));
        let (at, n) = s.batches.recv().await.expect("a batch");
        assert_eq!((at - t0, n), (Duration::from_secs(1), 2));
        // Idle, nothing is sent.
        assert!(
            tokio::time::timeout(Duration::from_secs(5), s.batches.recv())
                .await
                .is_err()
        );
        s.queue.buffer().push(record(3));
        let t1 = Instant::now();
        let (at, n) = s.batches.recv().await.expect("a batch");
        assert_eq!((at - t1, n), (Duration::from_secs(1), 1));
    }

    /// proves: OBS-5 (`flush` exports every span ended before it, in
    /// batches of at most `batch_size`, before it returns)
    #[tokio::test(start_paused = true)]
    async fn flush_exports_everything_ended_before_it() {
        let mut s = setup(100, 10, None, false);
        for i in 0..25 {
            s.queue.buffer().push(record(i));
        }
        let t0 = Instant::now();
        assert!(s.queue.flush().await);
        assert_eq!(Instant::now(), t0, "no delay waited");
        let mut sizes = Vec::new();
        while let Ok((_, n)) = s.batches.try_recv() {
            sizes.push(n);
        }
        assert_eq!(sizes.iter().sum::<usize>(), 25, "{sizes:?}");
        assert!(sizes.iter().all(|&n| n <= 10), "{sizes:?}");
        // Nothing waits: a second flush sends nothing.
        assert!(s.queue.flush().await);
        assert!(s.batches.try_recv().is_err());
    }

    /// proves: OBS-5 (a full queue drops new spans and counts them; a
    /// failed or timed-out export drops and counts its batch; a call
    /// never waits)
    #[tokio::test(start_paused = true)]
    async fn full_queue_and_failed_exports_drop_and_count() {
        // The collector holds the first batch until let go.
        let gate = Arc::new(Semaphore::new(0));
        let mut s = setup(3, 1, Some(Arc::clone(&gate)), false);
        s.queue.buffer().push(record(0));
        // The task took it and waits on the collector.
        while s.queue.buffer().pending.lock().records.len() == 1 {
            tokio::task::yield_now().await;
        }
        for i in 1..=5 {
            s.queue.buffer().push(record(i));
        }
        assert_eq!(s.queue.dropped().get(), 2, "3 wait, 2 dropped");
        gate.add_permits(100);
        assert!(s.queue.flush().await);
        let mut sent = 0;
        while let Ok((_, n)) = s.batches.try_recv() {
            sent += n;
        }
        assert_eq!(sent, 4);
        assert_eq!(s.queue.dropped().get(), 2);

        // Refused exports: each batch counted.
        let mut s = setup(100, 2, None, true);
        for i in 0..5 {
            s.queue.buffer().push(record(i));
        }
        assert!(s.queue.flush().await);
        assert_eq!(s.queue.dropped().get(), 5);
        while s.batches.try_recv().is_ok() {}

        // An export that never answers: dropped at `export_timeout`.
        let s = setup(100, 2, Some(Arc::new(Semaphore::new(0))), false);
        s.queue.buffer().push(record(0));
        let t0 = Instant::now();
        assert!(s.queue.flush().await);
        assert_eq!(Instant::now() - t0, Duration::from_secs(10));
        assert_eq!(s.queue.dropped().get(), 1);
    }

    /// proves: OBS-5 (spans ended on many threads at once, into a queue
    /// small enough to overflow and a collector that takes its time: each
    /// is exported or counted as dropped, none lost, none counted twice,
    /// and nothing waits at the end). Real threads, real clock.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn spans_from_many_threads_are_exported_or_counted() {
        const THREADS: u32 = 8;
        const EACH: u32 = 2_000;
        let batching = Batching {
            queue_size: 64,
            batch_size: 16,
            delay: Duration::from_millis(5),
            timeout: Duration::from_secs(10),
        };
        let Setup { queue, mut batches } = spawn(batching, Duration::from_millis(1), None, false);
        let buffer = Arc::clone(queue.buffer());
        let pushers: Vec<_> = (0..THREADS)
            .map(|t| {
                let buffer = Arc::clone(&buffer);
                std::thread::spawn(move || {
                    for i in 0..EACH {
                        buffer.push(record(((t * 7 + i) % 250) as u8));
                        if i % 64 == 0 {
                            std::thread::yield_now();
                        }
                    }
                })
            })
            .collect();
        for p in pushers {
            p.join().expect("a pushing thread");
        }
        assert!(queue.flush().await);
        let mut sent = 0_u64;
        while let Ok((_, n)) = batches.try_recv() {
            sent += n as u64;
        }
        assert_eq!(
            sent + queue.dropped().get(),
            u64::from(THREADS * EACH),
            "{sent} exported, {} dropped",
            queue.dropped().get()
        );
        assert!(buffer.pending.lock().records.is_empty());
    }

    /// proves: OBS-5 (when the telemetry is dropped, the export task sends
    /// what it holds and ends; spans ended after that are not exported,
    /// and counted as dropped)
    #[tokio::test(start_paused = true)]
    async fn dropping_the_queue_sends_what_it_holds() {
        let Setup { queue, mut batches } = setup(100, 512, None, false);
        let buffer = Arc::clone(queue.buffer());
        for i in 0..3 {
            buffer.push(record(i));
        }
        let t0 = Instant::now();
        drop(queue);
        let (at, n) = batches.recv().await.expect("the last batch");
        assert_eq!((at, n), (t0, 3));
        assert!(batches.recv().await.is_none(), "the task ended");
        buffer.push(record(9));
        assert!(buffer.pending.lock().records.is_empty());
        assert_eq!(buffer.dropped.get(), 1, "a span never exported is counted");
    }

    /// proves: OBS-5 (memory stays bounded: exported spans' records are
    /// kept, their attribute lists and text buffers emptied, for new
    /// spans, at most twice a batch of them)
    #[tokio::test(start_paused = true)]
    async fn exported_spans_buffers_are_reused_within_a_bound() {
        let mut s = setup(100, 4, None, false);
        for i in 0..12 {
            let mut r = s.queue.buffer().record();
            r.trace_id = [i; 16];
            r.set("tollgate.tenant", "team-a");
            r.model = Some(r.own("a-model"));
            s.queue.buffer().push(r);
        }
        assert!(s.queue.flush().await);
        while s.batches.try_recv().is_ok() {}
        assert_eq!(s.queue.buffer().spare.lock().len(), 8, "2 × batch_size");
        let r = s.queue.buffer().record();
        assert!(r.attributes.is_empty() && r.text.is_empty() && r.model.is_none());
        assert!(r.attributes.capacity() >= super::ATTRIBUTES);
        assert_eq!(s.queue.buffer().spare.lock().len(), 7);
    }
}

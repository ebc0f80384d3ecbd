//! The two load shapes and the per-worker recorder.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use hdrhistogram::Histogram;
use tokio::time::Instant;

use crate::conn::{Connection, Target};

/// Most distinct error messages kept for the summary.
const ERROR_SAMPLES: usize = 5;

/// What one worker saw; merged into the summary at the end.
pub struct Recorder {
    pub sent: u64,
    pub ok: u64,
    pub non_2xx: BTreeMap<u16, u64>,
    pub errors: u64,
    pub error_samples: Vec<String>,
    /// Microseconds from (scheduled) send to the end of the body.
    pub latency: Histogram<u64>,
    /// Microseconds from (scheduled) send to the first body bytes.
    pub ttft: Histogram<u64>,
    /// When the last request of this worker ended.
    pub last_end: Option<Instant>,
}

fn histogram() -> anyhow::Result<Histogram<u64>> {
    // 1 µs .. 1 h at 3 significant digits.
    Ok(Histogram::new_with_bounds(1, 3_600_000_000, 3)?)
}

fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX).max(1)
}

impl Recorder {
    pub fn new() -> anyhow::Result<Self> {
        Ok(Self {
            sent: 0,
            ok: 0,
            non_2xx: BTreeMap::new(),
            errors: 0,
            error_samples: Vec::new(),
            latency: histogram()?,
            ttft: histogram()?,
            last_end: None,
        })
    }

    /// Sends one request on `conn`, timing it from `origin`.
    async fn one(
        &mut self,
        conn: &mut Connection,
        origin: Instant,
        timeout: Duration,
        stream: bool,
    ) {
        self.sent += 1;
        let result = conn.send(timeout).await;
        let end = Instant::now();
        self.last_end = Some(end);
        match result {
            Ok(reply) => {
                self.latency.saturating_record(micros(end - origin));
                if reply.status.is_success() {
                    self.ok += 1;
                    if stream && let Some(first) = reply.first_chunk {
                        self.ttft.saturating_record(micros(first - origin));
                    }
                } else {
                    *self.non_2xx.entry(reply.status.as_u16()).or_default() += 1;
                }
            }
            Err(e) => {
                self.errors += 1;
                let message = format!("{e:#}");
                if self.error_samples.len() < ERROR_SAMPLES
                    && !self.error_samples.contains(&message)
                {
                    self.error_samples.push(message);
                }
            }
        }
    }

    /// Adds `other` into `self`.
    pub fn merge(&mut self, other: Recorder) {
        self.sent += other.sent;
        self.ok += other.ok;
        self.errors += other.errors;
        for (status, n) in other.non_2xx {
            *self.non_2xx.entry(status).or_default() += n;
        }
        for message in other.error_samples {
            if self.error_samples.len() < ERROR_SAMPLES && !self.error_samples.contains(&message) {
                self.error_samples.push(message);
            }
        }
        // Same bounds on both sides, so adding cannot fail.
        let _ = self.latency.add(&other.latency);
        let _ = self.ttft.add(&other.ttft);
        self.last_end = self.last_end.max(other.last_end);
    }
}

/// Shared settings of a run.
#[derive(Clone)]
pub struct Plan {
    pub target: Arc<Target>,
    pub timeout: Duration,
    pub stream: bool,
    pub start: Instant,
}

/// Closed loop: send, wait for the whole response, send again, until
/// `deadline`. Latency counts from the actual send.
pub async fn closed_loop_worker(plan: Plan, deadline: Instant) -> anyhow::Result<Recorder> {
    let mut rec = Recorder::new()?;
    let mut conn = Connection::new(Arc::clone(&plan.target));
    while Instant::now() < deadline {
        let origin = Instant::now();
        rec.one(&mut conn, origin, plan.timeout, plan.stream).await;
    }
    Ok(rec)
}

/// Open loop: request `k` is due at `start + k / rate`; a free worker
/// claims the next `k`, waits for its due time if it is ahead, and measures
/// latency from the due time. If every worker is busy, due requests queue up
/// and their waiting counts in their latency (coordinated omission
/// corrected, as in wrk2).
pub async fn open_loop_worker(
    plan: Plan,
    rate: f64,
    total: u64,
    next: Arc<AtomicU64>,
) -> anyhow::Result<Recorder> {
    let mut rec = Recorder::new()?;
    let mut conn = Connection::new(Arc::clone(&plan.target));
    loop {
        let k = next.fetch_add(1, Ordering::Relaxed);
        if k >= total {
            break;
        }
        let due = plan.start + Duration::from_secs_f64(k as f64 / rate);
        tokio::time::sleep_until(due).await;
        rec.one(&mut conn, due, plan.timeout, plan.stream).await;
    }
    Ok(rec)
}

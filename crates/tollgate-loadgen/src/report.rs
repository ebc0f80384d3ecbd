//! The JSON summary printed at the end of a run.

use std::collections::BTreeMap;
use std::time::Duration;

use hdrhistogram::Histogram;
use serde::Serialize;

use crate::run::Recorder;

/// Percentiles of one histogram, in milliseconds.
#[derive(Debug, Serialize)]
pub struct Percentiles {
    pub count: u64,
    pub mean: f64,
    pub p50: f64,
    pub p90: f64,
    pub p99: f64,
    #[serde(rename = "p99.9")]
    pub p99_9: f64,
    pub max: f64,
}

fn ms(micros: u64) -> f64 {
    micros as f64 / 1000.0
}

impl Percentiles {
    fn of(h: &Histogram<u64>) -> Option<Self> {
        (!h.is_empty()).then(|| Self {
            count: h.len(),
            mean: h.mean().round() / 1000.0,
            p50: ms(h.value_at_quantile(0.50)),
            p90: ms(h.value_at_quantile(0.90)),
            p99: ms(h.value_at_quantile(0.99)),
            p99_9: ms(h.value_at_quantile(0.999)),
            max: ms(h.max()),
        })
    }
}

/// The run's summary.
#[derive(Debug, Serialize)]
pub struct Summary {
    pub mode: &'static str,
    pub url: String,
    pub stream: bool,
    pub connections: usize,
    pub target_rate: Option<f64>,
    pub duration_s: f64,
    /// From the start to the end of the last response.
    pub elapsed_s: f64,
    pub sent: u64,
    pub ok: u64,
    pub non_2xx: BTreeMap<String, u64>,
    pub errors: u64,
    pub error_samples: Vec<String>,
    /// Responses (any status) per second of `elapsed_s`.
    pub achieved_rate: f64,
    /// Successful responses per second of `elapsed_s`.
    pub ok_rate: f64,
    pub latency_ms: Option<Percentiles>,
    pub ttft_ms: Option<Percentiles>,
}

/// Settings echoed in the summary.
pub struct RunInfo {
    pub mode: &'static str,
    pub url: String,
    pub stream: bool,
    pub connections: usize,
    pub target_rate: Option<f64>,
    pub duration: Duration,
}

impl Summary {
    pub fn new(info: RunInfo, rec: &Recorder, elapsed: Duration) -> Self {
        let secs = elapsed.as_secs_f64().max(1e-9);
        let responses = rec.ok + rec.non_2xx.values().sum::<u64>();
        let round2 = |x: f64| (x * 100.0).round() / 100.0;
        Self {
            mode: info.mode,
            url: info.url,
            stream: info.stream,
            connections: info.connections,
            target_rate: info.target_rate,
            duration_s: info.duration.as_secs_f64(),
            elapsed_s: (secs * 1000.0).round() / 1000.0,
            sent: rec.sent,
            ok: rec.ok,
            non_2xx: rec
                .non_2xx
                .iter()
                .map(|(status, n)| (status.to_string(), *n))
                .collect(),
            errors: rec.errors,
            error_samples: rec.error_samples.clone(),
            achieved_rate: round2(responses as f64 / secs),
            ok_rate: round2(rec.ok as f64 / secs),
            latency_ms: Percentiles::of(&rec.latency),
            ttft_ms: if info.stream {
                Percentiles::of(&rec.ttft)
            } else {
                None
            },
        }
    }
}

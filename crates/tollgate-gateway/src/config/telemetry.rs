//! `[telemetry]`: OpenTelemetry trace export over OTLP (SPEC OBS-5), off
//! unless an endpoint is configured here or in `OTEL_EXPORTER_OTLP_ENDPOINT`.
//! The settings apply at start only (a reload that changes them says so).
//! The settings and their checks are `tollgate-telemetry`'s, shared with
//! the batch runner; this file reads them from the TOML table, locating
//! each error.

use std::time::Duration;

use serde::Deserialize;
pub use tollgate_telemetry::config::{
    DEFAULT_BATCH_SIZE, DEFAULT_EXPORT_TIMEOUT, DEFAULT_QUEUE_SIZE, DEFAULT_SCHEDULE_DELAY,
    OtlpProtocol, TelemetryConfig, check_endpoint,
};
use tollgate_telemetry::config::{check_sample_ratio, parse_protocol};

use super::error::{FieldPath, Problem};
use super::raw::duration;

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawTelemetry {
    endpoint: Option<String>,
    protocol: Option<String>,
    service_name: Option<String>,
    sample_ratio: Option<f64>,
    queue_size: Option<usize>,
    batch_size: Option<usize>,
    schedule_delay: Option<String>,
    export_timeout: Option<String>,
}

impl RawTelemetry {
    pub(super) fn convert(self) -> Result<TelemetryConfig, Problem> {
        let at = FieldPath::top("telemetry");
        let d = TelemetryConfig::default();
        if let Some(e) = &self.endpoint {
            check_endpoint(e.trim()).map_err(|why| Problem::invalid(&at.key("endpoint"), why))?;
        }
        let protocol = match self.protocol.as_deref() {
            None => d.protocol,
            Some(p) => {
                parse_protocol(p).map_err(|why| Problem::invalid(&at.key("protocol"), why))?
            }
        };
        if let Some(name) = &self.service_name
            && name.trim().is_empty()
        {
            return Err(Problem::invalid(
                &at.key("service_name"),
                "must not be empty",
            ));
        }
        let sample_ratio = self.sample_ratio.unwrap_or(d.sample_ratio);
        check_sample_ratio(sample_ratio)
            .map_err(|why| Problem::invalid(&at.key("sample_ratio"), why))?;
        let positive = |key: &str, v: Option<usize>, default: usize| match v {
            Some(0) => Err(Problem::invalid(&at.key(key), "must be at least 1")),
            v => Ok(v.unwrap_or(default)),
        };
        let queue_size = positive("queue_size", self.queue_size, d.queue_size)?;
        let batch_size = positive("batch_size", self.batch_size, d.batch_size)?;
        let time = |key: &str, v: Option<&String>, default: Duration| match v {
            None => Ok(default),
            Some(t) => match duration(&at.key(key), t)? {
                Duration::ZERO => Err(Problem::invalid(&at.key(key), "must be longer than 0")),
                t => Ok(t),
            },
        };
        Ok(TelemetryConfig {
            endpoint: self.endpoint.map(|e| e.trim().to_owned()),
            protocol,
            service_name: self.service_name.map(|s| s.trim().to_owned()),
            sample_ratio,
            queue_size,
            batch_size: batch_size.min(queue_size),
            schedule_delay: time(
                "schedule_delay",
                self.schedule_delay.as_ref(),
                d.schedule_delay,
            )?,
            export_timeout: time(
                "export_timeout",
                self.export_timeout.as_ref(),
                d.export_timeout,
            )?,
        })
    }
}

//! `[telemetry]`: OpenTelemetry trace export over OTLP (SPEC OBS-5), off
//! unless an endpoint is configured here or in `OTEL_EXPORTER_OTLP_ENDPOINT`.
//! The settings apply at start only (a reload that changes them says so).

use std::time::Duration;

use serde::Deserialize;

use super::error::{FieldPath, Problem};
use super::raw::duration;

/// Spans waiting for export by default; past it new spans are dropped
/// (and counted), never waited for.
pub const DEFAULT_QUEUE_SIZE: usize = 2048;
/// Spans per export request by default.
pub const DEFAULT_BATCH_SIZE: usize = 512;
/// The longest a span waits for its batch by default.
pub const DEFAULT_SCHEDULE_DELAY: Duration = Duration::from_secs(1);
/// The longest one export request may take by default.
pub const DEFAULT_EXPORT_TIMEOUT: Duration = Duration::from_secs(10);

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

/// The OTLP transport.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OtlpProtocol {
    /// `http/protobuf`: protobuf bodies POSTed to `<endpoint>/v1/traces`.
    #[default]
    HttpProtobuf,
}

/// `[telemetry]`.
#[derive(Debug, Clone, PartialEq)]
pub struct TelemetryConfig {
    /// `endpoint`: the collector's base URL (`http://host:4318`); spans go
    /// to `<endpoint>/v1/traces`. Unset: `OTEL_EXPORTER_OTLP_ENDPOINT`,
    /// else no export.
    pub endpoint: Option<String>,
    /// `protocol` (only `http/protobuf`).
    pub protocol: OtlpProtocol,
    /// `service_name`; unset: `OTEL_SERVICE_NAME`, else `tollgate`.
    pub service_name: Option<String>,
    /// `sample_ratio` of new traces recorded, 0 to 1 (default 1); a trace
    /// the client continues keeps the client's decision.
    pub sample_ratio: f64,
    /// `queue_size`: spans waiting for export at most.
    pub queue_size: usize,
    /// `batch_size`: spans per export request at most.
    pub batch_size: usize,
    /// `schedule_delay`: the longest a span waits for its batch.
    pub schedule_delay: Duration,
    /// `export_timeout`: the longest one export request may take.
    pub export_timeout: Duration,
}

impl Default for TelemetryConfig {
    fn default() -> Self {
        TelemetryConfig {
            endpoint: None,
            protocol: OtlpProtocol::HttpProtobuf,
            service_name: None,
            sample_ratio: 1.0,
            queue_size: DEFAULT_QUEUE_SIZE,
            batch_size: DEFAULT_BATCH_SIZE,
            schedule_delay: DEFAULT_SCHEDULE_DELAY,
            export_timeout: DEFAULT_EXPORT_TIMEOUT,
        }
    }
}

/// Checks an OTLP endpoint: an absolute `http://` or `https://` URL with a
/// host. Also used for `OTEL_EXPORTER_OTLP_ENDPOINT`.
pub fn check_endpoint(text: &str) -> Result<(), String> {
    let uri: http::Uri = text
        .parse()
        .map_err(|e| format!("{text:?} is not a URL ({e})"))?;
    match uri.scheme_str() {
        Some("http" | "https") => {}
        _ => {
            return Err(format!(
                "{text:?} must start with http:// or https:// (e.g. \"http://127.0.0.1:4318\")"
            ));
        }
    }
    if uri.host().is_none_or(str::is_empty) {
        return Err(format!("{text:?} has no host"));
    }
    if uri.query().is_some() {
        return Err(format!("{text:?} must not have a query"));
    }
    Ok(())
}

impl RawTelemetry {
    pub(super) fn convert(self) -> Result<TelemetryConfig, Problem> {
        let at = FieldPath::top("telemetry");
        let d = TelemetryConfig::default();
        if let Some(e) = &self.endpoint {
            check_endpoint(e.trim()).map_err(|why| Problem::invalid(&at.key("endpoint"), why))?;
        }
        let protocol = match self.protocol.as_deref().map(str::trim) {
            None | Some("http/protobuf") => OtlpProtocol::HttpProtobuf,
            Some(other) => {
                return Err(Problem::invalid(
                    &at.key("protocol"),
                    format!("{other:?} is not supported; the only protocol is \"http/protobuf\""),
                ));
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
        if !(0.0..=1.0).contains(&sample_ratio) {
            return Err(Problem::invalid(
                &at.key("sample_ratio"),
                format!("{sample_ratio} is outside 0..1 (0 records no new trace, 1 every one)"),
            ));
        }
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

//! What trace export is told: the settings the gateway reads from
//! `[telemetry]` and the batch runner takes as they are (SPEC OBS-5).

use std::time::Duration;

/// Spans waiting for export by default; past it new spans are dropped
/// (and counted), never waited for.
pub const DEFAULT_QUEUE_SIZE: usize = 2048;
/// Spans per export request by default.
pub const DEFAULT_BATCH_SIZE: usize = 512;
/// The longest a span waits for its batch by default.
pub const DEFAULT_SCHEDULE_DELAY: Duration = Duration::from_secs(1);
/// The longest one export request may take by default.
pub const DEFAULT_EXPORT_TIMEOUT: Duration = Duration::from_secs(10);

/// The OTLP transport.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OtlpProtocol {
    /// `http/protobuf`: protobuf bodies POSTed to `<endpoint>/v1/traces`.
    #[default]
    HttpProtobuf,
}

/// Trace export settings (the gateway's `[telemetry]`).
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
///
/// # Errors
/// What is wrong with `text`, quoting it.
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

/// Checks a protocol name; only `http/protobuf` is supported.
///
/// # Errors
/// What is supported instead.
pub fn parse_protocol(text: &str) -> Result<OtlpProtocol, String> {
    match text.trim() {
        "http/protobuf" => Ok(OtlpProtocol::HttpProtobuf),
        other => Err(format!(
            "{other:?} is not supported; the only protocol is \"http/protobuf\""
        )),
    }
}

/// Checks a sampling ratio: from 0 to 1.
///
/// # Errors
/// The ratio is outside 0..1 (or not a number).
pub fn check_sample_ratio(ratio: f64) -> Result<(), String> {
    if (0.0..=1.0).contains(&ratio) {
        Ok(())
    } else {
        Err(format!(
            "{ratio} is outside 0..1 (0 records no new trace, 1 every one)"
        ))
    }
}

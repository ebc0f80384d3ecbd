//! # tollgate-telemetry
//!
//! OpenTelemetry traces over OTLP/HTTP (SPEC OBS-5) for the gateway and
//! the batch runner, off unless an endpoint is configured
//! ([`TelemetryConfig::endpoint`], the gateway's `[telemetry] endpoint`,
//! else `OTEL_EXPORTER_OTLP_ENDPOINT`).
//!
//! One span per call (SERVER for a gateway client's call, INTERNAL for a
//! batch item) and one CLIENT span per upstream attempt, named and
//! attributed per [`semconv`]. The call span's values come from what the
//! caller already records (the gateway's access line, the batch runner's
//! output line: [`CallEnd`]) and from the attempt the engine hands the
//! provider; nothing is measured twice. A client's W3C `traceparent`
//! continues its trace, and each attempt sends its own upstream.
//!
//! Exporting never slows a call: ended spans go to a bounded queue and a
//! full one drops (and counts) them (`tollgate_telemetry_spans_dropped_total`).
//!
//! Spans are the crate's own records, not OpenTelemetry SDK objects: the
//! request path fills a compact record per span (ids, times, the
//! attribute values it already holds) and pushes it to a bounded buffer;
//! the export task wakes per batch, not per span, and encodes the records
//! straight to OTLP protobuf. `traceparent` and `tracestate` are read and
//! written by hand, sampling is OpenTelemetry's
//! `ParentBased(TraceIdRatioBased(sample_ratio))`.
//!
//! The tracer is the process's own (no global provider is installed), made
//! once at start; the gateway keeps it across reloads (`[telemetry]` needs
//! a restart).
#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod call;
pub mod config;
mod encode;
mod export;
mod queue;
pub mod semconv;
mod span;
#[cfg(feature = "testing")]
pub mod testing;
mod w3c;

use std::sync::Arc;

pub use call::{AttemptSpan, AttemptTarget, CallEnd, CallTrace, TRACEPARENT, TraceHeaders};
pub use config::{OtlpProtocol, TelemetryConfig};
pub use queue::DROPPED_METRIC;

use crate::config::check_endpoint;

/// The standard variable naming the collector when the file does not.
pub const ENDPOINT_ENV: &str = "OTEL_EXPORTER_OTLP_ENDPOINT";
/// The standard variable naming the service when the file does not.
pub const SERVICE_NAME_ENV: &str = "OTEL_SERVICE_NAME";
/// The service name when neither the file nor the environment gives one.
pub const DEFAULT_SERVICE_NAME: &str = "tollgate";

/// Why tracing could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum TelemetryError {
    /// `OTEL_EXPORTER_OTLP_ENDPOINT` is not a usable URL.
    #[error("{ENDPOINT_ENV}: {0}")]
    Endpoint(String),
    /// The exporter could not be built.
    #[error("telemetry: {0}")]
    Exporter(String),
}

/// Where spans go and under which name, once the file and the environment
/// are combined.
#[derive(Debug, Clone, PartialEq)]
pub struct Resolved {
    /// The full URL spans are POSTed to (`<endpoint>/v1/traces`).
    pub traces_url: String,
    /// `service.name`.
    pub service_name: String,
}

/// The export target of `config`, the file's settings first, then the
/// variables `env` returns (`std::env::var` in the gateway); `None` when
/// no endpoint is set anywhere (tracing off).
///
/// # Errors
/// `OTEL_EXPORTER_OTLP_ENDPOINT` is not a usable URL.
pub fn resolve(
    config: &TelemetryConfig,
    env: impl Fn(&str) -> Option<String>,
) -> Result<Option<Resolved>, TelemetryError> {
    let endpoint = match &config.endpoint {
        Some(e) => e.clone(),
        None => match env(ENDPOINT_ENV).filter(|e| !e.trim().is_empty()) {
            Some(e) => {
                let e = e.trim().to_owned();
                check_endpoint(&e).map_err(TelemetryError::Endpoint)?;
                e
            }
            None => return Ok(None),
        },
    };
    let service_name = config
        .service_name
        .clone()
        .or_else(|| env(SERVICE_NAME_ENV).filter(|s| !s.trim().is_empty()))
        .unwrap_or_else(|| DEFAULT_SERVICE_NAME.to_owned());
    Ok(Some(Resolved {
        traces_url: format!("{}/v1/traces", endpoint.trim_end_matches('/')),
        service_name,
    }))
}

/// The compression `OTEL_EXPORTER_OTLP_TRACES_COMPRESSION` (else
/// `OTEL_EXPORTER_OTLP_COMPRESSION`) asks for, if it asks for one
/// (`gzip`, `zstd`): not supported (it was not with the OpenTelemetry
/// SDK's exporter as this crate built it either).
fn compression(env: impl Fn(&str) -> Option<String>) -> Option<String> {
    let value = env("OTEL_EXPORTER_OTLP_TRACES_COMPRESSION")
        .or_else(|| env("OTEL_EXPORTER_OTLP_COMPRESSION"))?;
    let value = value.trim().to_ascii_lowercase();
    matches!(value.as_str(), "gzip" | "zstd").then_some(value)
}

/// The process's tracer, or nothing when tracing is off. Cloning shares it.
#[derive(Debug, Clone, Default)]
pub struct Telemetry(Option<Arc<Exporting>>);

/// Tracing on. Dropped with the last [`Telemetry`] clone: the queue's
/// task then sends what it holds and ends.
#[derive(Debug)]
struct Exporting {
    /// New traces recorded, 0 to 1.
    sample_ratio: f64,
    queue: queue::Queue,
}

impl Telemetry {
    /// Tracing off.
    pub fn off() -> Self {
        Telemetry(None)
    }

    /// Tracing as `config` and the process environment say, the spans'
    /// instrumentation scope named `scope` (the crate tracing, e.g.
    /// `tollgate-gateway`). Starts the export task on the current tokio
    /// runtime; without one, tracing is off (with a warning).
    ///
    /// # Errors
    /// `OTEL_EXPORTER_OTLP_ENDPOINT` is not a usable URL, or the exporter
    /// cannot be built.
    pub fn start(config: &TelemetryConfig, scope: &'static str) -> Result<Self, TelemetryError> {
        Self::start_with(config, scope, |name| std::env::var(name).ok())
    }

    /// [`Telemetry::start`] with the environment read through `env`.
    ///
    /// # Errors
    /// As [`Telemetry::start`].
    pub fn start_with(
        config: &TelemetryConfig,
        scope: &'static str,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<Self, TelemetryError> {
        let Some(target) = resolve(config, &env)? else {
            return Ok(Self::off());
        };
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            tracing::warn!("no async runtime: traces are not exported");
            return Ok(Self::off());
        };
        if let Some(c) = compression(&env) {
            return Err(TelemetryError::Exporter(format!(
                "compression {c:?} is not supported (only \"none\")"
            )));
        }
        let encoder = encode::Encoder::new(
            &target.service_name,
            scope,
            env!("CARGO_PKG_VERSION"),
            semconv::SCHEMA_URL,
        );
        let exporter = export::OtlpHttp::new(
            target.traces_url.clone(),
            encoder,
            export::env_headers(&env),
        )
        .map_err(TelemetryError::Exporter)?;
        let queue = queue::Queue::spawn(
            exporter,
            queue::Batching {
                queue_size: config.queue_size,
                batch_size: config.batch_size,
                delay: config.schedule_delay,
                timeout: config.export_timeout,
            },
            &runtime,
        );
        tracing::info!(
            endpoint = %target.traces_url,
            service = %target.service_name,
            "exporting traces over OTLP/HTTP"
        );
        Ok(Telemetry(Some(Arc::new(Exporting {
            sample_ratio: config.sample_ratio,
            queue,
        }))))
    }

    /// Whether spans are recorded and exported.
    pub fn is_on(&self) -> bool {
        self.0.is_some()
    }

    /// Exports every span ended so far (tests, shutdown). Returns at once
    /// when tracing is off.
    pub async fn flush(&self) {
        if let Some(e) = &self.0 {
            e.queue.flush().await;
        }
    }

    /// Spans dropped so far: the queue was full, or their export failed.
    pub fn dropped(&self) -> u64 {
        self.0.as_ref().map_or(0, |e| e.queue.dropped().get())
    }

    fn exporting(&self) -> Option<&Exporting> {
        self.0.as_deref()
    }
}

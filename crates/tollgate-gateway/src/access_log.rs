//! The access log (SPEC GW-14): one line per request, text or JSON as
//! `server.log_format` says, on standard output.
//!
//! A line holds only what the gateway decided or measured: the time, the
//! request id, the route, the tenant's and the model's configured names,
//! the deployment, status and error code, attempts, waits and times, token
//! counts, and the call's cost (SPEC BUD-6). Never a key, a prompt, a completion, a header value or a
//! name the client made up (an unknown model is logged as `-`).

use std::fmt::Write as _;
use std::io::Write as _;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, SystemTime};

use parking_lot::Mutex;
use serde::Serialize;

use crate::config::LogFormat;

/// What one request did. Filled as the request proceeds; written once.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Record {
    /// When the request's head was read (wall clock, for the line only).
    #[serde(skip)]
    pub at: Option<SystemTime>,
    /// The request id (the client's `x-request-id`, or a generated one).
    pub request_id: String,
    /// `chat`, `embeddings`, `responses` or `messages`.
    pub route: &'static str,
    /// The tenant's configured name, once authenticated.
    #[serde(serialize_with = "name")]
    pub tenant: Option<Arc<str>>,
    /// The configured model, once known.
    #[serde(serialize_with = "name")]
    pub model: Option<Arc<str>>,
    /// The deployment of the last attempt.
    #[serde(serialize_with = "name")]
    pub deployment: Option<Arc<str>>,
    /// The HTTP status sent.
    pub status: u16,
    /// The OpenAI `error.code` (or `stream_failed:<code>` for a stream
    /// that broke after it began).
    pub error: Option<String>,
    /// Attempts that reached an upstream.
    pub attempts: u32,
    /// Whether the response was a stream.
    pub stream: bool,
    /// Time waiting for admission (tenant and upstream quota and permits).
    #[serde(serialize_with = "millis")]
    pub queue: Duration,
    /// Time upstream: until the answer (one-shot) or the first chunk
    /// (stream), admission excluded.
    #[serde(serialize_with = "millis")]
    pub upstream: Duration,
    /// Time from the request's head to the last byte handed to the
    /// connection.
    #[serde(serialize_with = "millis")]
    pub total: Duration,
    /// Tokens reserved for the call (input plus output allowance).
    pub tokens_estimated: Option<u64>,
    /// Tokens the upstream reported.
    pub tokens_reported: Option<u64>,
    /// The call's worst-case cost reserved for its tenant, in micro-dollars
    /// (written in dollars as `cost_reserved_usd`), when the call is
    /// priced (SPEC BUD-2).
    #[serde(rename = "cost_reserved_usd", serialize_with = "usd")]
    pub cost_reserved: Option<u64>,
    /// What the call cost its tenant, in micro-dollars (written in dollars
    /// as `cost_usd`): the usage priced at the model that answered, or the
    /// reserved worst case when the usage is unknown (SPEC BUD-5, BUD-6).
    #[serde(rename = "cost_usd", serialize_with = "usd")]
    pub cost: Option<u64>,
    /// The upstream limits that kept the call waiting for its quota
    /// (`requests`, `input_tokens`, `tokens+output_tokens`, ...; `none`
    /// when it did not wait), once admitted (SPEC OBS-4, Q-12).
    pub limited_by: Option<&'static str>,
    /// The priority class the call was admitted in (`interactive`,
    /// `standard`, `batch`; SPEC FAIR-8), once known.
    pub class: Option<&'static str>,
    /// What the upstream reported, for the call's trace (the line has
    /// `tokens_reported`).
    #[serde(skip)]
    pub usage: Option<tollgate::Usage>,
    /// How the served attempt was admitted, for the call's trace (the
    /// line has `queue_ms` and `limited_by`).
    #[serde(skip)]
    pub admission: Option<tollgate::Admission>,
    /// The call's trace, ended when the line is written (SPEC OBS-5).
    #[serde(skip)]
    pub trace: Option<crate::telemetry::CallTrace>,
}

fn name<S: serde::Serializer>(v: &Option<Arc<str>>, s: S) -> Result<S::Ok, S::Error> {
    match v {
        Some(n) => s.serialize_str(n),
        None => s.serialize_none(),
    }
}

/// Micro-dollars as a decimal string of dollars (exact), or null.
fn usd<S: serde::Serializer>(v: &Option<u64>, s: S) -> Result<S::Ok, S::Error> {
    match v {
        Some(m) => s.serialize_str(&tollgate::price::format_usd(*m)),
        None => s.serialize_none(),
    }
}

fn millis<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_f64((d.as_secs_f64() * 1e6).round() / 1e3)
}

impl Record {
    /// The line in `format`, without the line break.
    pub fn line(&self, format: LogFormat) -> String {
        let time = self
            .at
            .map(|t| humantime::format_rfc3339_millis(t).to_string())
            .unwrap_or_default();
        match format {
            LogFormat::Json => {
                // The record's object with `kind` and `time` in front (the
                // time is digits and punctuation: nothing to escape).
                let fields = serde_json::to_string(self).unwrap_or_else(|_| "{}".to_owned());
                let rest = fields.strip_prefix('{').unwrap_or("}");
                let sep = if rest == "}" { "" } else { "," };
                format!("{{\"kind\":\"access\",\"time\":\"{time}\"{sep}{rest}")
            }
            LogFormat::Text => {
                let name = |v: &Option<Arc<str>>| v.as_deref().unwrap_or("-").to_owned();
                let count = |v: Option<u64>| v.map_or("-".to_owned(), |n| n.to_string());
                let dollars =
                    |v: Option<u64>| v.map_or("-".to_owned(), tollgate::price::format_usd);
                let ms = |d: Duration| format!("{:.3}", d.as_secs_f64() * 1e3);
                let mut out = String::with_capacity(256);
                let _ = write!(
                    out,
                    "{time} access request_id={} route={} tenant={} model={} deployment={} \
                     status={} error={} attempts={} stream={} queue_ms={} upstream_ms={} \
                     total_ms={} tokens_estimated={} tokens_reported={} limited_by={} \
                     cost_reserved_usd={} cost_usd={} class={}",
                    self.request_id,
                    self.route,
                    name(&self.tenant),
                    name(&self.model),
                    name(&self.deployment),
                    self.status,
                    self.error.as_deref().unwrap_or("-"),
                    self.attempts,
                    self.stream,
                    ms(self.queue),
                    ms(self.upstream),
                    ms(self.total),
                    count(self.tokens_estimated),
                    count(self.tokens_reported),
                    self.limited_by.unwrap_or("-"),
                    dollars(self.cost_reserved),
                    dollars(self.cost),
                    self.class.unwrap_or("-"),
                );
                out
            }
        }
    }
}

/// Bytes of lines kept before they are written out at once.
const BUFFER: usize = 16 * 1024;

/// How often [`AccessLog::flush`] should run (the server does it): the
/// longest a line waits in the buffer.
pub const FLUSH_EVERY: Duration = Duration::from_millis(200);

/// What every configuration of the sink shares across reloads.
#[derive(Debug, Default)]
struct Sink {
    /// Lines waiting to be written (one `write` per [`BUFFER`] bytes or
    /// per flush instead of one per line).
    pending: Mutex<Vec<u8>>,
    /// Set by [`AccessLog::capture`].
    capture: OnceLock<Arc<Mutex<Vec<String>>>>,
}

/// Where access lines go: standard output, buffered (written when
/// [`BUFFER`] bytes are waiting and at every [`AccessLog::flush`], which
/// the server runs every [`FLUSH_EVERY`] and at shutdown). Cloning shares
/// it.
#[derive(Debug, Clone)]
pub struct AccessLog {
    format: LogFormat,
    enabled: bool,
    sink: Arc<Sink>,
}

impl AccessLog {
    /// Lines in `format` on standard output, or none when not `enabled`.
    pub fn new(format: LogFormat, enabled: bool) -> Self {
        AccessLog {
            format,
            enabled,
            sink: Arc::default(),
        }
    }

    /// The same sink (buffer and capture) with new settings, for a reload.
    pub fn reconfigured(&self, format: LogFormat, enabled: bool) -> Self {
        AccessLog {
            format,
            enabled,
            sink: Arc::clone(&self.sink),
        }
    }

    /// From now on, lines go to the returned buffer instead of standard
    /// output (for tests and embedders). Calling it again returns the same
    /// buffer.
    pub fn capture(&self) -> Arc<Mutex<Vec<String>>> {
        Arc::clone(self.sink.capture.get_or_init(Arc::default))
    }

    /// Writes `record`'s line (into the buffer; out once it is full).
    pub fn write(&self, record: &Record) {
        if !self.enabled {
            return;
        }
        let line = record.line(self.format);
        if let Some(buffer) = self.sink.capture.get() {
            buffer.lock().push(line);
            return;
        }
        let full = {
            let mut pending = self.sink.pending.lock();
            pending.extend_from_slice(line.as_bytes());
            pending.push(b'\n');
            (pending.len() >= BUFFER).then(|| std::mem::take(&mut *pending))
        };
        if let Some(bytes) = full {
            emit(&bytes);
        }
    }

    /// Writes out the lines waiting in the buffer.
    pub fn flush(&self) {
        let bytes = std::mem::take(&mut *self.sink.pending.lock());
        if !bytes.is_empty() {
            emit(&bytes);
        }
    }
}

/// One write of whole lines to standard output (outside the buffer's lock).
fn emit(bytes: &[u8]) {
    let mut out = std::io::stdout().lock();
    let _ = out.write_all(bytes);
    let _ = out.flush();
}

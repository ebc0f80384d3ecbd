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
use tokio::sync::{mpsc, oneshot};

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

/// Appends `d` in milliseconds with three decimals (`12.345`), rounded to
/// the microsecond, with integer formatting.
fn push_millis(out: &mut String, d: Duration) {
    let micros = u64::try_from((d.as_nanos() + 500) / 1000).unwrap_or(u64::MAX);
    out.push_str(itoa::Buffer::new().format(micros / 1000));
    out.push('.');
    let frac = micros % 1000;
    for digit in [frac / 100, frac / 10 % 10, frac % 10] {
        out.push(char::from(b'0' + digit as u8));
    }
}

impl Record {
    /// The line in `format`, without the line break.
    pub fn line(&self, format: LogFormat) -> String {
        // Written straight into the line: this runs once per request.
        let mut out = String::with_capacity(320);
        match format {
            LogFormat::Json => {
                // The record's object with `kind` and `time` in front (the
                // time is digits and punctuation: nothing to escape).
                let fields = serde_json::to_string(self).unwrap_or_else(|_| "{}".to_owned());
                let rest = fields.strip_prefix('{').unwrap_or("}");
                let sep = if rest == "}" { "" } else { "," };
                out.push_str("{\"kind\":\"access\",\"time\":\"");
                self.time(&mut out);
                let _ = write!(out, "\"{sep}{rest}");
            }
            LogFormat::Text => {
                // Pieces pushed one by one, numbers through `itoa`: this is
                // a tenth of the gateway's own work per request otherwise.
                fn name(v: &Option<Arc<str>>) -> &str {
                    v.as_deref().unwrap_or("-")
                }
                let mut n = itoa::Buffer::new();
                self.time(&mut out);
                for (label, value) in [
                    (" access request_id=", self.request_id.as_str()),
                    (" route=", self.route),
                    (" tenant=", name(&self.tenant)),
                    (" model=", name(&self.model)),
                    (" deployment=", name(&self.deployment)),
                ] {
                    out.push_str(label);
                    out.push_str(value);
                }
                out.push_str(" status=");
                out.push_str(n.format(self.status));
                out.push_str(" error=");
                out.push_str(self.error.as_deref().unwrap_or("-"));
                out.push_str(" attempts=");
                out.push_str(n.format(self.attempts));
                out.push_str(if self.stream {
                    " stream=true"
                } else {
                    " stream=false"
                });
                for (label, d) in [
                    (" queue_ms=", self.queue),
                    (" upstream_ms=", self.upstream),
                    (" total_ms=", self.total),
                ] {
                    out.push_str(label);
                    push_millis(&mut out, d);
                }
                for (label, v) in [
                    (" tokens_estimated=", self.tokens_estimated),
                    (" tokens_reported=", self.tokens_reported),
                ] {
                    out.push_str(label);
                    out.push_str(v.map_or("-", |v| n.format(v)));
                }
                out.push_str(" limited_by=");
                out.push_str(self.limited_by.unwrap_or("-"));
                for (label, v) in [
                    (" cost_reserved_usd=", self.cost_reserved),
                    (" cost_usd=", self.cost),
                ] {
                    out.push_str(label);
                    match v {
                        Some(m) => {
                            let _ = write!(out, "{}", tollgate::price::Usd(m));
                        }
                        None => out.push('-'),
                    }
                }
                out.push_str(" class=");
                out.push_str(self.class.unwrap_or("-"));
            }
        }
        out
    }

    /// The head's wall-clock time in RFC 3339 with milliseconds: nothing
    /// when unknown or not writable in that format (before 1970, after
    /// 9999). The text up to the second is formatted once per second and
    /// thread.
    fn time(&self, out: &mut String) {
        thread_local! {
            /// The second last formatted here and its text (`…T22:13:20.`).
            static SECOND: std::cell::RefCell<(u64, String)> =
                const { std::cell::RefCell::new((u64::MAX, String::new())) };
        }
        /// 10000-01-01T00:00:00Z, the first instant RFC 3339 cannot write.
        const YEAR_10000: u64 = 253_402_300_800;
        let Some(since) = self
            .at
            .and_then(|t| t.duration_since(SystemTime::UNIX_EPOCH).ok())
            .filter(|d| d.as_secs() < YEAR_10000)
        else {
            return;
        };
        SECOND.with_borrow_mut(|(second, text)| {
            if *second != since.as_secs() {
                text.clear();
                let t = SystemTime::UNIX_EPOCH + Duration::from_secs(since.as_secs());
                // `2023-11-14T22:13:20Z` without its `Z`, then the point.
                let _ = write!(text, "{}", humantime::format_rfc3339_seconds(t));
                text.pop();
                text.push('.');
                *second = since.as_secs();
            }
            out.push_str(text);
        });
        let millis = since.subsec_millis();
        for digit in [millis / 100, millis / 10 % 10, millis % 10] {
            out.push(char::from(b'0' + digit as u8));
        }
        out.push('Z');
    }
}

/// Bytes of lines kept before they are handed to the writer at once
/// (a wake-up of its thread per 64 KiB, not per line).
const BUFFER: usize = 64 * 1024;

/// How often [`AccessLog::flush`] should run (the server does it): the
/// longest a line waits in the buffer.
pub const FLUSH_EVERY: Duration = Duration::from_millis(200);

/// The longest shutdown waits for standard output to take the last
/// lines ([`AccessLog::finish`]).
pub const FINISH_WITHIN: Duration = Duration::from_secs(5);

/// Buffers handed to the writer thread and not written yet (about
/// 1 MiB of lines). While the queue is full, lines wait in the buffer,
/// up to [`PENDING_MAX`]; past that a standard output that does not keep
/// up costs lines, counted in [`DROPPED_METRIC`], never a request's time.
const QUEUED_BUFFERS: usize = 16;

/// The most bytes of lines the buffer holds while the writer's queue is
/// full; reaching it drops them (counted).
const PENDING_MAX: usize = 1024 * 1024;

/// Written buffers kept for reuse.
const SPARE_BUFFERS: usize = 4;

/// The counter of access lines dropped because standard output did not
/// take them (a pipe nobody reads), or written after shutdown began.
pub const DROPPED_METRIC: &str = "tollgate_access_log_lines_dropped_total";

/// What the writer thread is asked to do.
enum Job {
    /// Write these whole lines (the bytes and how many lines they hold).
    Lines(Vec<u8>, u64),
    /// Say so once everything asked before is written.
    Synced(oneshot::Sender<()>),
}

/// Lines waiting to be handed to the writer.
#[derive(Default)]
struct Pending {
    bytes: Vec<u8>,
    lines: u64,
    /// Set by [`AccessLog::finish`]: later lines are dropped (counted).
    closed: bool,
}

/// The count of lines between the request path and the writer thread.
#[derive(Default)]
struct Tally {
    /// Handed to the writer, not written yet.
    queued: u64,
    /// Dropped, as counted in [`DROPPED_METRIC`].
    dropped: u64,
    /// Shutdown stopped waiting for the writer: what it still held is
    /// counted as dropped, and it writes nothing more.
    abandoned: bool,
}

/// What the writer thread shares with the sink.
#[derive(Default)]
struct Shared {
    tally: Mutex<Tally>,
    /// Buffers the writer has written out, emptied, for the next lines
    /// (so that a buffer is not grown again from nothing each time).
    spares: Mutex<Vec<Vec<u8>>>,
}

impl Shared {
    fn count_dropped(&self, lines: u64) {
        if lines > 0 {
            self.tally.lock().dropped += lines;
            metrics::counter!(DROPPED_METRIC).increment(lines);
        }
    }

    /// The writer thread: writes each buffer whole (or counts the lines
    /// it could not write) until the sink is gone.
    fn run(&self, mut jobs: mpsc::Receiver<Job>, out: &mut dyn std::io::Write) {
        // The last buffer stopped inside a line: the next starts on a
        // line of its own.
        let mut torn = false;
        while let Some(job) = jobs.blocking_recv() {
            match job {
                Job::Lines(mut bytes, lines) => {
                    if self.tally.lock().abandoned {
                        continue;
                    }
                    if torn {
                        self.write_out(out, b"\n");
                    }
                    let written = self.write_out(out, &bytes);
                    torn = written < bytes.len()
                        && written > 0
                        && bytes.get(written - 1) != Some(&b'\n');
                    let unwritten = bytes.get(written..).map_or(0, newlines);
                    let mut tally = self.tally.lock();
                    if !tally.abandoned {
                        tally.queued = tally.queued.saturating_sub(lines);
                        drop(tally);
                        self.count_dropped(unwritten);
                    }
                    bytes.clear();
                    let mut spares = self.spares.lock();
                    if spares.len() < SPARE_BUFFERS {
                        spares.push(bytes);
                    }
                }
                Job::Synced(done) => {
                    let _ = done.send(());
                }
            }
        }
    }

    /// Writes `bytes` to `out`; how many were taken (fewer on an error).
    fn write_out(&self, out: &mut dyn std::io::Write, bytes: &[u8]) -> usize {
        use std::io::ErrorKind;
        let mut at = 0;
        while let Some(rest) = bytes.get(at..).filter(|r| !r.is_empty()) {
            match out.write(rest) {
                Ok(0) => break,
                Ok(n) => at += n,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                // An output left non-blocking by whoever started us.
                Err(e) if e.kind() == ErrorKind::WouldBlock => {
                    if self.tally.lock().abandoned {
                        break;
                    }
                    std::thread::sleep(Duration::from_millis(10));
                }
                Err(_) => break,
            }
        }
        let _ = out.flush();
        at
    }
}

/// How many lines `bytes` holds (ends with).
fn newlines(bytes: &[u8]) -> u64 {
    bytes.iter().filter(|&&b| b == b'\n').count() as u64
}

/// What every configuration of the sink shares across reloads.
#[derive(Default)]
struct Sink {
    /// Lines waiting to be handed to the writer (one `write` per
    /// [`BUFFER`] bytes or per flush instead of one per line).
    pending: Mutex<Pending>,
    /// Set by [`AccessLog::capture`].
    capture: OnceLock<Arc<Mutex<Vec<String>>>>,
    /// The writer thread's queue, started with the first buffer to
    /// write; `None` if no thread could be started (then buffers are
    /// written where they fill).
    writer: OnceLock<Option<mpsc::Sender<Job>>>,
    /// Where the writer writes, if not standard output (tests).
    output: Mutex<Option<Box<dyn std::io::Write + Send>>>,
    shared: Arc<Shared>,
}

impl std::fmt::Debug for Sink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sink")
            .field("pending", &self.pending.lock().bytes.len())
            .field("dropped", &self.shared.tally.lock().dropped)
            .finish_non_exhaustive()
    }
}

impl Sink {
    /// The writer thread's queue, started on first use.
    fn writer(&self) -> Option<&mpsc::Sender<Job>> {
        self.writer
            .get_or_init(|| {
                let output = self.output.lock().take();
                let mut out = output.unwrap_or_else(standard_output);
                let (queue, jobs) = mpsc::channel(QUEUED_BUFFERS);
                let shared = Arc::clone(&self.shared);
                let started = std::thread::Builder::new()
                    .name("tollgate-access-log".to_owned())
                    .spawn(move || shared.run(jobs, &mut *out));
                match started {
                    Ok(_) => Some(queue),
                    Err(e) => {
                        tracing::warn!(
                            error = %e,
                            "no thread for the access log: lines are written where they are made"
                        );
                        None
                    }
                }
            })
            .as_ref()
    }

    /// Hands the lines of `pending` to the writer without waiting. While
    /// its queue is full they stay, up to [`PENDING_MAX`] bytes; past
    /// that they are dropped and counted.
    fn send(&self, pending: &mut Pending) {
        let Some(writer) = self.writer() else {
            let (bytes, _) = self.take(pending);
            emit(&bytes);
            return;
        };
        match writer.try_reserve() {
            Ok(slot) => {
                let (bytes, lines) = self.take(pending);
                self.shared.tally.lock().queued += lines;
                slot.send(Job::Lines(bytes, lines));
            }
            Err(mpsc::error::TrySendError::Full(())) if pending.bytes.len() < PENDING_MAX => {}
            Err(_) => {
                let (_, lines) = self.take(pending);
                self.shared.count_dropped(lines);
            }
        }
    }

    /// The lines waiting in `pending`, leaving it an empty buffer with
    /// room for the next ones.
    fn take(&self, pending: &mut Pending) -> (Vec<u8>, u64) {
        let next = self
            .shared
            .spares
            .lock()
            .pop()
            .unwrap_or_else(|| Vec::with_capacity(BUFFER + BUFFER / 8));
        (
            std::mem::replace(&mut pending.bytes, next),
            std::mem::take(&mut pending.lines),
        )
    }
}

/// Where access lines go: standard output, buffered (handed to a thread
/// of their own when [`BUFFER`] bytes are waiting and at every
/// [`AccessLog::flush`], which the server runs every [`FLUSH_EVERY`], and
/// at shutdown, [`AccessLog::finish`]). Cloning shares it.
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

    /// Lines in `format` written to `out` instead of standard output.
    #[cfg(test)]
    fn to_output(format: LogFormat, out: impl std::io::Write + Send + 'static) -> Self {
        let log = AccessLog::new(format, true);
        *log.sink.output.lock() = Some(Box::new(out));
        log
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

    /// Lines dropped so far (also counted in [`DROPPED_METRIC`]): standard
    /// output did not take them, or they came after [`AccessLog::finish`].
    pub fn dropped(&self) -> u64 {
        self.sink.shared.tally.lock().dropped
    }

    /// Writes `record`'s line (into the buffer; handed on once it is
    /// full). Never waits for standard output.
    pub fn write(&self, record: &Record) {
        if !self.enabled {
            return;
        }
        let line = record.line(self.format);
        if let Some(buffer) = self.sink.capture.get() {
            buffer.lock().push(line);
            return;
        }
        let mut pending = self.sink.pending.lock();
        if pending.closed {
            drop(pending);
            self.sink.shared.count_dropped(1);
            return;
        }
        pending.bytes.extend_from_slice(line.as_bytes());
        pending.bytes.push(b'\n');
        pending.lines += 1;
        if pending.bytes.len() >= BUFFER {
            // Under the lock: buffers reach the writer in the order their
            // lines were written.
            self.sink.send(&mut pending);
        }
    }

    /// Hands the lines waiting in the buffer to the writer. Never waits
    /// for standard output.
    pub fn flush(&self) {
        let mut pending = self.sink.pending.lock();
        if pending.lines > 0 {
            self.sink.send(&mut pending);
        }
    }

    /// At shutdown: hands on the lines waiting in the buffer and waits,
    /// at most `bound`, until everything handed on is written. Lines
    /// written after it starts, and those still unwritten when `bound`
    /// runs out, are counted as dropped, the whole buffer being written
    /// then included (part of it may have gone out: counted rather than
    /// lost).
    pub async fn finish(&self, bound: Duration) {
        let (bytes, lines) = {
            let mut pending = self.sink.pending.lock();
            pending.closed = true;
            self.sink.take(&mut pending)
        };
        if lines == 0 && self.sink.writer.get().is_none() {
            return;
        }
        let Some(writer) = self.sink.writer() else {
            emit(&bytes);
            return;
        };
        let shared = &self.sink.shared;
        let mut unsent = lines;
        let written = tokio::time::timeout(bound, async {
            if lines > 0 {
                let Ok(slot) = writer.reserve().await else {
                    return false;
                };
                shared.tally.lock().queued += lines;
                unsent = 0;
                slot.send(Job::Lines(bytes, lines));
            }
            let (done, synced) = oneshot::channel();
            writer.send(Job::Synced(done)).await.is_ok() && synced.await.is_ok()
        })
        .await
        .unwrap_or(false);
        if !written {
            let held = {
                let mut tally = shared.tally.lock();
                tally.abandoned = true;
                std::mem::take(&mut tally.queued)
            };
            shared.count_dropped(held + unsent);
        }
    }
}

/// Standard output for the writer thread: its file descriptor itself
/// (a duplicate), so that what a write reports taken is in the pipe or
/// file, not in the line buffer of `std::io::stdout()`.
fn standard_output() -> Box<dyn std::io::Write + Send> {
    use std::os::fd::AsFd as _;
    match std::io::stdout().as_fd().try_clone_to_owned() {
        Ok(fd) => Box::new(std::fs::File::from(fd)),
        Err(_) => Box::new(std::io::stdout()),
    }
}

/// One write of whole lines to standard output, where no writer thread
/// could be started.
fn emit(bytes: &[u8]) {
    let mut out = std::io::stdout().lock();
    let _ = out.write_all(bytes);
    let _ = out.flush();
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record() -> Record {
        Record {
            at: Some(SystemTime::UNIX_EPOCH + Duration::from_millis(1_700_000_000_123)),
            request_id: "req-1".to_owned(),
            route: "chat",
            tenant: Some(Arc::from("t")),
            model: Some(Arc::from("m")),
            status: 200,
            attempts: 1,
            queue: Duration::from_micros(1_500),
            upstream: Duration::from_micros(2_250),
            total: Duration::from_millis(4),
            tokens_estimated: Some(12),
            cost_reserved: Some(1_500),
            limited_by: Some("none"),
            class: Some("standard"),
            ..Record::default()
        }
    }

    // proves: GW-14 (the text line names every field, in order, with "-"
    // for what is unknown; the JSON line is the record with kind and time
    // in front)
    #[test]
    fn lines_hold_every_field_in_their_format() {
        assert_eq!(
            record().line(LogFormat::Text),
            "2023-11-14T22:13:20.123Z access request_id=req-1 route=chat tenant=t model=m \
             deployment=- status=200 error=- attempts=1 stream=false queue_ms=1.500 \
             upstream_ms=2.250 total_ms=4.000 tokens_estimated=12 tokens_reported=- \
             limited_by=none cost_reserved_usd=0.0015 cost_usd=- class=standard"
        );
        // The time's text up to the second is reused within its second only.
        let at = |millis: u64| {
            let mut r = record();
            r.at = Some(SystemTime::UNIX_EPOCH + Duration::from_millis(millis));
            r.line(LogFormat::Text)
        };
        assert!(at(1_700_000_000_999).starts_with("2023-11-14T22:13:20.999Z access"));
        assert!(at(1_700_000_001_005).starts_with("2023-11-14T22:13:21.005Z access"));
        assert!(at(1_700_000_000_007).starts_with("2023-11-14T22:13:20.007Z access"));
        assert!(at(0).starts_with("1970-01-01T00:00:00.000Z access"));
        // A clock RFC 3339 cannot write leaves the time out, never panics.
        assert!(at(253_402_300_799_999).starts_with("9999-12-31T23:59:59.999Z access"));
        for t in [
            SystemTime::UNIX_EPOCH + Duration::from_secs(253_402_300_800),
            SystemTime::UNIX_EPOCH - Duration::from_secs(1),
        ] {
            let mut r = record();
            r.at = Some(t);
            assert!(
                r.line(LogFormat::Text)
                    .starts_with(" access request_id=req-1")
            );
            assert!(
                r.line(LogFormat::Json)
                    .starts_with("{\"kind\":\"access\",\"time\":\"\",")
            );
        }
        // Times are rounded to the microsecond; long ones keep every digit.
        let mut odd = record();
        odd.queue = Duration::from_nanos(1_234_567);
        odd.upstream = Duration::from_nanos(499);
        odd.total = Duration::from_secs(90_061) + Duration::from_nanos(999_999_500);
        let line = odd.line(LogFormat::Text);
        assert!(
            line.contains(" queue_ms=1.235 upstream_ms=0.000 total_ms=90062000.000 "),
            "{line}"
        );
        let json = record().line(LogFormat::Json);
        assert!(
            json.starts_with(
                "{\"kind\":\"access\",\"time\":\"2023-11-14T22:13:20.123Z\",\"request_id\":\"req-1\","
            ),
            "{json}"
        );
        let v: serde_json::Value = serde_json::from_str(&json).unwrap();
        assert_eq!(v["cost_reserved_usd"], "0.0015");
        assert_eq!(v["deployment"], serde_json::Value::Null);
        assert_eq!(v["queue"], 1.5);
        let bare = Record::default().line(LogFormat::Text);
        assert!(
            bare.starts_with(" access request_id= route= tenant=-"),
            "{bare}"
        );
    }

    // proves: GW-14, GW-17 (a standard output nobody reads costs access
    // lines, each one counted, never a request's time: writes and flushes
    // return while it is blocked; once it is read again every line not
    // counted as dropped arrives, whole and in order)
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_blocked_output_costs_counted_lines_never_a_request() {
        use std::io::Read as _;
        let (mut reader, writer) = std::io::pipe().unwrap();
        let log = AccessLog::to_output(LogFormat::Text, writer);
        // About 6 MB of lines: far more than the pipe (64 KiB), the
        // writer's queue and the buffer (about 2 MiB) hold.
        let total: u64 = 20_000;
        let writing = log.clone();
        let writes = tokio::task::spawn_blocking(move || {
            for i in 0..total {
                let mut r = record();
                r.request_id = format!("req-{i}");
                writing.write(&r);
                if i % 1_000 == 0 {
                    writing.flush();
                }
            }
            writing.flush();
        });
        // A bound for a hang, not a timing: with nobody reading, the
        // writes still return.
        tokio::time::timeout(Duration::from_secs(120), writes)
            .await
            .expect("a write waited for the blocked output")
            .unwrap();
        assert!(log.dropped() > 0, "the blocked output dropped nothing");
        let read = std::thread::spawn(move || {
            let mut text = String::new();
            reader.read_to_string(&mut text).unwrap();
            text
        });
        log.finish(Duration::from_secs(120)).await;
        let dropped = log.dropped();
        // The writer thread ends with the last handle; the pipe closes.
        drop(log);
        let text = read.join().unwrap();
        let ids: Vec<u64> = text
            .lines()
            .map(|line| {
                assert!(line.ends_with(" class=standard"), "a torn line: {line}");
                let id = line
                    .split(' ')
                    .find_map(|field| field.strip_prefix("request_id=req-"))
                    .unwrap();
                id.parse().unwrap()
            })
            .collect();
        assert!(!ids.is_empty());
        assert_eq!(
            ids.len() as u64 + dropped,
            total,
            "a line neither written nor counted"
        );
        assert!(ids.windows(2).all(|w| w[0] < w[1]), "lines out of order");
    }

    /// An output whose writes wait until the test lets them through.
    struct Gated(std::sync::mpsc::Receiver<()>);

    impl std::io::Write for Gated {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            let _ = self.0.recv();
            Ok(buf.len())
        }

        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    // proves: GW-14 (a shutdown that stops waiting for a blocked output
    // counts every line it did not write: those queued, the one being
    // written, those left in the buffer, and those written after the
    // shutdown began)
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_shutdown_that_gives_up_counts_every_unwritten_line() {
        let (gate, gated) = std::sync::mpsc::channel();
        let log = AccessLog::to_output(LogFormat::Text, Gated(gated));
        let total: u64 = 20_000;
        for _ in 0..total {
            log.write(&record());
        }
        // Nothing got through the gate: every line is queued, held or
        // dropped already.
        log.finish(Duration::from_millis(50)).await;
        log.write(&record());
        assert_eq!(log.dropped(), total + 1);
        // Let the writer go: it writes nothing more and counts nothing
        // twice.
        drop(gate);
        let (done, synced) = oneshot::channel();
        if log
            .sink
            .writer()
            .unwrap()
            .send(Job::Synced(done))
            .await
            .is_ok()
        {
            let _ = synced.await;
        }
        assert_eq!(log.dropped(), total + 1);
    }
}

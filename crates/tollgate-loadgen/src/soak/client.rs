//! The clients: each [`Call`] sent and read (or not) as its behaviour
//! says, and what came of it as an [`Outcome`].

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderValue, Method, Request, StatusCode, header};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::client::conn::http1::{self, SendRequest};
use hyper_util::rt::TokioIo;
use tokio::net::TcpSocket;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::args::Gateway;
use crate::plan::{Behaviour, Call, Upstream};
use crate::sse::{StreamReader, complete_completion, typed_error};
use crate::watch::CloseWatcher;

type Sender = SendRequest<Full<Bytes>>;

/// A pooled keep-alive connection idle longer than this is dropped rather
/// than reused (the gateway closes idle connections after its header read
/// timeout).
const MAX_IDLE: Duration = Duration::from_secs(3);
/// Most idle keep-alive connections kept: with `--concurrency` 256 the
/// soak then stays well below the gateway's default connection cap (512).
const MAX_POOLED: usize = 64;
/// Largest one-shot or error body read.
const MAX_BODY: usize = 16 << 20;
/// How long a stalled client drains what is left once it reads again.
const DRAIN: Duration = Duration::from_secs(15);

/// What came of one request.
#[derive(Debug, Clone, PartialEq)]
pub struct Outcome {
    /// Its class, e.g. `ok/stream`, `error/http/429/...`, `cut`.
    pub class: String,
    /// Set when the gateway broke a rule: what happened.
    pub violation: Option<String>,
    /// For stalled streams: when the gateway closed the connection,
    /// relative to the deadline (negative: before it).
    pub close_after_deadline: Option<f64>,
}

impl Outcome {
    fn ok(class: impl Into<String>) -> Self {
        Self {
            class: class.into(),
            violation: None,
            close_after_deadline: None,
        }
    }

    fn violation(class: &str, detail: impl Into<String>) -> Self {
        Self {
            class: format!("VIOLATION/{class}"),
            violation: Some(detail.into()),
            close_after_deadline: None,
        }
    }
}

/// How a body ended.
#[derive(Debug, Clone, PartialEq)]
enum End {
    /// The body ended normally.
    Clean,
    /// The connection broke or the body was aborted.
    Aborted(String),
}

struct Idle {
    sender: Sender,
    since: Instant,
}

/// Settings and shared state of every client.
pub struct Client {
    gateway: Gateway,
    host: HeaderValue,
    auth: HeaderValue,
    model: String,
    bulk_model: String,
    per_token: Duration,
    stall_grace: Duration,
    stall_rcvbuf: u32,
    client_timeout: Duration,
    watcher: CloseWatcher,
    idle: Mutex<Vec<Idle>>,
    /// Keep-alive connections the gateway had closed just as a request
    /// was sent on them; the request went again on a new connection.
    pub keepalive_retries: AtomicU64,
}

/// Settings of [`Client::new`].
pub struct ClientConfig {
    pub gateway: Gateway,
    pub api_key: String,
    pub model: String,
    pub bulk_model: String,
    pub per_token: Duration,
    pub stall_grace: Duration,
    pub stall_rcvbuf: u32,
    pub client_timeout: Duration,
}

impl Client {
    /// Clients of one run (spawns the close watcher).
    pub fn new(c: ClientConfig) -> anyhow::Result<Self> {
        Ok(Self {
            host: HeaderValue::try_from(c.gateway.host.as_str())?,
            auth: HeaderValue::try_from(format!("Bearer {}", c.api_key))?,
            watcher: CloseWatcher::spawn(c.gateway.addr.port()),
            gateway: c.gateway,
            model: c.model,
            bulk_model: c.bulk_model,
            per_token: c.per_token,
            stall_grace: c.stall_grace,
            stall_rcvbuf: c.stall_rcvbuf,
            client_timeout: c.client_timeout,
            idle: Mutex::new(Vec::new()),
            keepalive_retries: AtomicU64::new(0),
        })
    }

    fn request(&self, call: &Call) -> Request<Full<Bytes>> {
        let model = match call.upstream {
            Upstream::Slow => &self.model,
            Upstream::Bulk => &self.bulk_model,
        };
        let mut builder = Request::builder()
            .method(Method::POST)
            .uri("/v1/chat/completions")
            .header(header::HOST, self.host.clone())
            .header(header::CONTENT_TYPE, "application/json")
            .header(header::AUTHORIZATION, self.auth.clone());
        if let Some(t) = call.timeout {
            builder = builder.header("x-request-timeout", format!("{t}"));
        }
        builder
            .body(Full::new(call.body(model)))
            .expect("a valid request")
    }

    /// A new connection (its driver task, and the local port).
    async fn connect(
        &self,
        rcvbuf: Option<u32>,
        reset: bool,
    ) -> anyhow::Result<(Sender, JoinHandle<()>, u16)> {
        let socket = TcpSocket::new_v4()?;
        if let Some(n) = rcvbuf {
            socket.set_recv_buffer_size(n)?;
        }
        let stream = socket.connect(self.gateway.addr).await?;
        stream.set_nodelay(true)?;
        if reset {
            stream.set_zero_linger()?;
        }
        let port = stream.local_addr()?.port();
        let (sender, conn) = http1::handshake(TokioIo::new(stream)).await?;
        let task = tokio::spawn(async move {
            let _ = conn.await;
        });
        Ok((sender, task, port))
    }

    /// A ready keep-alive connection from the pool, or a new one (with
    /// whether it was reused).
    async fn checkout(&self) -> anyhow::Result<(Sender, bool)> {
        loop {
            let idle = self
                .idle
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .pop();
            let Some(idle) = idle else { break };
            let mut sender = idle.sender;
            if idle.since.elapsed() > MAX_IDLE || sender.is_closed() {
                continue;
            }
            if sender.ready().await.is_ok() {
                return Ok((sender, true));
            }
        }
        let (mut sender, _task, _) = self.connect(None, false).await?;
        sender.ready().await?;
        Ok((sender, false))
    }

    fn checkin(&self, sender: Sender) {
        let mut idle = self
            .idle
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if idle.len() < MAX_POOLED {
            idle.push(Idle {
                sender,
                since: Instant::now(),
            });
        }
    }

    /// Sends `call` and behaves as it says.
    pub async fn run(&self, call: &Call) -> Outcome {
        match call.behaviour {
            Behaviour::Normal => {
                match tokio::time::timeout(self.client_timeout, self.normal(call)).await {
                    Ok(Ok(outcome)) => outcome,
                    Ok(Err(e)) => Outcome::violation("transport", format!("{e:#}")),
                    Err(_) => Outcome::violation(
                        "client_timeout",
                        format!("no whole response within {:?}", self.client_timeout),
                    ),
                }
            }
            Behaviour::CancelBeforeHeaders { after } => {
                self.cancel_before_headers(call, after).await
            }
            Behaviour::CancelAfterHeaders | Behaviour::CancelMidStream { .. } => {
                let frames = match call.behaviour {
                    Behaviour::CancelMidStream { frames } => frames,
                    _ => 0,
                };
                self.cancel_after(call, frames).await
            }
            Behaviour::Stall { frames } => self.stall(call, frames).await,
        }
    }

    /// A well-behaved client: reads everything, reuses its connection.
    async fn normal(&self, call: &Call) -> anyhow::Result<Outcome> {
        let (mut sender, reused) = self.checkout().await?;
        let response = match sender.send_request(self.request(call)).await {
            Ok(r) => r,
            // The keep-alive race: the gateway closed the idle connection
            // as the request went out; nothing was read, send it again.
            Err(e) if reused && (e.is_canceled() || e.is_incomplete_message()) => {
                self.keepalive_retries.fetch_add(1, Ordering::Relaxed);
                let (mut fresh, _task, _) = self.connect(None, false).await?;
                fresh.ready().await?;
                sender = fresh;
                sender.send_request(self.request(call)).await?
            }
            Err(e) => return Err(e.into()),
        };
        let status = response.status();
        let mut body = response.into_body();
        let outcome = if status == StatusCode::OK && call.stream {
            let mut reader = StreamReader::default();
            let end = read_stream(&mut body, &mut reader, None).await;
            classify_stream(&reader, &end)
        } else {
            let (bytes, end) = read_all(&mut body).await;
            classify_whole(status, &bytes, &end)
        };
        if outcome.violation.is_none() && !sender.is_closed() {
            self.checkin(sender);
        }
        Ok(outcome)
    }

    /// Sends, then drops the request `after` a delay, headers or not.
    async fn cancel_before_headers(&self, call: &Call, after: Duration) -> Outcome {
        let (mut sender, task, _) = match self.connect(None, call.reset).await {
            Ok(c) => c,
            Err(e) => return Outcome::violation("connect", format!("{e:#}")),
        };
        let outcome =
            match tokio::time::timeout(after, sender.send_request(self.request(call))).await {
                Err(_) => Outcome::ok("cancelled_before_headers"),
                Ok(Ok(r)) => Outcome::ok(format!("headers_before_cancel/{}", r.status().as_u16())),
                Ok(Err(e)) => Outcome::violation(
                    "closed_before_cancel",
                    format!("the gateway broke the connection first: {e:#}"),
                ),
            };
        drop(sender);
        task.abort();
        outcome
    }

    /// Waits for headers, reads `frames` frames, then drops the
    /// connection.
    async fn cancel_after(&self, call: &Call, frames: u32) -> Outcome {
        let (mut sender, task, _) = match self.connect(None, call.reset).await {
            Ok(c) => c,
            Err(e) => return Outcome::violation("connect", format!("{e:#}")),
        };
        let work = async {
            let response = match sender.send_request(self.request(call)).await {
                Ok(r) => r,
                Err(e) => return Outcome::violation("transport", format!("{e:#}")),
            };
            let status = response.status();
            if frames == 0 || status != StatusCode::OK || !call.stream {
                return Outcome::ok(format!("cancelled_after_headers/{}", status.as_u16()));
            }
            let mut body = response.into_body();
            let mut reader = StreamReader::default();
            let end = read_stream(&mut body, &mut reader, Some(frames)).await;
            match end {
                None => Outcome::ok("cancelled_mid_stream"),
                // The stream ended before the client meant to go.
                Some(_) => {
                    let o = classify_stream(&reader, &end);
                    Outcome {
                        class: format!("ended_before_cancel/{}", o.class),
                        ..o
                    }
                }
            }
        };
        let outcome = match tokio::time::timeout(self.client_timeout, work).await {
            Ok(o) => o,
            Err(_) => Outcome::violation("client_timeout", "no headers or frames in time"),
        };
        drop(sender);
        task.abort();
        outcome
    }

    /// Reads `frames` frames, stops reading with the socket open until the
    /// gateway closes it (or the grace after the deadline ran out), then
    /// drains what is left and judges.
    async fn stall(&self, call: &Call, frames: u32) -> Outcome {
        let timeout = Duration::from_secs_f64(call.timeout.expect("stalled calls have a deadline"));
        let (mut sender, task, port) = match self.connect(Some(self.stall_rcvbuf), call.reset).await
        {
            Ok(c) => c,
            Err(e) => return Outcome::violation("connect", format!("{e:#}")),
        };
        let sent = Instant::now();
        let deadline = sent + timeout;
        let limit = deadline + self.stall_grace;
        let outcome = async {
            let response =
                match tokio::time::timeout_at(limit, sender.send_request(self.request(call))).await {
                    Err(_) => {
                        return Outcome::violation(
                            "stall_no_response",
                            format!(
                                "no response headers {:?} after a {timeout:?} deadline",
                                self.stall_grace
                            ),
                        );
                    }
                    Ok(Err(e)) => return Outcome::violation("transport", format!("{e:#}")),
                    Ok(Ok(r)) => r,
                };
            let status = response.status();
            let mut body = response.into_body();
            if status != StatusCode::OK {
                return match tokio::time::timeout(DRAIN, read_all(&mut body)).await {
                    Ok((bytes, end)) => classify_whole(status, &bytes, &end),
                    Err(_) => Outcome::violation(
                        "client_timeout",
                        format!("a {} body still unread after {DRAIN:?}", status.as_u16()),
                    ),
                };
            }
            let mut reader = StreamReader::default();
            // The first frames, read as a client that still listens.
            let mut end = match tokio::time::timeout_at(
                limit,
                read_stream(&mut body, &mut reader, Some(frames)),
            )
            .await
            {
                Ok(end) => end,
                Err(_) => {
                    return Outcome::violation(
                        "stall_held_past_deadline",
                        format!(
                            "a stream with a {timeout:?} deadline still sent nothing {:?} after it",
                            self.stall_grace
                        ),
                    );
                }
            };
            // Now it stops reading (unless the stream already ended).
            let stalled = end.is_none();
            let closed = if stalled {
                self.watcher.closed(port, limit).await
            } else {
                None
            };
            if stalled {
                end = match tokio::time::timeout(DRAIN, read_stream(&mut body, &mut reader, None))
                    .await
                {
                    Ok(end) => end,
                    Err(_) => Some(End::Aborted("drain timed out".into())),
                };
            }
            let complete = reader.done
                && end == Some(End::Clean)
                && reader.error.is_none()
                && !reader.has_partial();
            if reader.malformed.is_some() {
                return classify_stream(&reader, &end);
            }
            let after = closed.map(|at| signed_secs(at, deadline));
            if complete {
                // A stream on the slow upstream cannot end before
                // tokens × per-token.
                let natural = self.per_token.as_secs_f64() * f64::from(call.max_tokens);
                if call.upstream == Upstream::Slow && natural > timeout.as_secs_f64() + 0.2 {
                    return Outcome::violation(
                        "stall_outlived_deadline",
                        format!(
                            "a stream of {} tokens (at least {natural:.1} s) with a {timeout:?} deadline ended with [DONE]",
                            call.max_tokens
                        ),
                    );
                }
                return Outcome::ok("completed");
            }
            let how = reader.error.clone().unwrap_or_else(|| "no_error_event".into());
            match after {
                Some(after) if after < 0.0 => Outcome {
                    close_after_deadline: Some(after),
                    ..Outcome::ok(format!("ended_before_deadline/{how}"))
                },
                Some(after) => Outcome {
                    close_after_deadline: Some(after),
                    ..Outcome::ok(format!("cut_at_deadline/{how}"))
                },
                // It ended while the client still read its first frames:
                // no stall happened.
                None if !stalled => {
                    let o = classify_stream(&reader, &end);
                    Outcome {
                        class: format!("ended_while_reading/{}", o.class),
                        ..o
                    }
                }
                None => Outcome::violation(
                    "stall_held_past_deadline",
                    format!(
                        "the gateway kept the connection of a stalled stream (deadline {timeout:?}, {} tokens) open {:?} past its deadline; {} bytes had arrived when the client read again",
                        call.max_tokens, self.stall_grace, reader.bytes
                    ),
                ),
            }
        }
        .await;
        drop(sender);
        task.abort();
        outcome
    }
}

fn signed_secs(at: Instant, reference: Instant) -> f64 {
    if at >= reference {
        (at - reference).as_secs_f64()
    } else {
        -(reference - at).as_secs_f64()
    }
}

/// Reads body frames into `reader`: all of them, or `limit` at most.
/// `None` when it stopped at the limit.
async fn read_stream(
    body: &mut Incoming,
    reader: &mut StreamReader,
    limit: Option<u32>,
) -> Option<End> {
    let mut read = 0;
    loop {
        if limit.is_some_and(|l| read >= l) {
            return None;
        }
        match body.frame().await {
            None => return Some(End::Clean),
            Some(Err(e)) => return Some(End::Aborted(format!("{e:#}"))),
            Some(Ok(frame)) => {
                if let Some(data) = frame.data_ref() {
                    reader.feed(data);
                    read += 1;
                }
            }
        }
    }
}

/// The whole body (up to `MAX_BODY`) and how it ended.
async fn read_all(body: &mut Incoming) -> (Vec<u8>, End) {
    let mut out = Vec::new();
    loop {
        match body.frame().await {
            None => return (out, End::Clean),
            Some(Err(e)) => return (out, End::Aborted(format!("{e:#}"))),
            Some(Ok(frame)) => {
                if let Some(data) = frame.data_ref() {
                    if out.len() + data.len() > MAX_BODY {
                        return (out, End::Aborted("body over 16 MiB".into()));
                    }
                    out.extend_from_slice(data);
                }
            }
        }
    }
}

/// A one-shot answer, or any non-200 answer.
fn classify_whole(status: StatusCode, body: &[u8], end: &End) -> Outcome {
    if let End::Aborted(e) = end {
        return Outcome::violation(
            "body_aborted",
            format!("{} body aborted: {e}", status.as_u16()),
        );
    }
    if status == StatusCode::OK {
        return if complete_completion(body) {
            Outcome::ok("ok/oneshot")
        } else {
            Outcome::violation(
                "not_a_completion",
                format!(
                    "200 body: {}",
                    String::from_utf8_lossy(&body[..body.len().min(200)])
                ),
            )
        };
    }
    match typed_error(body) {
        Some(class) => Outcome::ok(format!("error/http/{}/{class}", status.as_u16())),
        None => Outcome::violation(
            "untyped_error",
            format!(
                "{} with body {}",
                status.as_u16(),
                String::from_utf8_lossy(&body[..body.len().min(200)])
            ),
        ),
    }
}

/// A streamed 200 answer that was read to its end.
fn classify_stream(reader: &StreamReader, end: &Option<End>) -> Outcome {
    if reader.error_after_done {
        return Outcome::violation(
            "error_event_after_done",
            reader.malformed.clone().unwrap_or_default(),
        );
    }
    if let Some(problem) = &reader.malformed {
        return Outcome::violation("malformed_stream", problem.clone());
    }
    if let Some(class) = &reader.error {
        return Outcome::ok(format!("error/stream/{class}"));
    }
    match end {
        Some(End::Clean) if reader.done && !reader.has_partial() => Outcome::ok("ok/stream"),
        Some(End::Clean) => Outcome::violation(
            "stream_without_done",
            format!(
                "ended cleanly without [DONE] after {} chunks",
                reader.chunks
            ),
        ),
        Some(End::Aborted(e)) if reader.done => {
            Outcome::violation("aborted_after_done", format!("aborted after [DONE]: {e}"))
        }
        Some(End::Aborted(e)) => Outcome::violation(
            "stream_cut_without_error",
            format!(
                "cut after {} chunks without an error event: {e}",
                reader.chunks
            ),
        ),
        None => Outcome::violation("stream_not_read", "stopped before its end"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn streams_are_judged_by_their_end() {
        let mut done = StreamReader::default();
        done.feed(b"data: [DONE]\n\n");
        assert_eq!(classify_stream(&done, &Some(End::Clean)).class, "ok/stream");
        assert!(
            classify_stream(&done, &Some(End::Aborted("x".into())))
                .violation
                .is_some()
        );
        let cut = StreamReader::default();
        assert!(
            classify_stream(&cut, &Some(End::Aborted("x".into())))
                .violation
                .is_some()
        );
        let mut late = StreamReader::default();
        late.feed(b"data: [DONE]\n\ndata: {\"error\":{\"message\":\"m\",\"type\":\"t\"}}\n\n");
        assert_eq!(
            classify_stream(&late, &Some(End::Aborted("x".into()))).class,
            "VIOLATION/error_event_after_done"
        );
        let mut failed = StreamReader::default();
        failed.feed(b"data: {\"error\":{\"message\":\"m\",\"type\":\"t\",\"code\":\"c\"}}\n\n");
        assert_eq!(
            classify_stream(&failed, &Some(End::Aborted("x".into()))).class,
            "error/stream/t/c"
        );
        assert_eq!(
            classify_whole(
                StatusCode::TOO_MANY_REQUESTS,
                br#"{"error":{"message":"m","type":"rate_limit_error","code":"admission_rejected"}}"#,
                &End::Clean
            )
            .class,
            "error/http/429/rate_limit_error/admission_rejected"
        );
        assert!(
            classify_whole(StatusCode::BAD_GATEWAY, b"oops", &End::Clean)
                .violation
                .is_some()
        );
    }
}

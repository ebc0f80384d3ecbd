//! The provider stream: an upstream SSE body in, engine stream events out.
//!
//! Implementation notes (invariants):
//! * Every upstream event reaches the consumer in its canonical form: for
//!   the events OpenAI sends (`data: <one line>` and a blank line, LF line
//!   ends) that is the upstream's bytes, relayed without being copied
//!   (slices of the body's chunks); other framings (CRLF line ends, `data:`
//!   without the space, several `data:` lines, named events) are decoded
//!   and re-encoded, normalised but carrying the same event. Comment lines
//!   (keep-alives) are not forwarded.
//! * The relay: while the decoder holds nothing (between events), each
//!   canonical event that is complete in a body chunk is taken from the
//!   chunk as is — the decoder would yield exactly that event, and
//!   re-encoding it would give exactly those bytes. Anything else (a
//!   partial event, another framing, an oversize line, invalid UTF-8) goes
//!   through the decoder, up to the next blank line. Only what settlement
//!   needs is looked at in an event: `[DONE]`, and the `usage`, `error`
//!   and `choices` members of its JSON (checked to be an object).
//! * The stream ends exactly once, and only in one of three ways: after
//!   `[DONE]` (forwarded as the last chunk), after a provider-declared error
//!   chunk (forwarded once inside `StreamEvent::Error`, SPEC LC-4), or with
//!   an `Err` (SPEC LC-3: a body that ends or fails before `[DONE]` is
//!   `StreamBroken`, never a silent normal end). Afterwards it yields `None`
//!   for ever.
//! * The HTTP body is dropped as soon as the stream has ended, and with the
//!   stream otherwise: a consumer that drops the stream closes the upstream
//!   connection (SPEC LC-5, GW-6).
//! * States: `Open` (reading events) → `Draining` (after `[DONE]`: the
//!   frame is already out; the body is read to its end, at most for a short
//!   grace, so that its connection goes back to the pool instead of being
//!   closed) → `Ended`. A declared error or a failure goes from `Open`
//!   straight to `Ended`. The grace only delays the stream's `None`, never
//!   the `[DONE]` frame.
//! * Usage is reported to the engine at most once per stream: from the
//!   usage-only chunk, else (at `[DONE]` or with the final error) from the
//!   last usage seen in any chunk.
//! * Dialects ([`Dialect`], chosen by [`ChunkStream::with_endpoint`]): the
//!   above is the chat-completions protocol. The Responses and Messages
//!   streams use named events (`event: <type>` and `data: <json>`; the
//!   relay also takes those whole from the body when canonical) and end
//!   with a terminal event instead of `[DONE]`: usage is reported from it,
//!   the event is forwarded, then the stream drains as after `[DONE]`. What
//!   an event of those dialects means is decided in `dialect.rs`
//!   ([`EventReader`]); the states, ends and usage rules are the same.

use std::collections::VecDeque;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use futures_core::Stream;
use serde::Deserialize;
use serde::de::IgnoredAny;
use serde_json::Value;
use serde_json::value::RawValue;
use tokio::time::Sleep;

use super::members::{Members, members};
use tollgate::lifecycle::{ErrorKind, ProviderError, StreamEvent};

use super::classify::{declared_message, describe, sanitize};
use super::dialect::{Dialect, EventReader, Step};
use super::request::Endpoint;
use super::transport::BodyError;
use crate::sse::{DONE_FRAME, SseDecoder, SseError, SseEvent, SseItem};
use crate::wire;

/// The body of an upstream response as the HTTP client yields it.
pub type BodyStream = Pin<Box<dyn Stream<Item = Result<Bytes, BodyError>> + Send>>;

/// One item of a [`ChunkStream`].
pub type ChunkItem = Result<StreamEvent<Bytes>, ProviderError>;

/// Default time an [`HttpProvider`](super::HttpProvider) stream waits, after
/// `[DONE]`, for the upstream body to end so that its connection can be
/// reused.
pub const DEFAULT_END_GRACE: Duration = Duration::from_millis(250);

/// The engine-facing stream of one streamed chat completion.
///
/// Each upstream event becomes [`StreamEvent::Chunk`] holding the event
/// encoded ready to forward (`data: {...}\n\n`); the usage-only chunk becomes
/// [`StreamEvent::Usage`], followed by the chunk itself only when the client
/// asked for usage (SPEC GW-5); a chunk carrying an `error` (or an
/// `event: error`) becomes [`StreamEvent::Error`] and ends the stream
/// (SPEC LC-4); `data: [DONE]` is forwarded as the last chunk. A body that
/// ends or fails before `[DONE]` ends the stream with
/// `Err(ProviderError { kind: StreamBroken, .. })` (SPEC LC-3); an event
/// that is not a JSON object, or one larger than the decoder's limit, with
/// `Err(ProviderError { kind: Protocol, .. })`.
///
/// After `[DONE]` the stream yields `None` once the upstream body has ended
/// (normally at once), or after a short grace
/// ([`ChunkStream::with_end_grace`]; the HTTP provider uses
/// [`DEFAULT_END_GRACE`]), whichever comes first: reading the body to its
/// end lets the connection be reused. A non-zero grace needs a tokio
/// runtime with its timer enabled, as the HTTP client does.
///
/// Dropping the stream drops the HTTP response and so closes its
/// connection (SPEC LC-5).
///
/// The above is the chat-completions dialect, the default. With
/// [`ChunkStream::with_endpoint`] the stream reads the Responses or the
/// Anthropic Messages dialect instead: named events, each forwarded as a
/// chunk; the terminal event (`response.completed` /
/// `response.incomplete`, `message_stop`) is preceded by
/// [`StreamEvent::Usage`] and is the last chunk; `response.failed` and
/// `error` events are declared errors; a body that ends before the
/// terminal event is `StreamBroken`.
pub struct ChunkStream<S = BodyStream> {
    state: State<S>,
    forward_usage: bool,
    end_grace: Duration,
    /// The upstream key, redacted from any message.
    secret: Option<Arc<str>>,
    /// Items decided but not yet yielded (at most three at a time).
    pending: VecDeque<ChunkItem>,
    usage_reported: bool,
    last_usage: Option<tollgate::Usage>,
    /// What the response headers said about the provider's budget.
    budget: tollgate::lifecycle::Budgets,
    /// The streaming dialect and what it remembers between events.
    events: EventReader,
}

enum State<S> {
    /// Reading events (boxed: the decoder is large, the other states small).
    Open(Box<Open<S>>),
    /// `[DONE]` seen: reading the body to its end, until `grace` fires
    /// (the timer is started the first time the body is not done yet).
    Draining {
        body: S,
        grace: Option<Pin<Box<Sleep>>>,
    },
    /// Over; the body is dropped.
    Ended,
}

/// The body being read and its decoder.
struct Open<S> {
    body: S,
    decoder: SseDecoder,
    /// Reused for the decoder's output.
    scratch: Vec<SseItem>,
}

impl<S> fmt::Debug for ChunkStream<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ChunkStream")
            .field(
                "state",
                &match self.state {
                    State::Open(_) => "open",
                    State::Draining { .. } => "draining",
                    State::Ended => "ended",
                },
            )
            .field("dialect", &self.events.dialect())
            .field("forward_usage", &self.forward_usage)
            .field("pending", &self.pending.len())
            .field("usage_reported", &self.usage_reported)
            .finish_non_exhaustive()
    }
}

impl<S, E> ChunkStream<S>
where
    S: Stream<Item = Result<Bytes, E>> + Unpin,
    E: std::error::Error + 'static,
{
    /// Decodes `body` with the default event size limit. `forward_usage`
    /// says whether the usage-only chunk also reaches the consumer.
    pub fn new(body: S, forward_usage: bool) -> Self {
        Self::with_decoder(body, SseDecoder::new(), forward_usage)
    }

    /// Decodes `body` with `decoder` (and its size limit).
    pub fn with_decoder(body: S, decoder: SseDecoder, forward_usage: bool) -> Self {
        ChunkStream {
            state: State::Open(Box::new(Open {
                body,
                decoder,
                scratch: Vec::new(),
            })),
            forward_usage,
            end_grace: Duration::ZERO,
            secret: None,
            pending: VecDeque::with_capacity(2),
            usage_reported: false,
            last_usage: None,
            budget: tollgate::lifecycle::Budgets::default(),
            events: EventReader::new(Dialect::Chat),
        }
    }

    /// Reads the streaming dialect of `endpoint`:
    /// [`Endpoint::ChatCompletions`] (the default; also used for
    /// [`Endpoint::Embeddings`], which does not stream),
    /// [`Endpoint::Responses`] or [`Endpoint::Messages`]. Set it before the
    /// first poll.
    pub fn with_endpoint(mut self, endpoint: Endpoint) -> Self {
        self.events = EventReader::new(Dialect::of(endpoint));
        self
    }

    /// Sets how long the stream waits, after `[DONE]`, for the upstream body
    /// to end. Zero (the default of this constructor) ends the stream at
    /// once, and the body's connection is then closed unless the body had
    /// already ended.
    pub fn with_end_grace(mut self, grace: Duration) -> Self {
        self.end_grace = grace;
        self
    }

    /// Redacts `secret` from every error message.
    pub(super) fn redacting(mut self, secret: Option<Arc<str>>) -> Self {
        self.secret = secret;
        self
    }

    /// Records what the response headers said about the provider's budget.
    pub(super) fn with_budget(mut self, budget: tollgate::lifecycle::Budgets) -> Self {
        self.budget = budget;
        self
    }

    /// What the response headers said about the provider's budget (SPEC
    ///
    pub fn budget(&self) -> tollgate::lifecycle::Budgets {
        self.budget
    }

    /// `true` once the stream has yielded its last item (it may still be
    /// reading the upstream body's end after `[DONE]`).
    pub fn is_finished(&self) -> bool {
        !matches!(self.state, State::Open(_)) && self.pending.is_empty()
    }

    fn secret(&self) -> Option<&str> {
        self.secret.as_deref()
    }

    fn dialect(&self) -> Dialect {
        self.events.dialect()
    }

    /// `data: [DONE]`: in chat, report usage if it is still owed, forward
    /// the frame, then drain the body. The other dialects do not use it.
    fn on_done(&mut self) {
        let dialect = self.dialect();
        if dialect.is_named() {
            let message = format!(
                "upstream sent [DONE], which the {} stream does not use, before {}",
                dialect.api(),
                dialect.terminal()
            );
            self.fail(ProviderError::new(ErrorKind::Protocol, message));
            return;
        }
        // Usage still owed: the last seen in any chunk.
        let usage = self.last_usage.take();
        self.complete(usage, Bytes::from_static(DONE_FRAME));
    }

    /// The normal end: `usage` (if any, and if none was reported yet), the
    /// terminal `frame`, then the body is drained.
    fn complete(&mut self, usage: Option<tollgate::Usage>, frame: Bytes) {
        if let Some(usage) = usage
            && !self.usage_reported
        {
            self.usage_reported = true;
            self.last_usage = None;
            self.pending.push_back(Ok(StreamEvent::Usage(usage)));
        }
        self.pending.push_back(Ok(StreamEvent::Chunk(frame)));
        self.state = match std::mem::replace(&mut self.state, State::Ended) {
            State::Open(open) => State::Draining {
                body: open.body,
                grace: None,
            },
            other => other,
        };
    }

    /// A body chunk: its complete events, in order, until the stream ends.
    fn on_bytes(&mut self, chunk: &Bytes) {
        let mut at = 0;
        while let Some(rest) = chunk.get(at..).filter(|r| !r.is_empty()) {
            let State::Open(open) = &mut self.state else {
                // Ended or [DONE]: the rest is not forwarded.
                return;
            };
            let max = open.decoder.max_event_size();
            let named = self.events.dialect().is_named();
            if let Some(event) = canonical_event(rest, max, named)
                && rest.first().is_some_and(|&b| open.decoder.idle_before(b))
            {
                let frame = chunk.slice(at..at + event.len);
                at += event.len;
                // As the decoder decides (its data is known valid UTF-8).
                let default_type = event.name.is_none_or(|n| n == "message");
                if default_type && event.data.trim() == "[DONE]" {
                    self.on_done();
                } else if named {
                    self.on_named_event(event.name, event.data.as_bytes(), || frame);
                } else {
                    self.on_data_event(event.data, || frame);
                }
                continue;
            }
            // Up to the next blank line (LF framing) or the chunk's end.
            let take = blank_line(rest).map_or(rest.len(), |at| at + 2);
            let (part, _) = rest.split_at(take);
            at += take;
            let mut items = std::mem::take(&mut open.scratch);
            let pushed = open.decoder.push(part, &mut items);
            for item in items.drain(..) {
                if !matches!(self.state, State::Open(_)) {
                    break;
                }
                match item {
                    SseItem::Done => self.on_done(),
                    SseItem::Event(event) => self.on_event(event),
                }
            }
            if let State::Open(open) = &mut self.state {
                open.scratch = items;
                if let Err(err) = pushed {
                    // Events completed before the error went out first.
                    let err = self.sse_broken(err);
                    self.fail(err);
                }
            }
        }
    }

    /// The body ended: [DONE] may still be pending in the decoder (without
    /// its blank line); anything else is a broken stream (the terminal
    /// event of a named dialect always ends with its blank line).
    fn on_body_end(&mut self) {
        let State::Open(open) = &mut self.state else {
            return;
        };
        match open.decoder.finish() {
            Ok(Some(SseItem::Done)) => self.on_done(),
            Ok(Some(SseItem::Event(event))) => self.on_event(event),
            Ok(None) => {}
            Err(err) => {
                let err = self.sse_broken(err);
                self.fail(err);
            }
        }
        if matches!(self.state, State::Open(_)) {
            let message = format!("upstream stream ended before {}", self.dialect().terminal());
            self.fail(ProviderError::new(ErrorKind::StreamBroken, message));
        }
    }

    fn on_event(&mut self, event: SseEvent) {
        if self.dialect().is_named() {
            self.on_named_event(event.event.as_deref(), event.data.as_bytes(), || {
                event.encode()
            });
            return;
        }
        match event.event.as_deref() {
            None | Some("message") => self.on_data_event(&event.data, || event.encode()),
            Some("error") => {
                let message = serde_json::from_str::<Value>(&event.data)
                    .ok()
                    .and_then(|v| declared_message(&v))
                    .unwrap_or_else(|| event.data.clone());
                let err = self.declared(&message, None);
                self.end_with(Ok(StreamEvent::Error(event.encode(), err)));
            }
            // Another named event: not part of the OpenAI protocol, passed
            // through unchanged for the consumer to judge.
            Some(_) => self
                .pending
                .push_back(Ok(StreamEvent::Chunk(event.encode()))),
        }
    }

    /// A data event: `data` is its payload, `frame` its wire form.
    fn on_data_event(&mut self, data: &str, frame: impl FnOnce() -> Bytes) {
        let members = chunk_members(data)
            .and_then(|m| Ok((m.choices, raw_value(m.usage)?, raw_value(m.error)?)));
        let (choices, usage, error) = match members {
            Ok(members) => members,
            Err(reason) => {
                let message = format!("upstream stream event is not a JSON object: {reason}");
                self.fail(ProviderError::new(ErrorKind::Protocol, message));
                return;
            }
        };
        let usage = usage.map(engine_usage);
        if let Some(error) = error {
            let message = declared_message(&serde_json::json!({ "error": error }))
                .unwrap_or_else(|| "upstream declared an error in the stream".to_owned());
            let err = self.declared(&message, usage);
            self.end_with(Ok(StreamEvent::Error(frame(), err)));
            return;
        }
        let no_choices = !choices;
        match usage {
            Some(usage) if no_choices => {
                if !self.usage_reported {
                    self.usage_reported = true;
                    self.last_usage = None;
                    self.pending.push_back(Ok(StreamEvent::Usage(usage)));
                }
                if self.forward_usage {
                    self.pending.push_back(Ok(StreamEvent::Chunk(frame())));
                }
            }
            Some(usage) => {
                self.last_usage = Some(usage);
                self.pending.push_back(Ok(StreamEvent::Chunk(frame())));
            }
            None => self.pending.push_back(Ok(StreamEvent::Chunk(frame()))),
        }
    }

    /// An event of a named dialect (Responses, Messages): `name` is its SSE
    /// event name, `data` its payload, `frame` its wire form.
    fn on_named_event(&mut self, name: Option<&str>, data: &[u8], frame: impl FnOnce() -> Bytes) {
        match self.events.read(name, data) {
            Err(reason) => {
                let message = format!("upstream stream event is not a JSON object: {reason}");
                self.fail(ProviderError::new(ErrorKind::Protocol, message));
            }
            Ok(Step::Forward(progress)) => {
                if let Some(usage) = progress
                    && !self.usage_reported
                {
                    self.last_usage = Some(usage);
                }
                self.pending.push_back(Ok(StreamEvent::Chunk(frame())));
            }
            Ok(Step::Complete(usage)) => self.complete(Some(usage), frame()),
            Ok(Step::Declared { message, usage }) => {
                let err = self.declared(&message, usage);
                self.end_with(Ok(StreamEvent::Error(frame(), err)));
            }
        }
    }

    /// A provider-declared error, with the usage it reported, if any.
    fn declared(&mut self, message: &str, usage: Option<tollgate::Usage>) -> ProviderError {
        let err = ProviderError::new(ErrorKind::Declared, sanitize(message, self.secret()));
        match usage.or_else(|| self.owed_usage()) {
            Some(usage) => err.with_usage(usage),
            None => err,
        }
    }

    /// Usage seen but not yet reported, handed over exactly once.
    fn owed_usage(&mut self) -> Option<tollgate::Usage> {
        if self.usage_reported {
            return None;
        }
        let usage = self.last_usage.take()?;
        self.usage_reported = true;
        Some(usage)
    }

    /// Ends the stream with an error (usage still owed goes with it).
    fn fail(&mut self, err: ProviderError) {
        let err = match self.owed_usage() {
            Some(usage) => err.with_usage(usage),
            None => err,
        };
        self.end_with(Err(err));
    }

    /// Queues the last item and drops the body (closing the connection).
    fn end_with(&mut self, item: ChunkItem) {
        self.pending.push_back(item);
        self.state = State::Ended;
    }

    fn body_broken(&self, err: &E) -> ProviderError {
        ProviderError::new(
            ErrorKind::StreamBroken,
            format!(
                "upstream stream failed before {}: {}",
                self.dialect().terminal(),
                describe(err, self.secret())
            ),
        )
    }

    fn sse_broken(&self, err: SseError) -> ProviderError {
        match err {
            SseError::Truncated { .. } => ProviderError::new(
                ErrorKind::StreamBroken,
                format!(
                    "upstream stream was cut inside an event, before {}",
                    self.dialect().terminal()
                ),
            ),
            err @ SseError::EventTooLarge { .. } => {
                ProviderError::new(ErrorKind::Protocol, err.to_string())
            }
        }
    }
}

impl<S, E> Stream for ChunkStream<S>
where
    S: Stream<Item = Result<Bytes, E>> + Unpin,
    E: std::error::Error + 'static,
{
    type Item = ChunkItem;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<ChunkItem>> {
        let this = self.get_mut();
        loop {
            if let Some(item) = this.pending.pop_front() {
                return Poll::Ready(Some(item));
            }
            match &mut this.state {
                State::Ended => return Poll::Ready(None),
                State::Draining { body, grace } => {
                    match Pin::new(body).poll_next(cx) {
                        // Bytes after [DONE] are not forwarded.
                        Poll::Ready(Some(Ok(_))) => continue,
                        Poll::Ready(Some(Err(_)) | None) => this.state = State::Ended,
                        Poll::Pending if this.end_grace.is_zero() => this.state = State::Ended,
                        Poll::Pending => {
                            let end_grace = this.end_grace;
                            let timer = grace
                                .get_or_insert_with(|| Box::pin(tokio::time::sleep(end_grace)));
                            if timer.as_mut().poll(cx).is_pending() {
                                return Poll::Pending;
                            }
                            this.state = State::Ended;
                        }
                    }
                }
                State::Open(open) => match Pin::new(&mut open.body).poll_next(cx) {
                    Poll::Pending => return Poll::Pending,
                    Poll::Ready(Some(Ok(chunk))) => this.on_bytes(&chunk),
                    Poll::Ready(Some(Err(err))) => {
                        let err = this.body_broken(&err);
                        this.fail(err);
                    }
                    Poll::Ready(None) => this.on_body_end(),
                },
            }
        }
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let pending = self.pending.len();
        match self.state {
            State::Open(_) => (pending, None),
            State::Draining { .. } | State::Ended => (pending, Some(pending)),
        }
    }
}

/// A canonical event taken whole from the body.
struct Canonical<'a> {
    /// Its length in bytes, blank line included.
    len: usize,
    /// Its `event:` name, if it has that line.
    name: Option<&'a str>,
    /// Its data.
    data: &'a str,
}

/// A canonical event at the start of `bytes` (what the decoder would take
/// whole, and re-encode to exactly these bytes): `data: <line>` and a blank
/// line, LF line ends, the line valid UTF-8 and within `max_event_size`;
/// with `named`, optionally preceded by `event: <name>` and an LF, the name
/// non-empty, valid UTF-8, without CR, and counted in the size.
fn canonical_event(bytes: &[u8], max_event_size: usize, named: bool) -> Option<Canonical<'_>> {
    const EVENT: &[u8] = b"event: ";
    let (name, head, rest) = match bytes.strip_prefix(EVENT) {
        Some(after) if named => {
            let end = after.iter().position(|&b| b == b'\n')?;
            let (name, tail) = after.split_at(end);
            let name = std::str::from_utf8(name)
                .ok()
                .filter(|n| !n.is_empty() && !n.contains('\r'))?;
            if EVENT.len() + end > max_event_size {
                return None;
            }
            // `tail` starts with the LF.
            (Some(name), EVENT.len() + end + 1, tail.get(1..)?)
        }
        _ => (None, 0, bytes),
    };
    // The name stays in the decoder's buffer while it reads the data line.
    let room = max_event_size.saturating_sub(name.map_or(0, str::len));
    let (len, data) = data_event(rest, room)?;
    Some(Canonical {
        len: head + len,
        name,
        data,
    })
}

/// `data: <line>` and a blank line at the start of `bytes`, LF line ends,
/// the line valid UTF-8 and within `max_event_size`. Its length and its
/// data.
fn data_event(bytes: &[u8], max_event_size: usize) -> Option<(usize, &str)> {
    const PREFIX: &[u8] = b"data: ";
    let rest = bytes.strip_prefix(PREFIX)?;
    let end = memchr::memchr2(b'\n', b'\r', rest)?;
    let (data, after) = rest.split_at(end);
    // A CR before the LF is not the canonical form.
    if after.get(..2) != Some(b"\n\n") || PREFIX.len() + end > max_event_size {
        return None;
    }
    let data = std::str::from_utf8(data).ok()?;
    Some((PREFIX.len() + end + 2, data))
}

/// Where the first `\n\n` (an LF line end and a blank line) starts.
fn blank_line(bytes: &[u8]) -> Option<usize> {
    bytes.windows(2).position(|w| w == b"\n\n")
}

/// The members of a stream chunk the adapter looks at, borrowed from the
/// event's text. Unknown members are skipped (still checked to be valid
/// JSON); `choices` elements are only counted, `usage` and `error` kept as
/// raw text and parsed only when present.
#[derive(Deserialize)]
struct ChunkProbe<'a> {
    #[serde(default, deserialize_with = "any_element")]
    choices: bool,
    #[serde(default, borrow)]
    usage: Option<&'a RawValue>,
    #[serde(default, borrow)]
    error: Option<&'a RawValue>,
}

/// Whether a `choices` member holds at least one element: an array (its
/// elements skipped, never materialised) or `null` (none).
fn any_element<'de, D: serde::Deserializer<'de>>(d: D) -> Result<bool, D::Error> {
    struct AnyElement;
    impl<'de> serde::de::Visitor<'de> for AnyElement {
        type Value = bool;
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("an array or null")
        }
        fn visit_unit<E: serde::de::Error>(self) -> Result<bool, E> {
            Ok(false)
        }
        fn visit_none<E: serde::de::Error>(self) -> Result<bool, E> {
            Ok(false)
        }
        fn visit_some<D: serde::Deserializer<'de>>(self, d: D) -> Result<bool, D::Error> {
            d.deserialize_seq(self)
        }
        fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<bool, A::Error> {
            let mut any = false;
            while seq.next_element::<IgnoredAny>()?.is_some() {
                any = true;
            }
            Ok(any)
        }
    }
    d.deserialize_option(AnyElement)
}

/// A raw member as a `Value`: parsed as a member of a whole parse would be
/// (numbers in range, escapes paired, repeated keys: the last one wins),
/// except that its nesting is bounded from the member down (serde_json's
/// 128 levels), not from the whole event: one level more than a whole
/// parse would allow.
pub(super) fn raw_value(raw: Option<&str>) -> Result<Option<Value>, String> {
    raw.map(|r| serde_json::from_str::<Value>(r).map_err(|err| err.to_string()))
        .transpose()
}

/// The `choices`, `usage` and `error` members of an event's JSON, which
/// must be an object: the one-pass reader's answer, else serde_json's
/// (which also words the error).
fn chunk_members(data: &str) -> Result<Members<'_>, String> {
    match members(data) {
        Some(found) => Ok(found),
        None => probed_members(data),
    }
}

/// The same members as serde_json reads them (the one-pass reader's
/// fallback, and the reference its tests compare it with).
pub(super) fn probed_members(data: &str) -> Result<Members<'_>, String> {
    parse_object_str::<ChunkProbe<'_>>(data).map(|p| Members {
        choices: p.choices,
        usage: p.usage.map(RawValue::get),
        error: p.error.map(RawValue::get),
    })
}

/// A raw OpenAI `usage` value (chat or Responses counter names) in the
/// engine's terms (SPEC Q-6): a value that is not a usage object is unknown
/// usage. For Anthropic's, see `dialect::anthropic_usage`.
pub(super) fn engine_usage(raw: Value) -> tollgate::Usage {
    serde_json::from_value::<wire::Usage>(raw)
        .map(|u| u.to_engine())
        .unwrap_or(tollgate::Usage::UNKNOWN)
}

/// Parses `json` as `T`, which must come from a JSON object (serde would
/// also accept an array for a struct). The error names the position of the
/// fault, never the content.
pub(super) fn parse_object<'a, T: Deserialize<'a>>(json: &'a [u8]) -> Result<T, String> {
    let first = json.iter().find(|b| !b.is_ascii_whitespace());
    if first != Some(&b'{') {
        return Err("expected an object".to_owned());
    }
    serde_json::from_slice(json).map_err(|err| err.to_string())
}

/// [`parse_object`] of text already known to be UTF-8, borrowing from it.
fn parse_object_str<'a, T: Deserialize<'a>>(json: &'a str) -> Result<T, String> {
    if json.trim_start().as_bytes().first() != Some(&b'{') {
        return Err("expected an object".to_owned());
    }
    serde_json::from_str(json).map_err(|err| err.to_string())
}

//! The incremental decoder.
//!
//! Implementation notes (invariants):
//! * Bytes are consumed line by line. A partial line is buffered in `line`
//!   until its terminator arrives; a comment line (first byte `:`) is never
//!   buffered, its bytes are dropped as they come.
//! * A CR ends a line at once; `after_cr` remembers it so that an LF that
//!   follows, even at the start of the next chunk, is taken as the second
//!   half of a CRLF and not as an empty line.
//! * Lines are split on ASCII bytes, so a complete line never ends inside a
//!   UTF-8 sequence; invalid UTF-8 is replaced with U+FFFD per line.
//! * `line.len() + data.len() + event_type.len()` never exceeds
//!   `max_event_size`: every append is checked before it happens.

use std::time::Duration;

use super::error::SseError;
use super::event::{SseEvent, SseItem};

/// Default maximum size of one event: 1 MiB.
pub const DEFAULT_MAX_EVENT_SIZE: usize = 1 << 20;

const BOM: [u8; 3] = [0xEF, 0xBB, 0xBF];
const DONE: &str = "[DONE]";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum LineMode {
    /// No byte of the current line seen yet.
    Start,
    /// A field line, buffered in `line`.
    Field,
    /// A comment line, being skipped.
    Comment,
}

/// Incremental SSE decoder: feed it byte chunks split anywhere, get events.
///
/// ```
/// use tollgate_openai::sse::{SseDecoder, SseItem};
/// let mut dec = SseDecoder::new();
/// let mut items = Vec::new();
/// dec.push(b"data: {\"a\":1}\n\nda", &mut items).unwrap();
/// dec.push(b"ta: [DONE]\n\n", &mut items).unwrap();
/// assert_eq!(dec.finish(), Ok(None));
/// assert!(matches!(&items[0], SseItem::Event(e) if e.data == "{\"a\":1}"));
/// assert_eq!(items[1], SseItem::Done);
/// ```
///
/// After an error the decoder stays failed: every later call returns the
/// same error.
#[derive(Debug, Clone)]
pub struct SseDecoder {
    max_event_size: usize,
    /// Bytes of the current field line (without terminator).
    line: Vec<u8>,
    line_mode: LineMode,
    /// The previous byte was a CR that ended a line.
    after_cr: bool,
    /// Number of BOM bytes matched at the very start of the stream, or
    /// `None` once the start of the stream has been passed.
    bom_matched: Option<usize>,
    /// Data buffer of the pending event (each line followed by `\n`).
    data: String,
    /// Event type buffer of the pending event.
    event_type: String,
    /// `id` given in the pending event.
    event_id: Option<String>,
    /// `retry` given in the pending event.
    event_retry: Option<Duration>,
    /// The stream's last event id (persists across events).
    last_event_id: Option<String>,
    /// The stream's reconnection time (persists across events).
    retry: Option<Duration>,
    failed: Option<SseError>,
}

impl Default for SseDecoder {
    fn default() -> Self {
        Self::new()
    }
}

impl SseDecoder {
    /// A decoder with [`DEFAULT_MAX_EVENT_SIZE`].
    pub fn new() -> Self {
        Self::with_max_event_size(DEFAULT_MAX_EVENT_SIZE)
    }

    /// A decoder whose events (pending lines plus data, in bytes) may not
    /// exceed `max_event_size`. A zero limit admits only empty events.
    pub fn with_max_event_size(max_event_size: usize) -> Self {
        SseDecoder {
            max_event_size,
            line: Vec::new(),
            line_mode: LineMode::Start,
            after_cr: false,
            bom_matched: Some(0),
            data: String::new(),
            event_type: String::new(),
            event_id: None,
            event_retry: None,
            last_event_id: None,
            retry: None,
            failed: None,
        }
    }

    /// The configured maximum event size.
    pub fn max_event_size(&self) -> usize {
        self.max_event_size
    }

    /// Bytes held for the event in progress.
    pub fn buffered_bytes(&self) -> usize {
        self.line.len() + self.data.len() + self.event_type.len()
    }

    /// The last `id:` seen in the stream (it persists across events).
    pub fn last_event_id(&self) -> Option<&str> {
        self.last_event_id.as_deref()
    }

    /// The last valid `retry:` seen in the stream.
    pub fn retry(&self) -> Option<Duration> {
        self.retry
    }

    /// Whether the decoder holds nothing, between two events, if the
    /// stream goes on with byte `next`: no partial line, no field of a
    /// pending event, no CR whose LF may follow, no possible BOM. Bytes
    /// from here up to a blank line may then be decoded without it (the
    /// stream path's relay of canonical events). Settles the start of the
    /// stream when `next` cannot begin a BOM.
    pub(crate) fn idle_before(&mut self, next: u8) -> bool {
        if self.bom_matched == Some(0) && next != BOM[0] {
            self.bom_matched = None;
        }
        self.bom_matched.is_none()
            && self.failed.is_none()
            && self.line_mode == LineMode::Start
            && !self.after_cr
            && self.line.is_empty()
            && self.data.is_empty()
            && self.event_type.is_empty()
            && self.event_id.is_none()
            && self.event_retry.is_none()
    }

    /// Decodes one chunk and appends the completed items to `out`.
    ///
    /// # Errors
    /// [`SseError::EventTooLarge`] when an event outgrows the limit. Items
    /// completed earlier in the same chunk are already in `out`.
    pub fn push(&mut self, chunk: &[u8], out: &mut Vec<SseItem>) -> Result<(), SseError> {
        if let Some(err) = self.failed {
            return Err(err);
        }
        let result = self.push_inner(chunk, out);
        if let Err(err) = result {
            self.failed = Some(err);
        }
        result
    }

    /// Decodes one chunk and returns the completed items.
    ///
    /// # Errors
    /// As [`SseDecoder::push`]; the items completed before the error are
    /// lost with this form.
    pub fn decode(&mut self, chunk: &[u8]) -> Result<Vec<SseItem>, SseError> {
        let mut out = Vec::new();
        self.push(chunk, &mut out)?;
        Ok(out)
    }

    /// Ends the stream.
    ///
    /// Returns `Ok(None)` when the stream ended between events. A stream that
    /// ends inside an event is an error, with one exception: when the
    /// unterminated event is exactly the `[DONE]` sentinel (a provider that
    /// omits the last blank line), it returns `Ok(Some(SseItem::Done))`, since
    /// nothing can be missing after it.
    ///
    /// The decoder is reset afterwards (same limit), ready for a new stream,
    /// unless it had failed.
    ///
    /// # Errors
    /// [`SseError::Truncated`] for a partial event (it is discarded, never
    /// dispatched), or the earlier error of a failed decoder.
    pub fn finish(&mut self) -> Result<Option<SseItem>, SseError> {
        if let Some(err) = self.failed {
            return Err(err);
        }
        // Bytes held back as a possible BOM are an unterminated line too.
        let held_bom = self.bom_matched.unwrap_or(0);
        let partial_line = self.line_mode == LineMode::Field || held_bom > 0;
        let pending_bytes = self.line.len() + self.data.len() + held_bom;
        let result = if !partial_line && self.data.is_empty() {
            Ok(None)
        } else {
            // Apply the unterminated last line, then see whether the pending
            // event is just the sentinel. The line fitted under the limit
            // when it was buffered, so this cannot fail on size; a failure is
            // reported as truncation all the same.
            let applied = if partial_line {
                self.end_field_line()
            } else {
                Ok(())
            };
            let data = self.data.strip_suffix('\n').unwrap_or(&self.data);
            if applied.is_ok() && self.is_default_type() && data.trim() == DONE {
                Ok(Some(SseItem::Done))
            } else {
                Err(SseError::Truncated { pending_bytes })
            }
        };
        *self = Self::with_max_event_size(self.max_event_size);
        result
    }

    fn push_inner(&mut self, chunk: &[u8], out: &mut Vec<SseItem>) -> Result<(), SseError> {
        let mut rest = self.skip_bom(chunk)?;
        while let Some((&first, tail)) = rest.split_first() {
            if self.after_cr {
                self.after_cr = false;
                if first == b'\n' {
                    rest = tail;
                    continue;
                }
            }
            match rest.iter().position(|&b| b == b'\n' || b == b'\r') {
                Some(pos) => {
                    // `pos < rest.len()`, so the split is in bounds.
                    let (content, terminator) = rest.split_at(pos);
                    self.append(content)?;
                    self.after_cr = terminator.first() == Some(&b'\r');
                    rest = terminator.get(1..).unwrap_or_default();
                    self.end_line(out)?;
                }
                None => {
                    self.append(rest)?;
                    rest = &[];
                }
            }
        }
        Ok(())
    }

    /// Strips a UTF-8 BOM at the very start of the stream, even when it is
    /// split across chunks. Bytes that looked like the start of a BOM but
    /// were not are fed back as ordinary bytes.
    fn skip_bom<'a>(&mut self, chunk: &'a [u8]) -> Result<&'a [u8], SseError> {
        let Some(mut matched) = self.bom_matched else {
            return Ok(chunk);
        };
        let mut rest = chunk;
        while let Some((&b, tail)) = rest.split_first() {
            if BOM.get(matched) == Some(&b) {
                matched += 1;
                rest = tail;
                if matched == BOM.len() {
                    self.bom_matched = None;
                    return Ok(rest);
                }
            } else {
                // Not a BOM: replay the bytes held back as the start of the
                // first line (they contain no line terminator).
                self.bom_matched = None;
                self.append(BOM.get(..matched).unwrap_or_default())?;
                return Ok(rest);
            }
        }
        self.bom_matched = Some(matched);
        Ok(rest)
    }

    /// Adds bytes (no terminator among them) to the current line.
    fn append(&mut self, bytes: &[u8]) -> Result<(), SseError> {
        let Some(&first) = bytes.first() else {
            return Ok(());
        };
        if self.line_mode == LineMode::Start {
            self.line_mode = if first == b':' {
                LineMode::Comment
            } else {
                LineMode::Field
            };
        }
        if self.line_mode == LineMode::Comment {
            return Ok(());
        }
        self.ensure_room(bytes.len())?;
        self.line.extend_from_slice(bytes);
        Ok(())
    }

    fn ensure_room(&self, extra: usize) -> Result<(), SseError> {
        if self.buffered_bytes().saturating_add(extra) > self.max_event_size {
            Err(SseError::EventTooLarge {
                limit: self.max_event_size,
            })
        } else {
            Ok(())
        }
    }

    /// A line terminator was seen.
    fn end_line(&mut self, out: &mut Vec<SseItem>) -> Result<(), SseError> {
        let mode = std::mem::replace(&mut self.line_mode, LineMode::Start);
        match mode {
            LineMode::Start => {
                self.dispatch(out);
                Ok(())
            }
            LineMode::Comment => Ok(()),
            LineMode::Field => self.end_field_line(),
        }
    }

    /// Applies the buffered field line and clears it.
    fn end_field_line(&mut self) -> Result<(), SseError> {
        self.line_mode = LineMode::Start;
        let line = std::mem::take(&mut self.line);
        let (name, value) = match line.iter().position(|&b| b == b':') {
            Some(colon) => {
                let (name, rest) = line.split_at(colon);
                // `rest` starts with the colon; drop it and one optional space.
                let value = rest.get(1..).unwrap_or_default();
                (name, value.strip_prefix(b" ").unwrap_or(value))
            }
            None => (line.as_slice(), &[][..]),
        };
        let result = match name {
            b"data" => {
                let value = utf8_lossy(value);
                // The value bytes were counted as part of the line; they now
                // move into `data` with one newline.
                if self.data.len() + value.len() + 1 + self.event_type.len() > self.max_event_size {
                    Err(SseError::EventTooLarge {
                        limit: self.max_event_size,
                    })
                } else {
                    self.data.push_str(&value);
                    self.data.push('\n');
                    Ok(())
                }
            }
            b"event" => {
                // Lossy decoding can grow the value (U+FFFD is 3 bytes), so
                // the limit is checked again on the decoded form.
                let event_type = utf8_lossy(value);
                if self.data.len() + event_type.len() > self.max_event_size {
                    Err(SseError::EventTooLarge {
                        limit: self.max_event_size,
                    })
                } else {
                    self.event_type = event_type.into_owned();
                    Ok(())
                }
            }
            b"id" => {
                if !value.contains(&0) {
                    let id = String::from_utf8_lossy(value).into_owned();
                    self.event_id = Some(id.clone());
                    self.last_event_id = Some(id);
                }
                Ok(())
            }
            b"retry" => {
                if !value.is_empty() && value.iter().all(u8::is_ascii_digit) {
                    // All ASCII digits: valid UTF-8; overflow is ignored.
                    if let Some(ms) = std::str::from_utf8(value)
                        .ok()
                        .and_then(|s| s.parse::<u64>().ok())
                    {
                        let retry = Duration::from_millis(ms);
                        self.retry = Some(retry);
                        self.event_retry = Some(retry);
                    }
                }
                Ok(())
            }
            _ => Ok(()),
        };
        // Reuse the allocation for the next line.
        self.line = line;
        self.line.clear();
        result
    }

    fn is_default_type(&self) -> bool {
        self.event_type.is_empty() || self.event_type == "message"
    }

    /// A blank line: dispatch the pending event, if it has data.
    fn dispatch(&mut self, out: &mut Vec<SseItem>) {
        let event_type = std::mem::take(&mut self.event_type);
        let id = self.event_id.take();
        let retry = self.event_retry.take();
        if self.data.is_empty() {
            return;
        }
        let mut data = std::mem::take(&mut self.data);
        if data.ends_with('\n') {
            data.pop();
        }
        let default_type = event_type.is_empty() || event_type == "message";
        if default_type && data.trim() == DONE {
            out.push(SseItem::Done);
            return;
        }
        out.push(SseItem::Event(SseEvent {
            event: (!event_type.is_empty()).then_some(event_type),
            data,
            id,
            retry,
        }));
    }
}

/// `bytes` as text, invalid sequences replaced by U+FFFD. Valid UTF-8 (the
/// usual case) takes the standard library's fast validation and is
/// borrowed.
fn utf8_lossy(bytes: &[u8]) -> std::borrow::Cow<'_, str> {
    match std::str::from_utf8(bytes) {
        Ok(text) => std::borrow::Cow::Borrowed(text),
        Err(_) => String::from_utf8_lossy(bytes),
    }
}

//! The encoder: events to `text/event-stream` bytes.
//!
//! Data is written one `data:` line per line of the payload (LF, CRLF and
//! CR all count as line breaks, so CR and CRLF come back as LF after
//! decoding). Each field value is written after `": "`, so a leading space
//! survives the decoder's removal of one optional space. Line breaks in an
//! event type or id would break the framing and are removed, as are NUL
//! bytes in an id (the decoder would ignore such an id).

use bytes::Bytes;
use serde::Serialize;

use super::event::{SseEvent, SseItem};

/// The OpenAI end-of-stream frame: `data: [DONE]` and a blank line.
pub const DONE_FRAME: &[u8] = b"data: [DONE]\n\n";

impl SseEvent {
    /// Appends the wire form of the event, blank line included, to `out`.
    pub fn encode_into(&self, out: &mut Vec<u8>) {
        if let Some(event) = &self.event {
            write_field(out, b"event", &single_line(event, false));
        }
        if let Some(id) = &self.id {
            write_field(out, b"id", &single_line(id, true));
        }
        if let Some(retry) = self.retry {
            write_field(out, b"retry", retry.as_millis().to_string().as_bytes());
        }
        for line in split_lines(self.data.as_bytes()) {
            write_field(out, b"data", line);
        }
        out.push(b'\n');
    }

    /// The wire form of the event, blank line included.
    pub fn encode(&self) -> Bytes {
        let mut out = Vec::with_capacity(self.data.len() + 16);
        self.encode_into(&mut out);
        Bytes::from(out)
    }
}

impl SseItem {
    /// The wire form: the event, or [`DONE_FRAME`].
    pub fn encode(&self) -> Bytes {
        match self {
            SseItem::Event(event) => event.encode(),
            SseItem::Done => Bytes::from_static(DONE_FRAME),
        }
    }
}

/// `data: <data>` (one line per line of `data`) and a blank line.
pub fn encode_data(data: &str) -> Bytes {
    let mut out = Vec::with_capacity(data.len() + 8);
    for line in split_lines(data.as_bytes()) {
        write_field(&mut out, b"data", line);
    }
    out.push(b'\n');
    Bytes::from(out)
}

/// `value` as compact JSON in one `data:` event (JSON text never contains a
/// raw line break, so it is always a single line).
///
/// # Errors
/// When `value` cannot be serialised (a map with non-string keys).
pub fn encode_json<T: Serialize + ?Sized>(value: &T) -> Result<Bytes, serde_json::Error> {
    let json = serde_json::to_vec(value)?;
    let mut out = Vec::with_capacity(json.len() + 8);
    write_field(&mut out, b"data", &json);
    out.push(b'\n');
    Ok(Bytes::from(out))
}

/// A comment (`: text`, one per line of `text`) and a blank line: a
/// keep-alive that every decoder ignores.
pub fn encode_comment(text: &str) -> Bytes {
    let mut out = Vec::with_capacity(text.len() + 4);
    for line in split_lines(text.as_bytes()) {
        out.extend_from_slice(b": ");
        out.extend_from_slice(line);
        out.push(b'\n');
    }
    out.push(b'\n');
    Bytes::from(out)
}

fn write_field(out: &mut Vec<u8>, name: &[u8], value: &[u8]) {
    out.extend_from_slice(name);
    out.extend_from_slice(b": ");
    out.extend_from_slice(value);
    out.push(b'\n');
}

/// `value` without CR and LF (and without NUL when `strip_nul`).
fn single_line(value: &str, strip_nul: bool) -> Vec<u8> {
    value
        .bytes()
        .filter(|&b| b != b'\r' && b != b'\n' && !(strip_nul && b == 0))
        .collect()
}

/// Splits on LF, CRLF and CR. An empty input is one empty line; a trailing
/// break yields a trailing empty line (so the decoder restores it).
fn split_lines(bytes: &[u8]) -> Lines<'_> {
    Lines { rest: Some(bytes) }
}

/// The lines of [`split_lines`], without allocating.
struct Lines<'a> {
    /// What is left; `None` once the last line was yielded.
    rest: Option<&'a [u8]>,
}

impl<'a> Iterator for Lines<'a> {
    type Item = &'a [u8];

    fn next(&mut self) -> Option<&'a [u8]> {
        let rest = self.rest?;
        match rest.iter().position(|&b| b == b'\n' || b == b'\r') {
            Some(pos) => {
                // `pos < rest.len()`, so both splits are in bounds.
                let (line, tail) = rest.split_at(pos);
                let skip = if tail.starts_with(b"\r\n") { 2 } else { 1 };
                self.rest = Some(tail.get(skip..).unwrap_or_default());
                Some(line)
            }
            None => {
                self.rest = None;
                Some(rest)
            }
        }
    }
}

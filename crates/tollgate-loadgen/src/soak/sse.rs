//! Reading responses the way a strict client would: a complete one-shot
//! completion, a complete stream (`[DONE]` after well-formed chunks), or
//! an OpenAI-format error with a type (as the HTTP body, or as the one
//! `data: {"error": ...}` event that ends a failed stream).

use bytes::{Buf, BytesMut};
use serde::Deserialize;

/// The `error` object of an OpenAI error body.
#[derive(Debug, Deserialize)]
struct ErrorObject {
    message: String,
    #[serde(rename = "type")]
    kind: String,
    code: Option<String>,
}

#[derive(Debug, Deserialize)]
struct ErrorBody {
    error: ErrorObject,
}

/// A typed error's class, `type/code` (code `-` when absent).
fn error_class(e: &ErrorObject) -> Option<String> {
    (!e.message.is_empty() && !e.kind.is_empty()).then(|| {
        format!(
            "{}/{}",
            e.kind,
            e.code.as_deref().filter(|c| !c.is_empty()).unwrap_or("-")
        )
    })
}

/// The class of a non-2xx body when it is a typed OpenAI error.
pub fn typed_error(body: &[u8]) -> Option<String> {
    let parsed: ErrorBody = serde_json::from_slice(body).ok()?;
    error_class(&parsed.error)
}

/// Whether a 200 one-shot body is a whole chat completion.
pub fn complete_completion(body: &[u8]) -> bool {
    #[derive(Deserialize)]
    struct Choice {
        message: serde_json::Value,
        finish_reason: Option<String>,
    }
    #[derive(Deserialize)]
    struct Completion {
        object: String,
        choices: Vec<Choice>,
    }
    serde_json::from_slice::<Completion>(body).is_ok_and(|c| {
        c.object == "chat.completion"
            && !c.choices.is_empty()
            && c.choices
                .iter()
                .all(|ch| ch.message.is_object() && ch.finish_reason.is_some())
    })
}

/// One streamed chunk: only what the checks need.
#[derive(Debug, Deserialize)]
struct Chunk {
    object: Option<String>,
    error: Option<ErrorObject>,
}

/// What a stream showed so far, fed frame by frame.
#[derive(Debug, Default)]
pub struct StreamReader {
    buf: BytesMut,
    /// Content chunks seen.
    pub chunks: u64,
    /// `data: [DONE]` seen.
    pub done: bool,
    /// The class of the error event, when one came.
    pub error: Option<String>,
    /// What broke the rules, if anything: the first problem only.
    pub malformed: Option<String>,
    /// An error event came after `[DONE]` (a complete stream then
    /// declared failed).
    pub error_after_done: bool,
    /// Body bytes seen.
    pub bytes: u64,
}

impl StreamReader {
    /// Feeds one body frame.
    pub fn feed(&mut self, data: &[u8]) {
        self.bytes += data.len() as u64;
        self.buf.extend_from_slice(data);
        while let Some(end) = find_event_end(&self.buf) {
            let event = self.buf.split_to(end.0);
            self.buf.advance(end.1);
            self.event(&event);
        }
        if self.buf.len() > 1 << 20 && self.malformed.is_none() {
            self.malformed = Some("an SSE event over 1 MiB".into());
            self.buf.clear();
        }
    }

    fn event(&mut self, event: &[u8]) {
        let mut data = Vec::new();
        for line in event.split(|&b| b == b'\n') {
            let line = line.strip_suffix(b"\r").unwrap_or(line);
            if let Some(rest) = line.strip_prefix(b"data:") {
                if !data.is_empty() {
                    data.push(b'\n');
                }
                data.extend_from_slice(rest.strip_prefix(b" ").unwrap_or(rest));
            }
        }
        if data.is_empty() {
            return; // a comment or keep-alive
        }
        if self.done || self.error.is_some() {
            let after = if self.done {
                "[DONE]".to_owned()
            } else {
                format!("the error event ({})", self.error.as_deref().unwrap_or(""))
            };
            let text = String::from_utf8_lossy(&data[..data.len().min(300)]).into_owned();
            if self.done && text.starts_with("{\"error\"") {
                self.error_after_done = true;
            }
            self.problem(&format!("an event after {after}: {text}"));
            return;
        }
        if data == b"[DONE]" {
            self.done = true;
            return;
        }
        // Past the first chunks of a long stream, a chunk is recognised
        // without parsing it (a stalled client drains megabytes of them;
        // the first ones, and every event of an ordinary stream, are
        // parsed in full).
        if self.chunks >= FULLY_PARSED
            && data.starts_with(b"{\"id\":")
            && contains(&data, b"\"object\":\"chat.completion.chunk\"")
            && !contains(&data, b"\"error\"")
        {
            self.chunks += 1;
            return;
        }
        match serde_json::from_slice::<Chunk>(&data) {
            Ok(Chunk { error: Some(e), .. }) => match error_class(&e) {
                Some(class) => self.error = Some(class),
                None => self.problem("an error event without message or type"),
            },
            Ok(Chunk {
                object: Some(o), ..
            }) if o == "chat.completion.chunk" => self.chunks += 1,
            Ok(_) => self.problem("an event that is neither a chunk nor an error"),
            Err(_) => self.problem("an event that is not JSON"),
        }
    }

    fn problem(&mut self, what: &str) {
        if self.malformed.is_none() {
            self.malformed = Some(what.to_owned());
        }
    }

    /// Whether anything is left after the last event separator.
    pub fn has_partial(&self) -> bool {
        !self.buf.is_empty()
    }
}

/// Chunks of a stream parsed as JSON before the fast path takes over.
const FULLY_PARSED: u64 = 64;

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

/// The end of the first event in `buf` and the separator's length.
fn find_event_end(buf: &[u8]) -> Option<(usize, usize)> {
    let mut i = 0;
    while i + 1 < buf.len() {
        if buf[i] == b'\n' {
            if buf[i + 1] == b'\n' {
                return Some((i, 2));
            }
            if buf[i + 1] == b'\r' && buf.get(i + 2) == Some(&b'\n') {
                return Some((i, 3));
            }
        }
        i += 1;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    const CHUNK: &str = r#"data: {"id":"c","object":"chat.completion.chunk","choices":[]}"#;

    #[test]
    fn a_complete_stream_in_odd_frames() {
        let text = format!("{CHUNK}\n\n{CHUNK}\n\ndata: [DONE]\n\n");
        let mut r = StreamReader::default();
        for piece in text.as_bytes().chunks(7) {
            r.feed(piece);
        }
        assert_eq!(r.chunks, 2);
        assert!(r.done && r.error.is_none() && r.malformed.is_none());
        assert!(!r.has_partial());
    }

    #[test]
    fn an_error_event_ends_a_stream_with_its_class() {
        let mut r = StreamReader::default();
        r.feed(CHUNK.as_bytes());
        r.feed(b"\n\ndata: {\"error\":{\"message\":\"cut\",\"type\":\"server_error\",\"code\":\"upstream_error\"}}\n\n");
        assert_eq!(r.error.as_deref(), Some("server_error/upstream_error"));
        assert!(!r.done && r.malformed.is_none());
        r.feed(b"data: [DONE]\n\n");
        assert!(r.malformed.is_some());
    }

    #[test]
    fn typed_and_untyped_bodies() {
        assert_eq!(
            typed_error(br#"{"error":{"message":"m","type":"invalid_request_error","code":null}}"#)
                .as_deref(),
            Some("invalid_request_error/-")
        );
        assert_eq!(typed_error(br#"{"error":"nope"}"#), None);
        assert_eq!(typed_error(b"<html>"), None);
        assert!(complete_completion(
            br#"{"object":"chat.completion","choices":[{"message":{"role":"assistant","content":"x"},"finish_reason":"stop"}]}"#
        ));
        assert!(!complete_completion(
            br#"{"object":"chat.completion","choices":[]}"#
        ));
        let mut r = StreamReader::default();
        r.feed(b"data: {nope}\n\n");
        assert!(r.malformed.is_some());
    }
}

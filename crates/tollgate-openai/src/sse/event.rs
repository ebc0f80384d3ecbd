//! What the decoder produces and the encoder consumes.

use std::time::Duration;

use serde::Serialize;
use serde::de::DeserializeOwned;

/// One item of a decoded stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SseItem {
    /// A dispatched event.
    Event(SseEvent),
    /// The OpenAI end-of-stream sentinel `data: [DONE]` (an event of the
    /// default type whose data, trimmed, is exactly `[DONE]`).
    Done,
}

/// One dispatched server-sent event.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SseEvent {
    /// The `event:` type; `None` when not given (the default `message`).
    pub event: Option<String>,
    /// The data lines joined with `\n` (no trailing newline).
    pub data: String,
    /// The `id:` given inside this event, if any. (The decoder also keeps the
    /// stream's last id: [`super::SseDecoder::last_event_id`].)
    pub id: Option<String>,
    /// The `retry:` given inside this event, if any.
    pub retry: Option<Duration>,
}

impl SseEvent {
    /// An event of the default type carrying `data`.
    pub fn data(data: impl Into<String>) -> Self {
        SseEvent {
            data: data.into(),
            ..Default::default()
        }
    }

    /// An event whose data is `value` as compact JSON.
    ///
    /// # Errors
    /// When `value` cannot be serialised (a map with non-string keys).
    pub fn json<T: Serialize + ?Sized>(value: &T) -> Result<Self, serde_json::Error> {
        serde_json::to_string(value).map(SseEvent::data)
    }

    /// Sets the event type.
    pub fn with_event(mut self, event: impl Into<String>) -> Self {
        self.event = Some(event.into());
        self
    }

    /// Sets the id.
    pub fn with_id(mut self, id: impl Into<String>) -> Self {
        self.id = Some(id.into());
        self
    }

    /// Sets the reconnection time.
    pub fn with_retry(mut self, retry: Duration) -> Self {
        self.retry = Some(retry);
        self
    }

    /// Parses the data as JSON (e.g. a
    /// [`ChatCompletionChunk`](crate::wire::ChatCompletionChunk)).
    ///
    /// # Errors
    /// When the data is not valid JSON for `T`.
    pub fn parse_json<T: DeserializeOwned>(&self) -> Result<T, serde_json::Error> {
        serde_json::from_str(&self.data)
    }
}

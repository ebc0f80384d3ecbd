//! Decoder errors.

/// Why an SSE byte stream could not be decoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum SseError {
    /// One event (its pending lines and data) grew past the configured limit.
    /// The decoder is unusable afterwards: the stream has to be abandoned.
    #[error("server-sent event larger than the {limit}-byte limit")]
    EventTooLarge {
        /// The configured maximum event size in bytes.
        limit: usize,
    },
    /// The byte stream ended inside an event (no terminating blank line).
    /// The partial event was discarded.
    #[error("event stream ended inside an unterminated event ({pending_bytes} bytes discarded)")]
    Truncated {
        /// Bytes of the partial event that were discarded.
        pending_bytes: usize,
    },
}

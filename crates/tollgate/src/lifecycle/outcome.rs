//! How a supervised call ends (SPEC LC-1, LC-2, DL-6, DL-7).

use std::fmt;

use super::breaker::CircuitOpen;
use super::policy::GiveUp;
use super::provider::ProviderError;
use crate::admission::Admission;
use crate::call::CallId;
use crate::clock::Instant;
use crate::deadline::Phase;
use crate::error::AdmissionError;
use crate::usage::Settlement;

/// The terminal states of a call (SPEC LC-1). Terminal states never change.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Terminal {
    /// The provider answered (one-shot) or the stream reached its normal end.
    Completed,
    /// The provider, a hook, the circuit or the call itself failed.
    Failed,
    /// The caller went away (the future or stream was dropped).
    Cancelled,
    /// The deadline passed or the supervisor closed.
    Aborted,
}

impl Terminal {
    /// `completed`, `failed`, `cancelled` or `aborted`.
    pub const fn as_str(self) -> &'static str {
        match self {
            Terminal::Completed => "completed",
            Terminal::Failed => "failed",
            Terminal::Cancelled => "cancelled",
            Terminal::Aborted => "aborted",
        }
    }
}

impl fmt::Display for Terminal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why a supervised call did not complete.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum CallError {
    /// Admission refused the call (queue or pool full, estimate problems,
    /// quota too far away...).
    #[error(transparent)]
    Admission(AdmissionError),
    /// The deadline passed, or cannot be met, in `phase` (SPEC DL-6).
    #[error("deadline exceeded while in phase {phase}")]
    Deadline {
        /// Where the time ran out.
        phase: Phase,
        /// When admission could have succeeded, if known.
        retry_at: Option<Instant>,
    },
    /// The upstream's circuit is open; no attempt was made (SPEC CB-3).
    #[error(transparent)]
    CircuitOpen(#[from] CircuitOpen),
    /// The provider failed and the call gave up (SPEC RT-1..RT-5).
    #[error("provider failed after {attempts} attempt(s) ({}): {error}", gave_up.as_str())]
    Provider {
        /// The last attempt's error, with its rate-limit metadata.
        error: ProviderError,
        /// Attempts made.
        attempts: u32,
        /// Why no further attempt was made.
        gave_up: GiveUp,
    },
    /// A stream failed after its first chunk reached the consumer; it is
    /// never replayed (SPEC LC-3, LC-4).
    #[error("stream failed after output began: {error}")]
    Stream {
        /// What broke.
        error: ProviderError,
    },
    /// A pre- or post-call hook failed.
    #[error("hook failed: {message}")]
    Hook {
        /// What the hook said.
        message: String,
    },
    /// The supervisor was closed (SPEC LC-7).
    #[error("the supervisor is closed")]
    Closed,
}

impl CallError {
    /// The terminal state this error leaves the call in.
    pub fn terminal(&self) -> Terminal {
        match self {
            CallError::Deadline { .. } | CallError::Closed => Terminal::Aborted,
            _ => Terminal::Failed,
        }
    }

    /// The deadline phase, for `Deadline`.
    pub fn phase(&self) -> Option<Phase> {
        match self {
            CallError::Deadline { phase, .. } => Some(*phase),
            _ => None,
        }
    }

    /// A short stable name for metrics and logs.
    pub fn kind(&self) -> &'static str {
        match self {
            CallError::Admission(e) => e.kind(),
            CallError::Deadline { .. } => "deadline_exceeded",
            CallError::CircuitOpen(_) => "circuit_open",
            CallError::Provider { error, .. } | CallError::Stream { error } => error.kind.as_str(),
            CallError::Hook { .. } => "hook",
            CallError::Closed => "closed",
        }
    }
}

impl From<AdmissionError> for CallError {
    fn from(e: AdmissionError) -> Self {
        match e {
            AdmissionError::DeadlineExceeded { phase, retry_at } => {
                CallError::Deadline { phase, retry_at }
            }
            AdmissionError::Closed => CallError::Closed,
            other => CallError::Admission(other),
        }
    }
}

impl From<crate::deadline::DeadlineExceeded> for CallError {
    fn from(e: crate::deadline::DeadlineExceeded) -> Self {
        CallError::Deadline {
            phase: e.phase,
            retry_at: None,
        }
    }
}

/// A one-shot call's result.
#[derive(Debug, Clone, PartialEq)]
pub struct Completed<R> {
    /// The provider's response.
    pub response: R,
    /// Attempts made (1 without retries).
    pub attempts: u32,
    /// How the last attempt's tokens were settled.
    pub settlement: Option<Settlement>,
    /// What the last attempt's admission waited for.
    pub admission: Admission,
    /// The provider's id of the last attempt's request, if it sent one.
    pub request_id: Option<String>,
}

/// What an observer learns about every call once it is terminal and its
/// cleanup is done (SPEC LC-1, RT-7, OBS-3). Never payloads or keys.
#[derive(Debug, Clone, PartialEq)]
pub struct CallReport {
    /// The call's id, if it had one.
    pub id: Option<CallId>,
    /// How it ended.
    pub terminal: Terminal,
    /// The error's stable name, if it failed or was aborted.
    pub error: Option<&'static str>,
    /// The deadline phase, if the deadline ended it.
    pub phase: Option<Phase>,
    /// Attempts made.
    pub attempts: u32,
    /// Chunks delivered to the consumer (streams).
    pub chunks: u64,
}

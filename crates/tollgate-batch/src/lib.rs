//! # tollgate-batch
//!
//! Runs an OpenAI Batch JSONL file (`/v1/chat/completions`,
//! `/v1/embeddings`) against an OpenAI-compatible API at the highest rate
//! its quota allows, resumably (SPEC §12, BATCH-1..6). The `tollgate batch`
//! command is a thin shell over [`run`].
//!
//! * **Input** ([`input`]): the whole file is validated before any request;
//!   each problem has its line number and a stable code. An item whose
//!   estimate is larger than a whole token limit stops the run too
//!   (BATCH-5, Q-3).
//! * **Engine**: one [`tollgate::AdmissionController`] scope with the
//!   configured limits and one [`tollgate::lifecycle::Supervisor`] over the
//!   [`tollgate_openai::HttpProvider`], exactly as the gateway builds them:
//!   retries, deadlines, cooldowns, settlement from `usage`, accounting
//!   profiles and limits learned from headers are the engine's (BATCH-2).
//! * **Workers** (ADM-8): a dispatcher takes a worker slot before it takes
//!   the next item, so at most `concurrency` items are futures at a time;
//!   the rest of the file is plain data.
//! * **Output** ([`output`]): one OpenAI Batch output line per `custom_id`,
//!   appended and handed to the kernel as each item finishes (`--fsync`
//!   also syncs it). Items that fail for good are recorded with their error
//!   class and the run continues (BATCH-5).
//! * **Resume** (BATCH-3): an existing output is read first; a torn last
//!   line is cut off, finished items are skipped, a changed request under
//!   a recorded `custom_id` is reported. A crash costs at most the items in
//!   flight: they are sent again; a finished line is never sent again,
//!   duplicated or corrupted.
//! * **Progress and summary** ([`summary`]): BATCH-4, BATCH-6.
//! * **Traces** (OBS-5): with an OTLP endpoint (`OTEL_EXPORTER_OTLP_ENDPOINT`
//!   or [`BatchConfig::telemetry`]), a span per item and a child per
//!   attempt, as the gateway's (`tollgate-telemetry`).
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod args;
pub mod config;
pub mod input;
pub mod output;
pub mod plot;
mod progress;
mod runner;
mod spool;
pub mod stats;
pub mod summary;
mod trace;

use std::fmt;
use std::path::PathBuf;

pub use args::BatchArgs;
pub use config::{BatchConfig, ErrorClass, ProgressMode, SharedStore, Target};
pub use runner::{DRAIN_GRACE, run};
pub use summary::Summary;

/// Why a run could not start or go on.
#[derive(Debug, thiserror::Error)]
pub enum BatchError {
    /// The input is invalid (nothing was sent).
    #[error("{0}")]
    Input(input::InputErrors),
    /// The output file cannot be used.
    #[error(transparent)]
    Output(#[from] output::OutputError),
    /// A file cannot be read or written.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// What failed.
        source: std::io::Error,
    },
    /// A setting is invalid.
    #[error("configuration: {0}")]
    Config(String),
    /// The HTTP client cannot be built.
    #[error(transparent)]
    Provider(tollgate_openai::provider::BuildError),
}

impl BatchError {
    /// The process exit code: 2 for invalid input, 1 otherwise.
    pub fn exit_code(&self) -> u8 {
        match self {
            BatchError::Input(_) => EXIT_INVALID_INPUT,
            _ => 1,
        }
    }
}

/// Exit code of a run that finished every item (some may be recorded
/// failures).
pub const EXIT_COMPLETE: u8 = 0;
/// Exit code of invalid input: nothing was sent.
pub const EXIT_INVALID_INPUT: u8 = 2;
/// Exit code of a run that stopped early (`--abort-on`, `--deadline`,
/// interrupted, quota out of reach): re-run to resume.
pub const EXIT_STOPPED: u8 = 3;

/// Why a run stopped before every item had a result.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StopReason {
    /// An item failed with a class named by `--abort-on`.
    AbortOn {
        /// The class.
        class: ErrorClass,
        /// The item.
        custom_id: String,
    },
    /// The run's `--deadline` passed.
    Deadline,
    /// The next item could not be admitted within `--item-timeout` (the
    /// quota is spent for longer, e.g. a daily limit).
    QuotaWait {
        /// Where the wait was.
        phase: tollgate::Phase,
    },
    /// Interrupted (Ctrl-C).
    Interrupted,
    /// The output could not be written.
    Output(String),
    /// The input file changed (or became unreadable) during the run.
    InputChanged(String),
    /// The shared quota store (`--redis`) did not answer and
    /// `--redis-unavailable fail_closed` is in force (SPEC DQ-3).
    QuotaStoreUnavailable,
    /// An item needs more than a whole limit learned from the provider's
    /// headers and confirmed by two of its answers (SPEC Q-14): it can
    /// never be sent under that limit. Nothing is recorded for it.
    ExceedsLearnedLimit {
        /// The item.
        custom_id: String,
        /// The engine's account: the demand, the limit and its window.
        message: String,
    },
    /// `--budget` is spent (SPEC BUD-6): the next item's worst case does
    /// not fit what is left, and no item in flight can give any back.
    Budget {
        /// The budget, in micro-dollars.
        budget: u64,
        /// The item that did not fit.
        custom_id: String,
    },
}

impl fmt::Display for StopReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StopReason::AbortOn { class, custom_id } => write!(
                f,
                "--abort-on {class}: item `{}` failed with {class}",
                input::printable(custom_id)
            ),
            StopReason::Deadline => f.write_str("the run's --deadline passed"),
            StopReason::QuotaWait { phase } => write!(
                f,
                "the quota cannot admit the next item within --item-timeout (waiting in phase {phase}); re-run later to resume"
            ),
            StopReason::Interrupted => f.write_str("interrupted"),
            StopReason::Output(e) => write!(
                f,
                "cannot write the output: {e}; re-run to resume (items without a line run again)"
            ),
            StopReason::InputChanged(e) => f.write_str(e),
            StopReason::QuotaStoreUnavailable => f.write_str(
                "the shared quota store (--redis) is unavailable; re-run to resume, or use --redis-unavailable fail_open_local:N",
            ),
            StopReason::Budget { budget, custom_id } => write!(
                f,
                "the --budget of ${} is spent: the worst-case cost of item `{}` does not fit what \
                 is left; the items sent so far are recorded, re-run with the budget you give the \
                 rest to resume",
                tollgate::price::format_usd(*budget),
                input::printable(custom_id)
            ),
            StopReason::ExceedsLearnedLimit { custom_id, message } => write!(
                f,
                "item `{}` can never be sent: {message}, the limit the provider's x-ratelimit-limit-* headers advertised in two answers; lower its max_tokens, or state the limits (--tpm, --limit), and re-run to resume",
                input::printable(custom_id)
            ),
        }
    }
}

/// How a run ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Every item has a result.
    Complete,
    /// `--dry-run`: nothing was sent.
    DryRun,
    /// Stopped early; a re-run resumes.
    Stopped(StopReason),
}

impl Outcome {
    /// `complete`, `dry_run` or `stopped`.
    pub const fn as_str(&self) -> &'static str {
        match self {
            Outcome::Complete => "complete",
            Outcome::DryRun => "dry_run",
            Outcome::Stopped(_) => "stopped",
        }
    }

    /// The process exit code.
    pub const fn exit_code(&self) -> u8 {
        match self {
            Outcome::Complete | Outcome::DryRun => EXIT_COMPLETE,
            Outcome::Stopped(_) => EXIT_STOPPED,
        }
    }
}

/// The result of [`run`].
#[derive(Debug, Clone)]
pub struct Report {
    /// The summary.
    pub summary: Summary,
    /// How it ended.
    pub outcome: Outcome,
    /// Reports asked for (`--summary-json`, `--plot`) that could not be
    /// written at the end, each with its path and cause. The results are
    /// recorded all the same; [`Report::exit_code`] tells it.
    pub report_errors: Vec<String>,
}

impl Report {
    /// The process's exit code: the outcome's, or 1 when a run that
    /// completed could not write a report it was asked for (a stopped
    /// run keeps its 3: resuming it matters more).
    pub fn exit_code(&self) -> u8 {
        match self.outcome.exit_code() {
            EXIT_COMPLETE if !self.report_errors.is_empty() => 1,
            code => code,
        }
    }
}

//! Typed admission errors (SPEC ADM, DL-6, Q-3, Q-11).

use std::time::Duration;

use crate::call::{CallId, PoolId, ScopeId};
use crate::clock::Instant;
use crate::deadline::{DeadlineExceeded, Phase};
use crate::quota::Dimension;

/// A demand larger than a whole limit: waiting cannot make it fit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("a demand of {demand} {} exceeds the whole limit of {limit} per {window:?}", dimension.as_str())]
pub struct ExceedsLimit {
    /// The dimension of the limit.
    pub dimension: Dimension,
    /// What the attempt asked for.
    pub demand: u64,
    /// The limit's amount.
    pub limit: u64,
    /// The limit's window.
    pub window: Duration,
}

/// Why a call was not admitted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum AdmissionError {
    /// The controller is closed (SPEC LC-7).
    #[error("admission is closed")]
    Closed,
    /// The id is already queued or active (SPEC ADM-6).
    #[error("{0} is already queued or active")]
    Conflict(CallId),
    /// The scope's waiting queue is full and the overflow policy is `reject`
    /// (SPEC ADM-5).
    #[error("the waiting queue of {scope} is full")]
    QueueFull {
        /// The scope.
        scope: ScopeId,
    },
    /// The deadline passed, or cannot be met, in `phase` (SPEC DL-6, Q-11).
    #[error("deadline exceeded while in phase {phase}")]
    DeadlineExceeded {
        /// Where the time ran out (or would have).
        phase: Phase,
        /// When the call could have been admitted, when known: a retry hint.
        retry_at: Option<Instant>,
    },
    /// The earliest admission lies further away than `max_wait` (SPEC Q-11).
    #[error("quota would be available only after {wait:?}, more than max_wait {max_wait:?}")]
    QuotaWaitTooLong {
        /// When it could be admitted.
        ready_at: Instant,
        /// How far away that is.
        wait: Duration,
        /// The configured bound.
        max_wait: Duration,
    },
    /// A cost limit (a budget, SPEC BUD-4) cannot take the call's worst
    /// case before its deadline or `max_wait`: refused at once, before any
    /// provider work. `retry_at` is when the budget's window frees enough
    /// room, if nothing else is admitted meanwhile.
    #[error("{scope} has no budget left for this call until its window frees room")]
    BudgetExceeded {
        /// The scope whose cost limit bound it.
        scope: ScopeId,
        /// When the call could fit, when known: a retry hint.
        retry_at: Option<Instant>,
    },
    /// The estimate exceeds a whole per-window limit (SPEC Q-3).
    #[error(transparent)]
    EstimateExceedsLimit(#[from] ExceedsLimit),
    /// The scope has a token limit but the call carries no estimate.
    #[error("{scope} has a token limit, so every attempt needs a token estimate")]
    TokenEstimateRequired {
        /// The scope.
        scope: ScopeId,
    },
    /// The scope has a cost limit but the call carries no price (SPEC
    /// BUD-1): a budget never counts a call as free.
    #[error("{scope} has a cost limit, so every attempt needs a price")]
    PriceRequired {
        /// The scope.
        scope: ScopeId,
    },
    /// The estimator failed or returned an invalid estimate (SPEC Q-3).
    #[error("token estimation failed: {reason}")]
    TokenEstimationFailed {
        /// What went wrong (never the prompt).
        reason: String,
    },
    /// The call names a scope this controller does not have.
    #[error("{0} is not a scope of this controller")]
    UnknownScope(ScopeId),
    /// The call names a pool this controller does not have.
    #[error("{0} is not a pool of this controller")]
    UnknownPool(PoolId),
    /// The pool's waiting bound is reached (SPEC POOL-3).
    #[error("the waiting line of {pool} is full")]
    PoolFull {
        /// The pool.
        pool: PoolId,
    },
    /// The scope's shared quota store does not answer and the scope fails
    /// closed (SPEC DQ-3): refused at once, without waiting (the gateway
    /// answers 503). Retryable once the store is back.
    #[error("the quota store of {scope} is unavailable")]
    QuotaStoreUnavailable {
        /// The scope.
        scope: ScopeId,
    },
}

impl AdmissionError {
    /// The deadline phase, for `DeadlineExceeded`.
    pub fn phase(&self) -> Option<Phase> {
        match self {
            AdmissionError::DeadlineExceeded { phase, .. } => Some(*phase),
            _ => None,
        }
    }

    /// Whether the error is about the configuration or the item itself, so
    /// retrying the same call cannot help (SPEC Q-3, CFG-3).
    pub fn is_configuration(&self) -> bool {
        matches!(
            self,
            AdmissionError::EstimateExceedsLimit(_)
                | AdmissionError::TokenEstimateRequired { .. }
                | AdmissionError::PriceRequired { .. }
                | AdmissionError::TokenEstimationFailed { .. }
                | AdmissionError::UnknownScope(_)
                | AdmissionError::UnknownPool(_)
        )
    }

    /// When admission could succeed, if known (for `retry-after`).
    pub fn retry_at(&self) -> Option<Instant> {
        match self {
            AdmissionError::DeadlineExceeded { retry_at, .. } => *retry_at,
            AdmissionError::QuotaWaitTooLong { ready_at, .. } => Some(*ready_at),
            AdmissionError::BudgetExceeded { retry_at, .. } => *retry_at,
            _ => None,
        }
    }

    /// A short stable name for metrics and logs.
    pub const fn kind(&self) -> &'static str {
        match self {
            AdmissionError::Closed => "closed",
            AdmissionError::Conflict(_) => "conflict",
            AdmissionError::QueueFull { .. } => "queue_full",
            AdmissionError::DeadlineExceeded { .. } => "deadline_exceeded",
            AdmissionError::QuotaWaitTooLong { .. } => "quota_wait_too_long",
            AdmissionError::BudgetExceeded { .. } => "budget_exceeded",
            AdmissionError::EstimateExceedsLimit(_) => "estimate_exceeds_limit",
            AdmissionError::TokenEstimateRequired { .. } => "token_estimate_required",
            AdmissionError::PriceRequired { .. } => "price_required",
            AdmissionError::TokenEstimationFailed { .. } => "token_estimation_failed",
            AdmissionError::UnknownScope(_) => "unknown_scope",
            AdmissionError::UnknownPool(_) => "unknown_pool",
            AdmissionError::PoolFull { .. } => "pool_full",
            AdmissionError::QuotaStoreUnavailable { .. } => "quota_store_unavailable",
        }
    }
}

impl From<DeadlineExceeded> for AdmissionError {
    fn from(e: DeadlineExceeded) -> Self {
        AdmissionError::DeadlineExceeded {
            phase: e.phase,
            retry_at: None,
        }
    }
}

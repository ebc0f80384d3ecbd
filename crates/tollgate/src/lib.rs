//! # tollgate
//!
//! One admission, deadline and resilience engine for calls to rate-limited
//! LLM APIs: request and token quotas that are never exceeded, a bounded
//! FIFO queue, concurrency limits, and one absolute deadline that bounds
//! every phase of a call.
//!
//! The engine has no HTTP in it; the OpenAI wire layer, the gateway and the
//! batch runner are thin shells over it. Rule IDs in the docs (`Q-7`, `DL-6`)
//! refer to the project's behaviour specification.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod admission;
mod call;
pub mod clock;
pub mod config;
mod deadline;
mod error;
pub mod estimate;
mod flow;
mod in_flight;
pub mod lifecycle;
pub mod price;
pub mod quota;
mod sync;
#[cfg(feature = "tower")]
pub mod tower;
mod usage;

pub use admission::{
    Acquire, Admission, AdmissionController, CallClaim, ControllerBuilder, CooldownOutcome,
    FlowSnapshot, Lease, Pool, PoolPermit, PoolSnapshot, Reconfiguration, SavedQuota,
    ScopeCounters, ScopeSnapshot, Snapshot, StoreMode,
};
pub use call::{Call, CallId, PoolId, ScopeId, TokenEstimate};
pub use deadline::{Deadline, DeadlineExceeded, Phase};
pub use error::{AdmissionError, ExceedsLimit};
pub use estimate::{CharRatioEstimator, EstimateError, TokenEstimator};
pub use flow::{Flow, Priority, UnknownPriority};
pub use price::{Parts, Price, ReservePrice};
pub use quota::{BudgetReport, Dimension, LimitSnapshot, LimitedBy, Observed, RefusalCost};
pub use usage::{AlreadySettled, CostSettlement, Counter, Settlement, Usage};

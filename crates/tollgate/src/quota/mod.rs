//! Request and token quotas (SPEC §4).
//!
//! A scope has any number of limits, each a (dimension, amount, window)
//! counted by one of three algorithms; a demand takes one request unit and
//! its estimated tokens from every limit at once, or nothing. A token limit
//! counts input plus output, or only input, or only output (SPEC Q-12).

mod bucket;
mod calendar;
mod demand;
mod fixed;
mod limit;
mod local;
mod others;
mod remote;
mod saved;
mod sent;
mod sliding;
mod store;

/// Nanoseconds since a scope's epoch: the quota arithmetic's time unit.
pub(crate) type Nanos = u64;

pub use demand::{
    Actual, BudgetReport, Demand, Dimension, Hold, LimitedBy, NotUntil, Observed, RefusalCost,
    Reservation,
};
pub use local::LocalQuota;
pub use remote::{
    ForeignSettlement, HoldId, OpId, RemoteBackend, RemoteHold, RemoteQuota, SharedRemote,
    StoreError, StoreFuture, Unavailable,
};
pub use saved::{Counted, SavedLimit, SavedScope};
pub use store::{LimitSnapshot, LocalBackend, QuotaBackend, QuotaStore, SharedBackend};

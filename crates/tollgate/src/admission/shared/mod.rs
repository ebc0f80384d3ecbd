//! Scopes whose quota lives in a store shared by several processes
//! (SPEC DQ-1..DQ-5).
//!
//! A controller built with
//! [`ControllerBuilder::shared_store`](crate::ControllerBuilder::shared_store)
//! opens every scope's [`RemoteQuota`](crate::quota::RemoteQuota). What
//! belongs to one process stays local (concurrency permits, call ids,
//! close and idle, counters); the quota is the store's, and so are what a
//! provider's budget reports teach and the cooldown after a provider 429
//! (SPEC DQ-9: `settle.rs` sends them, each replica also keeps its own
//! cooldown, aligned with the store's answer). Admission of
//! a shared scope runs through [`SharedAcquire`] (one round trip per call
//! on the fast path), settlement through detached, bounded round trips
//! (`settle.rs`), and while the store is unavailable the scope fails
//! closed or falls back to a local share (`fallback.rs`, DQ-3).

mod acquire;
mod detached;
mod fallback;
mod scope;
mod settle;

pub(crate) use acquire::SharedAcquire;
pub(crate) use fallback::FallbackQuota;
pub(crate) use scope::SharedScope;
pub use scope::StoreMode;
pub(crate) use settle::{RemoteLease, cool_down};

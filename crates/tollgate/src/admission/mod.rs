//! Admission: the controller, its leases and snapshots (SPEC §3).

mod acquire;
mod claim;
mod controller;
mod idle;
mod lease;
mod permits;
#[cfg(test)]
mod permits_tests;
mod pool;
mod pools;
mod queue;
mod scope;
mod snapshot;

pub use acquire::Acquire;
pub use claim::CallClaim;
pub use controller::{AdmissionController, ControllerBuilder, CooldownOutcome};
pub use lease::{Admission, Lease};
pub use pool::{Pool, PoolAcquire, PoolPermit};
pub use scope::ScopeCounters;
pub use snapshot::{PoolSnapshot, ScopeSnapshot, Snapshot};

//! Admission: the controller, its leases and snapshots (SPEC §3).

mod acquire;
mod controller;
mod lease;
mod permits;
mod pool;
mod pools;
mod queue;
mod scope;
mod snapshot;

pub use acquire::Acquire;
pub use controller::{AdmissionController, ControllerBuilder, CooldownOutcome};
pub use lease::{Admission, Lease};
pub use pool::{Pool, PoolAcquire, PoolPermit};
pub use scope::ScopeCounters;
pub use snapshot::{PoolSnapshot, ScopeSnapshot, Snapshot};

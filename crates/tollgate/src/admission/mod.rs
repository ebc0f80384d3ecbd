//! Admission: the controller, its leases and snapshots (SPEC §3).

mod acquire;
mod builder;
mod claim;
mod controller;
mod cooldown;
mod fair;
mod forecast;
mod idle;
mod lease;
mod permits;
#[cfg(test)]
mod permits_tests;
mod pool;
mod pool_set;
mod queue;
mod reconfigure;
mod saved;
mod scope;
mod settings;
mod settle;
mod shared;
mod shutdown;
mod snapshot;

pub use acquire::Acquire;
pub use builder::ControllerBuilder;
pub use claim::CallClaim;
pub use controller::AdmissionController;
pub use cooldown::CooldownOutcome;
pub use forecast::Forecast;
pub use lease::{Admission, Lease};
pub use pool::{Pool, PoolAcquire, PoolPermit};
pub use reconfigure::Reconfiguration;
pub use saved::SavedQuota;
pub use scope::ScopeCounters;
pub use shared::StoreMode;
pub use snapshot::{FlowSnapshot, PoolSnapshot, ScopeSnapshot, Snapshot};

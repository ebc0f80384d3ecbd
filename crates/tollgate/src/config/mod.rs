//! Validated configuration (SPEC §1).
//!
//! Every limit is either unset (unlimited) or a positive integer; zero is an
//! error naming the field, never a silent "unlimited" (CFG-1).

mod calendar;
mod controller;
mod error;
mod quota;

pub use calendar::{Calendar, Period, UnknownZone, Zone};
pub use controller::{ControllerConfig, CooldownConfig, Overflow, PoolConfig};
pub use error::ConfigError;
pub(crate) use error::non_zero;
pub use quota::{Algorithm, DAY, DEFAULT_MIN_SHARE, Limit, MINUTE, ScopeConfig};

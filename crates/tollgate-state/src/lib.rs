//! tollgate's state file: the quota state of long windows kept across
//! restarts in an embedded SQLite database (SPEC DQ-8).
//!
//! The engine hands out what each in-process scope counts
//! ([`AdmissionController::save_quota`](tollgate::AdmissionController::save_quota))
//! and takes it back after a restart; this crate keeps it in
//! `<state_dir>/tollgate-state.sqlite3` (WAL mode), one row per saved
//! limit, keyed by an owner (the controller's role, e.g. `upstream` or
//! `tenant:<name>`), the scope's name and the limit's identity (dimension
//! by name, window, calendar period and zone). Scopes kept in a shared
//! store (Redis) are never written: the store holds them.
//!
//! Which limits are kept: [`keep`]. What a crash can lose: what changed
//! since the last successful [`StateFile::save`] (the caller saves on an
//! interval; see docs/operations.md).
#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod codec;
mod error;
mod file;

pub use error::StateError;
pub use file::{FILE_NAME, LOCK_NAME, OnUnreadable, StateFile, keep};

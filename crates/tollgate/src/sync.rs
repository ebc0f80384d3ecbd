//! The synchronisation primitives of the lock-free permit code.
//!
//! `admission/permits.rs` takes its atomics and its mutex from here, so the
//! loom model (`tests/loom_permits.rs`) can compile the same file against
//! loom's instrumented versions and check every interleaving of its
//! hand-over (see docs/design.md, "Concurrency").

pub(crate) use parking_lot::Mutex;
pub(crate) use std::sync::atomic::{AtomicUsize, Ordering};

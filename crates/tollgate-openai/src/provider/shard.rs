//! Thread shards of the upstream connection pools.
//!
//! A pooled connection's socket is registered with the reactor of the
//! runtime that opened it, and hyper's pooling client runs each connection
//! in a task of that runtime. A thread that runs a single-threaded runtime
//! serving its own client connections (the gateway's connection threads)
//! is pinned to a shard of its own: its one-shot and stream requests then
//! use only connections that thread opened, so no upstream exchange wakes
//! another thread. Threads of a work-stealing runtime share one reactor
//! and keep shard 0.

use std::cell::Cell;

/// Shards `1..=MAX_SHARDS` get connections of their own; a larger shard
/// shares those of shard 0 (correct, only without the thread affinity).
pub(super) const MAX_SHARDS: usize = 256;

thread_local! {
    /// This thread's shard: 0 unless pinned.
    static SHARD: Cell<usize> = const { Cell::new(0) };
}

/// Gives the calling thread's upstream requests (one-shot and stream)
/// connections of their own (shard `shard`, non-zero, at most 256), for a
/// thread that runs a single-threaded runtime serving its own connections:
/// a pooled connection is registered with the reactor of the thread that
/// opened it (and, for one-shot calls, driven by a task of that thread's
/// runtime), so using it from another thread would make every upstream
/// exchange a cross-thread wake-up. Threads of a work-stealing runtime
/// share one reactor and keep shard 0.
pub fn pin_to_thread(shard: usize) {
    SHARD.with(|s| s.set(shard));
}

/// The calling thread's shard.
pub(super) fn current() -> usize {
    SHARD.with(Cell::get)
}

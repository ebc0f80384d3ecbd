//! The tokio runtime every future of the package runs on.
//!
//! Futures are polled on the thread that awaits them (an event loop's
//! thread, or a thread blocked in a `*_blocking` call); the runtime's worker
//! threads drive the timers and sockets those futures wait on, and run the
//! few background tasks the engine spawns (a stream's watchdog, a shared
//! store's connection, the simulator's server).

use tokio::runtime::{EnterGuard, Handle, Runtime};

/// This process's runtime (multi-threaded, built on first use; a child
/// made by `fork()` builds its own: `process.rs`).
pub(crate) fn runtime() -> &'static Runtime {
    crate::process::current().runtime()
}

/// A handle to the runtime.
pub(crate) fn handle() -> &'static Handle {
    runtime().handle()
}

/// Enters the runtime's context on this thread, so a future polled here
/// can create timers and spawn tasks.
pub(crate) fn enter() -> EnterGuard<'static> {
    handle().enter()
}

//! Connection threads (`server.connection_threads`): each a single-threaded
//! runtime serving the connections handed to it, nothing stolen between
//! them.
//!
//! On tokio's work-stealing runtime a worker that parked is woken whenever
//! another one queues work, and at a moderate request rate those wake-ups
//! cost more CPU than the requests (BENCHMARKS.md, "Worker threads").
//! Here a connection, and every task its requests spawn, stays on the
//! thread it was handed to, as with nginx's worker processes; the accept
//! loop hands connections out in turn. The engine's state is shared by all
//! threads as before.
//!
//! The threads end when the pool is dropped: each drops its runtime, and
//! with it the tasks still on it (the server drops its remaining
//! connections at that point anyway).

use std::future::Future;
use std::io;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::thread::JoinHandle;

use tokio::runtime::Handle;
use tokio_util::sync::CancellationToken;

/// The connection threads of one server.
#[derive(Debug)]
pub struct ConnectionThreads {
    handles: Vec<Handle>,
    threads: Vec<JoinHandle<()>>,
    next: AtomicUsize,
    stop: CancellationToken,
}

impl ConnectionThreads {
    /// Starts `count` threads (at least one), each running a
    /// single-threaded runtime with I/O and time enabled.
    ///
    /// # Errors
    /// When a thread or its runtime cannot be created.
    pub fn start(count: usize) -> io::Result<Self> {
        let stop = CancellationToken::new();
        let mut handles = Vec::with_capacity(count.max(1));
        let mut threads = Vec::with_capacity(count.max(1));
        for i in 0..count.max(1) {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            handles.push(runtime.handle().clone());
            let stop = stop.clone();
            let thread = std::thread::Builder::new()
                .name(format!("tollgate-conn-{i}"))
                .spawn(move || runtime.block_on(stop.cancelled()))?;
            threads.push(thread);
        }
        Ok(ConnectionThreads {
            handles,
            threads,
            next: AtomicUsize::new(0),
            stop,
        })
    }

    /// Runs the future `make` returns on the next thread in turn. `make`
    /// runs on that thread, inside its runtime (so a socket can be
    /// registered with that runtime's reactor there).
    pub fn spawn<F, Fut>(&self, make: F)
    where
        F: FnOnce() -> Fut + Send + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let i = self.next.fetch_add(1, Ordering::Relaxed) % self.handles.len().max(1);
        if let Some(handle) = self.handles.get(i) {
            handle.spawn(async move { make().await });
        }
    }
}

impl Drop for ConnectionThreads {
    /// Stops every thread; each drops its runtime and the tasks still on
    /// it. Not waited for (this may run on a runtime thread).
    fn drop(&mut self) {
        self.stop.cancel();
        self.threads.clear();
    }
}

//! Connection threads (`server.connection_threads`): each a single-threaded
//! runtime serving the connections handed to it, nothing stolen between
//! them.
//!
//! On tokio's work-stealing runtime a worker that parked is woken whenever
//! another one queues work, and at a moderate request rate those wake-ups
//! cost more CPU than the requests (BENCHMARKS.md, "Worker threads").
//! Here a client connection, and every task its requests spawn, stays on
//! the thread it was handed to, as with nginx's worker processes; the
//! accept loop hands connections out in turn. The engine's state is shared
//! by all threads as before. Each thread keeps its own upstream
//! connections, stream and one-shot (`tollgate_openai::provider::pin_to_thread`):
//! a socket is registered with the reactor of the thread that opened it
//! (and a one-shot connection is driven by a task of that thread's
//! runtime), and reusing it from another would make every upstream
//! exchange a cross-thread wake-up.
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
    ///
    /// Each runtime is built on its own thread and dropped there, never on
    /// the caller's (which may be a runtime thread, where dropping a
    /// runtime is not allowed). On an error the threads already started
    /// are stopped.
    pub fn start(count: usize) -> io::Result<Self> {
        let mut pool = ConnectionThreads {
            handles: Vec::with_capacity(count.max(1)),
            threads: Vec::with_capacity(count.max(1)),
            next: AtomicUsize::new(0),
            stop: CancellationToken::new(),
        };
        for i in 0..count.max(1) {
            let (tx, rx) = std::sync::mpsc::channel();
            let stop = pool.stop.clone();
            let thread = std::thread::Builder::new()
                .name(format!("tollgate-conn-{i}"))
                .spawn(move || {
                    tollgate_openai::provider::pin_to_thread(i + 1);
                    let runtime = match tokio::runtime::Builder::new_current_thread()
                        .enable_all()
                        .build()
                    {
                        Ok(runtime) => runtime,
                        Err(e) => {
                            let _ = tx.send(Err(e));
                            return;
                        }
                    };
                    let _ = tx.send(Ok(runtime.handle().clone()));
                    runtime.block_on(stop.cancelled());
                })?;
            pool.threads.push(thread);
            // Dropping `pool` on an error stops the threads started so far.
            let handle = rx
                .recv()
                .map_err(|_| io::Error::other("a connection thread ended at start"))??;
            pool.handles.push(handle);
        }
        Ok(pool)
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

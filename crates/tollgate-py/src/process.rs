//! What belongs to one process: the tokio runtime, the notifier thread and
//! its lock, and the marker of the process an object was made in.
//!
//! `fork()` copies memory but only the forking thread: a child made after
//! the package was used would inherit a runtime with no worker threads and
//! a notifier whose thread never runs, and every wait there would hang.
//! So the package keeps one [`Process`] slot per fork depth: an
//! `os.register_at_fork(after_in_child=...)` hook, registered at module
//! load, moves the child to the next slot, which nothing has touched (no
//! lock in it can be held by a thread the child lacks). The slot's runtime
//! and notifier start on first use in the child.
//!
//! An object made in another process (a limiter made before the fork) is
//! refused with `RuntimeError` ([`Made::check`]) and never dropped in the
//! child ([`Made::leak_unless_here`]): its state may be locked by threads
//! the child lacks, and its sockets are the parent's.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::Sender;
use std::sync::{Arc, Mutex, OnceLock};

use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use pyo3::types::PyDict;
use tokio::runtime::Runtime;

use crate::notifier::Job;

/// How many nested forks get a process of their own (a child of a child
/// of ... up to this depth); deeper children cannot make objects.
const DEPTHS: usize = 16;

/// One process's runtime and notifier.
pub(crate) struct Process {
    /// The tokio runtime, built on first use.
    runtime: OnceLock<Runtime>,
    /// The notifier thread's queue, its thread started on first use.
    pub(crate) notifier: OnceLock<Mutex<Sender<Job>>>,
    /// Held by the notifier thread while it may be in Python (see
    /// `notifier.rs`).
    pub(crate) in_python: Mutex<()>,
}

impl Process {
    const fn new() -> Self {
        Process {
            runtime: OnceLock::new(),
            notifier: OnceLock::new(),
            in_python: Mutex::new(()),
        }
    }

    /// This process's runtime (multi-threaded, timers and sockets on),
    /// built on first use.
    pub(crate) fn runtime(&self) -> &Runtime {
        self.runtime.get_or_init(|| {
            tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .thread_name("tollgate-runtime")
                .build()
                .expect("the tokio runtime starts")
        })
    }
}

/// How many forks this process is below the one that loaded the module.
static DEPTH: AtomicUsize = AtomicUsize::new(0);

static PROCESSES: [Process; DEPTHS] = [const { Process::new() }; DEPTHS];

/// This process's slot (the deepest one for a child beyond [`DEPTHS`],
/// which [`Made::here`] refuses to make objects in).
pub(crate) fn current() -> &'static Process {
    &PROCESSES[DEPTH.load(Ordering::Acquire).min(DEPTHS - 1)]
}

/// Whether this process is forked deeper than the slots go (it can make
/// no object, so no notifier thread of its own runs).
pub(crate) fn overflowed() -> bool {
    DEPTH.load(Ordering::Acquire) >= DEPTHS
}

/// The process an object was made in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Made(usize);

impl Made {
    /// This process, or `RuntimeError` in a child forked more than
    /// [`DEPTHS`] - 1 times deep.
    pub(crate) fn here() -> PyResult<Made> {
        let depth = DEPTH.load(Ordering::Acquire);
        if depth >= DEPTHS {
            return Err(PyRuntimeError::new_err(format!(
                "tollgate works in processes up to {} fork()s deep; this one is {depth} deep",
                DEPTHS - 1
            )));
        }
        Ok(Made(depth))
    }

    /// This process, unchecked (for what a checked object makes).
    pub(crate) fn current() -> Made {
        Made(DEPTH.load(Ordering::Acquire))
    }

    /// Whether this is the current process.
    pub(crate) fn is_here(self) -> bool {
        self.0 == DEPTH.load(Ordering::Acquire)
    }

    /// `Ok` in the process the object was made in, else a `RuntimeError`
    /// naming `what`.
    pub(crate) fn check(self, what: &str) -> PyResult<()> {
        if self.is_here() {
            Ok(())
        } else {
            Err(PyRuntimeError::new_err(format!(
                "this {what} was made in another process (before fork()); \
                 make a new {what} in this process"
            )))
        }
    }

    /// In a process other than the one it was made in, keeps what
    /// `shared` points to from ever being dropped (one reference is
    /// leaked) and returns `true`: the owner's `Drop` then leaves it alone.
    pub(crate) fn keeps<T>(self, shared: &Arc<T>) -> bool {
        if self.is_here() {
            return false;
        }
        std::mem::forget(Arc::clone(shared));
        true
    }

    /// Drops `value` inside this process's runtime (its drop may start
    /// runtime tasks: a store round trip, a server's shutdown), or never
    /// in a process other than the one it was made in.
    pub(crate) fn drop_here<T>(self, value: T) {
        if self.is_here() {
            let _runtime = crate::runtime::enter();
            drop(value);
        } else {
            std::mem::forget(value);
        }
    }
}

/// The `after_in_child` fork hook: this process is one fork deeper.
#[pyfunction]
fn forked() {
    DEPTH.fetch_add(1, Ordering::AcqRel);
}

/// Registers [`forked`] with `os.register_at_fork` (at module load).
pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    let kwargs = PyDict::new(py);
    kwargs.set_item("after_in_child", wrap_pyfunction!(forked, m)?)?;
    py.import("os")?
        .call_method("register_at_fork", (), Some(&kwargs))?;
    Ok(())
}

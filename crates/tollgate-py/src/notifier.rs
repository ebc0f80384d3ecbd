//! One thread that does Python work for code that must not take the GIL
//! itself (SPEC PY-2): a waker called under an engine lock, a future
//! dropped on a tokio worker thread.
//!
//! Jobs are taken in batches under one GIL acquisition. Every job acts on
//! an object's own event loop through `call_soon_threadsafe`, so nothing
//! runs on a loop from a foreign thread; a loop that has closed makes that
//! call raise, and the error is dropped: a late job prints nothing.
//!
//! Once the interpreter begins to exit (an `atexit` callback, registered
//! when the module is loaded), the thread takes the GIL no more: a wake
//! that fires during finalization (a timer, a store's reply) would take it
//! from a thread Python no longer lets in, and abort the process. Jobs
//! that arrive after that are dropped without touching Python: every loop
//! they would act on has stopped.

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, channel};

use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;

use crate::process::Process;

/// Python work for the notifier thread.
pub(crate) enum Job {
    /// Resolve an asyncio future (an awaiting task's wake), unless done.
    Wake(Py<PyAny>),
    /// Cancel an asyncio task (an awaited Python call whose Rust side went
    /// away).
    Cancel(Py<PyAny>),
    /// Close objects on `event_loop`, in order: `aclose()` as a task when
    /// an object has one, else `close()` (a coroutine never awaited, an
    /// async iterator left early).
    Close {
        /// The loop the objects belong to; `None`: close them on the
        /// notifier thread (a coroutine, a synchronous stream).
        event_loop: Option<Py<PyAny>>,
        /// The objects.
        objects: Vec<Py<PyAny>>,
    },
}

/// Does `job`: at once when this thread holds the GIL (see `gil.rs`),
/// else on the notifier thread. Either way it acts through the objects'
/// loops (`call_soon_threadsafe`), never on a loop from another thread.
///
/// Only for code that holds no engine lock (a Python awaitable or stream
/// dropped by its owner): running Python may hand the GIL to another
/// thread, which could then wait for that lock while this one waits for
/// the GIL. A waker, which the engine may call under its locks, uses
/// [`send`].
pub(crate) fn submit(job: Job) {
    if crate::gil::held() {
        Python::attach(|py| {
            let _ = perform(py, job);
        });
    } else {
        send(job);
    }
}

/// Hands `job` to the notifier thread.
pub(crate) fn send(job: Job) {
    let process = crate::process::current();
    let sender = process.notifier.get_or_init(|| {
        let (tx, rx) = channel();
        std::thread::Builder::new()
            .name("tollgate-notify".into())
            .spawn(move || run(process, rx))
            .expect("the notifier thread starts");
        Mutex::new(tx)
    });
    if let Ok(tx) = sender.lock() {
        // The receiver lives as long as the process.
        let _ = tx.send(job);
    }
}

/// Runs jobs, in batches: one GIL acquisition for all the jobs that
/// arrived meanwhile.
fn run(process: &'static Process, rx: Receiver<Job>) {
    while let Ok(first) = rx.recv() {
        let mut batch = vec![first];
        batch.extend(rx.try_iter());
        // Held while this thread may be in Python: `exiting` waits for it.
        let _in_python = process.in_python.lock();
        if EXITING.load(Ordering::Acquire) {
            // Not dropped: a reference's release would need the GIL.
            std::mem::forget(batch);
            continue;
        }
        Python::attach(|py| {
            for job in batch {
                let _ = perform(py, job);
            }
        });
    }
}

/// The interpreter is exiting: the notifier thread takes the GIL no more.
/// (The notifier thread holds its process's `in_python` from its check of
/// this until it is out of Python again.)
static EXITING: AtomicBool = AtomicBool::new(false);

/// The `atexit` callback: from now on the notifier thread leaves Python
/// alone; returns once a batch it is running (if any) is done, the GIL
/// released meanwhile so that the batch can finish.
#[pyfunction]
fn exiting(py: Python<'_>) {
    EXITING.store(true, Ordering::Release);
    if crate::process::overflowed() {
        // The slot is an ancestor's: its lock may be held by a thread this
        // process lacks, and no notifier of this process ever ran.
        return;
    }
    let process = crate::process::current();
    crate::gil::detach(py, || drop(process.in_python.lock()));
}

/// Registers [`exiting`] with `atexit` (at module load).
pub(crate) fn register_exit(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    py.import("atexit")?
        .call_method1("register", (wrap_pyfunction!(exiting, m)?,))?;
    Ok(())
}

fn perform(py: Python<'_>, job: Job) -> PyResult<()> {
    match job {
        Job::Wake(target) => soon(py, target.bind(py), wake_target_fn(py)?),
        Job::Cancel(task) => {
            let task = task.bind(py);
            soon(py, task, &task.getattr(pyo3::intern!(py, "cancel"))?)
        }
        Job::Close {
            event_loop: Some(event_loop),
            objects,
        } => {
            for object in objects {
                event_loop.bind(py).call_method1(
                    pyo3::intern!(py, "call_soon_threadsafe"),
                    (close_fn(py)?, object),
                )?;
            }
            Ok(())
        }
        Job::Close {
            event_loop: None,
            objects,
        } => {
            for object in objects {
                let _ = object.bind(py).call_method0(pyo3::intern!(py, "close"));
            }
            Ok(())
        }
    }
}

/// Resolves `target` from a thread holding the GIL: at once when this
/// thread runs its loop, else through `call_soon_threadsafe`.
pub(crate) fn wake_now(py: Python<'_>, target: &Bound<'_, PyAny>) {
    let here = (|| -> PyResult<bool> {
        let running = running_loop(py)?;
        Ok(target
            .call_method0(pyo3::intern!(py, "get_loop"))?
            .is(&running))
    })();
    let _ = match here {
        Ok(true) => wake_target(target),
        _ => wake_target_fn(py).and_then(|f| soon(py, target, f)),
    };
}

/// `asyncio._get_running_loop()`: the loop running on this thread, or
/// `None`.
fn running_loop(py: Python<'_>) -> PyResult<Bound<'_, PyAny>> {
    static F: PyOnceLock<Py<PyAny>> = PyOnceLock::new();
    F.get_or_try_init(py, || {
        Ok::<_, PyErr>(py.import("asyncio")?.getattr("_get_running_loop")?.unbind())
    })?
    .bind(py)
    .call0()
}

/// `future.get_loop().call_soon_threadsafe(callback, future)`.
fn soon(py: Python<'_>, future: &Bound<'_, PyAny>, callback: &Bound<'_, PyAny>) -> PyResult<()> {
    let event_loop = future.call_method0(pyo3::intern!(py, "get_loop"))?;
    event_loop.call_method1(
        pyo3::intern!(py, "call_soon_threadsafe"),
        (callback, future),
    )?;
    Ok(())
}

fn wake_target_fn(py: Python<'_>) -> PyResult<&Bound<'_, PyAny>> {
    static F: PyOnceLock<Py<PyAny>> = PyOnceLock::new();
    F.get_or_try_init(py, || {
        Ok::<_, PyErr>(wrap_pyfunction!(wake_target, py)?.into_any().unbind())
    })
    .map(|f| f.bind(py))
}

fn close_fn(py: Python<'_>) -> PyResult<&Bound<'_, PyAny>> {
    static F: PyOnceLock<Py<PyAny>> = PyOnceLock::new();
    F.get_or_try_init(py, || {
        Ok::<_, PyErr>(wrap_pyfunction!(close_now, py)?.into_any().unbind())
    })
    .map(|f| f.bind(py))
}

/// Resolves `target` on its loop, unless its task already went away.
#[pyfunction]
pub(crate) fn wake_target(target: &Bound<'_, PyAny>) -> PyResult<()> {
    if !target.call_method0("done")?.is_truthy()? {
        target.call_method1("set_result", (target.py().None(),))?;
    }
    Ok(())
}

/// Closes `object` on the running loop: `aclose()`, else `close()`; an
/// awaitable it returns runs as a task whose outcome is taken, so nothing
/// is printed.
#[pyfunction]
pub(crate) fn close_now(object: &Bound<'_, PyAny>) -> PyResult<()> {
    let py = object.py();
    let closing = if object.hasattr(pyo3::intern!(py, "aclose"))? {
        object.call_method0(pyo3::intern!(py, "aclose"))?
    } else if object.hasattr(pyo3::intern!(py, "close"))? {
        object.call_method0(pyo3::intern!(py, "close"))?
    } else {
        return Ok(());
    };
    if closing.hasattr(pyo3::intern!(py, "__await__"))? {
        crate::pyawait::detach_task(py, &closing)?;
    }
    Ok(())
}

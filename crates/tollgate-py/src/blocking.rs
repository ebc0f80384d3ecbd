//! Running a Rust future to its end on a Python thread (the blocking
//! API, the sync httpx transport): the GIL is released while it waits,
//! and a signal (Ctrl-C) interrupts it every [`SIGNAL_CHECK`] at most.

use std::future::Future;
use std::time::Duration;

use pyo3::prelude::*;

use crate::{gil, runtime};

/// How long a blocking wait sleeps before it checks for a signal
/// (Ctrl-C) from Python.
pub(crate) const SIGNAL_CHECK: Duration = Duration::from_millis(50);

/// Runs `future` on this thread without the GIL until it completes. A
/// signal handler that raises (Ctrl-C) drops the future, inside the
/// runtime, so whatever it held is given back, and raises its exception.
pub(crate) fn block_on<F>(py: Python<'_>, future: F) -> PyResult<F::Output>
where
    F: Future + Send,
    F::Output: Send,
{
    let mut future = Box::pin(future);
    loop {
        let step = gil::detach(py, || {
            runtime::handle()
                .block_on(async { tokio::time::timeout(SIGNAL_CHECK, future.as_mut()).await })
        });
        match step {
            Ok(out) => return Ok(out),
            Err(_) => {
                if let Err(e) = py.check_signals() {
                    let _runtime = runtime::enter();
                    drop(future);
                    return Err(e);
                }
            }
        }
    }
}

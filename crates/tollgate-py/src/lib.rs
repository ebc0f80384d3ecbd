//! `tollgate._tollgate`: tollgate's engine as a CPython extension module
//! (SPEC §17). The Python package `tollgate` (python/tollgate) re-exports
//! it with its stubs, exceptions and the httpx transports.
//!
//! Nothing here re-implements quota or lifecycle logic: the limiter is the
//! engine's `AdmissionController`, its configuration the gateway's parser,
//! the supervised calls the engine's `Supervisor`, the estimates and
//! accounting profiles `tollgate-openai`'s. This crate only bridges Rust
//! futures to asyncio (`driver.rs`, `waker.rs`) and values to Python.
#![forbid(unsafe_code)]

mod blocking;
mod classify;
mod config;
mod driver;
mod errors;
mod gil;
mod lease;
mod limiter;
mod notifier;
mod process;
mod pyawait;
mod runtime;
mod simulator;
mod snapshot;
mod supervised;
mod transport;
mod usage;
mod waker;

use pyo3::prelude::*;

#[pymodule]
fn _tollgate(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<limiter::Limiter>()?;
    m.add_class::<limiter::AcquireCall>()?;
    m.add_class::<lease::PyLease>()?;
    m.add_class::<driver::Pending>()?;
    m.add_class::<driver::Ready>()?;
    m.add_class::<supervised::SupervisedStream>()?;
    m.add_class::<transport::TransportCore>()?;
    m.add_class::<transport::ResponseBody>()?;
    m.add_class::<simulator::SimulatorServer>()?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    notifier::register_exit(m)?;
    process::register(m)?;
    // Whether this build is optimised: speed bounds (PY-7) hold only for
    // an optimised one; the test command builds without (faster, and it
    // shares the workspace's test builds).
    m.add("__optimised__", !cfg!(debug_assertions))?;
    Ok(())
}

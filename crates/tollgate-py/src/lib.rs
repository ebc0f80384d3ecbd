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

mod config;
mod driver;
mod errors;
mod lease;
mod limiter;
mod runtime;
mod snapshot;
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
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}

//! `tollgate.testing.simulator(...)`: the strict simulated provider
//! (`tollgate-sim`, SPEC §14) served in-process on the package's tokio
//! runtime, for tests of code that calls an LLM API.
//!
//! Its settings are `tollgate sim`'s flags, parsed by the same parser
//! (`SimArgs`), so every knob and every validation is the simulator's own.

use clap::Parser;
use parking_lot::Mutex;
use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use tollgate_sim::{SimArgs, SimServer, Simulator};

use crate::blocking;
use crate::process::Made;

/// `tollgate sim`'s flags.
#[derive(Parser)]
#[command(name = "simulator", no_binary_name = false)]
struct Flags {
    #[command(flatten)]
    sim: SimArgs,
}

/// A running simulator.
#[pyclass(frozen, module = "tollgate._tollgate", name = "SimulatorServer")]
pub(crate) struct SimulatorServer {
    server: Mutex<Option<SimServer>>,
    base_url: String,
    openai_base_url: String,
    /// The process whose runtime serves it.
    made: Made,
}

impl SimulatorServer {
    fn with<T>(&self, f: impl FnOnce(&SimServer) -> T) -> PyResult<T> {
        self.made.check("SimulatorServer")?;
        match self.server.lock().as_ref() {
            Some(s) => Ok(f(s)),
            None => Err(PyRuntimeError::new_err("the simulator was stopped")),
        }
    }
}

#[pymethods]
impl SimulatorServer {
    /// Starts a simulator with `tollgate sim`'s command-line `flags`
    /// (e.g. `["--rpm", "60", "--window", "10s"]`), listening on a free
    /// loopback port unless `--listen` says otherwise.
    #[new]
    fn new(py: Python<'_>, flags: Vec<String>) -> PyResult<SimulatorServer> {
        let made = Made::here()?;
        let mut argv = vec![
            "simulator".to_owned(),
            "--listen".to_owned(),
            "127.0.0.1:0".to_owned(),
        ];
        argv.extend(flags);
        let parsed = Flags::try_parse_from(&argv)
            .map_err(|e| PyValueError::new_err(e.render().to_string().trim().to_owned()))?;
        let config = parsed
            .sim
            .to_config()
            .map_err(|e| PyValueError::new_err(e.to_string()))?;
        let listen = parsed.sim.listen;
        let server = blocking::block_on(py, Simulator::spawn(config, listen))?
            .map_err(|e| PyRuntimeError::new_err(e.to_string()))?;
        Ok(SimulatorServer {
            base_url: server.base_url(),
            openai_base_url: server.openai_base_url(),
            server: Mutex::new(Some(server)),
            made,
        })
    }

    /// `http://127.0.0.1:<port>` (the Anthropic SDK's `base_url`).
    #[getter]
    fn base_url(&self) -> &str {
        &self.base_url
    }

    /// `http://127.0.0.1:<port>/v1` (the OpenAI SDK's `base_url`).
    #[getter]
    fn openai_base_url(&self) -> &str {
        &self.openai_base_url
    }

    /// The counters of `GET /stats` (SPEC SIM-4) as JSON text.
    fn stats_json(&self) -> PyResult<String> {
        let stats = self.with(SimServer::stats)?;
        serde_json::to_string(&stats).map_err(|e| PyRuntimeError::new_err(e.to_string()))
    }

    /// Clears counters, windows and the fault sequence.
    fn reset(&self) -> PyResult<()> {
        self.with(SimServer::reset)
    }

    /// Stops accepting connections and lets requests in progress finish.
    /// Idempotent.
    fn stop(&self, py: Python<'_>) -> PyResult<()> {
        self.made.check("SimulatorServer")?;
        let Some(server) = self.server.lock().take() else {
            return Ok(());
        };
        blocking::block_on(py, server.shutdown())?
            .map_err(|e| PyRuntimeError::new_err(e.to_string()))
    }
}

impl Drop for SimulatorServer {
    fn drop(&mut self) {
        // Dropping the server aborts its task (in the runtime); a forked
        // child's copy is the parent's task and socket: never dropped.
        self.made.drop_here(self.server.get_mut().take());
    }
}

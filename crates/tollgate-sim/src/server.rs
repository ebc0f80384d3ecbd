//! The embeddable server: [`Simulator`] (state + router) and [`SimServer`]
//! (a running listener with graceful shutdown).

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use axum::serve::ListenerExt;
use tokio::net::{TcpListener, ToSocketAddrs};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use crate::args::SimArgs;
use crate::clock::{Clock, TokioClock};
use crate::config::{ConfigError, SimConfig};
use crate::routes;
use crate::state::Shared;
use crate::stats::SimStats;

/// Errors of starting or running the simulator.
#[derive(Debug, thiserror::Error)]
pub enum SimError {
    /// The configuration was refused.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The listen address could not be bound.
    #[error("simulator: cannot listen on {addr}: {source}")]
    Bind {
        /// The address asked for.
        addr: String,
        /// The operating system's error.
        source: io::Error,
    },
    /// The server failed while running (or its task panicked).
    #[error("simulator: server failed: {0}")]
    Serve(#[source] io::Error),
}

/// A simulated provider: configuration, referee and counters, shareable by
/// cheap clones. Serve it with [`Simulator::serve`] / [`Simulator::spawn`], or
/// mount [`Simulator::router`] in your own axum app.
#[derive(Debug, Clone)]
pub struct Simulator {
    shared: Arc<Shared>,
}

impl Simulator {
    /// A simulator on tokio's clock (paused time applies).
    pub fn new(config: SimConfig) -> Result<Self, ConfigError> {
        Self::with_clock(config, Arc::new(TokioClock))
    }

    /// A simulator whose windows read `clock` (e.g. a
    /// [`crate::ManualClock`]). Latency and fault delays still use
    /// `tokio::time`.
    pub fn with_clock(config: SimConfig, clock: Arc<dyn Clock>) -> Result<Self, ConfigError> {
        config.validate()?;
        let shared = Arc::new(Shared::new(config, clock));
        // The background consumer, if any, starts now when a runtime runs,
        // else with `router` / `serve`.
        shared.ensure_background();
        Ok(Self { shared })
    }

    /// The configuration in force.
    pub fn config(&self) -> &SimConfig {
        &self.shared.config
    }

    /// The simulator's routes, to serve or nest in another router.
    pub fn router(&self) -> Router {
        self.shared.ensure_background();
        routes::router(Arc::clone(&self.shared))
    }

    /// A snapshot of the counters (the same data as `GET /stats`).
    pub fn stats(&self) -> SimStats {
        self.shared.stats()
    }

    /// Clears counters, windows and the fault sequence (as `POST /reset`).
    /// Requests in progress keep their slot and stay counted as active.
    pub fn reset(&self) {
        self.shared.reset();
    }

    /// Serves on an already bound listener, in a background task. Must be
    /// called inside a tokio runtime.
    pub fn serve(&self, listener: TcpListener) -> Result<SimServer, SimError> {
        let addr = listener.local_addr().map_err(SimError::Serve)?;
        let (tx, rx) = oneshot::channel::<()>();
        let app = self.router();
        // Stream events are small writes: without TCP_NODELAY, Nagle's
        // algorithm and the client's delayed ACK stall each stream ~40 ms.
        let listener = listener.tap_io(|tcp| {
            if let Err(error) = tcp.set_nodelay(true) {
                tracing::debug!(%error, "cannot set TCP_NODELAY");
            }
        });
        let task = tokio::spawn(async move {
            axum::serve(listener, app)
                .with_graceful_shutdown(async move {
                    // A dropped sender also means "stop".
                    let _ = rx.await;
                })
                .await
        });
        tracing::info!(%addr, "simulated provider listening");
        Ok(SimServer {
            simulator: self.clone(),
            addr,
            shutdown: Some(tx),
            task: Some(task),
        })
    }

    /// Binds `addr` (e.g. `"127.0.0.1:0"` for a free port) and serves on it.
    pub async fn bind(
        &self,
        addr: impl ToSocketAddrs + std::fmt::Debug,
    ) -> Result<SimServer, SimError> {
        let shown = format!("{addr:?}");
        let listener = TcpListener::bind(addr)
            .await
            .map_err(|source| SimError::Bind {
                addr: shown,
                source,
            })?;
        self.serve(listener)
    }

    /// Validates `config`, binds `addr` and serves: the one-call way to get
    /// a running simulator in a test.
    pub async fn spawn(
        config: SimConfig,
        addr: impl ToSocketAddrs + std::fmt::Debug,
    ) -> Result<SimServer, SimError> {
        Self::new(config)?.bind(addr).await
    }
}

/// A running simulator. Dropping it stops accepting connections at once
/// (the serving task is aborted); [`SimServer::shutdown`] stops gracefully.
#[derive(Debug)]
pub struct SimServer {
    simulator: Simulator,
    addr: SocketAddr,
    shutdown: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<io::Result<()>>>,
}

impl SimServer {
    /// The address actually bound.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://<addr>`, without a trailing slash and without `/v1` (OpenAI
    /// SDKs want [`SimServer::openai_base_url`]).
    pub fn base_url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// `http://<addr>/v1`, the `base_url` OpenAI SDKs expect.
    pub fn openai_base_url(&self) -> String {
        format!("http://{}/v1", self.addr)
    }

    /// `base_url()` followed by `path` (which should start with `/`).
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    /// The simulator behind this server.
    pub fn simulator(&self) -> &Simulator {
        &self.simulator
    }

    /// A snapshot of the counters.
    pub fn stats(&self) -> SimStats {
        self.simulator.stats()
    }

    /// Clears counters, windows and the fault sequence.
    pub fn reset(&self) {
        self.simulator.reset();
    }

    /// Stops accepting connections, lets requests in progress (including
    /// streams) finish, and waits for the server to end.
    ///
    /// # Cancel safety
    ///
    /// Dropping the returned future after the signal was sent leaves the
    /// server shutting down in the background.
    pub async fn shutdown(mut self) -> Result<(), SimError> {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        match self.task.take() {
            Some(task) => match task.await {
                Ok(result) => result.map_err(SimError::Serve),
                Err(join) => Err(SimError::Serve(io::Error::other(join))),
            },
            None => Ok(()),
        }
    }
}

impl Drop for SimServer {
    fn drop(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}

/// Runs the simulator described by `args` until `shutdown` completes, then
/// stops gracefully: what `tollgate sim` does.
pub async fn run(args: &SimArgs, shutdown: impl Future<Output = ()>) -> Result<(), SimError> {
    let server = Simulator::spawn(args.to_config()?, args.listen).await?;
    shutdown.await;
    server.shutdown().await
}

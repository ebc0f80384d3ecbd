//! The running configuration and its reload (SPEC GW-15).
//!
//! Requests read the current [`AppState`] once, at their start, and keep
//! that `Arc` until they end: a call in flight finishes under the settings
//! it started with while new requests see the new ones. A reload builds a
//! whole new state from the file ([`build_with`]), keeping the quota state
//! of every scope and tenant whose settings did not change and the circuit
//! of every unchanged provider, then swaps it in; an invalid file is
//! refused with the same located error as at start and the running state
//! stays. Connections are never touched.
//!
//! The listeners' own settings (`server.listen`, `metrics_listen`,
//! `max_connections`, `max_connections_per_client`, `max_header_bytes`,
//! `header_read_timeout`, `idle_timeout`, `shutdown_grace`,
//! `connection_threads`), the state file's (`state_dir`,
//! `on_unreadable_state`, `state_save_interval`) and `[telemetry]` apply
//! only at start; a reload that changes them says so in a warning. `log_format`
//! applies to the access log at once and to the other logs after a
//! restart.

use std::path::PathBuf;
use std::sync::{Arc, Weak};

use parking_lot::{Mutex, RwLock};

use crate::build::{BuildFailure, build_with};
use crate::config::{ConfigError, GatewayConfig};
use crate::metrics::Metrics;
use crate::state::AppState;

/// Why a reload was refused; the running configuration stays.
#[derive(Debug, thiserror::Error)]
pub enum ReloadError {
    /// The gateway was started without a configuration file.
    #[error("the gateway runs the built-in default configuration; there is no file to reload")]
    NoFile,
    /// A shutdown began.
    #[error("the gateway is shutting down")]
    ShuttingDown,
    /// The file is invalid (file, field, reason, position).
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The runtime could not be built from it.
    #[error(transparent)]
    Build(#[from] BuildFailure),
}

/// The gateway's current state, and how to reload it.
#[derive(Debug)]
pub struct Live {
    current: RwLock<Arc<AppState>>,
    path: Option<PathBuf>,
    metrics: Metrics,
    /// States replaced by a reload, while requests of theirs still run:
    /// a shutdown closes them too.
    retired: Mutex<Vec<Weak<AppState>>>,
    /// One reload at a time.
    reloading: tokio::sync::Mutex<()>,
    /// Set by [`Live::begin_shutdown`] under the `current` lock: a reload
    /// never swaps a state in after it.
    shutting_down: std::sync::atomic::AtomicBool,
    /// The status page's samples, kept across reloads (SPEC OBS-6).
    history: crate::status::History,
    /// The quota state file (`server.state_dir`): a reload counts in the
    /// controllers it makes afresh what the file holds for them.
    state: Option<Arc<tollgate_state::StateFile>>,
}

impl Live {
    /// `state`, reloadable from `path` (when there is one).
    pub fn new(state: Arc<AppState>, path: Option<PathBuf>, metrics: Metrics) -> Self {
        Live {
            current: RwLock::new(state),
            path,
            metrics,
            retired: Mutex::new(Vec::new()),
            reloading: tokio::sync::Mutex::new(()),
            shutting_down: std::sync::atomic::AtomicBool::new(false),
            history: crate::status::History::default(),
            state: None,
        }
    }

    /// With the quota state file `file` (SPEC DQ-8): a tenant or an
    /// upstream scope a reload adds (back) counts what the file holds for
    /// it before the reloaded state serves.
    #[must_use]
    pub fn with_state(self, file: Option<Arc<tollgate_state::StateFile>>) -> Self {
        Live {
            state: file,
            ..self
        }
    }

    /// Marks every state shutting down (new requests get 503) and returns
    /// them all, for the shutdown to close. A reload that is building a
    /// state meanwhile is refused instead of swapping it in unmarked.
    pub fn begin_shutdown(&self) -> Vec<Arc<AppState>> {
        let states = {
            // Under the lock a reload swaps under: no swap is half done,
            // and none comes after.
            let current = self.current.write();
            self.shutting_down
                .store(true, std::sync::atomic::Ordering::SeqCst);
            Self::states(&current, &self.retired)
        };
        for app in &states {
            app.begin_shutdown();
        }
        states
    }

    /// `current` and the retired states still referenced (locks: `current`
    /// first, then `retired`, everywhere).
    fn states(current: &Arc<AppState>, retired: &Mutex<Vec<Weak<AppState>>>) -> Vec<Arc<AppState>> {
        let mut retired = retired.lock();
        retired.retain(|w| w.strong_count() > 0);
        std::iter::once(Arc::clone(current))
            .chain(retired.iter().filter_map(Weak::upgrade))
            .collect()
    }

    /// The status page's history (SPEC OBS-6).
    pub fn history(&self) -> &crate::status::History {
        &self.history
    }

    /// The state new requests use.
    pub fn current(&self) -> Arc<AppState> {
        Arc::clone(&self.current.read())
    }

    /// Every state that may still have calls: the current one and the
    /// replaced ones still referenced.
    pub fn all(&self) -> Vec<Arc<AppState>> {
        let current = self.current.read();
        Self::states(&current, &self.retired)
    }

    /// Re-reads the configuration file and swaps the state (SPEC GW-15).
    /// On error nothing changes; the error is logged and returned.
    pub async fn reload(&self) -> Result<(), ReloadError> {
        let _one = self.reloading.lock().await;
        let result = self.reload_now();
        match &result {
            Ok(()) => tracing::info!("configuration reloaded"),
            Err(e) => {
                tracing::error!(error = %e, "configuration reload refused; the running configuration stays")
            }
        }
        result
    }

    fn reload_now(&self) -> Result<(), ReloadError> {
        let path = self.path.as_deref().ok_or(ReloadError::NoFile)?;
        let old = self.current();
        if old.is_shutting_down() {
            return Err(ReloadError::ShuttingDown);
        }
        let mut config = GatewayConfig::load(path)?;
        let restart_only = listener_changes(&old.config, &config);
        // The listener was bound at start: it keeps its address.
        config.server.listen = old.config.server.listen;
        if !restart_only.is_empty() {
            tracing::warn!(
                settings = restart_only.join(", "),
                "these settings apply only after a restart"
            );
        }
        let new = build_with(&config, self.metrics.clone(), Some(&old))?;
        if let Some(file) = &self.state {
            let restored = crate::persist::restore_new(file, &old, &new);
            if restored > 0 {
                tracing::info!(scopes = restored, "quota state restored for added scopes");
            }
        }
        let mut current = self.current.write();
        if self.shutting_down.load(std::sync::atomic::Ordering::SeqCst) {
            return Err(ReloadError::ShuttingDown);
        }
        *current = new;
        self.retired.lock().push(Arc::downgrade(&old));
        Ok(())
    }
}

/// The `[server]` settings of `new` that differ from `old` and that only a
/// restart applies.
fn listener_changes(old: &GatewayConfig, new: &GatewayConfig) -> Vec<&'static str> {
    let (o, n) = (&old.server, &new.server);
    [
        ("server.listen", o.listen != n.listen),
        (
            "server.max_connections",
            o.max_connections != n.max_connections,
        ),
        (
            "server.max_connections_per_client",
            o.max_connections_per_client != n.max_connections_per_client,
        ),
        (
            "server.max_header_bytes",
            o.max_header_bytes != n.max_header_bytes,
        ),
        (
            "server.header_read_timeout",
            o.header_read_timeout != n.header_read_timeout,
        ),
        ("server.idle_timeout", o.idle_timeout != n.idle_timeout),
        (
            "server.shutdown_grace",
            o.shutdown_grace != n.shutdown_grace,
        ),
        (
            "server.metrics_listen",
            o.metrics_listen != n.metrics_listen,
        ),
        (
            "server.connection_threads",
            o.connection_threads != n.connection_threads,
        ),
        ("server.state_dir", o.state_dir != n.state_dir),
        (
            "server.on_unreadable_state",
            o.on_unreadable_state != n.on_unreadable_state,
        ),
        ("telemetry", old.telemetry != new.telemetry),
        (
            "server.state_save_interval",
            o.state_save_interval != n.state_save_interval,
        ),
    ]
    .into_iter()
    .filter_map(|(name, changed)| changed.then_some(name))
    .collect()
}

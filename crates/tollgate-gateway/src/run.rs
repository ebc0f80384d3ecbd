//! `tollgate serve`: load (or make up) the configuration, build the
//! runtime, serve until a signal.

use std::future::Future;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use tollgate_sim::{SimConfig, SimServer, Simulator};

use crate::build::{BuildFailure, build};
use crate::config::{ConfigError, GatewayConfig};
use crate::live::Live;
use crate::metrics::Metrics;
use crate::persist;
use crate::server::{ServeOptions, bind, serve_live};

/// The API key of the built-in default's `demo` tenant.
pub const DEMO_KEY: &str = "tollgate-demo-key";

/// Why the gateway stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// Invalid configuration (file, field, reason).
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The runtime could not be built.
    #[error(transparent)]
    Build(#[from] BuildFailure),
    /// The listen address could not be bound.
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// Why.
        source: std::io::Error,
    },
    /// The embedded simulator failed.
    #[error("the built-in simulated provider failed: {0}")]
    Sim(#[from] tollgate_sim::SimError),
    /// Serving failed.
    #[error("serving failed: {0}")]
    Serve(std::io::Error),
    /// The quota state file (`server.state_dir`) cannot be used (SPEC DQ-8).
    #[error("server.state_dir: {0}")]
    State(#[from] tollgate_state::StateError),
}

/// The simulated provider behind the built-in default: the same budget the
/// default configuration spends, enforced strictly.
pub fn embedded_sim_config() -> SimConfig {
    SimConfig {
        rpm: Some(600),
        tpm: Some(60_000),
        ttft: Duration::from_millis(20),
        per_token: Duration::from_millis(2),
        completion_tokens: 24,
        // Its Messages route, with Anthropic's three buckets.
        anthropic_rpm: Some(300),
        itpm: Some(40_000),
        otpm: Some(8_000),
        ..SimConfig::default()
    }
}

/// Runs the gateway until `shutdown` resolves. Without `config_path` it
/// starts an in-process simulated provider and the built-in default
/// configuration, and prints how to call it (SPEC GW-9).
pub async fn run(
    config_path: Option<&Path>,
    listen: Option<SocketAddr>,
    shutdown: impl Future<Output = ()>,
) -> Result<(), RunError> {
    let (mut config, sim): (GatewayConfig, Option<SimServer>) = match config_path {
        Some(path) => (GatewayConfig::load(path)?, None),
        None => {
            let sim = Simulator::spawn(embedded_sim_config(), "127.0.0.1:0").await?;
            (
                GatewayConfig::embedded(&sim.openai_base_url(), DEMO_KEY),
                Some(sim),
            )
        }
    };
    if let Some(addr) = listen {
        config.server.listen = addr;
    }
    let metrics = Metrics::install();
    let app = build(&config, metrics.clone())?;
    // Before any request: a bad state file refuses the start (SPEC DQ-8).
    let state = persist::open(&config)?;
    if let Some(file) = &state {
        let restored = persist::restore(file, &app);
        tracing::info!(
            file = %file.path().display(),
            scopes = restored,
            "quota state restored"
        );
    }
    let addr = config.server.listen;
    let listener = bind(addr)
        .await
        .map_err(|source| RunError::Bind { addr, source })?;
    let metrics_listener = match config.server.metrics_listen {
        Some(addr) => Some(
            bind(addr)
                .await
                .map_err(|source| RunError::Bind { addr, source })?,
        ),
        None => None,
    };
    let local = listener.local_addr().unwrap_or(addr);
    let options = ServeOptions::from_config(&config.server);
    let live = Arc::new(
        Live::new(app, config_path.map(Path::to_path_buf), metrics).with_state(state.clone()),
    );
    // SIGHUP is handled before the banner says the gateway is up: until
    // then the signal's default action would end the process.
    let hangup = tokio::spawn(reload_on_hangup(Arc::clone(&live), hangups()));
    let saver = state.as_ref().map(|file| {
        tokio::spawn(persist::save_every(
            Arc::clone(file),
            Arc::clone(&live),
            config.server.state_save_interval,
        ))
    });
    print_banner(local, sim.as_ref(), &config);
    let served = serve_live(
        listener,
        metrics_listener,
        Arc::clone(&live),
        options,
        shutdown,
    )
    .await;
    hangup.abort();
    if let (Some(saver), Some(file)) = (saver, &state) {
        saver.abort();
        let _ = saver.await;
        let (file, app) = (Arc::clone(file), live.current());
        match tokio::task::spawn_blocking(move || persist::save(&file, &app)).await {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => tracing::error!(error = %e, "quota state not saved at shutdown"),
            Err(e) => tracing::error!(error = %e, "quota state not saved at shutdown"),
        }
    }
    served.map_err(RunError::Serve)?;
    if let Some(sim) = sim {
        sim.shutdown().await?;
    }
    Ok(())
}

/// The process's SIGHUPs, from now on (`None` where there are none, or
/// when they cannot be listened to: reload with `POST /admin/reload`).
#[cfg(unix)]
fn hangups() -> Option<tokio::signal::unix::Signal> {
    use tokio::signal::unix::{SignalKind, signal};
    match signal(SignalKind::hangup()) {
        Ok(hangups) => Some(hangups),
        Err(_) => {
            tracing::warn!("cannot listen for SIGHUP; reload with POST /admin/reload");
            None
        }
    }
}

#[cfg(not(unix))]
fn hangups() -> Option<()> {
    None
}

/// Reloads the configuration on every SIGHUP (SPEC GW-15); a refused
/// reload is logged and the running configuration stays.
#[cfg(unix)]
async fn reload_on_hangup(live: Arc<Live>, hangups: Option<tokio::signal::unix::Signal>) {
    let Some(mut hangups) = hangups else {
        return;
    };
    while hangups.recv().await.is_some() {
        let _ = live.reload().await;
    }
}

#[cfg(not(unix))]
async fn reload_on_hangup(live: Arc<Live>, _: Option<()>) {
    let _ = live;
}

fn print_banner(addr: SocketAddr, sim: Option<&SimServer>, config: &GatewayConfig) {
    let base = format!("http://{addr}");
    println!("tollgate gateway listening on {base} ({})", config.origin);
    let mut models: Vec<&str> = config.models.iter().map(|m| m.name.as_str()).collect();
    models.sort_unstable();
    println!("models: {}", models.join(", "));
    if let Some(sim) = sim {
        println!(
            "upstream: built-in simulated provider at {}",
            sim.openai_base_url()
        );
        println!("demo API key: {DEMO_KEY}");
        for line in demo_limits(config) {
            println!("{line}");
        }
        println!("try:");
        println!(
            "  curl -s {base}/v1/chat/completions -H 'Authorization: Bearer {DEMO_KEY}' \
             -H 'Content-Type: application/json' \
             -d '{{\"model\":\"sim-chat\",\"messages\":[{{\"role\":\"user\",\"content\":\"Hello!\"}}]}}'"
        );
        println!(
            "  (also /v1/responses with sim-chat, /v1/messages with sim-claude, \
             /v1/embeddings with sim-embed)"
        );
    }
    println!("metrics: {base}/metrics   health: {base}/healthz   stop: Ctrl-C");
}

/// What the built-in default allows, for its banner: each tenant's calls
/// at once and waiting, the request deadline, and each simulated account's
/// limits with the models that spend it.
fn demo_limits(config: &GatewayConfig) -> Vec<String> {
    let mut lines = Vec::new();
    let admission = &config.admission;
    for t in &config.tenants {
        let at_once = t.concurrency.map_or_else(
            || "any number of calls".to_owned(),
            |n| format!("{n} calls"),
        );
        let waiting = t
            .max_waiting
            .map_or_else(|| "any number".to_owned(), |n| n.to_string());
        lines.push(format!(
            "demo limits: tenant `{}` runs {at_once} at once, up to {waiting} more wait \
             (each within its deadline: {}, or x-request-timeout up to {}){}",
            t.name,
            humantime::format_duration(admission.default_timeout),
            humantime::format_duration(admission.max_timeout),
            if t.all_limits().is_empty() {
                "; no quota of its own"
            } else {
                ""
            },
        ));
    }
    for scope in &config.scopes {
        let limits: Vec<String> = scope
            .all_limits()
            .iter()
            .map(|l| {
                format!(
                    "{} {} per {}",
                    l.amount,
                    l.dimension.as_str().replace('_', " "),
                    l.window_label()
                )
            })
            .collect();
        let models: Vec<&str> = config
            .models
            .iter()
            .filter(|m| {
                m.deployments
                    .iter()
                    .any(|d| d.scope.as_deref() == Some(scope.name.as_str()))
            })
            .map(|m| m.name.as_str())
            .collect();
        lines.push(format!(
            "  simulated account `{}` ({}): {}",
            scope.name,
            models.join(", "),
            limits.join(", ")
        ));
    }
    lines
}

#[cfg(test)]
mod tests {
    use super::*;

    // proves: GW-9 (the banner of the built-in default says what its demo
    // tenant and simulated accounts allow)
    #[test]
    fn the_banner_tells_the_demo_limits() {
        let config = GatewayConfig::embedded("http://127.0.0.1:1/v1", DEMO_KEY);
        let text = demo_limits(&config).join("\n");
        assert!(
            text.contains("tenant `demo` runs 16 calls at once, up to 1000 more wait"),
            "{text}"
        );
        assert!(text.contains("each within its deadline: 1m"), "{text}");
        assert!(text.contains("no quota of its own"), "{text}");
        assert!(
            text.contains("`sim` (sim-chat, sim-embed): 600 requests per 1m, 60000 tokens per 1m"),
            "{text}"
        );
        assert!(
            text.contains(
                "300 requests per 1m, 40000 input tokens per 1m, 8000 output tokens per 1m"
            ),
            "{text}"
        );
    }
}

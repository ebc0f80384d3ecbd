//! Command-line flags of the soak.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, bail};
use clap::Parser;
use http::Uri;

/// Longest `--max-duration` accepted.
const MAX_DURATION: Duration = Duration::from_secs(6 * 3600);

/// Soak of `tollgate serve`: a fixed number of requests, mixing one-shot
/// and streaming chat completions from well-behaved clients with clients
/// that cancel at random points and clients that stop reading streams,
/// then checks that the gateway gave every capacity unit back.
///
/// Every request's kind and parameters come from `--seed` and the
/// request's index only, so the same flags send the same requests in the
/// same order (their timing, and so the faults the simulator draws, still
/// vary from run to run). Exits with status 1 when a check fails; prints
/// one JSON report on stdout. Talks to 127.0.0.1 only. See
/// `benches/soak/run.sh`.
#[derive(Debug, Clone, Parser)]
#[command(name = "tollgate-soak", version)]
pub struct Args {
    /// Base URL of the gateway (must be on 127.0.0.1).
    #[arg(long, default_value = "http://127.0.0.1:18282")]
    pub url: String,
    /// Tenant key of the gateway.
    #[arg(long, env = "TOLLGATE_SOAK_API_KEY", hide_env_values = true)]
    pub api_key: String,
    /// Admin key of the gateway's `/admin/snapshot`.
    #[arg(long, env = "TOLLGATE_SOAK_ADMIN_KEY", hide_env_values = true)]
    pub admin_key: String,
    /// Process id of the gateway, for its resident set size
    /// (`/proc/PID/status`, VmRSS).
    #[arg(long)]
    pub gateway_pid: Option<u32>,
    /// Requests to send in all (each HTTP request counts once).
    #[arg(long, default_value_t = 200_000)]
    pub requests: u64,
    /// Requests scheduled per second (open loop, bounded by
    /// `--concurrency`).
    #[arg(long, default_value_t = 1000.0)]
    pub rate: f64,
    /// Most requests in flight at once.
    #[arg(long, default_value_t = 256)]
    pub concurrency: usize,
    /// Hard bound on the sending phase; the run stops and fails past it.
    #[arg(long, default_value = "30m", value_parser = humantime::parse_duration)]
    pub max_duration: Duration,
    /// Seed of every random choice.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Runtime worker threads of the soak client.
    #[arg(long, default_value_t = 1)]
    pub threads: usize,
    /// Model served by the simulator that streams slowly (one event per
    /// `--per-token`): most traffic.
    #[arg(long, default_value = "sim-chat")]
    pub model: String,
    /// Model served by the simulator that streams as fast as it can:
    /// some ordinary traffic, the large stalled streams and the bursts of
    /// impatient clients.
    #[arg(long, default_value = "sim-bulk")]
    pub bulk_model: String,
    /// The slow simulator's `--per-token`: a stalled stream of `n` tokens
    /// on `--model` cannot end before `n` times this.
    #[arg(long, default_value = "1ms", value_parser = humantime::parse_duration)]
    pub per_token: Duration,
    /// Completion tokens a large stalled stream asks `--bulk-model` for
    /// (far more than socket and gateway buffers hold).
    #[arg(long, default_value_t = 25_000)]
    pub bulk_stall_tokens: u32,
    /// After its deadline, how long a stalled client waits for the gateway
    /// to close its connection before it counts as held.
    #[arg(long, default_value = "2s", value_parser = humantime::parse_duration)]
    pub stall_grace: Duration,
    /// Receive buffer (SO_RCVBUF) of a stalled client's socket.
    #[arg(long, default_value_t = 8192)]
    pub stall_rcvbuf: u32,
    /// Longest time a well-behaved client waits for a whole response
    /// (beyond the gateway's own deadline).
    #[arg(long, default_value = "60s", value_parser = humantime::parse_duration)]
    pub client_timeout: Duration,
    /// Longest wait, after the last request, for every window to refill.
    #[arg(long, default_value = "3m", value_parser = humantime::parse_duration)]
    pub refill_timeout: Duration,
    /// Largest RSS growth of the gateway, in percent, between the first
    /// and the last checkpoint (a quarter and all of `--requests`).
    #[arg(long, default_value_t = 10.0)]
    pub max_rss_growth_pct: f64,
    /// Also write the report to this file.
    #[arg(long)]
    pub report: Option<PathBuf>,
}

/// The gateway's address and `Host` header.
#[derive(Debug, Clone)]
pub struct Gateway {
    pub addr: SocketAddr,
    pub host: String,
}

impl Args {
    /// Checks what clap cannot; returns the gateway's address.
    pub fn validate(&self) -> anyhow::Result<Gateway> {
        if self.requests < 8 {
            bail!("--requests must be at least 8 (four RSS checkpoints)");
        }
        if !(self.rate.is_finite() && self.rate > 0.0) {
            bail!("--rate must be a positive number, got {}", self.rate);
        }
        if self.concurrency == 0 || self.threads == 0 {
            bail!("--concurrency and --threads must be at least 1");
        }
        if self.max_duration.is_zero() || self.max_duration > MAX_DURATION {
            bail!("--max-duration must be greater than zero and at most 6 hours");
        }
        if self.stall_grace.is_zero() {
            bail!("--stall-grace must be greater than zero");
        }
        if !(self.max_rss_growth_pct.is_finite() && self.max_rss_growth_pct >= 0.0) {
            bail!("--max-rss-growth-pct must be a non-negative number");
        }
        let uri: Uri = self
            .url
            .parse()
            .with_context(|| format!("invalid --url {}", self.url))?;
        if uri.scheme_str() != Some("http") {
            bail!("--url must start with http://");
        }
        let authority = uri.authority().context("--url has no host")?;
        // All traffic stays on the loopback interface.
        if authority.host() != "127.0.0.1" {
            bail!("--url must be on 127.0.0.1, got {}", authority.host());
        }
        let port = authority.port_u16().unwrap_or(80);
        Ok(Gateway {
            addr: SocketAddr::from(([127, 0, 0, 1], port)),
            host: authority.as_str().to_owned(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(extra: &[&str]) -> Args {
        let mut argv = vec!["tollgate-soak", "--api-key", "k", "--admin-key", "a"];
        argv.extend_from_slice(extra);
        Args::try_parse_from(argv).expect("flags parse")
    }

    #[test]
    fn only_loopback_and_sane_bounds_are_accepted() {
        let gw = parse(&[]).validate().expect("defaults are valid");
        assert_eq!(gw.addr.port(), 18282);
        assert!(parse(&["--url", "http://10.0.0.1:80"]).validate().is_err());
        assert!(
            parse(&["--url", "https://127.0.0.1:80"])
                .validate()
                .is_err()
        );
        assert!(parse(&["--requests", "3"]).validate().is_err());
        assert!(parse(&["--rate", "0"]).validate().is_err());
        assert!(parse(&["--max-duration", "7h"]).validate().is_err());
    }
}

//! Command-line flags and the request they describe.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, bail};
use bytes::Bytes;
use clap::Parser;
use serde_json::json;

/// Longest `--duration` accepted.
const MAX_DURATION: Duration = Duration::from_secs(7 * 24 * 3600);

/// Load generator for OpenAI-compatible endpoints (HTTP/1.1 keep-alive).
///
/// Closed loop (default): `--concurrency` workers each send the next request
/// as soon as the previous one finished. Open loop (`--rate`): requests are
/// scheduled at a fixed rate and latency is measured from each request's
/// scheduled send time, so a stalled server is not hidden by a stalled
/// client (coordinated omission).
#[derive(Debug, Clone, Parser)]
#[command(name = "tollgate-loadgen", version)]
pub struct Args {
    /// Full URL of the endpoint (http only).
    #[arg(long, default_value = "http://127.0.0.1:8081/v1/chat/completions")]
    pub url: String,
    /// Open loop: requests per second to schedule. Without it, closed loop.
    #[arg(long)]
    pub rate: Option<f64>,
    /// Closed loop: workers, one connection each. Open loop: connections,
    /// i.e. the most requests in flight.
    #[arg(long, default_value_t = 64)]
    pub concurrency: usize,
    /// Runtime worker threads of the load generator itself (it usually
    /// shares the machine with the server it measures).
    #[arg(long, default_value_t = 1)]
    pub threads: usize,
    /// How long to send for (e.g. 10s, 1m).
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    pub duration: Duration,
    /// Per-request timeout, from send to the end of the body.
    #[arg(long, default_value = "30s", value_parser = humantime::parse_duration)]
    pub timeout: Duration,
    /// Ask for a streamed response (`stream: true` with usage) and measure
    /// time to first chunk.
    #[arg(long)]
    pub stream: bool,
    /// Model of the default body.
    #[arg(long, default_value = "sim-chat")]
    pub model: String,
    /// User message of the default body.
    #[arg(long, default_value = "Say hello to the load generator.")]
    pub prompt: String,
    /// `max_tokens` of the default body.
    #[arg(long, default_value_t = 16)]
    pub max_tokens: u64,
    /// Request body (JSON) instead of the default chat body; `--stream` then
    /// only switches time-to-first-chunk measurement on.
    #[arg(long, conflicts_with = "body_file")]
    pub body: Option<String>,
    /// Read the request body from a file.
    #[arg(long)]
    pub body_file: Option<PathBuf>,
    /// Bearer key sent as `Authorization: Bearer <key>`.
    #[arg(long, env = "TOLLGATE_LOADGEN_API_KEY", hide_env_values = true)]
    pub api_key: Option<String>,
}

impl Args {
    /// Checks the flags that clap cannot.
    pub fn validate(&self) -> anyhow::Result<()> {
        if self.concurrency == 0 {
            bail!("--concurrency must be at least 1");
        }
        if self.threads == 0 {
            bail!("--threads must be at least 1");
        }
        if self.duration.is_zero() || self.duration > MAX_DURATION {
            bail!("--duration must be greater than zero and at most 7 days");
        }
        if let Some(rate) = self.rate
            && !(rate.is_finite() && rate > 0.0)
        {
            bail!("--rate must be a positive number, got {rate}");
        }
        Ok(())
    }

    /// The request body to send, as bytes.
    pub fn body(&self) -> anyhow::Result<Bytes> {
        let text = match (&self.body, &self.body_file) {
            (Some(body), _) => body.clone(),
            (None, Some(path)) => std::fs::read_to_string(path)
                .with_context(|| format!("reading --body-file {}", path.display()))?,
            (None, None) => {
                let mut body = json!({
                    "model": self.model,
                    "messages": [{"role": "user", "content": self.prompt}],
                    "max_tokens": self.max_tokens,
                });
                if self.stream {
                    body["stream"] = json!(true);
                    body["stream_options"] = json!({"include_usage": true});
                }
                body.to_string()
            }
        };
        serde_json::from_str::<serde_json::Value>(&text).context("the body is not valid JSON")?;
        Ok(Bytes::from(text))
    }
}

//! Command-line flags of `tollgate batch`, as a `clap::Args` group the CLI
//! flattens into its subcommand.

use std::path::PathBuf;
use std::time::Duration;

use tollgate::Dimension;
use tollgate::config::Limit;
use tollgate::quota::Unavailable;
use tollgate_openai::provider::ApiKey;
use tollgate_openai::tokens::Profile;
use tollgate_sim::SimConfig;

use crate::BatchError;
use crate::config::{
    BatchConfig, ErrorClass, ProgressMode, SharedStore, Target, parse_budget, parse_duration,
    parse_limit, parse_profile, parse_unavailable, read_prices,
};

/// The OpenAI API.
pub const DEFAULT_BASE_URL: &str = "https://api.openai.com/v1";
/// `--rpm` of `--sim` when none is given.
pub const SIM_DEFAULT_RPM: u64 = 300;
/// `--tpm` of `--sim` when none is given.
pub const SIM_DEFAULT_TPM: u64 = 60_000;

/// Flags of `tollgate batch`.
#[derive(Debug, Clone, clap::Args)]
pub struct BatchArgs {
    /// The input: OpenAI Batch JSONL (`custom_id`, `method`, `url`, `body`).
    pub input: PathBuf,
    /// The output: OpenAI Batch output JSONL. An existing file is resumed:
    /// items already in it are skipped.
    #[arg(long, short)]
    pub output: Option<PathBuf>,
    /// Base URL of the OpenAI-compatible API.
    #[arg(long, default_value = DEFAULT_BASE_URL)]
    pub base_url: String,
    /// Environment variable holding the API key.
    #[arg(long, default_value = "OPENAI_API_KEY")]
    pub api_key_env: String,
    /// Run against a strict simulated provider started in this process
    /// (enforcing the same --rpm/--tpm; no account needed).
    #[arg(long)]
    pub sim: bool,
    /// Time to first byte of the simulated provider (with --sim).
    #[arg(long, default_value = "20ms", value_parser = parse_duration_or_zero)]
    pub sim_latency: Duration,
    /// Requests per --window.
    #[arg(long)]
    pub rpm: Option<u64>,
    /// Tokens (input plus output) per --window.
    #[arg(long)]
    pub tpm: Option<u64>,
    /// Input tokens per --window (SPEC Q-12; e.g. Anthropic's ITPM). The
    /// simulator of --sim does not enforce it on the routes batch calls.
    #[arg(long)]
    pub itpm: Option<u64>,
    /// Output tokens (the output allowance, settled from the reported
    /// output) per --window (SPEC Q-12; e.g. Anthropic's OTPM). The
    /// simulator of --sim does not enforce it on the routes batch calls.
    #[arg(long)]
    pub otpm: Option<u64>,
    /// The window of --rpm, --tpm, --itpm and --otpm (e.g. 1m; shorter for
    /// tests).
    #[arg(long, default_value = "1m", value_parser = parse_duration)]
    pub window: Duration,
    /// A further limit, e.g. `tokens=5000000/1d` or `requests=10000/1d`
    /// (repeatable).
    #[arg(long = "limit", value_parser = parse_limit)]
    pub limits: Vec<Limit>,
    /// Items in progress at once (waiting for quota or at the provider).
    #[arg(long, default_value_t = 64)]
    pub concurrency: u64,
    /// Attempts per item, the first included (429, 5xx, timeouts and
    /// connection errors are retried).
    #[arg(long, default_value_t = 5)]
    pub max_attempts: u32,
    /// Each item's deadline, from when a worker takes it: quota wait,
    /// attempts and backoff together.
    #[arg(long, default_value = "10m", value_parser = parse_duration)]
    pub item_timeout: Duration,
    /// The whole run's deadline; items not finished by then are left for a
    /// re-run.
    #[arg(long, value_parser = parse_duration)]
    pub deadline: Option<Duration>,
    /// Cap of one attempt (connect, headers and body).
    #[arg(long, default_value = "5m", value_parser = parse_duration)]
    pub attempt_timeout: Duration,
    /// How tokens are counted: chars (ceil(chars / 4) + output cap),
    /// tokenizer (the model family's tokenizer + output cap) or openai
    /// (the larger of both + output cap).
    #[arg(long, default_value = "tokenizer", value_parser = parse_profile)]
    pub estimator: Profile,
    /// Output allowance of a chat request without max_tokens.
    #[arg(long, default_value_t = tollgate_openai::tokens::DEFAULT_OUTPUT_TOKENS)]
    pub default_max_tokens: u64,
    /// Stop at the first item that fails with one of these classes
    /// (authentication, invalid_request, rate_limited, server, timeout,
    /// connection, protocol, deadline, configuration); comma-separated or
    /// repeated.
    #[arg(long, value_delimiter = ',')]
    pub abort_on: Vec<ErrorClass>,
    /// Sync each output line to disk (survives a power loss, not only a
    /// crash).
    #[arg(long)]
    pub fsync: bool,
    /// Run again the items whose recorded result is a failure.
    #[arg(long)]
    pub retry_failed: bool,
    /// Run again the items whose request changed since their result was
    /// recorded (otherwise such a change stops the run before it starts).
    #[arg(long)]
    pub rerun_changed: bool,
    /// Validate, estimate, print the totals, the worst-case cost and the
    /// lower bound on wall time; send nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// The most this run may spend, in dollars (e.g. 25 or 2.5): each item
    /// reserves its worst case at its model's price; when the next one no
    /// longer fits, the run stops (exit 3) with the items sent so far
    /// recorded, and a re-run resumes (give it the budget left).
    #[arg(long, value_parser = parse_budget)]
    pub budget: Option<u64>,
    /// Prices to add to or replace in the built-in table (a TOML file in
    /// the format of data/prices.toml: [models."name"] input = 2.5,
    /// output = 10, dollars per million tokens).
    #[arg(long)]
    pub prices: Option<PathBuf>,
    /// Progress display: auto (a bar on a terminal, lines otherwise),
    /// plain, off.
    #[arg(long, default_value = "auto", value_parser = parse_progress)]
    pub progress: ProgressMode,
    /// Interval of plain progress lines.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    pub progress_interval: Duration,
    /// Write the summary as JSON to this file too.
    #[arg(long)]
    pub summary_json: Option<PathBuf>,
    /// Draw what was admitted over the run against the limits (trailing
    /// window sums of requests and tokens) as an SVG file.
    #[arg(long)]
    pub plot: Option<PathBuf>,
    /// Share the quota through Redis with gateways and other runs
    /// (`redis://127.0.0.1:6379`, `rediss://` for TLS): the limits then
    /// hold for all of them together. With `--redis-cluster`, one or more
    /// seed nodes of a Redis Cluster, comma-separated.
    #[arg(long, value_name = "URL")]
    pub redis: Option<String>,
    /// `--redis` names seed nodes of a Redis Cluster.
    #[arg(long)]
    pub redis_cluster: bool,
    /// The PEM file of the certificate authorities a `rediss://` server's
    /// certificate is checked against (default: the system's roots).
    #[arg(long, value_name = "FILE")]
    pub redis_ca: Option<PathBuf>,
    /// The quota scope's name; a gateway scope (or another run) of the same
    /// name, on the same Redis and prefix, spends the same budget.
    #[arg(long, default_value = "batch")]
    pub scope: String,
    /// Redis key prefix (the gateways' `[quota_store] prefix`).
    #[arg(long, default_value = "tollgate")]
    pub redis_prefix: String,
    /// Most time one Redis operation may take.
    #[arg(long, default_value = "50ms", value_parser = parse_duration)]
    pub redis_timeout: Duration,
    /// While Redis is unreachable: `fail_closed` (the run stops; re-run to
    /// resume) or `fail_open_local:N` (go on with 1/N of every limit, N
    /// processes sharing the budget).
    #[arg(long, default_value = "fail_closed", value_parser = parse_unavailable)]
    pub redis_unavailable: Unavailable,
    /// Keep the counts of long windows (`--limit` of one hour or longer, or
    /// per calendar period) in this directory, so a re-run (a resume, a
    /// crash) does not start a fresh day (SPEC DQ-8).
    #[arg(long, value_name = "DIR")]
    pub state_dir: Option<PathBuf>,
    /// With `--state-dir`: move an unreadable state file aside and start
    /// with nothing counted, instead of refusing to run.
    #[arg(long, requires = "state_dir")]
    pub state_start_empty: bool,
    /// The class the run's calls wait in: interactive, standard or batch
    /// (SPEC FAIR-7). Other work on the same scope (a gateway sharing it
    /// through Redis, in its own process) is not affected; within this
    /// process it orders the run's calls.
    #[arg(long, default_value = "batch", value_parser = parse_priority)]
    pub priority: tollgate::Priority,
    /// The tenant the run's calls belong to (its flow, SPEC FAIR-1).
    #[arg(long, default_value = "batch")]
    pub tenant: String,
    /// The tenant's weight against other tenants of its class (1 to 1000).
    #[arg(long, default_value_t = 1)]
    pub weight: u64,
}

fn parse_priority(s: &str) -> Result<tollgate::Priority, String> {
    s.parse()
        .map_err(|e: tollgate::UnknownPriority| e.to_string())
}

fn parse_progress(s: &str) -> Result<ProgressMode, String> {
    match s {
        "auto" => Ok(ProgressMode::Auto),
        "plain" => Ok(ProgressMode::Plain),
        "off" => Ok(ProgressMode::Off),
        other => Err(format!(
            "unknown progress mode `{other}` (auto, plain, off)"
        )),
    }
}

fn parse_duration_or_zero(s: &str) -> Result<Duration, String> {
    humantime::parse_duration(s.trim()).map_err(|e| format!("`{s}`: {e}"))
}

impl BatchArgs {
    /// The run's settings. Reads the API key from the environment.
    ///
    /// # Errors
    /// A zero limit, or no key for the OpenAI API.
    pub fn to_config(&self) -> Result<BatchConfig, BatchError> {
        for (name, v) in [
            ("--rpm", self.rpm),
            ("--tpm", self.tpm),
            ("--itpm", self.itpm),
            ("--otpm", self.otpm),
        ] {
            if v == Some(0) {
                return Err(BatchError::Config(format!("{name} must be at least 1")));
            }
        }
        let (rpm, tpm) = if self.sim && self.rpm.is_none() && self.tpm.is_none() {
            (Some(SIM_DEFAULT_RPM), Some(SIM_DEFAULT_TPM))
        } else {
            (self.rpm, self.tpm)
        };
        let mut limits = Vec::new();
        if let Some(amount) = rpm {
            limits.push(Limit::new(Dimension::Requests, amount, self.window));
        }
        if let Some(amount) = tpm {
            limits.push(Limit::new(Dimension::Tokens, amount, self.window));
        }
        for (dimension, amount) in [
            (Dimension::InputTokens, self.itpm),
            (Dimension::OutputTokens, self.otpm),
        ] {
            if let Some(amount) = amount {
                limits.push(Limit::new(dimension, amount, self.window));
            }
        }
        limits.extend(self.limits.iter().copied());
        let target = if self.sim {
            Target::Sim(Box::new(SimConfig {
                rpm,
                tpm,
                window: self.window,
                ttft: self.sim_latency,
                ..SimConfig::default()
            }))
        } else {
            let key = std::env::var(&self.api_key_env)
                .ok()
                .filter(|k| !k.is_empty());
            if key.is_none() && !self.dry_run && self.base_url == DEFAULT_BASE_URL {
                return Err(BatchError::Config(format!(
                    "no API key: set {} (or name another variable with --api-key-env), or try --sim",
                    self.api_key_env
                )));
            }
            Target::Http {
                base_url: self.base_url.clone(),
                api_key: key.map(ApiKey::from),
            }
        };
        let mut c = BatchConfig::new(&self.input, self.output.clone(), target);
        c.learn_limits = (!self.sim && limits.is_empty()).then_some(self.window);
        c.limits = limits;
        c.concurrency = self.concurrency;
        c.max_attempts = self.max_attempts;
        c.item_timeout = Some(self.item_timeout);
        c.deadline = self.deadline;
        c.attempt_timeout = Some(self.attempt_timeout);
        c.profile = self.estimator;
        c.default_output = self.default_max_tokens;
        c.abort_on = self.abort_on.clone();
        c.fsync = self.fsync;
        c.retry_failed = self.retry_failed;
        c.rerun_changed = self.rerun_changed;
        c.dry_run = self.dry_run;
        c.progress = self.progress;
        c.progress_interval = self.progress_interval;
        c.summary_json = self.summary_json.clone();
        c.budget = self.budget;
        if let Some(path) = &self.prices {
            c.prices =
                read_prices(path).map_err(|e| BatchError::Config(format!("--prices {e}")))?;
        }
        c.plot = self.plot.clone();
        if self.scope.trim().is_empty() {
            return Err(BatchError::Config("--scope must not be empty".into()));
        }
        if self.tenant.trim().is_empty() {
            return Err(BatchError::Config("--tenant must not be empty".into()));
        }
        let weight = match self.weight {
            w @ 1..=1_000 => w as u32,
            _ => {
                return Err(BatchError::Config(
                    "--weight must be between 1 and 1000".into(),
                ));
            }
        };
        c.flow = crate::config::run_flow(self.tenant.trim(), self.priority, weight);
        c.scope = self.scope.clone();
        c.state_dir = self.state_dir.clone();
        c.on_unreadable_state = if self.state_start_empty {
            tollgate_state::OnUnreadable::StartEmpty
        } else {
            tollgate_state::OnUnreadable::Refuse
        };
        if self.redis.is_none() && (self.redis_cluster || self.redis_ca.is_some()) {
            return Err(BatchError::Config(
                "--redis-cluster and --redis-ca need --redis".into(),
            ));
        }
        c.shared = self.redis.as_ref().map(|url| SharedStore {
            url: url.clone(),
            cluster: self.redis_cluster,
            ca_file: self.redis_ca.clone(),
            prefix: self.redis_prefix.clone(),
            timeout: self.redis_timeout,
            on_unavailable: self.redis_unavailable,
        });
        if c.shared.is_some() {
            // Learned limits are per process (SPEC Q-14): a shared budget
            // needs its limits stated.
            if c.limits.is_empty() {
                return Err(BatchError::Config(
                    "--redis needs the account's limits (--rpm, --tpm, --itpm, --otpm or --limit)"
                        .into(),
                ));
            }
            c.learn_limits = None;
        }
        Ok(c)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        batch: BatchArgs,
    }

    fn config(args: &[&str]) -> Result<BatchConfig, BatchError> {
        let mut all = vec!["tollgate-batch", "in.jsonl", "-o", "out.jsonl"];
        all.extend_from_slice(args);
        Cli::try_parse_from(all)
            .expect("flags parse")
            .batch
            .to_config()
    }

    // proves: FAIR-7 (the run's calls are class batch by default; the
    // flags set the class, tenant and weight, and refuse a bad weight or
    // an unknown class)
    #[test]
    fn the_runs_flow_is_batch_unless_told() {
        use tollgate::{Flow, Priority};
        let c = config(&["--sim"]).expect("config");
        assert_eq!(
            c.flow,
            Flow::new(Flow::tenant_number("batch"), Priority::Batch)
        );
        let c = config(&[
            "--sim",
            "--priority",
            "standard",
            "--tenant",
            "nightly",
            "--weight",
            "4",
        ])
        .expect("config");
        assert_eq!(
            c.flow,
            Flow::new(Flow::tenant_number("nightly"), Priority::Standard).with_weight(4)
        );
        let e = config(&["--sim", "--weight", "0"]).expect_err("weight 0");
        assert!(e.to_string().contains("--weight"), "{e}");
        let mut all = vec![
            "tollgate-batch",
            "in.jsonl",
            "-o",
            "out.jsonl",
            "--priority",
            "urgent",
        ];
        all.push("--sim");
        assert!(Cli::try_parse_from(all).is_err());
    }

    // proves: DQ-1, Q-14 (a shared store needs the account's limits stated:
    // limits learned from one process's answers cannot bind the others;
    // with them, the run shares the named scope)
    #[test]
    fn redis_needs_the_accounts_limits() {
        let local = ["--base-url", "http://127.0.0.1:9/v1"];
        let e = config(&[&local[..], &["--redis", "redis://127.0.0.1:6379"]].concat())
            .expect_err("no limits");
        assert!(e.to_string().contains("--rpm"), "{e}");
        let c = config(
            &[
                &local[..],
                &[
                    "--redis",
                    "redis://127.0.0.1:6379",
                    "--rpm",
                    "500",
                    "--scope",
                    "openai-main",
                ],
            ]
            .concat(),
        )
        .expect("valid");
        assert_eq!(c.scope, "openai-main");
        assert_eq!(c.learn_limits, None);
        assert_eq!(
            c.shared.map(|s| s.url).as_deref(),
            Some("redis://127.0.0.1:6379")
        );
        let e = config(&[&local[..], &["--scope", " "]].concat()).expect_err("empty scope");
        assert!(e.to_string().contains("--scope"), "{e}");
    }

    // proves: DQ-7 (--redis takes a cluster's seeds with --redis-cluster
    // and a CA file with --redis-ca; either without --redis is an error)
    #[test]
    fn redis_cluster_and_ca_flags() {
        let local = ["--base-url", "http://127.0.0.1:9/v1", "--rpm", "500"];
        let c = config(
            &[
                &local[..],
                &[
                    "--redis",
                    "rediss://a:6379,rediss://b:6379",
                    "--redis-cluster",
                    "--redis-ca",
                    "/etc/ca.pem",
                ],
            ]
            .concat(),
        )
        .expect("valid");
        let shared = c.shared.expect("shared");
        assert!(shared.cluster);
        assert_eq!(shared.url, "rediss://a:6379,rediss://b:6379");
        assert_eq!(shared.ca_file, Some(PathBuf::from("/etc/ca.pem")));
        for flag in [&["--redis-cluster"][..], &["--redis-ca", "/etc/ca.pem"]] {
            let e = config(&[&local[..], flag].concat()).expect_err("needs --redis");
            assert!(e.to_string().contains("need --redis"), "{e}");
        }
    }

    // proves: Q-12 (--itpm and --otpm add input-token and output-token
    // limits over --window, beside --rpm/--tpm and --limit; zero is an error
    // naming the flag)
    #[test]
    fn itpm_and_otpm_add_input_and_output_limits() {
        let local = ["--base-url", "http://127.0.0.1:9/v1"];
        let c = config(
            &[
                &local[..],
                &[
                    "--rpm",
                    "50",
                    "--itpm",
                    "400000",
                    "--otpm",
                    "80000",
                    "--window",
                    "30s",
                    "--limit",
                    "output_tokens=1000000/1d",
                ],
            ]
            .concat(),
        )
        .expect("valid");
        let limits: Vec<_> = c
            .limits
            .iter()
            .map(|l| (l.dimension, l.amount, l.window.as_secs()))
            .collect();
        assert_eq!(
            limits,
            [
                (Dimension::Requests, 50, 30),
                (Dimension::InputTokens, 400_000, 30),
                (Dimension::OutputTokens, 80_000, 30),
                (Dimension::OutputTokens, 1_000_000, 86_400),
            ]
        );
        assert_eq!(c.learn_limits, None);
        let e = config(&[&local[..], &["--otpm", "0"]].concat()).expect_err("zero");
        assert!(e.to_string().contains("--otpm"), "{e}");
    }
}

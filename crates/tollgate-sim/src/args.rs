//! Command-line flags for `tollgate sim`, as a `clap::Args` group that the
//! CLI flattens into its subcommand.

use std::net::SocketAddr;
use std::time::Duration;

use crate::accounting::{ChargeMode, IngressDelay, RefusalCharge};
use crate::config::{ConfigError, SimConfig, default_models};
use crate::duration::parse_duration;

/// Flags of the simulated provider. Every [`SimConfig`] knob has one.
///
/// ```
/// use clap::Parser;
///
/// #[derive(Parser)]
/// struct Cli {
///     #[command(subcommand)]
///     command: Command,
/// }
///
/// #[derive(clap::Subcommand)]
/// enum Command {
///     /// Run the simulated provider.
///     Sim(tollgate_sim::SimArgs),
/// }
///
/// let cli = Cli::parse_from(["tollgate", "sim", "--rpm", "60", "--window", "1m"]);
/// let Command::Sim(args) = cli.command;
/// let config = args.to_config()?;
/// assert_eq!(config.rpm, Some(60));
/// # Ok::<(), tollgate_sim::ConfigError>(())
/// ```
#[derive(Debug, Clone, clap::Args)]
pub struct SimArgs {
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:8081")]
    pub listen: SocketAddr,
    /// Requests allowed per window (unset = unlimited).
    #[arg(long)]
    pub rpm: Option<u64>,
    /// Tokens (prompt + completion) allowed per window (unset = unlimited).
    #[arg(long)]
    pub tpm: Option<u64>,
    /// Requests in progress at once; a stream counts until it ends (unset =
    /// unlimited).
    #[arg(long)]
    pub max_concurrency: Option<u64>,
    /// Length of the sliding window of --rpm and --tpm (e.g. 60s, 1m, 500ms).
    #[arg(long, default_value = "60s", value_parser = parse_duration)]
    pub window: Duration,
    /// Time to first token: delay before the first stream chunk or the
    /// one-shot body.
    #[arg(long, default_value = "0s", value_parser = parse_duration)]
    pub ttft: Duration,
    /// Delay before each streamed content chunk (added per completion token to
    /// one-shot responses).
    #[arg(long, default_value = "0s", value_parser = parse_duration)]
    pub per_token: Duration,
    /// Completion tokens generated; a smaller max_tokens /
    /// max_completion_tokens in the request wins.
    #[arg(long, default_value_t = 16)]
    pub completion_tokens: u32,
    /// Embedding vector length when the request does not set `dimensions`.
    #[arg(long, default_value_t = 8)]
    pub embedding_dim: u32,
    /// Seed of the deterministic fault generator.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Probability that an admitted request fails with 500 or 503.
    #[arg(long, default_value_t = 0.0)]
    pub error_rate: f64,
    /// Probability that a stream is cut mid-way (no `[DONE]`, aborted
    /// connection).
    #[arg(long, default_value_t = 0.0)]
    pub disconnect_rate: f64,
    /// Probability that response headers are held back by
    /// --slow-headers-delay.
    #[arg(long, default_value_t = 0.0)]
    pub slow_headers_rate: f64,
    /// How long a slow-headers fault holds the headers back.
    #[arg(long, default_value = "5s", value_parser = parse_duration)]
    pub slow_headers_delay: Duration,
    /// Bearer key the simulator demands on /v1/* routes (401 otherwise).
    #[arg(long, env = "TOLLGATE_SIM_REQUIRE_KEY", hide_env_values = true)]
    pub require_key: Option<String>,
    /// Model id listed by GET /v1/models (repeatable; requests may name any
    /// model). Defaults to sim-chat and sim-embedding.
    #[arg(long = "model")]
    pub models: Vec<String>,
    /// Delay between receiving a request and counting it against the
    /// windows, drawn uniformly per request from MIN..MAX (seeded by --seed),
    /// or a single value (e.g. 20ms..300ms, 100ms).
    #[arg(long, default_value = "0s", value_name = "MIN..MAX")]
    pub ingress_delay: IngressDelay,
    /// What the token window charges at the counting instant: `usage`
    /// (prompt + generated completion), `chars:N+max_tokens`
    /// (ceil(characters / N) + max_tokens, or --completion-tokens when the
    /// request sets none) or `chars:N` (ceil(characters / N)).
    #[arg(long, default_value = "usage", value_name = "MODE")]
    pub charge: ChargeMode,
    /// Replace an admitted request's token charge by its usage once its
    /// response completes (same window entry). `--reconcile` alone means on.
    #[arg(
        long,
        default_value = "off",
        default_missing_value = "on",
        num_args = 0..=1,
        value_name = "on|off",
        value_parser = parse_on_off
    )]
    pub reconcile: bool,
    /// What a request refused with 429 still costs in the windows.
    #[arg(long, value_enum, default_value_t = RefusalCharge::None)]
    pub charge_refusals: RefusalCharge,
    /// Requests per window spent by a background consumer of the same
    /// account, one every window / N (unset = none).
    #[arg(long)]
    pub background_rpm: Option<u64>,
    /// Tokens per window spent by the background consumer, spread over its
    /// requests (needs --background-rpm).
    #[arg(long)]
    pub background_tpm: Option<u64>,
    /// Key the Azure routes (/openai/deployments/{deployment}/...) demand in
    /// the `api-key` header; a request with an `Authorization` header is
    /// refused too (401, Azure's body). Unset = no check.
    #[arg(long, env = "TOLLGATE_SIM_AZURE_KEY", hide_env_values = true)]
    pub azure_key: Option<String>,
    /// Key POST /v1/messages demands in the `x-api-key` header (401,
    /// Anthropic's body). Unset = no check.
    #[arg(long, env = "TOLLGATE_SIM_ANTHROPIC_KEY", hide_env_values = true)]
    pub anthropic_key: Option<String>,
    /// Requests per window on POST /v1/messages, replenished continuously
    /// (unset = unlimited). Separate from --rpm.
    #[arg(long)]
    pub anthropic_rpm: Option<u64>,
    /// Input tokens per window on POST /v1/messages (ITPM), replenished
    /// continuously (unset = unlimited). Separate from --tpm.
    #[arg(long)]
    pub itpm: Option<u64>,
    /// Output tokens per window on POST /v1/messages (OTPM): admission takes
    /// max_tokens, the unused part comes back when the response ends (unset =
    /// unlimited).
    #[arg(long)]
    pub otpm: Option<u64>,
}

/// `on`/`off` (also `true`/`false`, `yes`/`no`, `1`/`0`).
fn parse_on_off(s: &str) -> Result<bool, String> {
    match s.trim().to_ascii_lowercase().as_str() {
        "on" | "true" | "yes" | "1" => Ok(true),
        "off" | "false" | "no" | "0" => Ok(false),
        _ => Err(format!("expected on or off, got {s:?}")),
    }
}

impl SimArgs {
    /// The validated configuration these flags describe.
    pub fn to_config(&self) -> Result<SimConfig, ConfigError> {
        let config = SimConfig {
            rpm: self.rpm,
            tpm: self.tpm,
            max_concurrency: self.max_concurrency,
            window: self.window,
            ttft: self.ttft,
            per_token: self.per_token,
            completion_tokens: self.completion_tokens,
            embedding_dim: self.embedding_dim,
            seed: self.seed,
            error_rate: self.error_rate,
            disconnect_rate: self.disconnect_rate,
            slow_headers_rate: self.slow_headers_rate,
            slow_headers_delay: self.slow_headers_delay,
            require_key: self.require_key.clone(),
            models: if self.models.is_empty() {
                default_models()
            } else {
                self.models.clone()
            },
            ingress_delay: self.ingress_delay,
            charge: self.charge,
            reconcile: self.reconcile,
            charge_refusals: self.charge_refusals,
            background_rpm: self.background_rpm,
            background_tpm: self.background_tpm,
            azure_key: self.azure_key.clone(),
            anthropic_key: self.anthropic_key.clone(),
            anthropic_rpm: self.anthropic_rpm,
            itpm: self.itpm,
            otpm: self.otpm,
        };
        config.validate()?;
        Ok(config)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Debug, Parser)]
    struct Cli {
        #[command(flatten)]
        sim: SimArgs,
    }

    fn parse(args: &[&str]) -> Result<SimArgs, clap::Error> {
        Cli::try_parse_from(std::iter::once("sim").chain(args.iter().copied())).map(|c| c.sim)
    }

    #[test]
    fn defaults_match_the_default_config() {
        let args = parse(&[]).expect("no flags parse");
        assert_eq!(args.listen, "127.0.0.1:8081".parse().expect("addr"));
        let mut config = args.to_config().expect("valid");
        // The environment may carry a key for the CLI; it is not a default.
        config.require_key = None;
        config.azure_key = None;
        config.anthropic_key = None;
        assert_eq!(config, SimConfig::default());
    }

    #[test]
    fn every_knob_has_a_flag() {
        let args = parse(&[
            "--listen",
            "0.0.0.0:9000",
            "--rpm",
            "10",
            "--tpm",
            "1000",
            "--max-concurrency",
            "4",
            "--window",
            "1m",
            "--ttft",
            "250ms",
            "--per-token",
            "10ms",
            "--completion-tokens",
            "32",
            "--embedding-dim",
            "16",
            "--seed",
            "7",
            "--error-rate",
            "0.1",
            "--disconnect-rate",
            "0.2",
            "--slow-headers-rate",
            "0.3",
            "--slow-headers-delay",
            "1.5s",
            "--require-key",
            "sk-test",
            "--model",
            "a",
            "--model",
            "b",
            "--ingress-delay",
            "20ms..300ms",
            "--charge",
            "chars:4+max_tokens",
            "--reconcile",
            "--charge-refusals",
            "requests",
            "--background-rpm",
            "3",
            "--background-tpm",
            "300",
            "--azure-key",
            "az-key",
            "--anthropic-key",
            "ant-key",
            "--anthropic-rpm",
            "50",
            "--itpm",
            "40000",
            "--otpm",
            "8000",
        ])
        .expect("all flags parse");
        let c = args.to_config().expect("valid");
        assert_eq!(c.rpm, Some(10));
        assert_eq!(c.tpm, Some(1000));
        assert_eq!(c.max_concurrency, Some(4));
        assert_eq!(c.window, Duration::from_secs(60));
        assert_eq!(c.ttft, Duration::from_millis(250));
        assert_eq!(c.per_token, Duration::from_millis(10));
        assert_eq!(c.completion_tokens, 32);
        assert_eq!(c.embedding_dim, 16);
        assert_eq!(c.seed, 7);
        assert_eq!(c.error_rate, 0.1);
        assert_eq!(c.disconnect_rate, 0.2);
        assert_eq!(c.slow_headers_rate, 0.3);
        assert_eq!(c.slow_headers_delay, Duration::from_millis(1500));
        assert_eq!(c.require_key.as_deref(), Some("sk-test"));
        assert_eq!(c.models, vec!["a".to_owned(), "b".to_owned()]);
        assert_eq!(
            c.ingress_delay,
            IngressDelay::range(Duration::from_millis(20), Duration::from_millis(300))
        );
        assert_eq!(
            c.charge,
            ChargeMode::Chars {
                chars_per_token: 4,
                output: true
            }
        );
        assert!(c.reconcile);
        assert_eq!(c.charge_refusals, RefusalCharge::Requests);
        assert_eq!((c.background_rpm, c.background_tpm), (Some(3), Some(300)));
        assert_eq!(c.azure_key.as_deref(), Some("az-key"));
        assert_eq!(c.anthropic_key.as_deref(), Some("ant-key"));
        assert_eq!(
            (c.anthropic_rpm, c.itpm, c.otpm),
            (Some(50), Some(40_000), Some(8_000))
        );
    }

    // proves: CFG-2 (accounting flags: forms accepted, bad values named)
    #[test]
    fn accounting_flags_parse_and_validate() {
        let c = parse(&[
            "--ingress-delay",
            "100ms",
            "--reconcile",
            "off",
            "--charge",
            "chars:3",
        ])
        .expect("parses")
        .to_config()
        .expect("valid");
        assert_eq!(
            c.ingress_delay,
            IngressDelay::fixed(Duration::from_millis(100))
        );
        assert!(!c.reconcile);
        assert_eq!(
            c.charge,
            ChargeMode::Chars {
                chars_per_token: 3,
                output: false
            }
        );
        let c = parse(&["--reconcile", "on", "--charge-refusals", "all"])
            .expect("parses")
            .to_config()
            .expect("valid");
        assert!(c.reconcile);
        assert_eq!(c.charge_refusals, RefusalCharge::All);
        for bad in [
            &["--charge", "tokens"][..],
            &["--charge", "chars:4+output"],
            &["--ingress-delay", "soon"],
            &["--reconcile", "maybe"],
            &["--charge-refusals", "some"],
        ] {
            assert!(parse(bad).is_err(), "{bad:?}");
        }
        for (flags, field) in [
            (&["--ingress-delay", "300ms..20ms"][..], "ingress_delay"),
            (&["--charge", "chars:0"], "charge"),
            (&["--background-tpm", "10"], "background_tpm"),
            (&["--background-rpm", "0"], "background_rpm"),
            (&["--rpm", "5", "--background-rpm", "6"], "background_rpm"),
        ] {
            let err = parse(flags)
                .expect("parses; validation refuses")
                .to_config()
                .expect_err(field);
            assert!(err.to_string().contains(&format!("`{field}`")), "{err}");
        }
    }

    // proves: CFG-1
    #[test]
    fn zero_flags_are_refused_with_the_field_name() {
        let args = parse(&["--rpm", "0"]).expect("parses; validation refuses");
        assert_eq!(
            args.to_config(),
            Err(ConfigError::ZeroLimit { field: "rpm" })
        );
        assert!(parse(&["--window", "sixty"]).is_err());
        let args = parse(&["--window", "0s"]).expect("parses; validation refuses");
        assert_eq!(
            args.to_config(),
            Err(ConfigError::MustBePositive { field: "window" })
        );
    }
}

//! What a batch run is told: limits, target, error classes.

use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;

use tollgate::config::{Calendar, Limit, Period, Zone};
use tollgate::{Dimension, Flow, Priority};
use tollgate_openai::prices::PriceTable;
use tollgate_openai::provider::ApiKey;
use tollgate_openai::tokens::Profile;
use tollgate_sim::SimConfig;

/// Where requests go.
#[derive(Debug, Clone)]
pub enum Target {
    /// An OpenAI-compatible API under `base_url` (e.g.
    /// `https://api.openai.com/v1`).
    Http {
        /// The base URL; `/chat/completions` and `/embeddings` are appended.
        base_url: String,
        /// The bearer key, if any.
        api_key: Option<ApiKey>,
    },
    /// A simulated provider started in this process on 127.0.0.1.
    Sim(Box<SimConfig>),
}

/// The error classes of failed items, for the summary and `--abort-on`
/// (SPEC BATCH-5, BATCH-6).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ErrorClass {
    /// HTTP 401/403.
    Authentication,
    /// Any other 4xx: the request itself is wrong.
    InvalidRequest,
    /// HTTP 429 until the attempts ran out.
    RateLimited,
    /// HTTP 5xx until the attempts ran out.
    Server,
    /// Attempts timed out.
    Timeout,
    /// Could not connect, or the connection broke.
    Connection,
    /// The response broke the protocol (not JSON...).
    Protocol,
    /// The item's own deadline (`--item-timeout`) ran out during its
    /// provider attempts.
    Deadline,
    /// The engine refused the item's configuration (estimate problems).
    Configuration,
}

impl ErrorClass {
    /// Every class.
    pub const ALL: [ErrorClass; 9] = [
        ErrorClass::Authentication,
        ErrorClass::InvalidRequest,
        ErrorClass::RateLimited,
        ErrorClass::Server,
        ErrorClass::Timeout,
        ErrorClass::Connection,
        ErrorClass::Protocol,
        ErrorClass::Deadline,
        ErrorClass::Configuration,
    ];

    /// The stable name, as written in output lines and accepted by
    /// `--abort-on`.
    pub const fn as_str(self) -> &'static str {
        match self {
            ErrorClass::Authentication => "authentication",
            ErrorClass::InvalidRequest => "invalid_request",
            ErrorClass::RateLimited => "rate_limited",
            ErrorClass::Server => "server",
            ErrorClass::Timeout => "timeout",
            ErrorClass::Connection => "connection",
            ErrorClass::Protocol => "protocol",
            ErrorClass::Deadline => "deadline",
            ErrorClass::Configuration => "configuration",
        }
    }
}

impl fmt::Display for ErrorClass {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for ErrorClass {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        ErrorClass::ALL
            .into_iter()
            .find(|c| c.as_str() == s)
            .ok_or_else(|| {
                let names: Vec<_> = ErrorClass::ALL.iter().map(|c| c.as_str()).collect();
                format!("unknown error class `{s}` (one of: {})", names.join(", "))
            })
    }
}

/// Parses a limit such as `tokens=5000000/1d`, `requests=500/1m` or
/// `input_tokens=400000/1m` (`rpm`/`tpm`/`itpm`/`otpm` are accepted for
/// `requests`/`tokens`/`input_tokens`/`output_tokens`; the window is a
/// duration such as `60s`, `1m`, `1h`, `1d`, or a calendar period, `hour`,
/// `day`, `week` or `month`, in UTC or in a time zone after `@`:
/// `tokens=2000000/day@Europe/Paris`, SPEC BUD-3).
///
/// # Errors
/// A message naming what is wrong.
pub fn parse_limit(s: &str) -> Result<Limit, String> {
    let (dim, rest) = s.split_once('=').ok_or_else(|| {
        format!("`{s}`: expected DIMENSION=AMOUNT/WINDOW, e.g. tokens=5000000/1d")
    })?;
    let dimension = match dim.trim() {
        "requests" | "rpm" => Dimension::Requests,
        "tokens" | "tpm" => Dimension::Tokens,
        "input_tokens" | "itpm" => Dimension::InputTokens,
        "output_tokens" | "otpm" => Dimension::OutputTokens,
        other => {
            return Err(format!(
                "`{s}`: unknown dimension `{other}` \
                 (requests, tokens, input_tokens or output_tokens)"
            ));
        }
    };
    let (amount, window) = rest
        .split_once('/')
        .ok_or_else(|| format!("`{s}`: expected AMOUNT/WINDOW, e.g. 5000000/1d"))?;
    let amount: u64 = amount
        .trim()
        .replace('_', "")
        .parse()
        .map_err(|_| format!("`{s}`: `{amount}` is not a positive integer"))?;
    if amount == 0 {
        return Err(format!("`{s}`: the amount must be at least 1"));
    }
    let (period, zone) = match window.split_once('@') {
        Some((period, zone)) => (period.trim(), Some(zone.trim())),
        None => (window.trim(), None),
    };
    let Some(period) = Period::parse(period) else {
        if zone.is_some() {
            return Err(format!(
                "`{s}`: a time zone applies only to a calendar window (hour, day, week or month)"
            ));
        }
        return Ok(Limit::new(dimension, amount, parse_duration(window)?));
    };
    let zone = zone
        .map_or(Ok(Zone::UTC), Zone::named)
        .map_err(|e| format!("`{s}`: {e}"))?;
    Ok(Limit::per(
        dimension,
        amount,
        Calendar::new(period).zone(zone),
    ))
}

/// Parses a positive duration (`500ms`, `2s`, `1m`, `1d`).
///
/// # Errors
/// A message naming what is wrong.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let d = humantime::parse_duration(s.trim()).map_err(|e| format!("`{s}`: {e}"))?;
    if d.is_zero() {
        return Err(format!("`{s}`: must be longer than zero"));
    }
    Ok(d)
}

/// Parses `--estimator`: `chars`, `tokenizer` or `openai`.
///
/// # Errors
/// A message naming the choices.
pub fn parse_profile(s: &str) -> Result<Profile, String> {
    match s {
        "tokenizer" => Ok(Profile::Tokenizer),
        "openai" => Ok(Profile::OpenAi),
        "chars" => Ok(Profile::Chars {
            chars_per_token: 4,
            output: true,
        }),
        other => Err(format!(
            "unknown estimator `{other}` (chars, tokenizer or openai)"
        )),
    }
}

/// How progress is shown (SPEC BATCH-4).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProgressMode {
    /// A bar when stderr is a terminal, plain lines otherwise.
    Auto,
    /// Plain lines on stderr every `interval`.
    Plain,
    /// Nothing until the summary.
    Off,
}

/// A whole batch run's settings.
#[derive(Debug, Clone)]
pub struct BatchConfig {
    /// The input JSONL file.
    pub input: PathBuf,
    /// The output JSONL file (required unless `dry_run`).
    pub output: Option<PathBuf>,
    /// Where requests go.
    pub target: Target,
    /// Every quota limit (`--rpm`, `--tpm`, `--limit`).
    pub limits: Vec<Limit>,
    /// Learn the limits left out from the provider's headers, over this
    /// window (SPEC Q-14).
    pub learn_limits: Option<Duration>,
    /// Items in progress at once (in admission or at the provider).
    pub concurrency: u64,
    /// Attempts per item, the first included.
    pub max_attempts: u32,
    /// Each item's deadline, from when a worker takes it.
    pub item_timeout: Option<Duration>,
    /// The whole run's deadline, from its start.
    pub deadline: Option<Duration>,
    /// Cap of one provider attempt (connect + headers + body).
    pub attempt_timeout: Option<Duration>,
    /// How tokens are counted (SPEC Q-16).
    pub profile: Profile,
    /// Output allowance of a chat request without `max_tokens`.
    pub default_output: u64,
    /// Stop at the first recorded error of these classes.
    pub abort_on: Vec<ErrorClass>,
    /// Sync every appended line to disk.
    pub fsync: bool,
    /// Run again the items whose recorded result is a failure.
    pub retry_failed: bool,
    /// Run again the items whose input changed since their result.
    pub rerun_changed: bool,
    /// Validate and estimate only.
    pub dry_run: bool,
    /// How progress is shown.
    pub progress: ProgressMode,
    /// Interval of plain progress lines.
    pub progress_interval: Duration,
    /// Also write the summary as JSON here.
    pub summary_json: Option<PathBuf>,
    /// Draw what was admitted against the limits as SVG here.
    pub plot: Option<PathBuf>,
    /// The quota scope's name: replicas and runs sharing a store share the
    /// budget of the scope of this name (SPEC DQ-1).
    pub scope: String,
    /// Keep the quota in this shared store instead of in the process.
    pub shared: Option<SharedStore>,
    /// Keep the counts of long windows (one hour or longer, calendar
    /// windows) in this directory across runs (SPEC DQ-8); with a shared
    /// store nothing is written (the store holds them).
    pub state_dir: Option<PathBuf>,
    /// What to do with a state file that cannot be read.
    pub on_unreadable_state: tollgate_state::OnUnreadable,
    /// The flow the run's calls wait in (SPEC FAIR-7): class `batch` by
    /// default, so a run sharing a scope with a gateway (through Redis, or
    /// embedded) yields to interactive and standard traffic except for its
    /// `min_share`; tenant `batch`, weight 1 unless `--tenant`/`--weight`.
    pub flow: Flow,
    /// Prices of the items' models (SPEC BUD-1): the built-in table, with
    /// the entries of `--prices FILE` added or replacing.
    pub prices: PriceTable,
    /// `--budget`: the most this run may spend, in micro-dollars (SPEC
    /// BUD-6). Every item then needs a price; the run stops (resumable)
    /// when the next item's worst case no longer fits.
    pub budget: Option<u64>,
    /// Trace export (SPEC OBS-5): off unless `endpoint` is set here or in
    /// `OTEL_EXPORTER_OTLP_ENDPOINT` (the command line sets nothing here:
    /// the standard `OTEL_*` variables configure it).
    pub telemetry: tollgate_telemetry::TelemetryConfig,
}

/// The window of a run's `--budget`: longer than any run.
pub const BUDGET_WINDOW: Duration = Duration::from_secs(366 * 86_400);

/// Reads `--prices FILE` (the format of `data/prices.toml`) over the
/// built-in table.
///
/// # Errors
/// A message naming the file and the offending entry.
pub fn read_prices(path: &std::path::Path) -> Result<PriceTable, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let extra = PriceTable::parse(&text).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut table = PriceTable::builtin().clone();
    for entry in extra.entries() {
        table.set(&entry.model, entry.price);
    }
    Ok(table)
}

/// Parses `--budget`: dollars, at most six decimals, more than zero.
///
/// # Errors
/// A message naming what is wrong.
pub fn parse_budget(s: &str) -> Result<u64, String> {
    match tollgate::price::parse_usd(s, 1_000_000_000 * 1_000_000) {
        Ok(0) => Err(format!("`{s}`: a budget must be more than zero")),
        Ok(m) => Ok(m),
        Err(e) => Err(format!("`{s}`: {e}")),
    }
}

/// The flow of a run: tenant `name`, `priority`, `weight`.
pub fn run_flow(name: &str, priority: Priority, weight: u32) -> Flow {
    Flow::new(Flow::tenant_number(name), priority).with_weight(weight)
}

/// A quota store shared with gateways and other runs (SPEC DQ-1..DQ-7).
#[derive(Debug, Clone)]
pub struct SharedStore {
    /// `redis://host:port[/db]` (`rediss://` for TLS); a cluster's seed
    /// URLs, comma-separated.
    pub url: String,
    /// The URL names seeds of a Redis Cluster.
    pub cluster: bool,
    /// The PEM file of the certificate authorities of a `rediss://`
    /// server (default: the system's roots).
    pub ca_file: Option<std::path::PathBuf>,
    /// Key prefix (the gateways' `[quota_store] prefix`).
    pub prefix: String,
    /// Per-operation timeout.
    pub timeout: Duration,
    /// While the store is unreachable.
    pub on_unavailable: tollgate::quota::Unavailable,
}

/// Parses `--redis-unavailable`: `fail_closed` or `fail_open_local:N` (N
/// processes share the budget).
pub fn parse_unavailable(s: &str) -> Result<tollgate::quota::Unavailable, String> {
    use tollgate::quota::Unavailable;
    match s.trim().split_once(':') {
        None if s.trim() == "fail_closed" => Ok(Unavailable::FailClosed),
        Some(("fail_open_local", n)) => match n.trim().parse::<u32>() {
            Ok(replicas) if replicas > 0 => Ok(Unavailable::FailOpenLocal { replicas }),
            _ => Err(format!(
                "`{s}`: the number of processes sharing the budget must be at least 1"
            )),
        },
        _ => Err(format!(
            "`{s}`: expected fail_closed or fail_open_local:N (N processes share the budget)"
        )),
    }
}

impl BatchConfig {
    /// Settings with the defaults for `input` → `output` against `target`.
    pub fn new(input: impl Into<PathBuf>, output: Option<PathBuf>, target: Target) -> Self {
        BatchConfig {
            input: input.into(),
            output,
            target,
            limits: Vec::new(),
            learn_limits: None,
            concurrency: 64,
            max_attempts: 5,
            item_timeout: Some(Duration::from_secs(600)),
            deadline: None,
            attempt_timeout: Some(Duration::from_secs(300)),
            profile: Profile::Tokenizer,
            default_output: tollgate_openai::tokens::DEFAULT_OUTPUT_TOKENS,
            abort_on: Vec::new(),
            fsync: false,
            retry_failed: false,
            rerun_changed: false,
            dry_run: false,
            progress: ProgressMode::Off,
            progress_interval: Duration::from_secs(10),
            summary_json: None,
            plot: None,
            scope: "batch".into(),
            shared: None,
            prices: PriceTable::builtin().clone(),
            budget: None,
            state_dir: None,
            on_unreadable_state: tollgate_state::OnUnreadable::Refuse,
            flow: run_flow("batch", Priority::Batch, 1),
            telemetry: tollgate_telemetry::TelemetryConfig::default(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // proves: BUD-3 (`--limit` takes calendar windows, in UTC or a time
    // zone; an unknown zone is refused with its name)
    #[test]
    fn calendar_limits_parse() {
        let l = parse_limit("tokens=2000000/day").expect("limit");
        assert_eq!(l.calendar, Some(Calendar::new(Period::Day)));
        let l = parse_limit("requests=10/month@Europe/Paris").expect("limit");
        let paris = Zone::named("Europe/Paris").expect("zone");
        assert_eq!(l.calendar, Some(Calendar::new(Period::Month).zone(paris)));
        let e = parse_limit("requests=10/month@Mars/Base").expect_err("zone");
        assert!(e.contains("Mars/Base"), "{e}");
        assert!(parse_limit("requests=10/1d@UTC").is_err());
    }

    #[test]
    fn limits_parse() {
        let l = parse_limit("tokens=5000000/1d").expect("limit");
        assert_eq!(l.dimension, Dimension::Tokens);
        assert_eq!(l.amount, 5_000_000);
        assert_eq!(l.window, Duration::from_secs(86_400));
        let l = parse_limit("requests=500/1m").expect("limit");
        assert_eq!((l.amount, l.window), (500, Duration::from_secs(60)));
        assert!(parse_limit("tokens=0/1m").is_err());
        assert!(parse_limit("tokens=5/0s").is_err());
        let e = parse_limit("bytes=5/1m").expect_err("unknown");
        assert!(e.contains("input_tokens or output_tokens"), "{e}");
        assert!(parse_limit("tokens5").is_err());
        assert_eq!(
            "invalid_request".parse::<ErrorClass>(),
            Ok(ErrorClass::InvalidRequest)
        );
        assert!("nope".parse::<ErrorClass>().is_err());
    }

    // proves: Q-12 (`--limit` takes input and output token limits, by name
    // or by the itpm/otpm shortcuts)
    #[test]
    fn input_and_output_limits_parse() {
        let l = parse_limit("input_tokens=400000/1m").expect("limit");
        assert_eq!(
            (l.dimension, l.amount, l.window),
            (Dimension::InputTokens, 400_000, Duration::from_secs(60))
        );
        let l = parse_limit("otpm=80000/1m").expect("limit");
        assert_eq!(l.dimension, Dimension::OutputTokens);
        assert_eq!(
            parse_limit("itpm=5/1h").map(|l| l.dimension),
            Ok(Dimension::InputTokens)
        );
        assert!(parse_limit("output_tokens=0/1m").is_err());
    }

    // proves: DQ-3, CFG-2 (`--redis-unavailable` takes the two modes; a bad
    // value is a clear error naming what to write, never a silent default)
    #[test]
    fn redis_unavailable_parses_or_says_what_to_write() {
        use tollgate::quota::Unavailable;
        assert_eq!(
            parse_unavailable("fail_closed"),
            Ok(Unavailable::FailClosed)
        );
        assert_eq!(
            parse_unavailable("fail_open_local:3"),
            Ok(Unavailable::FailOpenLocal { replicas: 3 })
        );
        for bad in [
            "fail_open_local",
            "fail_open_local:0",
            "fail_open_local:x",
            "open",
        ] {
            let e = parse_unavailable(bad).expect_err(bad);
            assert!(e.contains(bad), "{bad}: {e}");
        }
    }
}

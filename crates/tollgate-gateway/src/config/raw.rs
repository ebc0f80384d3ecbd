//! The file as written: serde structs that reject unknown fields, and their
//! conversion into typed values (durations, addresses, hashes).
//!
//! Only parsing happens here; rules between values (zero limits,
//! references, cycles) are checked on the typed configuration by
//! `validate`, so that configurations built in code are checked the same
//! way.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Duration;

use serde::Deserialize;
use tollgate::Priority;
use tollgate::config::{Algorithm, Calendar, CooldownConfig, Limit, Overflow, Period, Zone};
use tollgate::lifecycle::{AttemptPolicy, CircuitConfig};
use tollgate::quota::{Dimension, RefusalCost};
use tollgate_openai::tokens::Profile;

use super::deployment::DeploymentConfig;
use super::error::{ConfigErrorKind, FieldPath, Problem};
use super::flavor::{ApiRoute, Flavor, ProviderWire, route_names};
use super::quota_store::RawQuotaStore;
use super::telemetry::RawTelemetry;
use super::types::{
    AdmissionConfig, AnonymousConfig, DEFAULT_ARRIVAL_FLOOR, DEFAULT_MAX_TOKENS, GatewayConfig,
    LogFormat, MAX_WEIGHT, ModelConfig, ModelKind, ProviderConfig, QuotaScope, ServerConfig,
    TenantConfig, TenantModelLimits, default_retry,
};
use crate::auth::KeyHash;

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawConfig {
    #[serde(default)]
    server: RawServer,
    #[serde(default)]
    admission: RawAdmission,
    #[serde(default)]
    retry: RawRetry,
    #[serde(default)]
    cooldown: RawCooldown,
    #[serde(default)]
    providers: BTreeMap<String, RawProvider>,
    #[serde(default)]
    scopes: BTreeMap<String, RawScope>,
    #[serde(default)]
    models: BTreeMap<String, RawModel>,
    #[serde(default)]
    tenants: BTreeMap<String, RawTenant>,
    #[serde(default)]
    anonymous: RawAnonymous,
    #[serde(default)]
    quota_store: RawQuotaStore,
    #[serde(default)]
    telemetry: RawTelemetry,
    /// `[prices.<model>]`: parsed by hand (located errors, decimals read
    /// exactly).
    #[serde(default)]
    prices: BTreeMap<String, toml::Value>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawServer {
    listen: Option<String>,
    max_body_bytes: Option<usize>,
    max_header_bytes: Option<usize>,
    header_read_timeout: Option<String>,
    body_read_timeout: Option<String>,
    idle_timeout: Option<String>,
    max_connections: Option<usize>,
    max_connections_per_client: Option<usize>,
    shutdown_grace: Option<String>,
    admin_key_env: Option<String>,
    log_format: Option<RawLogFormat>,
    access_log: Option<bool>,
    metrics_listen: Option<String>,
    connection_threads: Option<usize>,
    state_dir: Option<String>,
    on_unreadable_state: Option<RawOnUnreadable>,
    state_save_interval: Option<String>,
}

#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(rename_all = "snake_case")]
enum RawOnUnreadable {
    Refuse,
    StartEmpty,
}

#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(rename_all = "snake_case")]
enum RawLogFormat {
    Text,
    Json,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawAdmission {
    queue_capacity: Option<usize>,
    overflow: Option<RawOverflow>,
    default_timeout: Option<String>,
    max_timeout: Option<String>,
    max_wait: Option<String>,
}

#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(rename_all = "snake_case")]
enum RawOverflow {
    Reject,
    Wait,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRetry {
    max_attempts: Option<u32>,
    base_delay: Option<String>,
    factor: Option<f64>,
    max_delay: Option<String>,
    jitter: Option<f64>,
    max_wait: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawCooldown {
    base: Option<String>,
    factor: Option<f64>,
    max: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawProvider {
    base_url: String,
    api_key_env: Option<String>,
    connect_timeout: Option<String>,
    attempt_timeout: Option<String>,
    max_response_bytes: Option<usize>,
    #[serde(default)]
    circuit: RawCircuit,
    /// `"tokenizer"`, `"openai"` or `{ chars_per_token, output }`: parsed
    /// by hand so that a wrong value gets a precise message.
    accounting: Option<toml::Value>,
    refusals: Option<RawRefusals>,
    reconciles: Option<bool>,
    arrival_floor: Option<String>,
    flavor: Option<String>,
    api_version: Option<String>,
    auth_header: Option<String>,
    auth_prefix: Option<String>,
    #[serde(default)]
    headers: BTreeMap<String, String>,
    #[serde(default)]
    query: BTreeMap<String, String>,
}

#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(rename_all = "snake_case")]
enum RawRefusals {
    Full,
    Request,
    Free,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawCircuit {
    failure_threshold: Option<u32>,
    recovery_time: Option<String>,
    half_open_calls: Option<u32>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawScope {
    algorithm: Option<RawAlgorithm>,
    burst: Option<String>,
    rpm: Option<u64>,
    tpm: Option<u64>,
    itpm: Option<u64>,
    otpm: Option<u64>,
    #[serde(default)]
    limits: Vec<RawLimit>,
    queue_capacity: Option<usize>,
    learn_limits: Option<bool>,
    learn_window: Option<String>,
}

#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(rename_all = "snake_case")]
enum RawAlgorithm {
    SlidingWindow,
    TokenBucket,
    FixedWindow,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawLimit {
    requests: Option<u64>,
    tokens: Option<u64>,
    input_tokens: Option<u64>,
    output_tokens: Option<u64>,
    /// A budget in dollars (SPEC BUD-2): a number or a decimal string,
    /// read exactly into micro-dollars.
    usd: Option<toml::Value>,
    per: String,
    timezone: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawModel {
    provider: Option<String>,
    upstream_model: Option<String>,
    scope: Option<String>,
    concurrency: Option<u64>,
    max_waiting: Option<usize>,
    max_wait: Option<String>,
    #[serde(default)]
    fallbacks: Vec<String>,
    default_max_tokens: Option<u64>,
    kind: Option<RawKind>,
    routes: Option<Vec<String>>,
    learn_limits: Option<bool>,
    learn_window: Option<String>,
    #[serde(default)]
    deployments: BTreeMap<String, RawDeployment>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawDeployment {
    provider: String,
    upstream_model: Option<String>,
    scope: Option<String>,
    concurrency: Option<u64>,
    max_waiting: Option<usize>,
    max_wait: Option<String>,
    learn_limits: Option<bool>,
    learn_window: Option<String>,
    weight: Option<u32>,
}

/// `rpm`, `tpm`, `itpm`, `otpm` and `limits` of a tenant's per-model table.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTenantModel {
    rpm: Option<u64>,
    tpm: Option<u64>,
    itpm: Option<u64>,
    otpm: Option<u64>,
    #[serde(default)]
    limits: Vec<RawLimit>,
}

#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(rename_all = "snake_case")]
enum RawKind {
    Chat,
    Embeddings,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTenant {
    keys_sha256: Vec<String>,
    weight: Option<u64>,
    priority: Option<String>,
    concurrency: Option<u64>,
    max_waiting: Option<usize>,
    max_wait: Option<String>,
    rpm: Option<u64>,
    tpm: Option<u64>,
    itpm: Option<u64>,
    otpm: Option<u64>,
    #[serde(default)]
    limits: Vec<RawLimit>,
    models: Option<Vec<String>>,
    #[serde(default)]
    per_model: BTreeMap<String, RawTenantModel>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawAnonymous {
    #[serde(default)]
    enabled: bool,
    concurrency: Option<u64>,
    max_waiting: Option<usize>,
    max_wait: Option<String>,
}

/// Parses a humantime duration such as `500ms`, `10s`, `1m`, `1d`.
pub(super) fn duration(path: &FieldPath, text: &str) -> Result<Duration, Problem> {
    humantime::parse_duration(text.trim()).map_err(|e| {
        Problem::invalid(
            path,
            format!(
                "{text:?} is not a duration ({e}); write a number with a unit, \
                 such as \"500ms\", \"10s\", \"1m\" or \"1d\""
            ),
        )
    })
}

/// An optional duration with a default.
fn duration_or(
    path: &FieldPath,
    text: Option<&String>,
    default: Duration,
) -> Result<Duration, Problem> {
    text.map_or(Ok(default), |t| duration(path, t))
}

/// An optional duration without a default.
fn duration_opt(path: &FieldPath, text: Option<&String>) -> Result<Option<Duration>, Problem> {
    text.map(|t| duration(path, t)).transpose()
}

impl RawConfig {
    /// Typed values, or the first value that does not parse.
    pub(super) fn into_config(self, origin: &str) -> Result<GatewayConfig, Problem> {
        Ok(GatewayConfig {
            origin: origin.to_owned(),
            server: self.server.convert()?,
            admission: self.admission.convert()?,
            retry: self.retry.convert()?,
            cooldown: self.cooldown.convert()?,
            providers: self
                .providers
                .into_iter()
                .map(|(name, p)| p.convert(name))
                .collect::<Result<_, _>>()?,
            scopes: self
                .scopes
                .into_iter()
                .map(|(name, s)| s.convert(name))
                .collect::<Result<_, _>>()?,
            models: self
                .models
                .into_iter()
                .map(|(name, m)| m.convert(name))
                .collect::<Result<_, _>>()?,
            tenants: self
                .tenants
                .into_iter()
                .map(|(name, t)| t.convert(name))
                .collect::<Result<_, _>>()?,
            anonymous: self.anonymous.convert()?,
            quota_store: self.quota_store.convert()?,
            telemetry: self.telemetry.convert()?,
            prices: self
                .prices
                .into_iter()
                .map(|(model, value)| super::prices::override_entry(model, &value))
                .collect::<Result<_, _>>()?,
        })
    }
}

impl RawServer {
    fn convert(self) -> Result<ServerConfig, Problem> {
        let at = FieldPath::top("server");
        let d = ServerConfig::default();
        let address = |field: &str, text: &String| {
            text.trim().parse::<SocketAddr>().map_err(|_| {
                Problem::invalid(
                    &at.key(field),
                    format!(
                        "{text:?} is not an IP address with a port, such as \
                         \"127.0.0.1:8080\" or \"[::]:8080\" (host names are not resolved)"
                    ),
                )
            })
        };
        let listen = match &self.listen {
            None => d.listen,
            Some(text) => address("listen", text)?,
        };
        let metrics_listen = self
            .metrics_listen
            .as_ref()
            .map(|t| address("metrics_listen", t))
            .transpose()?;
        Ok(ServerConfig {
            listen,
            max_body_bytes: self.max_body_bytes.unwrap_or(d.max_body_bytes),
            max_header_bytes: self.max_header_bytes.unwrap_or(d.max_header_bytes),
            header_read_timeout: duration_or(
                &at.key("header_read_timeout"),
                self.header_read_timeout.as_ref(),
                d.header_read_timeout,
            )?,
            body_read_timeout: duration_or(
                &at.key("body_read_timeout"),
                self.body_read_timeout.as_ref(),
                d.body_read_timeout,
            )?,
            idle_timeout: duration_or(
                &at.key("idle_timeout"),
                self.idle_timeout.as_ref(),
                d.idle_timeout,
            )?,
            max_connections: self.max_connections.unwrap_or(d.max_connections),
            max_connections_per_client: self.max_connections_per_client,
            shutdown_grace: duration_or(
                &at.key("shutdown_grace"),
                self.shutdown_grace.as_ref(),
                d.shutdown_grace,
            )?,
            admin_key_env: self.admin_key_env,
            log_format: match self.log_format {
                None => d.log_format,
                Some(RawLogFormat::Text) => LogFormat::Text,
                Some(RawLogFormat::Json) => LogFormat::Json,
            },
            access_log: self.access_log.unwrap_or(d.access_log),
            metrics_listen,
            connection_threads: self.connection_threads,
            state_dir: self.state_dir.map(std::path::PathBuf::from),
            on_unreadable_state: match self.on_unreadable_state {
                None | Some(RawOnUnreadable::Refuse) => tollgate_state::OnUnreadable::Refuse,
                Some(RawOnUnreadable::StartEmpty) => tollgate_state::OnUnreadable::StartEmpty,
            },
            state_save_interval: duration_or(
                &at.key("state_save_interval"),
                self.state_save_interval.as_ref(),
                d.state_save_interval,
            )?,
        })
    }
}

impl RawAdmission {
    fn convert(self) -> Result<AdmissionConfig, Problem> {
        let at = FieldPath::top("admission");
        let d = AdmissionConfig::default();
        Ok(AdmissionConfig {
            queue_capacity: self.queue_capacity.unwrap_or(d.queue_capacity),
            overflow: match self.overflow {
                None => d.overflow,
                Some(RawOverflow::Reject) => Overflow::Reject,
                Some(RawOverflow::Wait) => Overflow::Wait,
            },
            default_timeout: duration_or(
                &at.key("default_timeout"),
                self.default_timeout.as_ref(),
                d.default_timeout,
            )?,
            max_timeout: duration_or(
                &at.key("max_timeout"),
                self.max_timeout.as_ref(),
                d.max_timeout,
            )?,
            max_wait: duration_opt(&at.key("max_wait"), self.max_wait.as_ref())?,
        })
    }
}

impl RawRetry {
    fn convert(self) -> Result<AttemptPolicy, Problem> {
        let at = FieldPath::top("retry");
        let d = default_retry();
        Ok(AttemptPolicy {
            max_attempts: self.max_attempts.unwrap_or(d.max_attempts),
            base_delay: duration_or(
                &at.key("base_delay"),
                self.base_delay.as_ref(),
                d.base_delay,
            )?,
            factor: self.factor.unwrap_or(d.factor),
            max_delay: duration_or(&at.key("max_delay"), self.max_delay.as_ref(), d.max_delay)?,
            jitter: self.jitter.unwrap_or(d.jitter),
            max_wait: duration_or(&at.key("max_wait"), self.max_wait.as_ref(), d.max_wait)?,
        })
    }
}

impl RawCooldown {
    fn convert(self) -> Result<CooldownConfig, Problem> {
        let at = FieldPath::top("cooldown");
        let d = CooldownConfig::default();
        Ok(CooldownConfig {
            base: duration_or(&at.key("base"), self.base.as_ref(), d.base)?,
            factor: self.factor.unwrap_or(d.factor),
            max: duration_or(&at.key("max"), self.max.as_ref(), d.max)?,
        })
    }
}

impl RawProvider {
    fn convert(self, name: String) -> Result<ProviderConfig, Problem> {
        let at = FieldPath::top("providers").key(&name);
        let circuit_at = at.key("circuit");
        let d = CircuitConfig::default();
        let circuit = CircuitConfig {
            failure_threshold: self
                .circuit
                .failure_threshold
                .unwrap_or(d.failure_threshold),
            recovery_time: duration_or(
                &circuit_at.key("recovery_time"),
                self.circuit.recovery_time.as_ref(),
                d.recovery_time,
            )?,
            half_open_calls: self.circuit.half_open_calls.unwrap_or(d.half_open_calls),
        };
        let flavor = match self.flavor.as_deref().map(str::trim) {
            None => Flavor::OpenAi,
            Some(name) => Flavor::parse(name).ok_or_else(|| {
                Problem::invalid(
                    &at.key("flavor"),
                    format!(
                        "unknown flavor {name:?}; write \"openai\", \"azure\", \
                         \"openai_compatible\" or \"anthropic\""
                    ),
                )
            })?,
        };
        let accounting = match &self.accounting {
            None => flavor.default_accounting(),
            Some(value) => accounting(&at.key("accounting"), value)?,
        };
        Ok(ProviderConfig {
            base_url: self.base_url.trim().trim_end_matches('/').to_owned(),
            api_key_env: self.api_key_env,
            connect_timeout: duration_or(
                &at.key("connect_timeout"),
                self.connect_timeout.as_ref(),
                Duration::from_secs(5),
            )?,
            attempt_timeout: duration_or(
                &at.key("attempt_timeout"),
                self.attempt_timeout.as_ref(),
                Duration::from_secs(120),
            )?,
            max_response_bytes: self
                .max_response_bytes
                .unwrap_or(tollgate_openai::provider::DEFAULT_MAX_RESPONSE_BODY),
            circuit,
            accounting,
            refusals: match self.refusals {
                // Anthropic's buckets take nothing from a refused request.
                None if flavor == Flavor::Anthropic => RefusalCost::Free,
                None | Some(RawRefusals::Full) => RefusalCost::Full,
                Some(RawRefusals::Request) => RefusalCost::Request,
                Some(RawRefusals::Free) => RefusalCost::Free,
            },
            reconciles: self.reconciles.unwrap_or(true),
            arrival_floor: duration_or(
                &at.key("arrival_floor"),
                self.arrival_floor.as_ref(),
                DEFAULT_ARRIVAL_FLOOR,
            )?,
            wire: ProviderWire {
                flavor,
                api_version: self.api_version,
                auth_header: self.auth_header,
                auth_prefix: self.auth_prefix,
                headers: self.headers.into_iter().collect(),
                query: self.query.into_iter().collect(),
            },
            name,
        })
    }
}

/// The example of every message about `accounting`.
const ACCOUNTING_FORMS: &str = "write \"tokenizer\", \"openai\", \"anthropic\" or \
     { chars_per_token = 4, output = \"max_tokens\" } (output: \"max_tokens\" or \"none\")";

/// `providers.<name>.accounting`: a profile name or a custom rule.
fn accounting(at: &FieldPath, value: &toml::Value) -> Result<Profile, Problem> {
    let table = match value {
        toml::Value::String(name) => {
            return match name.trim() {
                "tokenizer" => Ok(Profile::Tokenizer),
                "openai" => Ok(Profile::OpenAi),
                "anthropic" => Ok(Profile::Anthropic),
                other => Err(Problem::invalid(
                    at,
                    format!("unknown accounting profile {other:?}; {ACCOUNTING_FORMS}"),
                )),
            };
        }
        toml::Value::Table(table) => table,
        other => {
            return Err(Problem::invalid(
                at,
                format!(
                    "has the wrong type ({}); {ACCOUNTING_FORMS}",
                    other.type_str()
                ),
            ));
        }
    };
    if let Some(key) = table
        .keys()
        .find(|k| !matches!(k.as_str(), "chars_per_token" | "output"))
    {
        return Err(Problem::invalid(
            &at.key(key),
            format!(
                "unknown field {key:?}; a custom accounting rule has only chars_per_token and output"
            ),
        ));
    }
    let chars_per_token = match table.get("chars_per_token") {
        None => {
            return Err(Problem::invalid(
                at,
                format!("a custom rule needs chars_per_token; {ACCOUNTING_FORMS}"),
            ));
        }
        Some(toml::Value::Integer(n)) => {
            u32::try_from(*n).ok().filter(|n| *n >= 1).ok_or_else(|| {
                Problem::invalid(
                    &at.key("chars_per_token"),
                    format!("must be an integer from 1 to {}, got {n}", u32::MAX),
                )
            })?
        }
        Some(other) => {
            return Err(Problem::invalid(
                &at.key("chars_per_token"),
                format!(
                    "must be a positive integer (characters per token, e.g. 4), not a {}",
                    other.type_str()
                ),
            ));
        }
    };
    let output = match table.get("output") {
        None => true,
        Some(toml::Value::String(s)) if s == "max_tokens" => true,
        Some(toml::Value::String(s)) if s == "none" => false,
        Some(_) => {
            return Err(Problem::invalid(
                &at.key("output"),
                "must be \"max_tokens\" (the request's output cap is counted) or \"none\"",
            ));
        }
    };
    Ok(Profile::Chars {
        chars_per_token,
        output,
    })
}

/// `learn_limits` / `learn_window` of a scope or a model: the learning
/// window, if learning is on.
fn learn(
    at: &FieldPath,
    learn_limits: Option<bool>,
    learn_window: Option<&String>,
) -> Result<Option<Duration>, Problem> {
    let window = duration_opt(&at.key("learn_window"), learn_window)?;
    match (learn_limits, window) {
        (Some(true), window) => Ok(Some(window.unwrap_or(tollgate::config::MINUTE))),
        (None | Some(false), Some(_)) => Err(Problem::invalid(
            &at.key("learn_window"),
            "has no effect without learn_limits = true; set it or remove learn_window",
        )),
        (None | Some(false), None) => Ok(None),
    }
}

impl RawScope {
    fn convert(self, name: String) -> Result<QuotaScope, Problem> {
        let at = FieldPath::top("scopes").key(&name);
        let burst = duration_opt(&at.key("burst"), self.burst.as_ref())?;
        let algorithm = match (self.algorithm, burst) {
            (Some(RawAlgorithm::TokenBucket), burst) => Algorithm::TokenBucket { burst },
            (other, Some(_)) => {
                let algorithm = match other {
                    Some(RawAlgorithm::FixedWindow) => "fixed_window",
                    _ => "sliding_window (the default)",
                };
                return Err(Problem::invalid(
                    &at.key("burst"),
                    format!(
                        "applies only to algorithm = \"token_bucket\", but this scope uses \
                         {algorithm}; remove burst or change the algorithm"
                    ),
                ));
            }
            (None | Some(RawAlgorithm::SlidingWindow), None) => Algorithm::SlidingWindow,
            (Some(RawAlgorithm::FixedWindow), None) => Algorithm::FixedWindow,
        };
        let limits = limits(&at, &self.limits)?;
        Ok(QuotaScope {
            name,
            algorithm,
            rpm: self.rpm,
            tpm: self.tpm,
            itpm: self.itpm,
            otpm: self.otpm,
            limits,
            queue_capacity: self.queue_capacity,
            learn_limits: learn(&at, self.learn_limits, self.learn_window.as_ref())?,
        })
    }
}

impl RawLimit {
    fn convert(&self, at: &FieldPath) -> Result<Limit, Problem> {
        let usd = self
            .usd
            .as_ref()
            .map(|v| super::prices::budget(&at.key("usd"), v))
            .transpose()?;
        let set: Vec<(Dimension, u64)> = [
            (Dimension::Requests, self.requests),
            (Dimension::Tokens, self.tokens),
            (Dimension::InputTokens, self.input_tokens),
            (Dimension::OutputTokens, self.output_tokens),
            (Dimension::Cost, usd),
        ]
        .into_iter()
        .filter_map(|(d, n)| n.map(|n| (d, n)))
        .collect();
        let (dimension, amount) = match set[..] {
            [one] => one,
            [] => {
                return Err(Problem::invalid(
                    at,
                    "needs requests, tokens, input_tokens, output_tokens or usd, \
                     e.g. { tokens = 5000000, per = \"1d\" } or { usd = 50, per = \"1d\" }",
                ));
            }
            [(a, _), (b, _), ..] => {
                return Err(Problem::invalid(
                    at,
                    format!(
                        "sets both {} and {}; write one limit per entry, \
                         e.g. {{ requests = 10000, per = \"1d\" }}",
                        super::prices::limit_key(a),
                        super::prices::limit_key(b)
                    ),
                ));
            }
        };
        let per = self.per.trim();
        let Some(period) = Period::parse(per) else {
            if self.timezone.is_some() {
                return Err(Problem::invalid(
                    &at.key("timezone"),
                    format!(
                        "applies only to calendar windows (per = \"hour\", \"day\", \"week\" \
                         or \"month\"), not to the rolling window per = {per:?}; remove it"
                    ),
                ));
            }
            return Ok(Limit::new(
                dimension,
                amount,
                per_duration(&at.key("per"), per)?,
            ));
        };
        let zone = match &self.timezone {
            None => Zone::UTC,
            Some(name) => Zone::named(name.trim())
                .map_err(|e| Problem::invalid(&at.key("timezone"), e.to_string()))?,
        };
        Ok(Limit::per(
            dimension,
            amount,
            Calendar::new(period).zone(zone),
        ))
    }
}

/// A rolling window's `per`: a duration such as `"1m"` or `"1d"`.
fn per_duration(path: &FieldPath, text: &str) -> Result<Duration, Problem> {
    humantime::parse_duration(text).map_err(|_| {
        Problem::invalid(
            path,
            format!(
                "{text:?} is not a duration such as \"1m\", \"1h\" or \"1d\" (a rolling \
                 window), nor a calendar period: \"hour\", \"day\", \"week\" or \"month\""
            ),
        )
    })
}

impl RawModel {
    fn convert(self, name: String) -> Result<ModelConfig, Problem> {
        let at = FieldPath::top("models").key(&name);
        let kind = match self.kind {
            None | Some(RawKind::Chat) => ModelKind::Chat,
            Some(RawKind::Embeddings) => ModelKind::Embeddings,
        };
        if kind == ModelKind::Embeddings && self.default_max_tokens.is_some() {
            return Err(Problem::invalid(
                &at.key("default_max_tokens"),
                "applies only to chat models (embeddings produce no output tokens); remove it",
            ));
        }
        let listed = self
            .deployments
            .into_iter()
            .map(|(d, raw)| raw.convert(&at.key("deployments").key(&d), d, &name))
            .collect::<Result<Vec<_>, _>>()?;
        let own = [
            ("upstream_model", self.upstream_model.is_some()),
            ("scope", self.scope.is_some()),
            ("concurrency", self.concurrency.is_some()),
            ("max_waiting", self.max_waiting.is_some()),
            ("max_wait", self.max_wait.is_some()),
            ("learn_limits", self.learn_limits.is_some()),
            ("learn_window", self.learn_window.is_some()),
        ];
        let is_listed = !listed.is_empty();
        let deployments = match (self.provider, listed.is_empty()) {
            // The classic form: the model's own settings are its one
            // deployment, named after it.
            (Some(provider), true) => vec![DeploymentConfig {
                provider,
                upstream_model: self.upstream_model.unwrap_or_else(|| name.clone()),
                scope: self.scope,
                concurrency: self.concurrency,
                max_waiting: self.max_waiting,
                max_wait: duration_opt(&at.key("max_wait"), self.max_wait.as_ref())?,
                learn_limits: learn(&at, self.learn_limits, self.learn_window.as_ref())?,
                weight: 1,
                name: name.clone(),
            }],
            (None, false) => {
                if let Some((field, _)) = own.iter().find(|(_, set)| *set) {
                    return Err(Problem::invalid(
                        &at.key(field),
                        format!(
                            "this model lists deployments, so {field} belongs to each \
                             deployment; move it into [models.{name}.deployments.<name>]"
                        ),
                    ));
                }
                listed
            }
            (Some(_), false) => {
                return Err(Problem::invalid(
                    &at.key("provider"),
                    "a model has either its own provider (one deployment) or deployments, \
                     not both; set provider on each deployment",
                ));
            }
            (None, true) => {
                return Err(Problem {
                    kind: ConfigErrorKind::Schema,
                    path: Some(at.clone()),
                    reason: "missing field `provider` (or deployments, such as \
                             [models.<name>.deployments.east] with a provider each)"
                        .to_owned(),
                    span: None,
                });
            }
        };
        let routes = match self.routes {
            None => None,
            Some(names) => Some(
                names
                    .iter()
                    .enumerate()
                    .map(|(i, n)| {
                        ApiRoute::parse(n.trim()).ok_or_else(|| {
                            Problem::invalid(
                                &at.key("routes").index(i),
                                format!("unknown route {n:?} ({})", route_names()),
                            )
                        })
                    })
                    .collect::<Result<Vec<_>, _>>()?,
            ),
        };
        Ok(ModelConfig {
            routes,
            listed: is_listed,
            deployments,
            fallbacks: self.fallbacks,
            default_max_tokens: self.default_max_tokens.unwrap_or(DEFAULT_MAX_TOKENS),
            kind,
            name,
        })
    }
}

impl RawDeployment {
    fn convert(
        self,
        at: &FieldPath,
        name: String,
        model: &str,
    ) -> Result<DeploymentConfig, Problem> {
        Ok(DeploymentConfig {
            provider: self.provider,
            upstream_model: self.upstream_model.unwrap_or_else(|| model.to_owned()),
            scope: self.scope,
            concurrency: self.concurrency,
            max_waiting: self.max_waiting,
            max_wait: duration_opt(&at.key("max_wait"), self.max_wait.as_ref())?,
            learn_limits: learn(at, self.learn_limits, self.learn_window.as_ref())?,
            weight: self.weight.unwrap_or(1),
            name,
        })
    }
}

/// The `limits` array of a scope-like table at `at`.
fn limits(at: &FieldPath, raw: &[RawLimit]) -> Result<Vec<Limit>, Problem> {
    raw.iter()
        .enumerate()
        .map(|(i, l)| l.convert(&at.key("limits").index(i)))
        .collect()
}

impl RawTenant {
    fn convert(self, name: String) -> Result<TenantConfig, Problem> {
        let at = FieldPath::top("tenants").key(&name);
        let keys_sha256 = self
            .keys_sha256
            .iter()
            .enumerate()
            .map(|(i, hex)| {
                KeyHash::from_hex(hex.trim()).map_err(|e| {
                    Problem::invalid(
                        &at.key("keys_sha256").index(i),
                        format!(
                            "{e}; store the SHA-256 of the key, as printed by \
                             `tollgate hash-key`, never the key itself"
                        ),
                    )
                })
            })
            .collect::<Result<_, _>>()?;
        let per_model = self
            .per_model
            .into_iter()
            .map(|(model, m)| {
                Ok(TenantModelLimits {
                    limits: limits(&at.key("per_model").key(&model), &m.limits)?,
                    rpm: m.rpm,
                    tpm: m.tpm,
                    itpm: m.itpm,
                    otpm: m.otpm,
                    model,
                })
            })
            .collect::<Result<_, Problem>>()?;
        let weight = match self.weight {
            None => 1,
            Some(w @ 1..=MAX_WEIGHT) => w as u32,
            Some(_) => {
                return Err(Problem::invalid(
                    &at.key("weight"),
                    format!(
                        "must be between 1 and {MAX_WEIGHT} (the tenant's share of a scope its calls wait in, relative to other tenants)"
                    ),
                ));
            }
        };
        let priority = match &self.priority {
            None => Priority::Standard,
            Some(p) => p
                .parse()
                .map_err(|e| Problem::invalid(&at.key("priority"), e))?,
        };
        Ok(TenantConfig {
            weight,
            priority,
            limits: limits(&at, &self.limits)?,
            models: self.models,
            per_model,
            keys_sha256,
            concurrency: self.concurrency,
            max_waiting: self.max_waiting,
            max_wait: duration_opt(&at.key("max_wait"), self.max_wait.as_ref())?,
            rpm: self.rpm,
            tpm: self.tpm,
            itpm: self.itpm,
            otpm: self.otpm,
            name,
        })
    }
}

impl RawAnonymous {
    fn convert(self) -> Result<AnonymousConfig, Problem> {
        let at = FieldPath::top("anonymous");
        Ok(AnonymousConfig {
            enabled: self.enabled,
            concurrency: self.concurrency,
            max_waiting: self.max_waiting,
            max_wait: duration_opt(&at.key("max_wait"), self.max_wait.as_ref())?,
        })
    }
}

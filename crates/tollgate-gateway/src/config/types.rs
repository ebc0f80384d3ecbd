//! The validated configuration: plain data with typed values, plus the
//! conversions into the engine's own settings.

use std::net::SocketAddr;
use std::time::Duration;

use tollgate::Priority;
use tollgate::config::{
    Algorithm, ControllerConfig, CooldownConfig, Limit, MINUTE, Overflow, PoolConfig, ScopeConfig,
};
use tollgate::lifecycle::{Accounting, AttemptPolicy, CircuitConfig};
use tollgate::quota::{Dimension, RefusalCost};
use tollgate_openai::tokens::Profile;

use super::deployment::DeploymentConfig;
use super::flavor::{ApiRoute, ProviderWire};
use super::quota_store::QuotaStoreConfig;
use crate::auth::{ANONYMOUS_TENANT, KeyHash, TenantId};

/// Prefix of the private quota scope of a model that names no scope, and of
/// every model pool.
pub const MODEL_PREFIX: &str = "model:";
/// Prefix of a tenant's own quota scope and pool.
pub const TENANT_PREFIX: &str = "tenant:";

/// The largest tenant `weight` (SPEC FAIR-7).
pub const MAX_WEIGHT: u64 = 1_000;

/// The whole gateway configuration, validated (SPEC GW-9).
///
/// Tables keyed by name in the file (`providers`, `scopes`, `models`,
/// `tenants`) are vectors here, sorted by name; the `find` methods look
/// names up.
#[derive(Debug, Clone, PartialEq)]
pub struct GatewayConfig {
    /// Where the configuration came from (a path, or `<embedded>`); the
    /// `file` of every error.
    pub origin: String,
    /// `[server]`.
    pub server: ServerConfig,
    /// `[admission]`.
    pub admission: AdmissionConfig,
    /// `[retry]`: the engine's retry policy (SPEC RT-1).
    pub retry: AttemptPolicy,
    /// `[cooldown]`: the engine's cooldown after provider 429s (SPEC CD-1).
    pub cooldown: CooldownConfig,
    /// `[providers.<name>]`, at least one.
    pub providers: Vec<ProviderConfig>,
    /// `[scopes.<name>]`: the configured quota scopes (private scopes of
    /// models without one are not listed; see
    /// [`GatewayConfig::scope_configs`]).
    pub scopes: Vec<QuotaScope>,
    /// `[models.<name>]`, at least one.
    pub models: Vec<ModelConfig>,
    /// `[tenants.<name>]`; a tenant's [`TenantId`] is its index here.
    pub tenants: Vec<TenantConfig>,
    /// `[anonymous]`.
    pub anonymous: AnonymousConfig,
    /// `[quota_store]`: where upstream scopes keep their quota.
    pub quota_store: QuotaStoreConfig,
    /// `[telemetry]`: OTLP trace export (SPEC OBS-5).
    pub telemetry: super::telemetry::TelemetryConfig,
    /// `[prices.<model>]`: prices replacing or adding to the built-in
    /// table, by upstream model name (SPEC BUD-1), sorted by name.
    pub prices: Vec<super::prices::PriceOverride>,
}

/// Log output format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LogFormat {
    /// Human-readable lines (default).
    #[default]
    Text,
    /// One JSON object per line.
    Json,
}

impl LogFormat {
    /// `text` or `json`.
    pub const fn as_str(self) -> &'static str {
        match self {
            LogFormat::Text => "text",
            LogFormat::Json => "json",
        }
    }
}

/// `[server]`: the HTTP listener and its bounds (SPEC GW-7, GW-8).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerConfig {
    /// Listening address (default `127.0.0.1:8080`).
    pub listen: SocketAddr,
    /// Largest accepted request body in bytes (default 1 MiB).
    pub max_body_bytes: usize,
    /// Largest accepted request head in bytes (default 16 KiB).
    pub max_header_bytes: usize,
    /// Time allowed to receive a request's headers (default 10 s).
    pub header_read_timeout: Duration,
    /// Time allowed to receive a request's body, counted from when its
    /// headers were read (default 10 s; the request's deadline bounds it
    /// too). Past it: 408 (SPEC GW-17).
    pub body_read_timeout: Duration,
    /// Idle keep-alive connections close after this (default 60 s).
    pub idle_timeout: Duration,
    /// Client connections served at once (default 512). Further
    /// connections wait in the listen backlog until one closes.
    pub max_connections: usize,
    /// `max_connections_per_client`: connections one client address (an
    /// IPv4 address, an IPv6 /64 prefix) may hold on `listen` at once;
    /// one more is answered 429 `too_many_connections` and closed before
    /// its request is read (SPEC GW-17). `None` (default): no per-client
    /// cap, since behind a load balancer every client has its address.
    /// At most `max_connections`; applies at start.
    pub max_connections_per_client: Option<usize>,
    /// On SIGTERM/SIGINT, active calls may finish within this (default
    /// 30 s; zero aborts them at once).
    pub shutdown_grace: Duration,
    /// Name of the environment variable holding the admin key of
    /// `/admin/snapshot`; `None` keeps that endpoint closed.
    pub admin_key_env: Option<String>,
    /// Log format (default text), of the logs and of the access log.
    pub log_format: LogFormat,
    /// Whether one access-log line per request is written to standard
    /// output (default true; SPEC GW-14).
    pub access_log: bool,
    /// A separate listening address for `GET /metrics` (OBS-2); `None` =
    /// served on `listen` with the API.
    pub metrics_listen: Option<SocketAddr>,
    /// `connection_threads`: serve connections on this many threads of
    /// their own, each a single-threaded runtime (no work stealing: less
    /// CPU per request at moderate load, a connection's work stays on one
    /// core); unset: on the process's work-stealing runtime.
    pub connection_threads: Option<usize>,
    /// `state_dir`: where the quota state of long windows (one hour or
    /// longer, calendar windows) of in-process scopes is kept across
    /// restarts (SPEC DQ-8); `None` keeps nothing. Applies at start.
    pub state_dir: Option<std::path::PathBuf>,
    /// `on_unreadable_state`: `refuse` (default) to start when the state
    /// file cannot be read, or `start_empty` (the file is moved aside).
    pub on_unreadable_state: tollgate_state::OnUnreadable,
    /// `state_save_interval`: how often changed state is written (default
    /// 200 ms): what a crash can lose (docs/operations.md).
    pub state_save_interval: Duration,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            listen: SocketAddr::from(([127, 0, 0, 1], 8080)),
            max_body_bytes: 1 << 20,
            max_header_bytes: 16 << 10,
            header_read_timeout: Duration::from_secs(10),
            body_read_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(60),
            max_connections: 512,
            max_connections_per_client: None,
            shutdown_grace: Duration::from_secs(30),
            admin_key_env: None,
            log_format: LogFormat::Text,
            access_log: true,
            metrics_listen: None,
            connection_threads: None,
            state_dir: None,
            on_unreadable_state: tollgate_state::OnUnreadable::Refuse,
            state_save_interval: Duration::from_millis(200),
        }
    }
}

/// `[admission]`: queueing and deadlines (SPEC ADM-5, GW-3, Q-11).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AdmissionConfig {
    /// Waiting calls per quota scope (default 256, at least 1).
    pub queue_capacity: usize,
    /// Full-queue behaviour (gateway default: reject with 429).
    pub overflow: Overflow,
    /// Deadline of a request without `x-request-timeout` (default 60 s).
    pub default_timeout: Duration,
    /// Cap on `x-request-timeout` (default 300 s, at least the default).
    pub max_timeout: Duration,
    /// Longest quota wait accepted before failing early; `None` =
    /// only the deadline bounds it.
    pub max_wait: Option<Duration>,
}

impl Default for AdmissionConfig {
    fn default() -> Self {
        AdmissionConfig {
            queue_capacity: 256,
            overflow: Overflow::Reject,
            default_timeout: Duration::from_secs(60),
            max_timeout: Duration::from_secs(300),
            max_wait: None,
        }
    }
}

impl AdmissionConfig {
    /// The relative timeout of a request (SPEC GW-3): the client's
    /// `x-request-timeout` capped by `max_timeout`, or `default_timeout`
    /// without one.
    pub fn request_timeout(&self, requested: Option<Duration>) -> Duration {
        requested.map_or(self.default_timeout, |r| r.min(self.max_timeout))
    }
}

/// The gateway's retry defaults, gentler than the engine's library defaults.
pub(crate) fn default_retry() -> AttemptPolicy {
    AttemptPolicy {
        max_attempts: 3,
        base_delay: Duration::from_millis(500),
        factor: 2.0,
        max_delay: Duration::from_secs(10),
        jitter: 0.2,
        max_wait: Duration::from_secs(30),
    }
}

/// `[providers.<name>]`: one upstream API.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProviderConfig {
    /// The table key.
    pub name: String,
    /// Base URL without a trailing slash, e.g. `https://api.openai.com/v1`.
    pub base_url: String,
    /// Name of the environment variable holding the upstream key; `None`
    /// sends no key.
    pub api_key_env: Option<String>,
    /// Cap on connecting (default 5 s).
    pub connect_timeout: Duration,
    /// Local cap of one transport attempt (DL-4; default 120 s).
    pub attempt_timeout: Duration,
    /// Largest one-shot response body accepted from the provider, in bytes
    /// (GW-7; default 64 MiB). Streams are bounded per event instead.
    pub max_response_bytes: usize,
    /// The provider's circuit breaker (SPEC RT-8).
    pub circuit: CircuitConfig,
    /// `accounting`: what a reservation counts, following how the
    /// provider's rate limiter counts a request (SPEC Q-16; default: the
    /// flavour's, [`super::flavor::Flavor::default_accounting`]).
    pub accounting: Profile,
    /// `refusals`: what a 429 costs at the provider, and so in tollgate's
    /// window (SPEC Q-16; default [`RefusalCost::Full`]).
    pub refusals: RefusalCost,
    /// `reconciles`: whether the provider's limiter settles a request with
    /// its reported usage (default `true`); `false` keeps the whole
    /// estimate counted.
    pub reconciles: bool,
    /// `arrival_floor`: the least arrival delay assumed for an attempt whose
    /// response has not begun (SPEC Q-15; default 500 ms).
    pub arrival_floor: Duration,
    /// `flavor` and how requests are addressed (SPEC WIRE-2).
    pub wire: ProviderWire,
}

/// Default of `providers.<name>.arrival_floor`.
pub const DEFAULT_ARRIVAL_FLOOR: Duration = Duration::from_millis(500);

impl ProviderConfig {
    /// `base_url` joined with `path` by exactly one slash, e.g.
    /// `url("/chat/completions")`.
    pub fn url(&self, path: &str) -> String {
        format!("{}/{}", self.base_url, path.trim_start_matches('/'))
    }

    /// The engine's view of how this provider counts (SPEC ).
    pub fn engine_accounting(&self) -> Accounting {
        Accounting {
            refusal_cost: self.refusals,
            reconciles: self.reconciles,
            arrival_floor: self.arrival_floor,
        }
    }
}

/// `[scopes.<name>]`: a named quota scope (SPEC ).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QuotaScope {
    /// The table key.
    pub name: String,
    /// The algorithm; `burst` lives in [`Algorithm::TokenBucket`].
    pub algorithm: Algorithm,
    /// `rpm`: requests per minute.
    pub rpm: Option<u64>,
    /// `tpm`: tokens (input plus output) per minute.
    pub tpm: Option<u64>,
    /// `itpm`: input tokens per minute (SPEC Q-12).
    pub itpm: Option<u64>,
    /// `otpm`: output tokens per minute (SPEC Q-12).
    pub otpm: Option<u64>,
    /// The `limits` array, in file order.
    pub limits: Vec<Limit>,
    /// Per-scope override of `admission.queue_capacity`.
    pub queue_capacity: Option<usize>,
    /// `learn_limits = true`: the window over which the limits this scope
    /// leaves out are adopted from the provider's advertised
    /// `x-ratelimit-limit-*` (SPEC Q-14; `learn_window`, default one
    /// minute). `None` = nothing is learned.
    pub learn_limits: Option<Duration>,
}

impl QuotaScope {
    /// Every limit: `rpm`, `tpm`, `itpm`, `otpm`, then the `limits` array.
    pub fn all_limits(&self) -> Vec<Limit> {
        minute_limits([self.rpm, self.tpm, self.itpm, self.otpm])
            .chain(self.limits.iter().copied())
            .collect()
    }

    /// Whether any limit counts tokens, or may once learned (requests then
    /// need an estimate).
    pub fn has_token_limit(&self) -> bool {
        self.learn_limits.is_some() || self.all_limits().iter().any(|l| l.dimension.is_tokens())
    }

    /// The engine's scope settings.
    pub fn to_scope_config(&self) -> ScopeConfig {
        let mut scope = self
            .all_limits()
            .into_iter()
            .fold(ScopeConfig::new(&self.name), ScopeConfig::limit)
            .algorithm(self.algorithm);
        if let Some(capacity) = self.queue_capacity {
            scope = scope.queue_capacity(capacity);
        }
        if let Some(window) = self.learn_limits {
            scope = scope.learn_limits(window);
        }
        scope
    }

    /// Whether a limit of `dimension` is configured (in any window).
    pub fn limits_dimension(&self, dimension: Dimension) -> bool {
        self.all_limits().iter().any(|l| l.dimension == dimension)
    }
}

/// The per-minute shortcuts, in the order of [`Dimension::ALL`].
pub(super) const SHORTCUTS: [(&str, Dimension); 4] = [
    ("rpm", Dimension::Requests),
    ("tpm", Dimension::Tokens),
    ("itpm", Dimension::InputTokens),
    ("otpm", Dimension::OutputTokens),
];

/// The per-minute limits of the `rpm` / `tpm` / `itpm` / `otpm` shortcuts
/// (given in the order of [`SHORTCUTS`]).
pub(super) fn minute_limits(amounts: [Option<u64>; 4]) -> impl Iterator<Item = Limit> {
    SHORTCUTS
        .into_iter()
        .zip(amounts)
        .filter_map(|((_, dimension), amount)| {
            amount.map(|amount| Limit::new(dimension, amount, MINUTE))
        })
}

/// Which route a model serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ModelKind {
    /// `POST /v1/chat/completions` (default).
    #[default]
    Chat,
    /// `POST /v1/embeddings`.
    Embeddings,
}

impl ModelKind {
    /// `chat` or `embeddings`.
    pub const fn as_str(self) -> &'static str {
        match self {
            ModelKind::Chat => "chat",
            ModelKind::Embeddings => "embeddings",
        }
    }
}

/// Output allowance of a chat request without `max_tokens`, by default.
pub const DEFAULT_MAX_TOKENS: u64 = 1024;

/// `[models.<name>]`: a model clients may name (SPEC GW-1, GW-10, GW-11,
/// POOL-1).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelConfig {
    /// The table key: what clients send in `"model"`.
    pub name: String,
    /// Where it is served, at least one (SPEC GW-11): the
    /// `[models.<name>.deployments.<d>]` tables sorted by name, or the one
    /// deployment the model's own `provider`, `upstream_model`, `scope`,
    /// `concurrency`, `max_waiting`, `max_wait` and `learn_limits` describe
    /// (named after the model).
    pub deployments: Vec<DeploymentConfig>,
    /// Whether the deployments were listed as tables (their scopes and
    /// pools are then named `model:<name>/<deployment>`) rather than given
    /// by the model's own settings (`model:<name>`, as always).
    pub listed: bool,
    /// Models tried in order when this one fails retryably (GW-10).
    pub fallbacks: Vec<String>,
    /// Output allowance when a chat request gives no `max_tokens` (GW-5;
    /// default [`DEFAULT_MAX_TOKENS`]).
    pub default_max_tokens: u64,
    /// Generative (`chat`, default) or `embeddings`.
    pub kind: ModelKind,
    /// `routes`: the routes it serves, as listed (SPEC WIRE-4); `None` =
    /// what its providers' flavours serve by default (see
    /// [`GatewayConfig::model_routes`]).
    pub routes: Option<Vec<ApiRoute>>,
}

/// A pool of `limit` permits with optional bounds.
pub(super) fn pool(
    name: String,
    limit: Option<u64>,
    max_waiting: Option<usize>,
    max_wait: Option<Duration>,
) -> Option<PoolConfig> {
    limit.map(|limit| PoolConfig {
        name,
        limit,
        max_waiting,
        max_wait,
    })
}

/// `[tenants.<name>]`: a client identity (SPEC GW-2, POOL-1, POOL-2).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TenantConfig {
    /// The table key; used in logs and metric labels.
    pub name: String,
    /// Hashes of the tenant's API keys (at least one). Redacted in `Debug`.
    pub keys_sha256: Vec<KeyHash>,
    /// The tenant's share of an upstream scope its calls wait in, relative
    /// to other tenants of the same class (SPEC FAIR-3, FAIR-7; 1 to
    /// [`MAX_WEIGHT`], default 1).
    pub weight: u32,
    /// The highest class its calls may use (SPEC FAIR-2, FAIR-7; default
    /// `standard`); a request may ask for a lower one.
    pub priority: Priority,
    /// Tenant pool permits; `None` = unlimited.
    pub concurrency: Option<u64>,
    /// Calls that may wait for a tenant permit; `Some(0)` = never wait.
    pub max_waiting: Option<usize>,
    /// Longest wait for a tenant permit.
    pub max_wait: Option<Duration>,
    /// Tenant quota: requests per minute.
    pub rpm: Option<u64>,
    /// Tenant quota: tokens per minute.
    pub tpm: Option<u64>,
    /// Tenant quota: input tokens per minute.
    pub itpm: Option<u64>,
    /// Tenant quota: output tokens per minute.
    pub otpm: Option<u64>,
    /// Tenant quota: the `limits` array, like a scope's (SPEC GW-12).
    pub limits: Vec<Limit>,
    /// The models this tenant may call; `None` = every model. Others
    /// answer 404 as if unknown (SPEC GW-12).
    pub models: Option<Vec<String>>,
    /// `[tenants.<name>.per_model.<model>]`: limits on this tenant's calls
    /// of one model, on top of the tenant's own, sorted by model.
    pub per_model: Vec<TenantModelLimits>,
}

/// `[tenants.<name>.per_model.<model>]`: a tenant's limits for one model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TenantModelLimits {
    /// The model (a configured model's name).
    pub model: String,
    /// Requests per minute.
    pub rpm: Option<u64>,
    /// Tokens per minute.
    pub tpm: Option<u64>,
    /// Input tokens per minute.
    pub itpm: Option<u64>,
    /// Output tokens per minute.
    pub otpm: Option<u64>,
    /// The `limits` array.
    pub limits: Vec<Limit>,
}

impl TenantModelLimits {
    /// `rpm`, `tpm`, `itpm`, `otpm`, then `limits`.
    pub fn all_limits(&self) -> Vec<Limit> {
        minute_limits([self.rpm, self.tpm, self.itpm, self.otpm])
            .chain(self.limits.iter().copied())
            .collect()
    }
}

impl TenantConfig {
    /// The name of this tenant's pool and quota scope: `tenant:<name>`.
    pub fn pool_name(&self) -> String {
        format!("{TENANT_PREFIX}{}", self.name)
    }

    /// The engine pool of this tenant, when `concurrency` is set.
    pub fn pool_config(&self) -> Option<PoolConfig> {
        pool(
            self.pool_name(),
            self.concurrency,
            self.max_waiting,
            self.max_wait,
        )
    }

    /// Every limit of the tenant's own scope: `rpm`, `tpm`, `itpm`,
    /// `otpm`, then `limits`.
    pub fn all_limits(&self) -> Vec<Limit> {
        minute_limits([self.rpm, self.tpm, self.itpm, self.otpm])
            .chain(self.limits.iter().copied())
            .collect()
    }

    /// The tenant's own quota scope `tenant:<name>` (sliding window), when
    /// it has any limit.
    pub fn quota_scope(&self) -> Option<ScopeConfig> {
        let limits = self.all_limits();
        if limits.is_empty() {
            return None;
        }
        Some(
            limits
                .into_iter()
                .fold(ScopeConfig::new(self.pool_name()), ScopeConfig::limit),
        )
    }

    /// The scope of this tenant's calls of `model`: `tenant:<name>/<model>`.
    pub fn model_scope_name(&self, model: &str) -> String {
        format!("{TENANT_PREFIX}{}/{model}", self.name)
    }

    /// The per-model scopes of this tenant (SPEC GW-12).
    pub fn model_scopes(&self) -> impl Iterator<Item = ScopeConfig> + '_ {
        self.per_model.iter().map(|m| {
            m.all_limits().into_iter().fold(
                ScopeConfig::new(self.model_scope_name(&m.model)),
                ScopeConfig::limit,
            )
        })
    }

    /// Whether this tenant may call `model` (SPEC GW-12).
    pub fn allows(&self, model: &str) -> bool {
        self.models
            .as_ref()
            .is_none_or(|m| m.iter().any(|n| n == model))
    }
}

/// `[anonymous]`: unauthenticated traffic, one shared pool (SPEC POOL-2).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct AnonymousConfig {
    /// Whether requests without a valid key are served (default false).
    pub enabled: bool,
    /// Permits of the shared anonymous pool; `None` = unlimited.
    pub concurrency: Option<u64>,
    /// Calls that may wait for an anonymous permit; `Some(0)` = never wait.
    pub max_waiting: Option<usize>,
    /// Longest wait for an anonymous permit.
    pub max_wait: Option<Duration>,
}

impl AnonymousConfig {
    /// The name of the anonymous pool: `tenant:anonymous`.
    pub fn pool_name(&self) -> String {
        format!("{TENANT_PREFIX}{ANONYMOUS_TENANT}")
    }

    /// The engine pool of anonymous traffic, when enabled with a
    /// `concurrency`.
    pub fn pool_config(&self) -> Option<PoolConfig> {
        if !self.enabled {
            return None;
        }
        pool(
            self.pool_name(),
            self.concurrency,
            self.max_waiting,
            self.max_wait,
        )
    }
}

impl GatewayConfig {
    /// The provider called `name`.
    pub fn provider(&self, name: &str) -> Option<&ProviderConfig> {
        self.providers.iter().find(|p| p.name == name)
    }

    /// The configured quota scope called `name`.
    pub fn scope(&self, name: &str) -> Option<&QuotaScope> {
        self.scopes.iter().find(|s| s.name == name)
    }

    /// The model clients call `name`.
    pub fn model(&self, name: &str) -> Option<&ModelConfig> {
        self.models.iter().find(|m| m.name == name)
    }

    /// The provider of `model`'s first deployment (always present after
    /// validation).
    pub fn provider_of(&self, model: &ModelConfig) -> Option<&ProviderConfig> {
        self.provider(&model.deployments.first()?.provider)
    }

    /// The id of the tenant called `name`.
    pub fn tenant_id(&self, name: &str) -> Option<TenantId> {
        let index = self.tenants.iter().position(|t| t.name == name)?;
        TenantId::from_index(index)
    }

    /// The id of the anonymous tenant, when enabled: one past the last
    /// configured tenant.
    pub fn anonymous_tenant(&self) -> Option<TenantId> {
        if self.anonymous.enabled {
            TenantId::from_index(self.tenants.len())
        } else {
            None
        }
    }

    /// The configured tenant with id `id` (`None` for the anonymous one).
    pub fn tenant(&self, id: TenantId) -> Option<&TenantConfig> {
        self.tenants.get(id.index())
    }

    /// The name of tenant `id`: its table key, or `anonymous`.
    pub fn tenant_name(&self, id: TenantId) -> Option<&str> {
        match self.tenant(id) {
            Some(t) => Some(&t.name),
            None if self.anonymous_tenant() == Some(id) => Some(ANONYMOUS_TENANT),
            None => None,
        }
    }

    /// The pool of tenant `id` (anonymous included), when it has a
    /// `concurrency`.
    pub fn tenant_pool(&self, id: TenantId) -> Option<PoolConfig> {
        match self.tenant(id) {
            Some(t) => t.pool_config(),
            None if self.anonymous_tenant() == Some(id) => self.anonymous.pool_config(),
            None => None,
        }
    }

    /// Every quota scope the models spend, as engine settings: the
    /// configured scopes, then a private unlimited `model:<name>` scope for
    /// each model that names none.
    pub fn scope_configs(&self) -> Vec<ScopeConfig> {
        self.scopes
            .iter()
            .map(QuotaScope::to_scope_config)
            .chain(self.models.iter().flat_map(|m| {
                m.deployments
                    .iter()
                    .filter_map(|d| m.deployment_private_scope(d))
            }))
            .collect()
    }

    /// The tenants' own quota scopes (`tenant:<name>`, for tenants with
    /// limits) and their per-model scopes (`tenant:<name>/<model>`).
    pub fn tenant_scope_configs(&self) -> Vec<ScopeConfig> {
        self.tenants
            .iter()
            .flat_map(|t| t.quota_scope().into_iter().chain(t.model_scopes()))
            .collect()
    }

    /// Every concurrency pool (models, tenants, anonymous) with a
    /// `concurrency`, named `model:<name>` / `tenant:<name>`.
    pub fn pool_configs(&self) -> Vec<PoolConfig> {
        self.models
            .iter()
            .flat_map(|m| {
                m.deployments
                    .iter()
                    .filter_map(|d| m.deployment_pool_config(d))
            })
            .chain(self.tenants.iter().filter_map(TenantConfig::pool_config))
            .chain(self.anonymous.pool_config())
            .collect()
    }

    /// One engine controller configuration holding everything: model and
    /// tenant scopes, every pool, the queue and cooldown settings.
    pub fn controller_config(&self) -> ControllerConfig {
        let mut scopes = self.scope_configs();
        scopes.extend(self.tenant_scope_configs());
        ControllerConfig {
            scopes,
            queue_capacity: self.admission.queue_capacity,
            overflow: self.admission.overflow,
            concurrency: None,
            pools: self.pool_configs(),
            max_wait: self.admission.max_wait,
            cooldown: self.cooldown,
        }
    }
}

//! The built-in configuration of `tollgate serve` without `--config`
//! (SPEC GW-9): everything routes to the in-process simulator, so a new user
//! can `curl` the gateway at once.

use std::time::Duration;

use tollgate::config::{Algorithm, CooldownConfig};
use tollgate::lifecycle::CircuitConfig;
use tollgate::quota::RefusalCost;
use tollgate_openai::tokens::Profile;

use super::deployment::DeploymentConfig;
use super::flavor::{Flavor, ProviderWire};
use super::types::{
    AdmissionConfig, AnonymousConfig, GatewayConfig, ModelConfig, ModelKind, ProviderConfig,
    QuotaScope, ServerConfig, TenantConfig, default_retry,
};
use crate::auth::KeyHash;

/// The `origin` (file name in errors) of the embedded configuration.
pub const EMBEDDED_ORIGIN: &str = "<built-in default>";

/// The built-in `demo` tenant's calls in flight at once.
const DEMO_CONCURRENCY: u64 = 16;

/// The built-in `demo` tenant's calls that may wait for one of its
/// permits (each within its own deadline).
const DEMO_MAX_WAITING: usize = 1_000;

impl GatewayConfig {
    /// The built-in default: provider `sim` at `sim_base_url` (the
    /// simulator's OpenAI base URL, e.g. `http://127.0.0.1:PORT/v1`), quota
    /// scope `sim` (600 requests and 60,000 tokens per minute, sliding
    /// window; accounting `openai`, refusals `free`, matching how the
    /// embedded simulator counts), models `sim-chat` (chat completions and
    /// Responses) and `sim-embed` on that scope; provider `sim-anthropic`
    /// (the simulator's Messages route) with scope `sim-anthropic` (token
    /// buckets of 300 requests, 40,000 input and 8,000 output tokens per
    /// minute, as the embedded simulator enforces) and model `sim-claude`
    /// on `/v1/messages`; and tenant `demo` authenticated by `demo_key`
    /// (16 calls at once, up to 1,000 more waiting within their deadlines,
    /// no quota of its own); listening on
    /// `127.0.0.1:8080`.
    /// Every other setting has its documented default. It passes
    /// [`validate`](Self::validate) for any http(s) `sim_base_url`.
    pub fn embedded(sim_base_url: &str, demo_key: &str) -> GatewayConfig {
        let model =
            |name: &str, provider: &str, upstream: &str, kind, concurrency, default_max_tokens| {
                ModelConfig {
                    name: name.to_owned(),
                    deployments: vec![DeploymentConfig {
                        name: name.to_owned(),
                        provider: provider.to_owned(),
                        upstream_model: upstream.to_owned(),
                        scope: Some(provider.to_owned()),
                        concurrency: Some(concurrency),
                        max_waiting: Some(64),
                        max_wait: Some(Duration::from_secs(10)),
                        learn_limits: None,
                        weight: 1,
                    }],
                    listed: false,
                    fallbacks: Vec::new(),
                    default_max_tokens,
                    kind,
                    routes: None,
                }
            };
        GatewayConfig {
            origin: EMBEDDED_ORIGIN.to_owned(),
            server: ServerConfig::default(),
            admission: AdmissionConfig::default(),
            retry: default_retry(),
            cooldown: CooldownConfig::default(),
            providers: vec![
                // The embedded simulator counts a prompt as characters / 4
                // (plus framing) and the completion it will generate, charges
                // nothing for a 429 and settles nothing (its charge already
                // is the usage): `openai` reserves at least that.
                sim_provider("sim", sim_base_url, Profile::OpenAi, Flavor::OpenAi),
                // The simulator's Messages route counts as its OpenAI routes
                // do (characters / 4 plus framing): the `anthropic` profile
                // (characters / 3) reserves at least that.
                sim_provider(
                    "sim-anthropic",
                    sim_base_url,
                    Profile::Anthropic,
                    Flavor::Anthropic,
                ),
            ],
            scopes: vec![
                QuotaScope {
                    name: "sim".to_owned(),
                    algorithm: Algorithm::SlidingWindow,
                    rpm: Some(600),
                    tpm: Some(60_000),
                    itpm: None,
                    otpm: None,
                    limits: Vec::new(),
                    queue_capacity: None,
                    learn_limits: None,
                },
                QuotaScope {
                    name: "sim-anthropic".to_owned(),
                    algorithm: Algorithm::TokenBucket { burst: None },
                    rpm: Some(300),
                    tpm: None,
                    itpm: Some(40_000),
                    otpm: Some(8_000),
                    limits: Vec::new(),
                    queue_capacity: None,
                    learn_limits: None,
                },
            ],
            models: vec![
                model("sim-chat", "sim", "sim-chat", ModelKind::Chat, 16, 256),
                model(
                    "sim-claude",
                    "sim-anthropic",
                    "sim-claude",
                    ModelKind::Chat,
                    16,
                    256,
                ),
                model(
                    "sim-embed",
                    "sim",
                    "sim-embedding",
                    ModelKind::Embeddings,
                    8,
                    super::types::DEFAULT_MAX_TOKENS,
                ),
            ],
            tenants: vec![TenantConfig {
                name: "demo".to_owned(),
                keys_sha256: vec![KeyHash::of(demo_key)],
                weight: 1,
                priority: tollgate::Priority::Standard,
                // As many calls at once as a model's deployment takes; a
                // burst of a few hundred (an SDK's `asyncio.gather`) waits
                // for them within each call's deadline instead of being
                // refused.
                concurrency: Some(DEMO_CONCURRENCY),
                max_waiting: Some(DEMO_MAX_WAITING),
                max_wait: None,
                rpm: None,
                tpm: None,
                itpm: None,
                otpm: None,
                limits: Vec::new(),
                models: None,
                per_model: Vec::new(),
            }],
            anonymous: AnonymousConfig::default(),
            quota_store: super::QuotaStoreConfig::Local,
            telemetry: super::TelemetryConfig::default(),
            prices: Vec::new(),
        }
    }
}

/// One provider in front of the embedded simulator, named `name`, counting
/// with `accounting` and speaking `flavor`.
fn sim_provider(
    name: &str,
    sim_base_url: &str,
    accounting: Profile,
    flavor: Flavor,
) -> ProviderConfig {
    ProviderConfig {
        name: name.to_owned(),
        base_url: sim_base_url.trim().trim_end_matches('/').to_owned(),
        api_key_env: None,
        connect_timeout: Duration::from_secs(5),
        attempt_timeout: Duration::from_secs(120),
        max_response_bytes: tollgate_openai::provider::DEFAULT_MAX_RESPONSE_BODY,
        circuit: CircuitConfig::default(),
        accounting,
        refusals: RefusalCost::Free,
        reconciles: true,
        arrival_floor: super::types::DEFAULT_ARRIVAL_FLOOR,
        wire: ProviderWire {
            flavor,
            ..ProviderWire::default()
        },
    }
}

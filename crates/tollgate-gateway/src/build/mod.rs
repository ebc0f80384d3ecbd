//! Builds the gateway's runtime from a validated configuration.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use tollgate::TokenEstimate;
use tollgate::config::ConfigError as EngineConfigError;
use tollgate::lifecycle::{AttemptPolicy, CallReport, CircuitBreaker, SeededJitter, Supervisor};
use tollgate::quota::SharedRemote;
use tollgate_openai::HttpProvider;
use tollgate_openai::provider::BuildError;
use tollgate_openai::tokens::TokenEstimator;
use tollgate_redis::{RedisBackend, RedisSettings};

use crate::access_log::AccessLog;
use crate::auth::{AdminAuth, Authenticator, TenantId};
use crate::config::{ConfigError, GatewayConfig, QuotaStoreConfig};
use crate::metrics::{DeploymentMetrics, Metrics, ModelMetrics};
use crate::provider::{GatewayProvider, GatewayRequest};
use crate::router::InFlight;
use crate::state::{AppState, Bounds, Deployment, Model};
use crate::telemetry::{AttemptTarget, Telemetry};

/// Why the runtime could not be built.
#[derive(Debug, thiserror::Error)]
pub enum BuildFailure {
    /// The configuration is invalid.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The engine refused a derived setting.
    #[error("{origin}: {source}")]
    Engine {
        /// The configuration's file.
        origin: String,
        /// What the engine said.
        source: EngineConfigError,
    },
    /// The shared quota store could not be set up.
    #[error("{origin}: quota_store: {reason}")]
    QuotaStore {
        /// The configuration's file.
        origin: String,
        /// What went wrong.
        reason: String,
    },
    /// Tracing could not be set up (SPEC OBS-5).
    #[error("{origin}: {source}")]
    Telemetry {
        /// The configuration's file.
        origin: String,
        /// What went wrong.
        source: crate::telemetry::TelemetryError,
    },
    /// An upstream client could not be built.
    #[error("{origin}: providers.{provider}: {source}")]
    Provider {
        /// The configuration's file.
        origin: String,
        /// The provider.
        provider: String,
        /// What went wrong.
        source: BuildError,
    },
}

mod upstream;

pub use upstream::ScopeRuntime;

/// The shared quota store of `config` and its resolved URL, kept from
/// `previous` when `[quota_store]` and the URL did not change (its
/// connection and subscriber go on). The flag says whether it was kept.
fn shared_store(
    config: &GatewayConfig,
    previous: Option<&AppState>,
) -> Result<(Option<SharedRemote>, Option<String>, bool), BuildFailure> {
    let QuotaStoreConfig::Redis(redis) = &config.quota_store else {
        return Ok((None, None, true));
    };
    let url = config.quota_store_url()?.unwrap_or_default();
    if let Some(kept) = previous
        .filter(|p| {
            p.config.quota_store == config.quota_store
                && p.quota_store_url.as_deref() == Some(url.as_str())
        })
        .and_then(|p| p.quota_store.clone())
    {
        return Ok((Some(kept), Some(url), true));
    }
    let mut settings = RedisSettings::new(url.clone())
        .cluster(redis.cluster)
        .prefix(redis.prefix.clone())
        .timeout(redis.timeout)
        .on_unavailable(redis.on_unavailable);
    if let Some(ca) = &redis.ca_file {
        settings = settings.ca_file(ca);
    }
    let backend = RedisBackend::new(settings).map_err(|e| BuildFailure::QuotaStore {
        origin: config.origin.clone(),
        reason: e.to_string(),
    })?;
    Ok((Some(Arc::new(backend)), Some(url), false))
}

/// Builds the shared state for `config`.
pub fn build(config: &GatewayConfig, metrics: Metrics) -> Result<Arc<AppState>, BuildFailure> {
    build_with(config, metrics, None)
}

/// Builds the shared state for `config`, keeping from `previous` (the
/// running state, on reload) every scope's and tenant's controller,
/// reconfigured in place so that its quota state, cooldown, queue and
/// calls in flight carry over, and the circuit of every provider whose
/// settings did not change (SPEC GW-15).
///
/// Everything that can fail is done before any running controller is
/// reconfigured: a refused reload changes nothing.
pub fn build_with(
    config: &GatewayConfig,
    metrics: Metrics,
    previous: Option<&AppState>,
) -> Result<Arc<AppState>, BuildFailure> {
    config.validate()?;
    let engine = |source| BuildFailure::Engine {
        origin: config.origin.clone(),
        source,
    };
    // The supervisors built below check these again; checked here, before
    // anything running changes.
    config.retry.validate().map_err(engine)?;
    let mut plans = Vec::new();
    // Made at start, kept across reloads (`[telemetry]` needs a restart).
    let telemetry = match previous {
        Some(p) => p.telemetry.clone(),
        None => Telemetry::start(&config.telemetry, "tollgate-gateway").map_err(|source| {
            BuildFailure::Telemetry {
                origin: config.origin.clone(),
                source,
            }
        })?,
    };

    // Upstream side: one controller per quota scope, its quota in the
    // shared store when one is configured (SPEC DQ-1).
    let (shared, shared_url, store_kept) = shared_store(config, previous)?;
    // A new store connection (another URL) starts every scope afresh.
    let kept: &[ScopeRuntime] = match previous {
        Some(p) if store_kept => &p.upstream,
        _ => &[],
    };
    let upstream = upstream::scopes(config, kept, shared.as_ref(), &mut plans).map_err(engine)?;

    // Tenant side: one controller per tenant, admitted once per call.
    let auth = Authenticator::new(config);
    let tenants = (0..auth.tenant_count())
        .filter_map(TenantId::from_index)
        .map(|id| {
            let name = config.tenant_name(id).unwrap_or_default();
            let kept = previous.and_then(|p| p.tenant_slots.iter().find(|t| &*t.name == name));
            // What was served to the tenant is kept across reloads (SPEC FAIR-8).
            let served = kept.map(|k| Arc::clone(&k.served)).unwrap_or_default();
            crate::tenants::controller(config, id, kept, &mut plans).map(|c| (id, c, served))
        })
        .collect::<Result<Vec<_>, _>>()
        .map_err(engine)?;

    // One HTTP client and one circuit breaker per provider; a provider
    // whose settings did not change keeps its circuit. Deployments whose
    // URL differs (Azure's deployment path) get their own `HttpProvider`
    // over the provider's one client (one connection pool).
    let mut providers = HashMap::new();
    let mut breakers = Vec::new();
    for p in &config.providers {
        let key = config.provider_api_key(p)?;
        let failure = |source| BuildFailure::Provider {
            origin: config.origin.clone(),
            provider: p.name.clone(),
            source,
        };
        let builder = move |url: String| {
            let mut b = HttpProvider::builder(url)
                .connect_timeout(p.connect_timeout)
                .max_response_body(p.max_response_bytes)
                .headers(p.wire.header_map());
            if let Some(key) = &key {
                let (name, prefix) = p.wire.key_header();
                b = b.api_key(key.expose().to_owned()).key_header(name, prefix);
            }
            b
        };
        let client = builder(p.base_url.clone())
            .build_client()
            .map_err(failure)?;
        let mut by_url = HashMap::new();
        for m in &config.models {
            for d in m.deployments.iter().filter(|d| d.provider == p.name) {
                let url = p.wire.base_url(&p.base_url, &d.upstream_model);
                if let std::collections::hash_map::Entry::Vacant(slot) = by_url.entry(url) {
                    let http = builder(slot.key().clone())
                        .client(client.clone())
                        .build()
                        .map_err(failure)?;
                    slot.insert(http);
                }
            }
        }
        let kept = previous
            .filter(|prev| prev.config.provider(&p.name) == Some(p))
            .and_then(|prev| prev.breakers.iter().find(|(n, _)| **n == *p.name))
            .map(|(_, b)| b.clone());
        let breaker = match kept {
            Some(b) => b,
            None => CircuitBreaker::new(p.circuit).map_err(engine)?,
        };
        breakers.push((Arc::<str>::from(p.name.as_str()), breaker.clone()));
        providers.insert(p.name.clone(), (by_url, breaker, p));
    }

    let admin = AdminAuth::from_config(config)?;

    // Nothing below fails: the running controllers take their new
    // configuration now, and ordinals are looked up after.
    for plan in plans {
        plan.apply();
    }
    let numbers = crate::tenants::flow_numbers(
        tenants
            .iter()
            .map(|(id, ..)| config.tenant_name(*id).unwrap_or_default()),
        previous.map_or(&[], |p| &p.tenant_slots[..]),
    );
    let tenant_slots = tenants
        .into_iter()
        .map(|(id, (controller, settings), served)| {
            let name = config.tenant_name(id).unwrap_or_default();
            let number = numbers.get(name).copied().unwrap_or_default();
            crate::tenants::slot(config, id, number, controller, settings, served)
        })
        .collect();

    let mut models = HashMap::new();
    for m in &config.models {
        let name: Arc<str> = Arc::from(m.name.as_str());
        let handles = ModelMetrics::new(m.kind.as_str(), &m.name);
        let configured = &m.deployments;
        // With several deployments the router retries across them, so each
        // supervisor makes one attempt per call (SPEC GW-11).
        let policy = if configured.len() > 1 {
            AttemptPolicy {
                max_attempts: 1,
                ..config.retry
            }
        } else {
            config.retry
        };
        let mut deployments = Vec::with_capacity(configured.len());
        for d in configured {
            let Some((by_url, breaker, provider)) = providers.get(&d.provider) else {
                continue;
            };
            let Some(http) = by_url.get(
                &provider
                    .wire
                    .base_url(&provider.base_url, &d.upstream_model),
            ) else {
                continue;
            };
            let deployment_metrics = DeploymentMetrics::new(&m.name, &d.name);
            let scope_name = m.deployment_scope(d);
            let Some(runtime) = upstream.iter().find(|s| *s.name == *scope_name) else {
                continue;
            };
            let controller = &runtime.controller;
            let scope = controller
                .scope_id(&scope_name)
                .unwrap_or(tollgate::ScopeId::FIRST);
            let observer_name = Arc::clone(&name);
            let observer_metrics = metrics.clone();
            let observer_handles = handles.clone();
            let mut sb = Supervisor::builder(
                controller.clone(),
                GatewayProvider::new(
                    http.clone(),
                    deployment_metrics.clone(),
                    AttemptTarget::new(
                        &provider.wire.flavor.gen_ai_provider_name(&provider.name),
                        &provider.base_url,
                        &d.upstream_model,
                        Some(&d.name),
                    ),
                ),
            )
            .scope(scope)
            .policy(policy)
            .breaker(breaker.clone())
            .transport_timeout(provider.attempt_timeout)
            .accounting(provider.engine_accounting())
            .estimator(Arc::new(|r: &GatewayRequest| {
                Ok::<TokenEstimate, _>(r.estimate)
            }))
            .observer(Arc::new(move |report: &CallReport| {
                observer_metrics.call(&observer_name, &observer_handles, report);
            }));
            if let Some(pool) = controller.pool_id(&m.deployment_pool(d)) {
                sb = sb.pool(pool);
            }
            // Priced attempts reserve their worst case from budgets and
            // settle their cost (SPEC BUD-2).
            let price = config.deployment_price(d);
            if let Some(price) = price {
                sb = sb.price(price);
            }
            deployments.push(Deployment {
                name: Arc::from(d.name.as_str()),
                upstream_model: d.upstream_model.clone(),
                supervisor: sb.build().map_err(engine)?,
                scope,
                breaker: breaker.clone(),
                estimator: TokenEstimator::new()
                    .with_default_output(m.default_max_tokens)
                    .with_profile(provider.accounting),
                cap_field: provider.wire.cap_field(),
                weight: d.weight,
                price,
                in_flight: InFlight::default(),
                metrics: deployment_metrics,
            });
        }
        models.insert(
            m.name.clone(),
            Arc::new(Model {
                name,
                routes: config.model_routes(m),
                deployments,
                fallbacks: m.fallbacks.iter().map(|f| Arc::from(f.as_str())).collect(),
                policy: config.retry,
                jitter: Arc::new(SeededJitter::random()),
                metrics: handles,
            }),
        );
    }

    let bounds = Bounds {
        default_timeout: config.admission.default_timeout,
        max_timeout: config.admission.max_timeout,
        max_body_bytes: config.server.max_body_bytes,
        body_read_timeout: config.server.body_read_timeout,
    };
    tollgate_openai::tokens::warm_up();
    let access_log = match previous {
        Some(p) => p
            .access_log
            .reconfigured(config.server.log_format, config.server.access_log),
        None => AccessLog::new(config.server.log_format, config.server.access_log),
    };
    Ok(Arc::new(AppState {
        telemetry,
        models,
        upstream,
        quota_store: shared,
        quota_store_url: shared_url,
        tenant_slots,
        auth,
        admin,
        breakers,
        bounds,
        metrics,
        access_log,
        spend: previous.map(|p| p.spend.clone()).unwrap_or_default(),
        config: config.clone(),
        shutting_down: AtomicBool::new(false),
    }))
}

//! Builds the gateway's runtime from a validated configuration.

use std::collections::HashMap;
use std::sync::Arc;

use tollgate::config::{ConfigError as EngineConfigError, ControllerConfig, ScopeConfig};
use tollgate::lifecycle::{CallReport, CircuitBreaker, Supervisor};
use tollgate::{AdmissionController, TokenEstimate};
use tollgate_openai::HttpProvider;
use tollgate_openai::provider::BuildError;
use tollgate_openai::tokens::TokenEstimator;

use crate::auth::{AdminAuth, Authenticator};
use crate::config::{ConfigError, GatewayConfig, ModelKind as ConfiguredKind};
use crate::metrics::{Metrics, ModelMetrics};
use crate::provider::{GatewayProvider, GatewayRequest};
use crate::state::{AppState, Bounds, Model, ModelKind, TenantSlot};

/// The name of the unlimited quota scope shared by tenants without quotas.
pub const SHARED_TENANT_SCOPE: &str = "tenant:*";

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

/// Builds the shared state for `config`.
pub fn build(config: &GatewayConfig, metrics: Metrics) -> Result<Arc<AppState>, BuildFailure> {
    config.validate()?;
    let engine = |source| BuildFailure::Engine {
        origin: config.origin.clone(),
        source,
    };

    // Upstream side: the configured quota scopes and one pool per model.
    let upstream = AdmissionController::new(ControllerConfig {
        scopes: config.scope_configs(),
        queue_capacity: config.admission.queue_capacity,
        overflow: config.admission.overflow,
        concurrency: None,
        pools: config
            .models
            .iter()
            .filter_map(|m| m.pool_config())
            .collect(),
        max_wait: config.admission.max_wait,
        cooldown: config.cooldown,
    })
    .map_err(engine)?;

    // Tenant side: tenant quotas (a shared unlimited scope for the rest)
    // and tenant pools, admitted once per call.
    let mut tenant_scopes = vec![ScopeConfig::new(SHARED_TENANT_SCOPE)];
    tenant_scopes.extend(config.tenant_scope_configs());
    let auth = Authenticator::new(config);
    let tenant_pools = (0..auth.tenant_count())
        .filter_map(|i| crate::auth::TenantId::from_index(i).and_then(|t| config.tenant_pool(t)))
        .collect();
    let tenants = AdmissionController::new(ControllerConfig {
        scopes: tenant_scopes,
        queue_capacity: config.admission.queue_capacity,
        overflow: config.admission.overflow,
        concurrency: None,
        pools: tenant_pools,
        max_wait: config.admission.max_wait,
        cooldown: config.cooldown,
    })
    .map_err(engine)?;
    let shared = tenants
        .scope_id(SHARED_TENANT_SCOPE)
        .unwrap_or(tollgate::ScopeId::FIRST);
    let tenant_slots = (0..auth.tenant_count())
        .map(|i| {
            let scope_name = match config.tenants.get(i) {
                Some(t) => t.pool_name(),
                None => config.anonymous.pool_name(),
            };
            TenantSlot {
                scope: tenants.scope_id(&scope_name).unwrap_or(shared),
                pool: tenants.pool_id(&scope_name),
            }
        })
        .collect();

    // One HTTP client and one circuit breaker per provider.
    let mut providers = HashMap::new();
    let mut breakers = Vec::new();
    for p in &config.providers {
        let key = config.provider_api_key(p)?;
        let mut b = HttpProvider::builder(p.base_url.clone())
            .connect_timeout(p.connect_timeout)
            .max_response_body(p.max_response_bytes);
        if let Some(key) = key {
            b = b.api_key(key.expose().to_owned());
        }
        let http = b.build().map_err(|source| BuildFailure::Provider {
            origin: config.origin.clone(),
            provider: p.name.clone(),
            source,
        })?;
        let breaker = CircuitBreaker::new(p.circuit).map_err(engine)?;
        breakers.push((Arc::<str>::from(p.name.as_str()), breaker.clone()));
        providers.insert(p.name.clone(), (http, breaker, p));
    }

    let mut models = HashMap::new();
    for m in &config.models {
        let Some((http, breaker, provider)) = providers.get(&m.provider) else {
            continue;
        };
        let name: Arc<str> = Arc::from(m.name.as_str());
        let scope = upstream
            .scope_id(&m.scope_name())
            .unwrap_or(tollgate::ScopeId::FIRST);
        let handles = ModelMetrics::new(m.kind.as_str(), &m.name);
        let observer_name = Arc::clone(&name);
        let observer_metrics = metrics.clone();
        let observer_handles = handles.clone();
        let mut sb = Supervisor::builder(upstream.clone(), GatewayProvider::new(http.clone()))
            .scope(scope)
            .policy(config.retry)
            .breaker(breaker.clone())
            .transport_timeout(provider.attempt_timeout)
            .accounting(provider.engine_accounting())
            .estimator(Arc::new(|r: &GatewayRequest| {
                Ok::<TokenEstimate, _>(r.estimate)
            }))
            .observer(Arc::new(move |report: &CallReport| {
                observer_metrics.call(&observer_name, &observer_handles, report);
            }));
        if let Some(pool) = upstream.pool_id(&m.pool_name()) {
            sb = sb.pool(pool);
        }
        let supervisor = sb.build().map_err(engine)?;
        let kind = match m.kind {
            ConfiguredKind::Chat => ModelKind::Chat,
            ConfiguredKind::Embeddings => ModelKind::Embeddings,
        };
        models.insert(
            m.name.clone(),
            Arc::new(Model {
                name,
                upstream_model: m.upstream_model.clone(),
                kind,
                supervisor,
                fallbacks: m.fallbacks.iter().map(|f| Arc::from(f.as_str())).collect(),
                estimator: TokenEstimator::new()
                    .with_default_output(m.default_max_tokens)
                    .with_profile(provider.accounting),
                metrics: handles,
            }),
        );
    }

    let admin = AdminAuth::from_config(config)?;
    let bounds = Bounds {
        default_timeout: config.admission.default_timeout,
        max_timeout: config.admission.max_timeout,
        max_body_bytes: config.server.max_body_bytes,
        body_read_timeout: config.server.body_read_timeout,
    };
    tollgate_openai::tokens::warm_up();
    Ok(Arc::new(AppState::new(
        models,
        upstream,
        tenants,
        tenant_slots,
        auth,
        admin,
        breakers,
        bounds,
        metrics,
    )))
}

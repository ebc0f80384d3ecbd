//! What every request handler shares.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tollgate::lifecycle::{CircuitBreaker, Supervisor};
use tollgate::{AdmissionController, PoolId, ScopeId};
use tollgate_openai::tokens::TokenEstimator;

use crate::auth::{AdminAuth, Authenticator};
use crate::metrics::Metrics;
use crate::provider::GatewayProvider;

/// Which route a model serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ModelKind {
    /// `POST /v1/chat/completions`.
    Chat,
    /// `POST /v1/embeddings`.
    Embeddings,
}

/// One client-facing model.
#[derive(Debug)]
pub struct Model {
    /// The name clients send.
    pub name: Arc<str>,
    /// The name sent upstream.
    pub upstream_model: String,
    /// Which route it serves.
    pub kind: ModelKind,
    /// Its supervised calls (its provider, scope, pool, breaker).
    pub supervisor: Supervisor<GatewayProvider>,
    /// Models to try, in order, when this one is exhausted or its circuit
    /// is open (SPEC GW-10).
    pub fallbacks: Vec<Arc<str>>,
    /// Token estimation with this model's default output allowance.
    pub estimator: TokenEstimator,
    /// Its metric handles.
    pub metrics: crate::metrics::ModelMetrics,
}

/// A tenant's admission slot: its quota scope and its pool (SPEC POOL-1).
#[derive(Debug, Clone, Copy)]
pub struct TenantSlot {
    /// The tenant's own quota scope (unlimited unless configured).
    pub scope: ScopeId,
    /// The tenant's concurrency pool, when it has a concurrency limit.
    pub pool: Option<PoolId>,
}

/// Time and size bounds of requests (SPEC GW-3, GW-7).
#[derive(Debug, Clone, Copy)]
pub struct Bounds {
    /// Deadline of a request without `x-request-timeout`.
    pub default_timeout: Duration,
    /// Cap on `x-request-timeout`.
    pub max_timeout: Duration,
    /// Largest accepted body.
    pub max_body_bytes: usize,
    /// Time a client has to send its body, from when its request head was
    /// read (SPEC GW-17); the request's deadline bounds it too.
    pub body_read_timeout: Duration,
}

/// The gateway's shared state.
#[derive(Debug)]
pub struct AppState {
    /// Models by client-facing name.
    pub models: HashMap<String, Arc<Model>>,
    /// Admission of upstream attempts: quota scopes and model pools.
    pub upstream: AdmissionController,
    /// Admission of calls per tenant: tenant quotas and tenant pools.
    pub tenants: AdmissionController,
    /// Slots by tenant ordinal.
    pub tenant_slots: Vec<TenantSlot>,
    /// API key → tenant.
    pub auth: Authenticator,
    /// The admin key check, if one is configured.
    pub admin: Option<AdminAuth>,
    /// Circuit breakers by provider name.
    pub breakers: Vec<(Arc<str>, CircuitBreaker)>,
    /// Request bounds.
    pub bounds: Bounds,
    /// Metrics.
    pub metrics: Metrics,
    shutting_down: AtomicBool,
}

impl AppState {
    /// Assembles the state.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        models: HashMap<String, Arc<Model>>,
        upstream: AdmissionController,
        tenants: AdmissionController,
        tenant_slots: Vec<TenantSlot>,
        auth: Authenticator,
        admin: Option<AdminAuth>,
        breakers: Vec<(Arc<str>, CircuitBreaker)>,
        bounds: Bounds,
        metrics: Metrics,
    ) -> Self {
        AppState {
            models,
            upstream,
            tenants,
            tenant_slots,
            auth,
            admin,
            breakers,
            bounds,
            metrics,
            shutting_down: AtomicBool::new(false),
        }
    }

    /// Whether a graceful shutdown began (SPEC GW-8).
    pub fn is_shutting_down(&self) -> bool {
        self.shutting_down.load(Ordering::Acquire)
    }

    /// Begins a graceful shutdown: new requests get 503, queued calls are
    /// aborted with 503, active calls go on (SPEC GW-8).
    pub fn begin_shutdown(&self) {
        self.shutting_down.store(true, Ordering::Release);
        self.tenants.stop_admitting();
        self.upstream.stop_admitting();
    }
}

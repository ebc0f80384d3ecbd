//! What every request handler shares.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tollgate::lifecycle::{AttemptPolicy, CircuitBreaker, SharedJitter, Supervisor};
use tollgate::{AdmissionController, Price, ReservePrice, ScopeId, Snapshot};
use tollgate_openai::tokens::TokenEstimator;

use crate::access_log::AccessLog;
use crate::auth::{AdminAuth, Authenticator};
use crate::build::ScopeRuntime;
use crate::config::{ApiRoute, GatewayConfig};
use crate::metrics::Metrics;
use crate::provider::GatewayProvider;
use crate::router::InFlight;
use crate::tenants::TenantSlot;

/// One client-facing model.
#[derive(Debug)]
pub struct Model {
    /// The name clients send.
    pub name: Arc<str>,
    /// The routes it serves (SPEC WIRE-4).
    pub routes: Vec<ApiRoute>,
    /// Where it is served, at least one (SPEC GW-11).
    pub deployments: Vec<Deployment>,
    /// Models to try, in order, when this one is exhausted or its circuit
    /// is open (SPEC GW-10).
    pub fallbacks: Vec<Arc<str>>,
    /// The retry policy across deployments (a model with one deployment
    /// leaves retries to its supervisor).
    pub policy: AttemptPolicy,
    /// Jitter of the retry delays across deployments.
    pub jitter: SharedJitter,
    /// Its metric handles.
    pub metrics: crate::metrics::ModelMetrics,
}

impl Model {
    /// Whether it serves `route`.
    pub fn serves(&self, route: ApiRoute) -> bool {
        self.routes.contains(&route)
    }
}

/// The prices a call over `chain` (a model and its fallbacks) is reserved
/// at: the dearest input and output price of any of their deployments,
/// so that the worst case covers whichever serves it (SPEC BUD-2, GW-10).
/// `None` when one of them has no price (no budget covers it: the
/// configuration checks that).
pub fn reserve_price(chain: &[Arc<Model>]) -> Option<ReservePrice> {
    let mut out: Option<ReservePrice> = None;
    for d in chain.iter().flat_map(|m| &m.deployments) {
        let p = d.price?.reserve_price();
        out = Some(match out {
            None => p,
            Some(o) => ReservePrice {
                input: o.input.max(p.input),
                output: o.output.max(p.output),
            },
        });
    }
    out
}

/// One deployment of a model: its supervisor (provider, scope, pool,
/// breaker) and what the router reads (SPEC GW-11).
#[derive(Debug)]
pub struct Deployment {
    /// The configured name (a metric label).
    pub name: Arc<str>,
    /// The name sent upstream.
    pub upstream_model: String,
    /// Its supervised calls.
    pub supervisor: Supervisor<GatewayProvider>,
    /// The quota scope its attempts spend, in its supervisor's controller.
    pub scope: ScopeId,
    /// Its provider's circuit breaker.
    pub breaker: CircuitBreaker,
    /// Token estimation with the model's output allowance and the
    /// provider's accounting.
    pub estimator: TokenEstimator,
    /// Where a chat request's output cap goes upstream when the gateway
    /// sets one (the provider's flavour).
    pub cap_field: tollgate_openai::wire::CapField,
    /// Routing weight (at least 1).
    pub weight: u32,
    /// The price of its upstream model, if known (SPEC BUD-1).
    pub price: Option<Price>,
    /// Attempts in flight.
    pub in_flight: InFlight,
    /// Its metric handles.
    pub metrics: crate::metrics::DeploymentMetrics,
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
    /// Admission of upstream attempts: one controller per quota scope,
    /// with the pools of the deployments spending it.
    pub upstream: Vec<ScopeRuntime>,
    /// The gateway's tracer (SPEC OBS-5), made at start and kept across
    /// reloads.
    pub telemetry: crate::telemetry::Telemetry,
    /// The shared quota store of the upstream scopes, if any (SPEC DQ-1).
    pub quota_store: Option<tollgate::quota::SharedRemote>,
    /// Its URL as resolved at build (a reload with another URL, e.g. a
    /// changed `url_env` value, connects anew).
    pub quota_store_url: Option<String>,
    /// Tenants by ordinal: their quotas, pools and allowed models.
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
    /// The access log (SPEC GW-14).
    pub access_log: AccessLog,
    /// Money charged per tenant and model since start, kept across reloads
    /// (SPEC BUD-6).
    pub spend: crate::spend::Spend,
    /// The configuration this state was built from.
    pub config: GatewayConfig,
    /// Set once a graceful shutdown began.
    pub(crate) shutting_down: AtomicBool,
}

impl AppState {
    /// Whether a graceful shutdown began (SPEC GW-8).
    pub fn is_shutting_down(&self) -> bool {
        self.shutting_down.load(Ordering::Acquire)
    }

    /// Begins a graceful shutdown: new requests get 503, queued calls are
    /// aborted with 503, active calls go on (SPEC GW-8).
    pub fn begin_shutdown(&self) {
        self.shutting_down.store(true, Ordering::Release);
        for t in &self.tenant_slots {
            t.controller.stop_admitting();
        }
        for s in &self.upstream {
            s.controller.stop_admitting();
        }
    }

    /// Every controller: each upstream scope's, then each tenant's.
    pub fn controllers(&self) -> impl Iterator<Item = &AdmissionController> {
        self.upstream
            .iter()
            .map(|s| &s.controller)
            .chain(self.tenant_slots.iter().map(|t| &t.controller))
    }

    /// The upstream side's state: every scope and deployment pool in one
    /// snapshot (ids are per scope; look them up by name).
    pub fn upstream_snapshot(&self) -> Snapshot {
        merge(self.upstream.iter().map(|s| s.controller.snapshot()))
    }

    /// The configured name of the tenant numbered `flow_tenant` in
    /// upstream flows (SPEC FAIR-8), if it is one of this configuration's.
    pub fn tenant_of_flow(&self, flow_tenant: u32) -> Option<&Arc<str>> {
        self.tenant_slots
            .iter()
            .find(|t| t.flow.tenant() == flow_tenant)
            .map(|t| &t.name)
    }

    /// The tenant side's state: every tenant's scopes and pool in one
    /// snapshot (scope and pool ids are per tenant; look them up by name).
    pub fn tenant_snapshot(&self) -> Snapshot {
        merge(self.tenant_slots.iter().map(|t| t.controller.snapshot()))
    }
}

/// One snapshot of several controllers: their scopes and pools in order,
/// active calls summed, closed when any is.
pub fn merge(snapshots: impl Iterator<Item = Snapshot>) -> Snapshot {
    let mut out = Snapshot {
        closed: false,
        active: 0,
        concurrency_limit: None,
        concurrency_available: None,
        pools: Vec::new(),
        queue_capacity: 0,
        overflow: tollgate::config::Overflow::Reject,
        backend: "local",
        scopes: Vec::new(),
    };
    for s in snapshots {
        out.closed |= s.closed;
        out.active += s.active;
        out.queue_capacity = s.queue_capacity;
        out.overflow = s.overflow;
        out.backend = s.backend;
        out.pools.extend(s.pools);
        out.scopes.extend(s.scopes);
    }
    out
}

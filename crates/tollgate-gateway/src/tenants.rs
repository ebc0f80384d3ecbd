//! Tenants at run time (SPEC POOL-1, POOL-2, GW-12): each tenant has its
//! own admission controller holding its quota scope `tenant:<name>`
//! (unlimited without limits), the scopes of its per-model limits
//! (`tenant:<name>/<model>`) and its pool, plus the list of models it may
//! call.
//!
//! One controller per tenant keeps tenants apart: reading one tenant's
//! limits for its rate-limit headers (GW-13) touches only that tenant's
//! scopes, and a reload reconfigures a tenant's controller in place, so
//! its quota state, queue and calls in flight carry into its new limits
//! (GW-15).

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use tollgate::config::{ConfigError as EngineConfigError, ControllerConfig, ScopeConfig};
use tollgate::{
    AdmissionController, Call, Deadline, Flow, Lease, PoolId, Priority, Reconfiguration,
    ReservePrice, ScopeId, TokenEstimate,
};

use crate::auth::{ANONYMOUS_TENANT, TenantId};
use crate::config::{GatewayConfig, TENANT_PREFIX};

/// One tenant's admission (SPEC POOL-1, GW-12).
#[derive(Debug)]
pub struct TenantSlot {
    /// The tenant's configured name (`anonymous` for anonymous traffic).
    pub name: Arc<str>,
    /// Its scopes and pool.
    pub controller: AdmissionController,
    /// What `controller` was last configured with.
    pub settings: ControllerConfig,
    /// The tenant's own scope.
    pub scope: ScopeId,
    /// The tenant's pool, when it has a concurrency limit.
    pub pool: Option<PoolId>,
    /// The models it may call; `None` = every model.
    pub models: Option<HashSet<Arc<str>>>,
    /// The scopes of its per-model limits, by model.
    pub model_scopes: Vec<(Arc<str>, ScopeId)>,
    /// The flow its calls wait in on upstream scopes (SPEC FAIR-1,
    /// FAIR-7): its own number ([`flow_numbers`], kept across reloads), its
    /// weight, and its highest class.
    pub flow: Flow,
    /// What was served to it, per class (SPEC FAIR-8); kept across reloads.
    pub served: Arc<Served>,
}

/// Calls admitted upstream for one tenant and their estimated tokens, per
/// class (indexed by [`Priority::index`]), since the gateway started.
#[derive(Debug, Default)]
pub struct Served {
    calls: [AtomicU64; 3],
    tokens: [AtomicU64; 3],
}

impl Served {
    /// Counts a call of `class` estimated at `tokens`.
    pub fn add(&self, class: Priority, tokens: u64) {
        self.calls[class.index()].fetch_add(1, Ordering::Relaxed);
        self.tokens[class.index()].fetch_add(tokens, Ordering::Relaxed);
    }

    /// (calls, tokens) of `class`.
    pub fn get(&self, class: Priority) -> (u64, u64) {
        let i = class.index();
        (
            self.calls[i].load(Ordering::Relaxed),
            self.tokens[i].load(Ordering::Relaxed),
        )
    }

    /// `{"<class>": {"calls": n, "tokens": n}, ...}` for every class.
    pub fn to_json(&self) -> serde_json::Value {
        Priority::ALL
            .into_iter()
            .map(|c| {
                let (calls, tokens) = self.get(c);
                (
                    c.as_str().to_owned(),
                    serde_json::json!({ "calls": calls, "tokens": tokens }),
                )
            })
            .collect::<serde_json::Map<_, _>>()
            .into()
    }
}

/// The leases of one call on its tenant's side: the tenant's own, then the
/// per-model one if the model has its own limits. Held until the call is
/// terminal; dropping them releases the tenant's permit.
#[derive(Debug)]
pub struct TenantLeases(pub Vec<Lease>);

impl TenantLeases {
    /// How long the tenant's admission waited (quota and permit).
    pub fn wait(&self) -> std::time::Duration {
        self.0.iter().map(|l| l.admission().total_wait()).sum()
    }

    /// The worst-case cost reserved for the call, in micro-dollars (zero
    /// when it is not priced).
    pub fn reserved_cost(&self) -> u64 {
        self.0.first().map_or(0, |l| l.reservation().demand.cost)
    }

    /// Settles every lease with `used` (SPEC Q-5, BUD-2) and returns what
    /// the call is charged: its cost (the priced usage, or the reserved
    /// worst case when unknown), `None` when the call is not priced.
    pub fn settle(&mut self, used: tollgate::Usage) -> Option<u64> {
        let mut charged = None;
        for lease in &mut self.0 {
            let priced = lease.reservation().demand.cost > 0 || used.cost().is_some();
            if let Ok(s) = lease.reconcile(used)
                && priced
            {
                charged.get_or_insert(s.cost.charged());
            }
        }
        charged
    }
}

impl TenantSlot {
    /// Whether the tenant may call `model` (SPEC GW-12).
    pub fn allows(&self, model: &str) -> bool {
        self.models.as_ref().is_none_or(|m| m.contains(model))
    }

    /// The scope of the tenant's limits on `model`, if it has some.
    pub fn model_scope(&self, model: &str) -> Option<ScopeId> {
        self.model_scopes
            .iter()
            .find(|(m, _)| &**m == model)
            .map(|(_, s)| *s)
    }

    /// Admits one call of `model`: the tenant's quota and pool permit,
    /// then its per-model quota (SPEC POOL-1, GW-12). A refusal happens
    /// before any upstream work.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future returns whatever was admitted (the engine's
    /// `Acquire` and `Lease` guarantees).
    /// `price` is what the call is reserved at (SPEC BUD-2): a budget of
    /// the tenant takes the call's worst case. A refusal names the scope
    /// that refused it.
    pub async fn admit(
        &self,
        model: &str,
        estimate: TokenEstimate,
        price: Option<ReservePrice>,
        deadline: Deadline,
    ) -> Result<TenantLeases, (tollgate::AdmissionError, ScopeId)> {
        // The per-model limit first, holding no permit while it waits
        // (ADM-2); then the tenant's own limits and its permit. A refusal
        // or a cancellation of the second gives the first back in full:
        // nothing was sent (GW-4, GW-12).
        let call = |scope: ScopeId| {
            let mut call = Call::new(scope).with_estimate(estimate);
            call.price = price;
            call
        };
        let mut first = None;
        if let Some(scope) = self.model_scope(model) {
            let lease = self
                .controller
                .acquire(&call(scope), deadline)
                .await
                .map_err(|e| (e, scope))?;
            first = Some(Unsent(Some(lease)));
        }
        let mut own = call(self.scope);
        own.pool = self.pool;
        let own = self
            .controller
            .acquire(&own, deadline)
            .await
            .map_err(|e| (e, self.scope))?;
        let mut leases = vec![own];
        leases.extend(first.and_then(|mut f| f.0.take()));
        Ok(TenantLeases(leases))
    }

    /// How a budget of `scope` is named to the tenant: `tenant <name>` or
    /// `tenant <name> on model <model>`.
    pub fn budget_name(&self, scope: ScopeId) -> String {
        match self.model_scopes.iter().find(|(_, s)| *s == scope) {
            Some((model, _)) => format!("tenant {} on model {model}", self.name),
            None => format!("tenant {}", self.name),
        }
    }
}

/// A lease taken for a call that has not been sent: given back in full
/// (request unit and tokens) unless taken out.
struct Unsent(Option<Lease>);

impl Drop for Unsent {
    fn drop(&mut self) {
        if let Some(mut lease) = self.0.take() {
            let _ = lease.refused(tollgate::RefusalCost::Free);
        }
    }
}

/// The name of tenant `id`'s scope and pool: `tenant:<name>`.
fn own_name(name: &str) -> String {
    format!("{TENANT_PREFIX}{name}")
}

/// The controller settings of tenant `id` of `config` (anonymous
/// included).
pub fn settings(config: &GatewayConfig, id: TenantId) -> ControllerConfig {
    let (name, mut scopes) = match config.tenant(id) {
        Some(t) => (
            t.name.as_str(),
            t.quota_scope()
                .into_iter()
                .chain(t.model_scopes())
                .collect::<Vec<_>>(),
        ),
        None => (ANONYMOUS_TENANT, Vec::new()),
    };
    if !scopes.iter().any(|s| s.name() == own_name(name)) {
        scopes.insert(0, ScopeConfig::new(own_name(name)));
    }
    ControllerConfig {
        scopes,
        queue_capacity: config.admission.queue_capacity,
        overflow: config.admission.overflow,
        concurrency: None,
        pools: config.tenant_pool(id).into_iter().collect(),
        max_wait: config.admission.max_wait,
        cooldown: config.cooldown,
    }
}

/// The controller of tenant `id` and its settings: the running one of
/// `previous` (a slot of the running configuration with the same name),
/// with the reconfiguration that brings it to `config` pushed on `plans`
/// (applied by the caller once the whole state is built), or a new one
/// (SPEC GW-15).
pub fn controller(
    config: &GatewayConfig,
    id: TenantId,
    previous: Option<&TenantSlot>,
    plans: &mut Vec<Reconfiguration>,
) -> Result<(AdmissionController, ControllerConfig), EngineConfigError> {
    let settings = settings(config, id);
    let controller = match previous {
        Some(p) => {
            if p.settings != settings {
                plans.push(p.controller.prepare(settings.clone())?);
            }
            p.controller.clone()
        }
        None => AdmissionController::new(settings.clone())?,
    };
    Ok((controller, settings))
}

/// The slot of tenant `id` over `controller`, configured with `settings`,
/// counting what is served to it in `served` (the running slot's, on a
/// reload) (look-ups by name: call it once the controller's
/// reconfiguration is applied).
/// Each tenant's flow number (SPEC FAIR-1: one flow per tenant and
/// class), by name: a tenant kept across a reload keeps its number (GW-15);
/// a new one gets its name's [`Flow::tenant_number`] unless that is 0 (the
/// default flow's) or taken by another tenant, now or before this reload,
/// and then the next free number. Two tenants never share a flow, whatever
/// their names hash to.
pub fn flow_numbers<'a>(
    names: impl IntoIterator<Item = &'a str>,
    previous: &[TenantSlot],
) -> HashMap<&'a str, u32> {
    let mut taken: HashSet<u32> = previous.iter().map(|t| t.flow.tenant()).collect();
    taken.insert(Flow::DEFAULT.tenant());
    let mut numbers = HashMap::new();
    let mut new = Vec::new();
    for name in names {
        match previous.iter().find(|t| &*t.name == name) {
            Some(kept) => {
                numbers.insert(name, kept.flow.tenant());
            }
            None => new.push(name),
        }
    }
    for name in new {
        let mut n = Flow::tenant_number(name);
        while !taken.insert(n) {
            n = n.wrapping_add(1);
        }
        numbers.insert(name, n);
    }
    numbers
}

/// The running tenant `id` of `config`, its calls in flow `number`
/// ([`flow_numbers`]).
pub fn slot(
    config: &GatewayConfig,
    id: TenantId,
    number: u32,
    controller: AdmissionController,
    settings: ControllerConfig,
    served: Arc<Served>,
) -> TenantSlot {
    let name = config.tenant_name(id).unwrap_or(ANONYMOUS_TENANT);
    let tenant = config.tenant(id);
    let scope = controller
        .scope_id(&own_name(name))
        .unwrap_or(ScopeId::FIRST);
    let model_scopes = tenant
        .map(|t| {
            t.per_model
                .iter()
                .filter_map(|m| {
                    let scope = controller.scope_id(&t.model_scope_name(&m.model))?;
                    Some((Arc::from(m.model.as_str()), scope))
                })
                .collect()
        })
        .unwrap_or_default();
    let flow = Flow::new(number, tenant.map_or(Priority::Standard, |t| t.priority))
        .with_weight(tenant.map_or(1, |t| t.weight));
    TenantSlot {
        flow,
        served,
        name: Arc::from(name),
        pool: controller.pool_id(&own_name(name)),
        models: tenant
            .and_then(|t| t.models.as_ref())
            .map(|m| m.iter().map(|n| Arc::from(n.as_str())).collect()),
        controller,
        settings,
        scope,
        model_scopes,
    }
}

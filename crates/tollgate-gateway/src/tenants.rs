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

use parking_lot::Mutex;
use tollgate::Usage;

use crate::auth::{ANONYMOUS_TENANT, TenantId};
use crate::config::{GatewayConfig, TENANT_PREFIX};
use crate::provider::Started;

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

/// The leases of one call on its tenant's side, shared by the call's
/// attempts (SPEC BUD-2): the tenant's own, covering every attempt, then
/// one per model of the call that has its own limits (GW-12), covering
/// the attempts on that model, each with the top-ups its retries took.
/// Held until the call is terminal; settling them (or handing them to a
/// stream) drops them, which releases the tenant's permit.
///
/// An attempt after the first is sent only once every lease covering it
/// holds what the earlier attempts it covers may have cost (their
/// reported cost, else their worst case; nothing for a 429 or a request
/// never sent) plus the attempt's own worst case ([`cover`]): a budget
/// then cannot be spent past by retries, reroutes or fallbacks (BUD-2).
///
/// Settlement charges each lease what the attempts it covers cost: the
/// top-ups first, each up to what it took, then the call's own lease the
/// rest, so that every reservation settles to exactly what was billed.
///
/// [`cover`]: TenantLeases::cover
#[derive(Debug, Clone)]
pub struct TenantLeases(Arc<Mutex<Accounts>>);

#[derive(Debug)]
struct Accounts {
    list: Vec<Account>,
    /// Whether the call is priced (its tenant reserved its cost).
    priced: bool,
    /// The refusal of a top-up that kept an attempt from being sent, and
    /// the scope that refused it.
    refused: Option<(tollgate::AdmissionError, ScopeId)>,
}

/// One scope's reservations of a call.
#[derive(Debug)]
struct Account {
    /// The attempts it pays for: every one (`None`, the tenant's own
    /// scope) or those on model number `i` of the call's chain.
    covers: Option<usize>,
    /// The call's admission on the scope, until settled or handed to a
    /// stream.
    main: Option<Lease>,
    /// What retries added (SPEC BUD-2), in order.
    top_ups: Vec<Lease>,
}

/// A lease's reserved cost, in micro-dollars.
fn reserved(lease: &Lease) -> u64 {
    lease.reservation().demand.cost
}

/// Settles `lease` with `used`: what it is charged when priced (its cost,
/// or its reservation when the cost is unknown).
fn settle_one(lease: &mut Lease, used: Usage) -> Option<u64> {
    let priced = reserved(lease) > 0 || used.cost().is_some();
    match lease.reconcile(used) {
        Ok(s) if priced => Some(s.cost.charged()),
        _ => None,
    }
}

impl Account {
    fn covers(&self, model: usize) -> bool {
        self.covers.is_none_or(|m| m == model)
    }

    /// What the attempts it covers before the call's last one may have
    /// cost, in micro-dollars (zero when the call is not `priced`).
    fn billed_before_last(&self, started: &Started, priced: bool) -> u64 {
        if priced {
            started.tally(self.covers).before_last
        } else {
            0
        }
    }

    /// Settles the top-ups with `paid` micro-dollars, each up to what it
    /// took (the rest given back), and drops them. Returns what they were
    /// charged and what is left of `paid`.
    fn settle_top_ups(&mut self, paid: u64) -> (u64, u64) {
        let mut left = paid;
        for mut t in self.top_ups.drain(..) {
            let share = left.min(reserved(&t));
            left -= share;
            let _ = t.reconcile(Usage::known(0).with_cost(Some(share)));
        }
        (paid - left, left)
    }

    /// Settles an account whose attempts are over and none answered:
    /// nothing sent on it gives everything back (SPEC Q-9); otherwise the
    /// tokens stay counted (unknown usage) and, when `priced`, it costs
    /// what its attempts may have cost (Q-5, BUD-5).
    fn settle_failed(&mut self, started: &Started, priced: bool) -> Option<u64> {
        let tally = started.tally(self.covers);
        if tally.sent == 0 {
            let (top, _) = self.settle_top_ups(0);
            let main = self
                .main
                .take()
                .and_then(|mut l| settle_one(&mut l, Usage::known(0).with_cost(Some(0))));
            return main.map(|m| m + top);
        }
        if !priced {
            let _ = self.settle_top_ups(0);
            return self
                .main
                .take()
                .and_then(|mut l| settle_one(&mut l, Usage::UNKNOWN));
        }
        let (top, left) = self.settle_top_ups(tally.billed);
        let main = self
            .main
            .take()
            .and_then(|mut l| settle_one(&mut l, Usage::UNKNOWN.with_cost(Some(left))));
        Some(main.unwrap_or(left).saturating_add(top))
    }
}

impl TenantLeases {
    /// The leases of a call admitted with its tenant's `own` lease and,
    /// when its first model has its own limits, `model`'s; `priced` when
    /// the tenant reserved the call's cost.
    pub fn new(own: Lease, model: Option<Lease>, priced: bool) -> Self {
        let mut list = vec![Account {
            covers: None,
            main: Some(own),
            top_ups: Vec::new(),
        }];
        list.extend(model.map(|m| Account {
            covers: Some(0),
            main: Some(m),
            top_ups: Vec::new(),
        }));
        TenantLeases(Arc::new(Mutex::new(Accounts {
            list,
            priced,
            refused: None,
        })))
    }

    /// Adds the lease of the tenant's limits on model number `model` of the
    /// call's chain (a fallback, SPEC GW-10, GW-12): it covers the
    /// attempts on that model.
    pub fn add_model(&self, model: usize, lease: Lease) {
        self.0.lock().list.push(Account {
            covers: Some(model),
            main: Some(lease),
            top_ups: Vec::new(),
        });
    }

    /// Whether the tenant holds limits of model number `model` already.
    pub fn has_model(&self, model: usize) -> bool {
        self.0.lock().list.iter().any(|a| a.covers == Some(model))
    }

    /// How long the tenant's admission waited (quota and permit).
    pub fn wait(&self) -> std::time::Duration {
        self.0
            .lock()
            .list
            .iter()
            .filter_map(|a| a.main.as_ref())
            .map(|l| l.admission().total_wait())
            .sum()
    }

    /// The worst-case cost reserved for the call at its admission, in
    /// micro-dollars (zero when it is not priced).
    pub fn reserved_cost(&self) -> u64 {
        self.0
            .lock()
            .list
            .first()
            .and_then(|a| a.main.as_ref())
            .map_or(0, reserved)
    }

    /// Makes sure every lease covering the next attempt, on model number
    /// `model` of the chain at a worst case of `worst` micro-dollars,
    /// holds what the earlier attempts it covers may have cost plus
    /// `worst`, topping it up where it does not (SPEC BUD-2). Tried once,
    /// never waited for: `false` when a budget cannot take the top-up now
    /// (the attempt must not be sent; [`refused`](Self::refused) says
    /// which budget). Top-ups taken before a refusal stay, to be settled
    /// with the call.
    pub fn cover(&self, started: &Started, model: usize, worst: u64) -> bool {
        let mut accounts = self.0.lock();
        if !accounts.priced {
            return true;
        }
        let mut refusal = None;
        for a in accounts.list.iter_mut().filter(|a| a.covers(model)) {
            let Some(main) = &a.main else {
                continue;
            };
            let need = started.tally(a.covers).billed.saturating_add(worst);
            let held = a
                .top_ups
                .iter()
                .map(reserved)
                .fold(reserved(main), u64::saturating_add);
            if need <= held {
                continue;
            }
            match main.top_up(need - held) {
                Ok(t) => a.top_ups.push(t),
                Err(e) => {
                    refusal = Some((e, main.scope()));
                    break;
                }
            }
        }
        match refusal {
            None => true,
            Some(r) => {
                accounts.refused = Some(r);
                false
            }
        }
    }

    /// The refusal that kept an attempt from being sent, if one did, and
    /// the scope whose budget refused it.
    pub fn refused(&self) -> Option<(tollgate::AdmissionError, ScopeId)> {
        self.0.lock().refused.clone()
    }

    /// Settles the leases of a one-shot call answered on model number
    /// `model` with `used` (priced at the deployment that answered), after
    /// the attempts `started` counts (SPEC Q-5, BUD-2, BUD-5): each lease
    /// covering the answer is charged it and what the attempts it covers
    /// before it may have cost; every other is settled as failed. Drops
    /// them (the tenant's permit goes back) and returns what the call
    /// cost the tenant (`None`: not priced).
    pub fn settle_answer(&self, started: &Started, model: usize, used: Usage) -> Option<u64> {
        let mut accounts = self.0.lock();
        let priced = accounts.priced;
        let mut own = None;
        for mut a in accounts.list.drain(..) {
            let charged = if a.covers(model) {
                let before = a.billed_before_last(started, priced);
                let (top, left) = a.settle_top_ups(before);
                a.main.take().and_then(|mut l| {
                    let used = if left == 0 {
                        used
                    } else {
                        let answer = used.cost().unwrap_or_else(|| reserved(&l));
                        used.with_cost(Some(answer.saturating_add(left)))
                    };
                    settle_one(&mut l, used).map(|c| c.saturating_add(top))
                })
            } else {
                a.settle_failed(started, priced)
            };
            if a.covers.is_none() {
                own = charged;
            }
        }
        own
    }

    /// Settles the leases of a call whose attempts are over without an
    /// answer (or whose client went away, the attempt in flight at its
    /// worst case): a lease none of whose attempts was sent is given back
    /// in full, tokens and money (SPEC, BUD-4); otherwise its
    /// tokens stay counted and it is charged what its attempts may have
    /// cost (BUD-2, BUD-5). The request units stay spent. Drops
    /// them (the tenant's permit goes back) and returns what the call
    /// cost the tenant (`None`: not priced). Leases already settled or
    /// handed to a stream are not touched.
    pub fn settle_failed(&self, started: &Started) -> Option<u64> {
        let mut accounts = self.0.lock();
        let priced = accounts.priced;
        let mut own = None;
        for mut a in accounts.list.drain(..) {
            let charged = a.settle_failed(started, priced);
            if a.covers.is_none() {
                own = charged;
            }
        }
        own
    }

    /// Hands the leases covering a stream on model number `model` to it
    /// (SPEC POOL-1, GW-17: the tenant's permit lives and ends with the
    /// stream), to be charged its cost plus what the attempts they cover
    /// before it may have cost, beyond what their top-ups are charged at
    /// once (BUD-2, BUD-5); every other lease is settled as failed now.
    /// Returns what the attempts before the stream cost the tenant.
    pub fn hand_to_stream<P>(
        &self,
        started: &Started,
        model: usize,
        stream: &mut tollgate::lifecycle::CallStream<P>,
    ) -> u64
    where
        P: tollgate::lifecycle::Provider,
    {
        let mut accounts = self.0.lock();
        let priced = accounts.priced;
        let mut own = 0;
        for mut a in accounts.list.drain(..) {
            if !a.covers(model) {
                let _ = a.settle_failed(started, priced);
                continue;
            }
            let before = a.billed_before_last(started, priced);
            if a.covers.is_none() {
                own = before;
            }
            let (_, left) = a.settle_top_ups(before);
            if let Some(main) = a.main.take() {
                stream.hold_charging(main, left);
            }
        }
        own
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
        let model = first.and_then(|mut f| f.0.take());
        Ok(TenantLeases::new(own, model, price.is_some()))
    }

    /// Admits the call on the tenant's limits of `model`, a fallback of
    /// the model it was admitted for (SPEC GW-10, GW-12), if the tenant has
    /// some: the lease covers the attempts on that model. `None` when it
    /// has none. A refusal names the scope that refused it.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future returns whatever was admitted.
    pub async fn admit_model(
        &self,
        model: &str,
        estimate: TokenEstimate,
        price: Option<ReservePrice>,
        deadline: Deadline,
    ) -> Result<Option<Lease>, (tollgate::AdmissionError, ScopeId)> {
        let Some(scope) = self.model_scope(model) else {
            return Ok(None);
        };
        let mut call = Call::new(scope).with_estimate(estimate);
        call.price = price;
        self.controller
            .acquire(&call, deadline)
            .await
            .map(Some)
            .map_err(|e| (e, scope))
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

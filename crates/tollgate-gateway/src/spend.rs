//! Spend (SPEC BUD-4, BUD-6): what each call cost, per tenant and model,
//! and the budgets that bound calls.
//!
//! * [`Spend`]: the money charged since the gateway started (kept across
//!   reloads), per tenant and model, also counted in the
//!   `tollgate_spend_micro_usd_total{tenant, model}` counter. A call's cost
//!   is what its tenant was charged: the usage priced at the model that
//!   answered, or the reserved worst case when the usage is unknown (a
//!   stream cut before it reported any, an upstream failure), zero for a
//!   call no upstream billed (never sent, or refused with 429 on every
//!   attempt).
//! * [`budgets`]: every cost limit of a controller's scopes, as the admin
//!   report shows them.
//! * [`budget_exceeded`]: the 429 naming the budget that refused a call.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use metrics::counter;
use parking_lot::Mutex;
use serde_json::{Value, json};
use tollgate::clock::{Instant, WallClock};
use tollgate::price::format_usd;
use tollgate::quota::Dimension;
use tollgate::{AdmissionController, LimitSnapshot, ScopeId};

use crate::config::TENANT_PREFIX;
use crate::error::ApiError;
use crate::tenants::TenantSlot;

/// (tenant, model): configured names.
type Key = (Arc<str>, Arc<str>);

/// Money charged per (tenant, model) since start.
#[derive(Debug, Clone, Default)]
pub struct Spend {
    totals: Arc<Mutex<BTreeMap<Key, Totals>>>,
}

/// One tenant's spend on one model.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Totals {
    /// Micro-dollars charged.
    pub micros: u64,
    /// Calls charged (a call that cost nothing counts too).
    pub calls: u64,
}

impl Spend {
    /// Charges `micros` to `tenant`'s calls of `model` (configured names).
    pub fn record(&self, tenant: &Arc<str>, model: &Arc<str>, micros: u64) {
        counter!(
            "tollgate_spend_micro_usd_total",
            "tenant" => tenant.to_string(),
            "model" => model.to_string()
        )
        .increment(micros);
        let mut totals = self.totals.lock();
        let t = totals
            .entry((Arc::clone(tenant), Arc::clone(model)))
            .or_default();
        t.micros = t.micros.saturating_add(micros);
        t.calls += 1;
    }

    /// Every (tenant, model) charged so far, sorted by tenant then model.
    pub fn totals(&self) -> Vec<(Arc<str>, Arc<str>, Totals)> {
        self.totals
            .lock()
            .iter()
            .map(|((t, m), v)| (Arc::clone(t), Arc::clone(m), *v))
            .collect()
    }
}

/// The cost limit of `scope` with the least left (ties: the longer
/// window), as the controller sees it now.
pub fn tightest(controller: &AdmissionController, scope: ScopeId) -> Option<LimitSnapshot> {
    controller
        .snapshot()
        .scope(scope)?
        .limits
        .iter()
        .filter(|l| l.dimension == Dimension::Cost)
        .min_by_key(|l| (l.available, std::cmp::Reverse(l.window)))
        .copied()
}

/// Every cost limit of the scopes of `controller` whose names pass
/// `keep`, as JSON objects (`scope`, `window`, `window_s`, `limit_usd`,
/// `used_usd` (counted in the window now: settled spend and the worst
/// cases of calls in flight), `remaining_usd`).
pub fn budgets(controller: &AdmissionController, keep: impl Fn(&str) -> bool) -> Vec<Value> {
    let mut out = Vec::new();
    for s in controller.snapshot().scopes {
        if !keep(&s.name) {
            continue;
        }
        for l in s.limits.iter().filter(|l| l.dimension == Dimension::Cost) {
            let used = i128::from(l.limit) - i128::from(l.available);
            let used = u64::try_from(used.max(0)).unwrap_or(u64::MAX);
            out.push(json!({
                "scope": s.name,
                "window": humantime::format_duration(l.window).to_string(),
                "window_s": l.window.as_secs_f64(),
                "limit_usd": format_usd(l.limit),
                "used_usd": format_usd(used),
                "remaining_usd": format_usd(u64::try_from(l.available).unwrap_or(0)),
            }));
        }
    }
    out
}

/// One tenant's spend since start and its budgets, as `GET /admin/spend`
/// and the status page show it: `tenant`, `spent_usd`, `calls`, `models`
/// (per model: `model`, `spent_usd`, `calls`) and `budgets` (see
/// [`budgets`], with the `model` of a per-model budget). `totals` is
/// [`Spend::totals`].
pub fn tenant_report(totals: &[(Arc<str>, Arc<str>, Totals)], slot: &TenantSlot) -> Value {
    let mine: Vec<_> = totals.iter().filter(|(t, ..)| **t == *slot.name).collect();
    let spent: u64 = mine.iter().map(|(_, _, v)| v.micros).sum();
    let calls: u64 = mine.iter().map(|(_, _, v)| v.calls).sum();
    let models: Vec<Value> = mine
        .iter()
        .map(|(_, m, v)| {
            json!({
                "model": &**m,
                "spent_usd": format_usd(v.micros),
                "calls": v.calls,
            })
        })
        .collect();
    let own = format!("{TENANT_PREFIX}{}", slot.name);
    let budgets: Vec<Value> = budgets(&slot.controller, |_| true)
        .into_iter()
        .map(|mut b| {
            let scope = b["scope"].as_str().unwrap_or_default().to_owned();
            // `tenant:<name>/<model>`: the tenant's budget on one model.
            b["model"] = scope
                .strip_prefix(&own)
                .and_then(|r| r.strip_prefix('/'))
                .map_or(Value::Null, Value::from);
            b
        })
        .collect();
    json!({
        "tenant": &*slot.name,
        "spent_usd": format_usd(spent),
        "calls": calls,
        "models": models,
        "budgets": budgets,
    })
}

/// Whether `e` is a refusal by a budget (SPEC BUD-4).
pub fn is_budget(e: &tollgate::AdmissionError) -> bool {
    match e {
        tollgate::AdmissionError::BudgetExceeded { .. } => true,
        tollgate::AdmissionError::EstimateExceedsLimit(x) => x.dimension == Dimension::Cost,
        _ => false,
    }
}

/// The 429 `budget_exceeded` of a call refused by a budget of `scope` in
/// `controller` (SPEC BUD-4), naming it as `who` (e.g. `tenant team-a`)
/// with its amount and window, and when it frees room (`retry-after`).
/// A calendar budget is named by its period and zone (`$5 per day
/// (Europe/Paris)`) and says when it is available again, in UTC (SPEC
/// BUD-3, BUD-4; configuration.md). A call whose worst case is larger than
/// the whole budget can never fit it: its retry hint is one window.
pub fn budget_exceeded(
    e: &tollgate::AdmissionError,
    controller: &AdmissionController,
    scope: ScopeId,
    who: &str,
    now: Instant,
) -> ApiError {
    let limit = tightest(controller, scope);
    let described = limit.map_or_else(
        || who.to_owned(),
        |l| {
            let per = match l.calendar {
                Some(c) => c.to_string(),
                None => humantime::format_duration(l.window).to_string(),
            };
            format!("{who} (${} per {per})", format_usd(l.limit))
        },
    );
    let calendar = limit.is_some_and(|l| l.calendar.is_some());
    let (message, retry) = match e {
        tollgate::AdmissionError::EstimateExceedsLimit(x) => (
            format!(
                "This request's worst-case cost (${}) is more than the whole budget of {described}; \
                 lower its output allowance (max_tokens).",
                format_usd(x.demand)
            ),
            Some(x.window),
        ),
        // A spent calendar budget frees nothing before its period ends,
        // and says when that is.
        other if calendar => (
            format!(
                "The budget of {described} has no room left for this request's worst-case cost.{}",
                crate::error::available_again_at_boundary(
                    other.retry_at(),
                    WallClock::system_at(now)
                )
            ),
            other
                .retry_at()
                .map(|at| at.saturating_duration_since(now))
                .or(limit.map(|l| l.window)),
        ),
        other => (
            format!(
                "The budget of {described} has no room left for this request's worst-case cost \
                 before its deadline; it frees room in the time retry-after gives."
            ),
            other
                .retry_at()
                .map(|at| at.saturating_duration_since(now))
                .or(limit.map(|l| l.window)),
        ),
    };
    let mut err = ApiError::budget_exceeded(message, who);
    err.retry_after = retry.map(|r| r.max(Duration::from_millis(1)));
    err
}

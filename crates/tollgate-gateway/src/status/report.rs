//! The status page's JSON (`GET /status/json`, SPEC OBS-6): configured
//! names, counts, fill and money only; never keys, headers, prompts or
//! completions. Fields are listed in docs/operations.md, "Status page".

use std::collections::BTreeMap;
use std::sync::Arc;

use serde_json::{Value, json};
use tollgate::{Priority, Snapshot};

use super::history::{HISTORY_SAMPLES, History, SAMPLE_EVERY, Series, Side, now_ms};
use crate::spend;
use crate::state::AppState;

/// The status of `app` now, with the history points later than
/// `since_ms` (0: all of them).
pub fn report(app: &AppState, history: &History, since_ms: u64) -> Value {
    let names = |n: u32| app.tenant_of_flow(n).cloned();
    let series = history.series_since(since_ms);
    let mut scopes = Vec::new();
    for (side, snapshot) in [
        (Side::Upstream, app.upstream_snapshot()),
        (Side::Tenant, app.tenant_snapshot()),
    ] {
        scopes.extend(scopes_json(side, &snapshot, &series, &names));
    }
    let deployments: Vec<Value> = {
        let mut models: Vec<_> = app.models.values().collect();
        models.sort_by(|a, b| a.name.cmp(&b.name));
        models
            .into_iter()
            .flat_map(|m| {
                m.deployments.iter().map(move |d| {
                    let controller = d.supervisor.controller();
                    let scope = controller.snapshot().scope(d.scope).map(|s| s.name.clone());
                    json!({
                        "model": &*m.name,
                        "deployment": &*d.name,
                        "scope": scope,
                        "in_flight": d.in_flight.get(),
                        "circuit": d.breaker.state().as_str(),
                        "upstream_429s": d.metrics.upstream_429s(),
                    })
                })
            })
            .collect()
    };
    let circuits: Vec<Value> = app
        .breakers
        .iter()
        .map(|(n, b)| json!({ "provider": &**n, "state": b.state().as_str() }))
        .collect();
    let totals = app.spend.totals();
    let tenants: Vec<Value> = app
        .tenant_slots
        .iter()
        .map(|slot| {
            let mut t = spend::tenant_report(&totals, slot);
            t["served"] = slot.served.to_json();
            t
        })
        .collect();
    let throttles: Vec<Value> = history
        .throttles()
        .into_iter()
        .rev()
        .map(|t| {
            json!({
                "t_ms": t.t_ms,
                "model": &*t.model,
                "deployment": &*t.deployment,
                "count": t.count,
            })
        })
        .collect();
    json!({
        "now_ms": now_ms(),
        "sample_every_ms": SAMPLE_EVERY.as_millis() as u64,
        "history_samples": HISTORY_SAMPLES,
        "shutting_down": app.is_shutting_down(),
        "scopes": scopes,
        "deployments": deployments,
        "circuits": circuits,
        "tenants": tenants,
        "upstream_429s": throttles,
    })
}

/// Each scope of `snapshot`: its state now and its kept points.
fn scopes_json(
    side: Side,
    snapshot: &Snapshot,
    series: &[Series],
    names: &dyn Fn(u32) -> Option<Arc<str>>,
) -> Vec<Value> {
    snapshot
        .scopes
        .iter()
        .map(|sc| {
            let limits: Vec<Value> = sc
                .limits
                .iter()
                .map(|l| {
                    let capacity = i64::try_from(l.capacity).unwrap_or(i64::MAX);
                    json!({
                        "dimension": l.dimension.as_str(),
                        "window_s": l.window.as_secs_f64(),
                        "calendar": l.calendar.map(|c| crate::metrics::calendar_label(Some(&c))),
                        "limit": l.limit,
                        "capacity": l.capacity,
                        "used": capacity.saturating_sub(l.available),
                    })
                })
                .collect();
            let mut by_class: BTreeMap<&str, usize> =
                Priority::ALL.into_iter().map(|c| (c.as_str(), 0)).collect();
            let mut by_tenant: BTreeMap<String, usize> = BTreeMap::new();
            for f in &sc.flows {
                *by_class.entry(f.priority.as_str()).or_default() += f.queued;
                if let Some(t) = names(f.tenant) {
                    *by_tenant.entry(t.to_string()).or_default() += f.queued;
                }
            }
            let kept = series.iter().find(|s| s.side == side && s.name == sc.name);
            let history = kept.map(|s| {
                let t: Vec<u64> = s.points.iter().map(|p| p.t_ms).collect();
                let queued: Vec<u32> = s.points.iter().map(|p| p.queued).collect();
                let used: Vec<Vec<i64>> = (0..s.limits.len())
                    .map(|i| s.points.iter().map(|p| p.used[i]).collect())
                    .collect();
                let limits: Vec<Value> = s
                    .limits
                    .iter()
                    .map(|l| {
                        json!({
                            "dimension": l.dimension.as_str(),
                            "window_s": l.window.as_secs_f64(),
                            "capacity": l.capacity,
                        })
                    })
                    .collect();
                json!({ "limits": limits, "t_ms": t, "queued": queued, "used": used })
            });
            json!({
                "side": side.as_str(),
                "name": sc.name,
                "queued": sc.queued,
                "queue_capacity": sc.queue_capacity,
                "queue": { "by_class": by_class, "by_tenant": by_tenant },
                "cooldown_remaining_s": sc.cooldown_remaining.map(|d| d.as_secs_f64()),
                "cooldowns": sc.counters.cooldowns,
                "admitted": sc.counters.admitted,
                "limits": limits,
                "history": history,
            })
        })
        .collect()
}

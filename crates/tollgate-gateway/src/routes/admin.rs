//! The admin endpoints (SPEC OBS-1, GW-15, BUD-6): `GET /admin/snapshot`,
//! `GET /admin/spend` and `POST /admin/reload`, all behind the admin key
//! (`server.admin_key_env`); 404 when no admin key is configured.

use std::sync::Arc;

use axum::Json;
use axum::extract::State;
use http::{HeaderMap, StatusCode, header};
use serde_json::{Value, json};
use tollgate::{Priority, Snapshot};
use tollgate_openai::ErrorResponse;

use crate::error::ApiError;
use crate::live::{Live, ReloadError};
use crate::spend;
use crate::state::AppState;

/// Checks the admin key of a request (`Authorization: Bearer`).
fn admin(app: &AppState, headers: &HeaderMap) -> Result<(), ApiError> {
    admin_with(app, headers, false)
}

/// Checks the admin key of a request: `Authorization: Bearer <key>`, or
/// with `basic` also HTTP Basic with the key as the password. 404 when no
/// admin key is configured, 401 otherwise.
pub(super) fn admin_with(app: &AppState, headers: &HeaderMap, basic: bool) -> Result<(), ApiError> {
    let Some(admin) = &app.admin else {
        return Err(ApiError::new(
            StatusCode::NOT_FOUND,
            ErrorResponse::invalid_request("No admin key is configured.").with_code("not_found"),
        ));
    };
    let presented = headers
        .get(header::AUTHORIZATION)
        .map(|v| v.to_str().unwrap_or_default());
    let checked = if basic {
        admin.check_with_basic(presented)
    } else {
        admin.check(presented)
    };
    checked.map_err(|_| ApiError::unauthorized())
}

/// `POST /admin/reload`: re-reads the configuration file (SPEC GW-15).
/// 200 once the new configuration serves new requests; 422 with the
/// located error (file, field, reason, position) when the file is invalid,
/// the running configuration staying; 409 without a file or during a
/// shutdown.
pub async fn reload(
    State(live): State<Arc<Live>>,
    headers: HeaderMap,
) -> Result<Json<Value>, ApiError> {
    admin(&live.current(), &headers)?;
    match live.reload().await {
        Ok(()) => Ok(Json(json!({ "status": "reloaded" }))),
        Err(e) => {
            let status = match e {
                ReloadError::NoFile | ReloadError::ShuttingDown => StatusCode::CONFLICT,
                ReloadError::Config(_) | ReloadError::Build(_) => StatusCode::UNPROCESSABLE_ENTITY,
            };
            Err(ApiError::new(
                status,
                ErrorResponse::invalid_request(e.to_string()).with_code("reload_refused"),
            ))
        }
    }
}

/// `GET /admin/snapshot`: both controllers and every circuit, redacted
/// (SPEC OBS-1). Needs the admin key; 404 when none is configured.
pub async fn snapshot(
    State(live): State<Arc<Live>>,
    headers: HeaderMap,
) -> Result<Json<Value>, ApiError> {
    let app = live.current();
    admin(&app, &headers)?;
    let circuits: Vec<Value> = app
        .breakers
        .iter()
        .map(|(n, b)| json!({ "provider": &**n, "state": b.state().as_str() }))
        .collect();
    let names = |n: u32| app.tenant_of_flow(n).cloned();
    // What each tenant was served upstream, per class (SPEC FAIR-8).
    let served: serde_json::Map<String, Value> = app
        .tenant_slots
        .iter()
        .map(|t| (t.name.to_string(), t.served.to_json()))
        .collect();
    Ok(Json(json!({
        "shutting_down": app.is_shutting_down(),
        "upstream": snapshot_json(&app.upstream_snapshot(), &names),
        "tenants": snapshot_json(&app.tenant_snapshot(), &names),
        "served": served,
        "circuits": circuits,
    })))
}

/// `GET /admin/spend` (SPEC BUD-6): per tenant, what it spent since the
/// gateway started, per model, and each of its budgets over its window;
/// then the accounts' (upstream scopes') budgets. Amounts are decimal
/// strings of dollars (exact). See docs/operations.md, "Spend".
pub async fn spend(
    State(live): State<Arc<Live>>,
    headers: HeaderMap,
) -> Result<Json<Value>, ApiError> {
    let app = live.current();
    admin(&app, &headers)?;
    let totals = app.spend.totals();
    let tenants: Vec<Value> = app
        .tenant_slots
        .iter()
        .map(|slot| spend::tenant_report(&totals, slot))
        .collect();
    let accounts: Vec<Value> = app
        .upstream
        .iter()
        .flat_map(|s| spend::budgets(&s.controller, |_| true))
        .collect();
    Ok(Json(json!({
        "currency": "usd",
        "tenants": tenants,
        "accounts": accounts,
    })))
}

/// A snapshot as JSON: counts, availability and configured names only;
/// `names` maps a flow's tenant number to the tenant's configured name
/// (flows of other numbers are left out).
pub fn snapshot_json(s: &Snapshot, names: &dyn Fn(u32) -> Option<Arc<str>>) -> Value {
    let scopes: Vec<Value> = s
        .scopes
        .iter()
        .map(|sc| {
            let limits: Vec<Value> = sc
                .limits
                .iter()
                .map(|l| {
                    json!({
                        "dimension": l.dimension.as_str(),
                        "window_seconds": l.window.as_secs_f64(),
                        "calendar": l.calendar.map(|c| crate::metrics::calendar_label(Some(&c))),
                        "limit": l.limit,
                        "capacity": l.capacity,
                        "available": l.available,
                        "algorithm": l.algorithm.as_str(),
                    })
                })
                .collect();
            let k = &sc.counters;
            let flows: Vec<Value> = sc
                .flows
                .iter()
                .filter_map(|f| {
                    Some(json!({
                        "tenant": &*names(f.tenant)?,
                        "class": f.priority.as_str(),
                        "weight": f.weight,
                        "queued": f.queued,
                    }))
                })
                .collect();
            let served_cost: serde_json::Map<String, Value> = Priority::ALL
                .into_iter()
                .map(|c| (c.as_str().to_owned(), json!(k.served_cost[c.index()])))
                .collect();
            json!({
                "name": sc.name,
                "queued": sc.queued,
                "waiting_for_slot": sc.waiting_for_slot,
                "queue_capacity": sc.queue_capacity,
                "pending": sc.pending,
                "cooldown_generation": sc.cooldown_generation,
                "cooldown_remaining_seconds": sc.cooldown_remaining.map(|d| d.as_secs_f64()),
                "limits": limits,
                "admitted": k.admitted,
                "preempted": k.preempted,
                "refunded_reservations": k.refunded_reservations,
                "tokens_reserved": k.tokens_reserved,
                "tokens_reported": k.tokens_reported,
                "tokens_refunded": k.tokens_refunded,
                "tokens_debt": k.tokens_debt,
                "unknown_usage": k.unknown_usage,
                "known_zero": k.known_zero,
                "cooldowns": k.cooldowns,
                "flows": flows,
                "served_cost": served_cost,
            })
        })
        .collect();
    let pools: Vec<Value> = s
        .pools
        .iter()
        .map(|p| json!({ "name": p.name, "limit": p.limit, "available": p.available, "waiting": p.waiting }))
        .collect();
    json!({
        "closed": s.closed,
        "active": s.active,
        "queue_capacity": s.queue_capacity,
        "overflow": s.overflow.as_str(),
        "backend": s.backend,
        "scopes": scopes,
        "pools": pools,
    })
}

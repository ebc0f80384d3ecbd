//! `GET /v1/models`, health, readiness, metrics and the admin snapshot
//! (SPEC GW-1, OBS-1, OBS-2).

use std::sync::Arc;

use axum::Json;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use http::{HeaderMap, StatusCode, header};
use serde_json::{Value, json};
use tollgate::Snapshot;
use tollgate_openai::ErrorResponse;
use tollgate_openai::wire::{Model as WireModel, ModelList};

use super::common;
use crate::error::ApiError;
use crate::state::AppState;

/// `GET /v1/models`: the configured models only.
pub async fn models(
    State(app): State<Arc<AppState>>,
    headers: HeaderMap,
) -> Result<Json<ModelList>, ApiError> {
    common::tenant(&app, &headers)?;
    let mut names: Vec<&String> = app.models.keys().collect();
    names.sort();
    let list = names
        .into_iter()
        .map(|n| WireModel::new(n.clone(), "tollgate", 0))
        .collect();
    Ok(Json(ModelList::new(list)))
}

/// `GET /healthz`: the process is up.
pub async fn healthz() -> Json<Value> {
    Json(json!({ "status": "ok" }))
}

/// `GET /readyz`: 503 once a shutdown began.
pub async fn readyz(State(app): State<Arc<AppState>>) -> Response {
    if app.is_shutting_down() {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(json!({ "status": "shutting_down" })),
        )
            .into_response()
    } else {
        Json(json!({ "status": "ready" })).into_response()
    }
}

/// `GET /metrics`: Prometheus text, with controller state published at
/// scrape time.
pub async fn metrics(State(app): State<Arc<AppState>>) -> Response {
    app.metrics.snapshot("upstream", &app.upstream.snapshot());
    app.metrics.snapshot("tenant", &app.tenants.snapshot());
    for (name, breaker) in &app.breakers {
        app.metrics.circuit(name, breaker.state());
    }
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        app.metrics.render(),
    )
        .into_response()
}

/// `GET /admin/snapshot`: both controllers and every circuit, redacted
/// (SPEC OBS-1). Needs the admin key; 404 when none is configured.
pub async fn snapshot(
    State(app): State<Arc<AppState>>,
    headers: HeaderMap,
) -> Result<Json<Value>, ApiError> {
    let Some(admin) = &app.admin else {
        return Err(ApiError::new(
            StatusCode::NOT_FOUND,
            ErrorResponse::invalid_request("No admin key is configured.").with_code("not_found"),
        ));
    };
    let presented = headers
        .get(header::AUTHORIZATION)
        .map(|v| v.to_str().unwrap_or_default());
    if admin.check(presented).is_err() {
        return Err(ApiError::unauthorized());
    }
    let circuits: Vec<Value> = app
        .breakers
        .iter()
        .map(|(n, b)| json!({ "provider": &**n, "state": b.state().as_str() }))
        .collect();
    Ok(Json(json!({
        "shutting_down": app.is_shutting_down(),
        "upstream": snapshot_json(&app.upstream.snapshot()),
        "tenants": snapshot_json(&app.tenants.snapshot()),
        "circuits": circuits,
    })))
}

/// A snapshot as JSON: counts, availability and configured names only.
pub fn snapshot_json(s: &Snapshot) -> Value {
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
                        "limit": l.limit,
                        "capacity": l.capacity,
                        "available": l.available,
                        "algorithm": l.algorithm.as_str(),
                    })
                })
                .collect();
            let k = &sc.counters;
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

//! `GET /v1/models`, health, readiness and metrics (SPEC GW-1, OBS-2).

use std::sync::Arc;

use axum::Json;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use http::{HeaderMap, StatusCode, header};
use serde_json::{Value, json};
use tollgate::StoreMode;
use tollgate_openai::wire::{Model as WireModel, ModelList};

use super::common;
use crate::error::ApiError;
use crate::error::Dialect;
use crate::live::Live;

/// `GET /v1/models`: the configured models only.
pub async fn models(State(live): State<Arc<Live>>, headers: HeaderMap) -> Response {
    let answer = (|| {
        let app = live.current();
        let tenant = common::tenant(&app, &headers, Dialect::OpenAi)?;
        let mut names: Vec<&String> = app
            .models
            .keys()
            .filter(|m| common::allowed(&app, tenant, m))
            .collect();
        names.sort();
        let list = names
            .into_iter()
            .map(|n| WireModel::new(n.clone(), "tollgate", 0))
            .collect();
        Ok::<_, ApiError>(Json(ModelList::new(list)))
    })();
    with_request_id(answer.into_response(), &headers)
}

/// `GET /v1/models/{model}`: one configured model the key may call (the
/// SDKs' `models.retrieve`), else 404 `model_not_found`.
/// The name may hold `/` (`org/model`); one that is not UTF-8 once
/// decoded names no model.
pub async fn model(
    State(live): State<Arc<Live>>,
    name: Result<axum::extract::Path<String>, axum::extract::rejection::PathRejection>,
    headers: HeaderMap,
) -> Response {
    let answer = (|| {
        let app = live.current();
        let tenant = common::tenant(&app, &headers, Dialect::OpenAi)?;
        let name = name.map_or_else(|_| String::new(), |p| p.0);
        match app.models.get_key_value(&name) {
            Some((n, _)) if common::allowed(&app, tenant, n) => {
                Ok(Json(WireModel::new(n.clone(), "tollgate", 0)))
            }
            _ => Err(ApiError::model_not_found(&name)),
        }
    })();
    with_request_id(answer.into_response(), &headers)
}

/// Any path no route serves: 404 in the OpenAI format (the Anthropic one
/// under `/v1/messages`), with the request id, so a client's SDK reads
/// an error rather than an empty body.
pub async fn unknown_path(method: http::Method, uri: http::Uri, headers: HeaderMap) -> Response {
    let path = uri.path();
    let dialect = if path == "/v1/messages" || path.starts_with("/v1/messages/") {
        Dialect::Anthropic
    } else {
        Dialect::OpenAi
    };
    let response = ApiError::unknown_path(&method, path).into_response_for(dialect);
    with_request_id(response, &headers)
}

/// `response` with the request's id (SPEC GW-14).
fn with_request_id(mut response: Response, headers: &HeaderMap) -> Response {
    response
        .headers_mut()
        .insert(crate::request_id::HEADER, crate::request_id::of(headers));
    response
}

/// `GET /healthz`: the process is up.
pub async fn healthz() -> Json<Value> {
    Json(json!({ "status": "ok" }))
}

/// `GET /readyz`: 503 once a shutdown began, or while a shared quota
/// store does not answer and `fail_closed` refuses every call (SPEC DQ-3);
/// 200 `degraded` while `fail_open_local` serves from the local share.
pub async fn readyz(State(live): State<Arc<Live>>) -> Response {
    let app = live.current();
    if app.is_shutting_down() {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(json!({ "status": "shutting_down" })),
        )
            .into_response();
    }
    if app.quota_store.is_none() {
        return Json(json!({ "status": "ready" })).into_response();
    }
    let modes: Vec<StoreMode> = app
        .upstream_snapshot()
        .scopes
        .iter()
        .filter_map(|s| s.store)
        .collect();
    if modes.contains(&StoreMode::Unavailable) {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(json!({ "status": "quota_store_unavailable" })),
        )
            .into_response()
    } else if modes.contains(&StoreMode::LocalFallback) {
        Json(json!({ "status": "degraded", "quota_store": "local_fallback" })).into_response()
    } else {
        Json(json!({ "status": "ready", "quota_store": "shared" })).into_response()
    }
}

/// `GET /metrics`: Prometheus text, with controller state published at
/// scrape time.
pub async fn metrics(State(live): State<Arc<Live>>) -> Response {
    let app = live.current();
    let names = |n: u32| app.tenant_of_flow(n).cloned();
    app.metrics
        .snapshot("upstream", &app.upstream_snapshot(), &names);
    app.metrics
        .snapshot("tenant", &app.tenant_snapshot(), &names);
    for slot in &app.tenant_slots {
        app.metrics.served(&slot.name, &slot.served);
    }
    for (name, breaker) in &app.breakers {
        app.metrics.circuit(name, breaker.state());
    }
    for model in app.models.values() {
        for d in &model.deployments {
            let snapshot = d.supervisor.controller().snapshot();
            let scope = snapshot.scope(d.scope);
            d.metrics.publish(
                d.in_flight.get(),
                scope.map(|s| s.queued),
                scope.map(|s| s.counters.cooldowns),
                d.breaker.state(),
            );
        }
    }
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        app.metrics.render(),
    )
        .into_response()
}

//! `GET /v1/models`, `GET /stats`, `POST /reset` and the 404 fallback.

use std::sync::Arc;

use axum::Json;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::json;

use crate::state::{Route, Shared};
use crate::wire::ApiError;

pub(super) async fn models(State(shared): State<Arc<Shared>>, headers: HeaderMap) -> Response {
    shared.begin(Route::Models);
    if let Err(e) = shared.authorize(&headers) {
        return e.into_response();
    }
    let data: Vec<_> = shared
        .config
        .models
        .iter()
        .map(|id| json!({"id": id, "object": "model", "created": 0, "owned_by": "tollgate-sim"}))
        .collect();
    Json(json!({"object": "list", "data": data})).into_response()
}

pub(super) async fn stats(State(shared): State<Arc<Shared>>) -> Response {
    Json(shared.stats()).into_response()
}

pub(super) async fn reset(State(shared): State<Arc<Shared>>) -> Response {
    shared.reset();
    Json(json!({"reset": true})).into_response()
}

pub(super) async fn not_found(State(shared): State<Arc<Shared>>) -> Response {
    shared.begin(Route::NotFound);
    ApiError {
        status: StatusCode::NOT_FOUND,
        message: "Unknown route on the simulated provider.".to_owned(),
        kind: "invalid_request_error",
        param: None,
        code: Some("unknown_url"),
    }
    .into_response()
}

//! The gateway's HTTP routes (SPEC GW-1).

mod admin;
mod chat;
mod common;
mod embeddings;
mod flow;
mod info;
mod messages;
mod responses;
mod status;

use std::sync::Arc;

use axum::Router;
use axum::routing::{get, post};

pub use admin::snapshot_json;

use crate::live::Live;

/// The router serving every route (`/metrics` too unless `with_metrics`
/// is false: it then has a listener of its own). Model routes read their
/// own body, after authentication and under its bounds (SPEC GW-17).
pub fn router(live: Arc<Live>, with_metrics: bool) -> Router {
    let router = Router::new()
        .route("/v1/chat/completions", post(chat::chat))
        .route("/v1/embeddings", post(embeddings::embeddings))
        .route("/v1/responses", post(responses::responses))
        .route("/v1/messages", post(messages::messages))
        .route("/v1/models", get(info::models))
        .route("/healthz", get(info::healthz))
        .route("/readyz", get(info::readyz))
        .route("/admin/snapshot", get(admin::snapshot))
        .route("/admin/spend", get(admin::spend))
        .route("/admin/reload", post(admin::reload))
        .route("/status", get(status::page))
        .route("/status/json", get(status::json));
    let router = if with_metrics {
        router.route("/metrics", get(info::metrics))
    } else {
        router
    };
    router.with_state(live)
}

/// The router of a separate metrics listener (`server.metrics_listen`):
/// `GET /metrics` and the status page, without a key (SPEC OBS-6).
pub fn metrics_router(live: Arc<Live>) -> Router {
    Router::new()
        .route("/metrics", get(info::metrics))
        .route("/status", get(status::page_open))
        .route("/status/json", get(status::json_open))
        .with_state(live)
}

//! The gateway's HTTP routes (SPEC GW-1).

mod chat;
mod common;
mod embeddings;
mod flow;
mod info;

use std::sync::Arc;

use axum::Router;
use axum::routing::{get, post};

pub use info::snapshot_json;

use crate::state::AppState;

/// The router serving every route. Model routes read their own body,
/// after authentication and under its bounds (SPEC GW-17).
pub fn router(state: Arc<AppState>) -> Router {
    Router::new()
        .route("/v1/chat/completions", post(chat::chat))
        .route("/v1/embeddings", post(embeddings::embeddings))
        .route("/v1/models", get(info::models))
        .route("/healthz", get(info::healthz))
        .route("/readyz", get(info::readyz))
        .route("/metrics", get(info::metrics))
        .route("/admin/snapshot", get(info::snapshot))
        .with_state(state)
}

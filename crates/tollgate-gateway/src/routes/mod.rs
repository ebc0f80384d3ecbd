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

use crate::error::{ApiError, Dialect};
use crate::live::Live;

/// The router serving every route (`/metrics` too unless `with_metrics`
/// is false: it then has a listener of its own). Model routes read their
/// own body, after authentication and under its bounds (SPEC GW-17).
pub fn router(live: Arc<Live>, with_metrics: bool) -> Router {
    let router = Router::new()
        .route(
            "/v1/chat/completions",
            post(chat::chat).fallback(post_only::<OPENAI>),
        )
        .route(
            "/v1/embeddings",
            post(embeddings::embeddings).fallback(post_only::<OPENAI>),
        )
        .route(
            "/v1/responses",
            post(responses::responses).fallback(post_only::<OPENAI>),
        )
        .route(
            "/v1/messages",
            post(messages::messages).fallback(post_only::<ANTHROPIC>),
        )
        .route("/v1/models", get(info::models).fallback(get_only))
        .route("/v1/models/{*model}", get(info::model).fallback(get_only))
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
    router.fallback(info::unknown_path).with_state(live)
}

/// `post_only`'s dialect: OpenAI's error shape (chat completions,
/// embeddings, responses).
const OPENAI: bool = false;
/// `post_only`'s dialect: Anthropic's error shape (messages).
const ANTHROPIC: bool = true;

/// Any method but POST on a model route (SPEC GW-1, WIRE-3): 405 with
/// `allow: POST` and an error in the route's dialect, as every other error
/// of the route, with the request id (GW-14).
async fn post_only<const ANTHROPIC_DIALECT: bool>(
    method: http::Method,
    uri: http::Uri,
    headers: http::HeaderMap,
) -> axum::response::Response {
    let dialect = if ANTHROPIC_DIALECT {
        Dialect::Anthropic
    } else {
        Dialect::OpenAi
    };
    not_allowed(&method, &uri, &headers, "POST", dialect)
}

/// Any method but GET on `/v1/models` and `/v1/models/{model}`: as
/// [`post_only`], in the OpenAI format.
async fn get_only(
    method: http::Method,
    uri: http::Uri,
    headers: http::HeaderMap,
) -> axum::response::Response {
    not_allowed(&method, &uri, &headers, "GET, HEAD", Dialect::OpenAi)
}

/// 405 with `allow` and the request id.
fn not_allowed(
    method: &http::Method,
    uri: &http::Uri,
    headers: &http::HeaderMap,
    allow: &'static str,
    dialect: Dialect,
) -> axum::response::Response {
    let mut response =
        ApiError::method_not_allowed(method, uri.path(), allow).into_response_for(dialect);
    let h = response.headers_mut();
    h.insert(http::header::ALLOW, http::HeaderValue::from_static(allow));
    h.insert(crate::request_id::HEADER, crate::request_id::of(headers));
    response
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

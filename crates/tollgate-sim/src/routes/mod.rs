//! HTTP routes of the simulated provider.
//!
//! | route                        | what                                          |
//! |------------------------------|-----------------------------------------------|
//! | `POST /v1/chat/completions`  | one-shot JSON or `stream: true` SSE           |
//! | `POST /v1/embeddings`        | float or base64 vectors                       |
//! | `GET /v1/models`             | the configured model ids                      |
//! | `GET /stats`                 | [`crate::SimStats`] as JSON                   |
//! | `POST /reset`                | clears counters and windows                   |
//!
//! `/v1/*` routes demand the bearer key when one is configured; `/stats` and
//! `/reset` never do (they are the test harness's, not the client's).

use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use axum::Router;
use axum::routing::{get, post};
use serde::de::DeserializeOwned;

use crate::state::Shared;
use crate::wire::ApiError;

mod admin;
pub(crate) mod chat;
mod embeddings;

/// `system_fingerprint` of every completion.
pub(crate) const FINGERPRINT: &str = "tollgate-sim";

/// The simulator's routes over `shared`.
pub(crate) fn router(shared: Arc<Shared>) -> Router {
    Router::new()
        .route("/v1/chat/completions", post(chat::chat_completions))
        .route("/v1/embeddings", post(embeddings::embeddings))
        .route("/v1/models", get(admin::models))
        .route("/stats", get(admin::stats))
        .route("/reset", post(admin::reset))
        .fallback(admin::not_found)
        .with_state(shared)
}

/// Parses a JSON body, answering 400 in OpenAI format when it is not valid.
fn parse_json<T: DeserializeOwned>(body: &[u8]) -> Result<T, ApiError> {
    serde_json::from_slice(body).map_err(|e| {
        ApiError::invalid(
            format!("We could not parse the JSON body of your request: {e}"),
            None,
        )
    })
}

/// The `model` field, which every API request must carry.
fn require_model(model: Option<String>) -> Result<String, ApiError> {
    match model {
        Some(m) if !m.trim().is_empty() => Ok(m),
        _ => Err(ApiError::invalid(
            "You must provide a model parameter.",
            Some("model"),
        )),
    }
}

/// Seconds since the Unix epoch, for the `created` fields (0 if the system
/// clock is before 1970).
fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

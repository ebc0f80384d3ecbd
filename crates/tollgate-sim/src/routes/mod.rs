//! HTTP routes of the simulated provider.
//!
//! | route                        | what                                          |
//! |------------------------------|-----------------------------------------------|
//! | `POST /v1/chat/completions`  | one-shot JSON or `stream: true` SSE           |
//! | `POST /v1/embeddings`        | float or base64 vectors                       |
//! | `POST /v1/responses`         | Responses API, one-shot or typed SSE events   |
//! | `POST /openai/deployments/{d}/chat/completions?api-version=` | Azure's chat |
//! | `POST /openai/deployments/{d}/embeddings?api-version=`       | Azure's embeddings |
//! | `POST /v1/messages`          | Anthropic Messages, one-shot or SSE events    |
//! | `GET /v1/models`             | the configured model ids                      |
//! | `GET /stats`                 | [`crate::SimStats`] as JSON                   |
//! | `POST /reset`                | clears counters, windows and buckets          |
//!
//! The OpenAI `/v1/*` routes demand the bearer key when one is configured;
//! the Azure routes their `api-key` (`azure_key`), `/v1/messages` its
//! `x-api-key` (`anthropic_key`); `/stats` and `/reset` never need a key
//! (they are the test harness's, not the client's).

use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use axum::Router;
use axum::routing::{get, post};
use serde::de::DeserializeOwned;

use axum::response::Response;

use crate::azure::AzureTarget;
use crate::referee::Rejection;
use crate::state::Shared;
use crate::wire::ApiError;

mod admin;
mod anthropic;
mod azure;
pub(crate) mod chat;
mod embeddings;
mod responses;

/// The wire an OpenAI-shaped request arrived in.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Dialect<'a> {
    /// OpenAI's own routes.
    OpenAi,
    /// An Azure deployment route.
    Azure(&'a AzureTarget),
}

impl Dialect<'_> {
    /// The Azure deployment name, which stands for the model.
    fn deployment(&self) -> Option<&str> {
        match self {
            Dialect::OpenAi => None,
            Dialect::Azure(target) => Some(&target.deployment),
        }
    }

    /// The 429 of this dialect for a refused request of `tokens` tokens;
    /// `operation` is the Azure operation name.
    fn reject(&self, rejection: &Rejection, tokens: u64, seq: u64, operation: &str) -> Response {
        match self {
            Dialect::OpenAi => crate::headers::rejection_response(rejection, tokens, seq),
            Dialect::Azure(target) => {
                crate::azure::rejection_response(rejection, target, operation, seq)
            }
        }
    }
}

/// `system_fingerprint` of every completion.
pub(crate) const FINGERPRINT: &str = "tollgate-sim";

/// The simulator's routes over `shared`.
pub(crate) fn router(shared: Arc<Shared>) -> Router {
    Router::new()
        .route("/v1/chat/completions", post(chat::chat_completions))
        .route("/v1/embeddings", post(embeddings::embeddings))
        .route("/v1/responses", post(responses::responses))
        .route(
            "/openai/deployments/{deployment}/chat/completions",
            post(azure::chat_completions),
        )
        .route(
            "/openai/deployments/{deployment}/embeddings",
            post(azure::embeddings),
        )
        .route("/v1/messages", post(anthropic::messages))
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

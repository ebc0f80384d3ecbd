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
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use axum::routing::{MethodRouter, get, post};
use bytes::Bytes;
use serde::de::DeserializeOwned;
use tokio::time::Instant;

use crate::azure::AzureTarget;
use crate::faults::FaultPlan;
use crate::headers::server_error_response;
use crate::referee::{RateState, Rejection};
use crate::state::{Admission, Charge, RequestGuard, Route, Shared};
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

    /// The model of a request: the Azure deployment name stands for it.
    fn model(&self, requested: Option<String>) -> Option<String> {
        self.deployment().map(str::to_owned).or(requested)
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

/// A request past its key check: request `seq` in `dialect`, received at
/// `received`.
#[derive(Debug, Clone, Copy)]
struct Call<'a> {
    shared: &'a Arc<Shared>,
    dialect: Dialect<'a>,
    seq: u64,
    received: Instant,
}

impl Call<'_> {
    /// The ingress delay of this request (when configured).
    async fn ingress(&self) {
        self.shared.ingress(self.seq, self.received).await;
    }

    /// Admission of this request, charged `charge`: its guard and rate
    /// state, or its answer (its dialect's 429, an injected 5xx);
    /// `operation` is the Azure operation name. The answer is boxed: a
    /// `Response` is large, and a refusal the rarer path.
    fn admit(
        &self,
        charge: Charge,
        faults: &FaultPlan,
        operation: &str,
    ) -> Result<(RequestGuard, RateState), Box<Response>> {
        let seq = self.seq;
        let answer = match self.shared.admit(charge, faults) {
            Admission::Admitted { guard, state } => return Ok((guard, state)),
            Admission::Rejected(rejection) => {
                self.dialect
                    .reject(&rejection, charge.tokens, seq, operation)
            }
            Admission::ServerError { status, state } => server_error_response(status, &state, seq),
        };
        Err(Box::new(answer))
    }
}

/// An API operation in the OpenAI shape.
#[derive(Debug, Clone, Copy)]
enum Operation {
    ChatCompletions,
    Embeddings,
    Responses,
}

impl Operation {
    /// Everything after the key check.
    async fn serve(self, call: Call<'_>, body: &[u8]) -> Response {
        match self {
            Operation::ChatCompletions => chat::complete(call, body).await,
            Operation::Embeddings => embeddings::embed(call, body).await,
            Operation::Responses => responses::respond(call, body).await,
        }
    }
}

/// The handler of an OpenAI `/v1/*` route: counts the request on `route`
/// and takes its sequence number, checks the bearer key (401), then serves
/// `operation`.
fn openai(route: Route, operation: Operation) -> MethodRouter<Arc<Shared>> {
    post(
        move |State(shared): State<Arc<Shared>>, headers: HeaderMap, body: Bytes| async move {
            let received = Instant::now();
            let seq = shared.begin(route);
            if let Err(e) = shared.authorize(&headers) {
                return e.into_response();
            }
            let call = Call {
                shared: &shared,
                dialect: Dialect::OpenAi,
                seq,
                received,
            };
            operation.serve(call, &body).await
        },
    )
}

/// `system_fingerprint` of every completion.
pub(crate) const FINGERPRINT: &str = "tollgate-sim";

/// The simulator's routes over `shared`.
pub(crate) fn router(shared: Arc<Shared>) -> Router {
    Router::new()
        .route(
            "/v1/chat/completions",
            openai(Route::ChatCompletions, Operation::ChatCompletions),
        )
        .route(
            "/v1/embeddings",
            openai(Route::Embeddings, Operation::Embeddings),
        )
        .route(
            "/v1/responses",
            openai(Route::Responses, Operation::Responses),
        )
        .route(
            "/openai/deployments/{deployment}/chat/completions",
            azure::deployment(Route::AzureChatCompletions, Operation::ChatCompletions),
        )
        .route(
            "/openai/deployments/{deployment}/embeddings",
            azure::deployment(Route::AzureEmbeddings, Operation::Embeddings),
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

/// The answer to a request refused with 400, counted as a bad request.
fn bad_request(shared: &Shared, error: impl IntoResponse) -> Response {
    shared.count(|c| c.bad_request += 1);
    error.into_response()
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

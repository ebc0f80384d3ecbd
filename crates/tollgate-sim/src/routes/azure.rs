//! Azure OpenAI's deployment routes:
//! `POST /openai/deployments/{deployment}/chat/completions?api-version=...`
//! and `POST /openai/deployments/{deployment}/embeddings?api-version=...`.
//!
//! Order of work: no `api-version` → 404 "Resource not found" (counted as
//! `not_found`, not as an API request: the route does not exist without
//! it) → count it and take its sequence number → `api-key` check when an
//! Azure key is configured (401, Azure's body) → then exactly the OpenAI
//! route's work, with the deployment name as the model and Azure's 429
//! body. The OpenAI bearer key (`--require-key`) does not apply here.

use std::sync::Arc;

use axum::extract::{Path, RawQuery, State};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use bytes::Bytes;

use super::{Dialect, chat, embeddings};
use crate::azure::{AzureRefusal, AzureTarget, api_version, authorize};
use crate::state::{Route, Shared};

/// The target of a request on `route`, or the early answer (404, 401).
fn admit_route(
    shared: &Shared,
    route: Route,
    deployment: String,
    query: Option<&str>,
    headers: &HeaderMap,
) -> Result<(AzureTarget, u64), AzureRefusal> {
    let Some(api_version) = api_version(query) else {
        shared.begin(Route::NotFound);
        return Err(AzureRefusal::MissingApiVersion);
    };
    let seq = shared.begin(route);
    authorize(shared, headers)?;
    Ok((
        AzureTarget {
            deployment,
            api_version,
        },
        seq,
    ))
}

pub(super) async fn chat_completions(
    State(shared): State<Arc<Shared>>,
    Path(deployment): Path<String>,
    RawQuery(query): RawQuery,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let received = tokio::time::Instant::now();
    let route = Route::AzureChatCompletions;
    match admit_route(&shared, route, deployment, query.as_deref(), &headers) {
        Ok((target, seq)) => {
            chat::complete(&shared, Dialect::Azure(&target), seq, received, &body).await
        }
        Err(refusal) => refusal.into_response(),
    }
}

pub(super) async fn embeddings(
    State(shared): State<Arc<Shared>>,
    Path(deployment): Path<String>,
    RawQuery(query): RawQuery,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let received = tokio::time::Instant::now();
    let route = Route::AzureEmbeddings;
    match admit_route(&shared, route, deployment, query.as_deref(), &headers) {
        Ok((target, seq)) => {
            embeddings::embed(&shared, Dialect::Azure(&target), seq, received, &body).await
        }
        Err(refusal) => refusal.into_response(),
    }
}

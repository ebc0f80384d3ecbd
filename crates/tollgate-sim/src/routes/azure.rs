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
use axum::response::IntoResponse;
use axum::routing::{MethodRouter, post};
use bytes::Bytes;

use super::{Call, Dialect, Operation};
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

/// The handler of an Azure deployment route: counts the request on `route`
/// once it has its `api-version`, checks the `api-key`, then serves
/// `operation` as the OpenAI route does, in Azure's dialect.
pub(super) fn deployment(route: Route, operation: Operation) -> MethodRouter<Arc<Shared>> {
    post(
        move |State(shared): State<Arc<Shared>>,
              Path(deployment): Path<String>,
              RawQuery(query): RawQuery,
              headers: HeaderMap,
              body: Bytes| async move {
            let received = tokio::time::Instant::now();
            match admit_route(&shared, route, deployment, query.as_deref(), &headers) {
                Ok((target, seq)) => {
                    let call = Call {
                        shared: &shared,
                        dialect: Dialect::Azure(&target),
                        seq,
                        received,
                    };
                    operation.serve(call, &body).await
                }
                Err(refusal) => refusal.into_response(),
            }
        },
    )
}

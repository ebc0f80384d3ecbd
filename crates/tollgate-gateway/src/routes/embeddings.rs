//! `POST /v1/embeddings` (SPEC GW-1).

use std::sync::Arc;

use axum::extract::State;
use axum::extract::rejection::BytesRejection;
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use http::{HeaderMap, HeaderValue, StatusCode, header};
use tollgate::Usage;
use tollgate::clock::Instant;
use tollgate::lifecycle::CallOptions;
use tollgate_openai::{EmbeddingsRequest, UpstreamRequest};

use super::common::{self, fail};
use crate::error::ApiError;
use crate::provider::{GatewayRequest, Started};
use crate::state::{AppState, ModelKind};

const ROUTE: &str = "embeddings";

/// The handler.
pub async fn embeddings(
    State(app): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let arrived = Instant::now();
    let deadline = common::deadline(&app, &headers, arrived);
    if app.is_shutting_down() {
        return Err(fail(&app, ROUTE, "", ApiError::shutting_down()));
    }
    let tenant = common::tenant(&app, &headers).map_err(|e| fail(&app, ROUTE, "", e))?;
    let request: EmbeddingsRequest =
        common::body(&app, body).map_err(|e| fail(&app, ROUTE, "", e))?;
    let first = common::model(&app, &request.model, ModelKind::Embeddings)
        .map_err(|e| fail(&app, ROUTE, "", e))?;
    let mut tenant_lease = common::admit_tenant(
        &app,
        tenant,
        first.estimator.embeddings(&request).into(),
        deadline,
    )
    .await
    .map_err(|e| fail(&app, ROUTE, &first.name, e))?;
    let options = CallOptions::deadline(deadline);
    let chain = common::chain(&app, &first);
    let mut last = None;
    let reached = Started::default();
    for (i, model) in chain.iter().enumerate() {
        if i > 0 {
            app.metrics.fallback(&chain[i - 1].name, &model.name);
        }
        let upstream =
            UpstreamRequest::embeddings(&request, &model.upstream_model).map_err(|e| {
                fail(
                    &app,
                    ROUTE,
                    &model.name,
                    ApiError::bad_request(e.to_string()),
                )
            })?;
        let call = GatewayRequest {
            upstream,
            estimate: model.estimator.embeddings(&request).into(),
            started: reached.clone(),
        };
        let started = Instant::now();
        match model.supervisor.invoke(&call, options).await {
            Ok(done) => {
                app.metrics
                    .upstream_latency(&model.name, false, started.elapsed());
                let used = done
                    .settlement
                    .and_then(|s| s.reported)
                    .map_or(Usage::UNKNOWN, Usage::known);
                let _ = tenant_lease.reconcile(used);
                app.metrics.request(ROUTE, &model.name, 200);
                let mut response = (StatusCode::OK, done.response).into_response();
                response.headers_mut().insert(
                    header::CONTENT_TYPE,
                    HeaderValue::from_static("application/json"),
                );
                return Ok(response);
            }
            Err(e) if common::falls_back(&e) => last = Some(e),
            Err(e) => {
                last = Some(e);
                break;
            }
        }
    }
    common::settle_failed(tenant_lease, &reached);
    let err = last.map_or_else(ApiError::shutting_down, |e| {
        ApiError::from_call(&e, Instant::now())
    });
    Err(fail(&app, ROUTE, &first.name, err))
}

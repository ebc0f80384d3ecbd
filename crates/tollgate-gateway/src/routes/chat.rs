//! `POST /v1/chat/completions`, one-shot and streaming (SPEC GW-1, GW-5,
//! GW-6, GW-10).

use std::sync::Arc;

use axum::body::Body;
use axum::extract::State;
use axum::extract::rejection::BytesRejection;
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use http::{HeaderMap, HeaderValue, StatusCode, header};
use tollgate::Usage;
use tollgate::clock::Instant;
use tollgate::lifecycle::CallOptions;
use tollgate_openai::{ChatCompletionRequest, UpstreamRequest};

use super::common::{self, fail};
use crate::error::ApiError;
use crate::provider::{GatewayRequest, Started};
use crate::sse::SseBody;
use crate::state::{AppState, ModelKind};

const ROUTE: &str = "chat";

/// The handler.
pub async fn chat(
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
    let request: ChatCompletionRequest =
        common::body(&app, body).map_err(|e| fail(&app, ROUTE, "", e))?;
    let first = common::model(&app, &request.model, ModelKind::Chat)
        .map_err(|e| fail(&app, ROUTE, "", e))?;
    let mut tenant_lease = common::admit_tenant(
        &app,
        tenant,
        first.estimator.chat(&request).into(),
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
        let upstream = UpstreamRequest::chat(&request, &model.upstream_model).map_err(|e| {
            fail(
                &app,
                ROUTE,
                &model.name,
                ApiError::bad_request(e.to_string()),
            )
        })?;
        let call = GatewayRequest {
            upstream,
            estimate: model.estimator.chat(&request).into(),
            started: reached.clone(),
        };
        let started = Instant::now();
        if request.is_stream() {
            match model.supervisor.stream(&call, options).await {
                Ok(stream) => {
                    app.metrics
                        .upstream_latency(&model.name, true, started.elapsed());
                    if let Some(lease) = stream.lease() {
                        let a = lease.admission();
                        app.metrics
                            .admission(&model.name, a.quota_wait, a.concurrency_wait);
                    }
                    app.metrics.request(ROUTE, &model.name, 200);
                    let body = SseBody::new(
                        stream,
                        tenant_lease,
                        app.metrics.clone(),
                        Arc::clone(&model.name),
                    );
                    let mut response = Body::from_stream(body).into_response();
                    let h = response.headers_mut();
                    h.insert(
                        header::CONTENT_TYPE,
                        HeaderValue::from_static("text/event-stream"),
                    );
                    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
                    return Ok(response);
                }
                Err(e) => last = Some(e),
            }
        } else {
            match model.supervisor.invoke(&call, options).await {
                Ok(done) => {
                    app.metrics
                        .upstream_latency(&model.name, false, started.elapsed());
                    app.metrics.admission(
                        &model.name,
                        done.admission.quota_wait,
                        done.admission.concurrency_wait,
                    );
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
                Err(e) => last = Some(e),
            }
        }
        match &last {
            Some(e) if common::falls_back(e) => continue,
            _ => break,
        }
    }
    common::settle_failed(tenant_lease, &reached);
    let err = last.map_or_else(ApiError::shutting_down, |e| {
        ApiError::from_call(&e, Instant::now())
    });
    if err.status == StatusCode::TOO_MANY_REQUESTS {
        app.metrics.rejected(err.reason());
    }
    Err(fail(&app, ROUTE, &first.name, err))
}

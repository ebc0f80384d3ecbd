//! The flow every model route follows (SPEC GW-1..GW-10): deadline first,
//! identity, body, tenant admission, then the model and its fallbacks
//! through the supervised lifecycle, one-shot or streaming.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::rejection::BytesRejection;
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use http::{HeaderMap, HeaderValue, StatusCode, header};
use serde::de::DeserializeOwned;
use tollgate::clock::Instant;
use tollgate::lifecycle::{CallOptions, Completed};
use tollgate::{Lease, TokenEstimate, Usage};
use tollgate_openai::UpstreamRequest;

use super::common::{self, fail};
use crate::error::ApiError;
use crate::provider::{GatewayRequest, Started};
use crate::sse::SseBody;
use crate::state::{AppState, Model, ModelKind};

/// What tells one model route from another.
pub trait Route {
    /// The parsed request body.
    type Request: DeserializeOwned;
    /// The route's label in metrics.
    const NAME: &'static str;
    /// The models it serves.
    const KIND: ModelKind;
    /// The model the request names.
    fn model(request: &Self::Request) -> &str;
    /// Tokens the request will spend on `model` (its tokenizer and output
    /// allowance).
    fn estimate(model: &Model, request: &Self::Request) -> TokenEstimate;
    /// The request as sent to `upstream_model`. `body` is the client's
    /// body as received: when nothing needs rewriting it goes upstream
    /// unchanged (no re-serialization).
    fn upstream(
        request: &Self::Request,
        body: &Bytes,
        upstream_model: &str,
    ) -> Result<UpstreamRequest, serde_json::Error>;
    /// Whether the client asked for a stream.
    fn is_stream(request: &Self::Request) -> bool;
}

/// Serves one request of route `R`.
pub async fn handle<R: Route>(
    app: &AppState,
    headers: &HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let arrived = Instant::now();
    let deadline = common::deadline(app, headers, arrived);
    let route = R::NAME;
    if app.is_shutting_down() {
        return Err(fail(app, route, "", ApiError::shutting_down()));
    }
    let tenant = common::tenant(app, headers).map_err(|e| fail(app, route, "", e))?;
    let (request, raw): (R::Request, Bytes) =
        common::body(app, body).map_err(|e| fail(app, route, "", e))?;
    let first =
        common::model(app, R::model(&request), R::KIND).map_err(|e| fail(app, route, "", e))?;
    let tenant_lease = common::admit_tenant(app, tenant, R::estimate(&first, &request), deadline)
        .await
        .map_err(|e| fail(app, route, &first.name, e))?;
    let options = CallOptions::deadline(deadline);
    let chain = common::chain(app, &first);
    let reached = Started::default();
    let mut last = None;
    for (i, model) in chain.iter().enumerate() {
        if i > 0 {
            app.metrics.fallback(&chain[i - 1].name, &model.name);
        }
        let upstream = R::upstream(&request, &raw, &model.upstream_model).map_err(|e| {
            fail(
                app,
                route,
                &model.name,
                ApiError::bad_request(e.to_string()),
            )
        })?;
        let call = GatewayRequest {
            upstream,
            estimate: R::estimate(model, &request),
            started: reached.clone(),
        };
        let started = Instant::now();
        let result = if R::is_stream(&request) {
            match model.supervisor.stream(&call, options).await {
                Ok(stream) => {
                    let a = stream.lease().map(|l| *l.admission()).unwrap_or_default();
                    model.metrics.success(
                        true,
                        started.elapsed(),
                        a.quota_wait,
                        a.concurrency_wait,
                    );
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
                Err(e) => e,
            }
        } else {
            match model.supervisor.invoke(&call, options).await {
                Ok(done) => {
                    model.metrics.success(
                        false,
                        started.elapsed(),
                        done.admission.quota_wait,
                        done.admission.concurrency_wait,
                    );
                    return Ok(one_shot(done, tenant_lease));
                }
                Err(e) => e,
            }
        };
        let next = common::falls_back(&result);
        last = Some(result);
        if !next {
            break;
        }
    }
    common::settle_failed(tenant_lease, &reached);
    let err = last.map_or_else(ApiError::shutting_down, |e| {
        ApiError::from_call(&e, Instant::now())
    });
    if err.status == StatusCode::TOO_MANY_REQUESTS {
        app.metrics.rejected(err.reason());
    }
    Err(fail(app, route, &first.name, err))
}

/// The response of a completed one-shot call; the tenant's tokens are
/// settled with what the upstream reported.
fn one_shot(done: Completed<Bytes>, mut tenant_lease: Lease) -> Response {
    let used = done
        .settlement
        .and_then(|s| s.reported)
        .map_or(Usage::UNKNOWN, Usage::known);
    let _ = tenant_lease.reconcile(used);
    let mut response = (StatusCode::OK, done.response).into_response();
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    response
}

//! The flow every model route follows (SPEC GW-1..GW-10): deadline first,
//! identity, body, tenant admission, then the model and its fallbacks
//! through the supervised lifecycle, one-shot or streaming.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::Request;
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use http::{HeaderValue, StatusCode, header};
use serde::de::DeserializeOwned;
use tollgate::clock::Instant;
use tollgate::lifecycle::{CallOptions, Completed};
use tollgate::{Lease, TokenEstimate, Usage};
use tollgate_openai::UpstreamRequest;

use super::common::{self, fail};
use crate::connection::{Arrival, LINGER};
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

/// Serves one request of route `R`: the deadline from the instant its
/// head was read (SPEC DL-1), identity from the headers alone (401 before
/// any body byte is read), then the body under its size and time bounds
/// (SPEC GW-17), then admission.
pub async fn handle<R: Route>(app: &AppState, request: Request) -> Result<Response, ApiError> {
    let (parts, body) = request.into_parts();
    let arrival = parts.extensions.get::<Arrival>();
    let arrived = arrival.map_or_else(Instant::now, |a| a.at);
    let headers = &parts.headers;
    let deadline = common::deadline(app, headers, arrived);
    let route = R::NAME;
    if app.is_shutting_down() {
        return Err(fail(app, route, "", ApiError::shutting_down()));
    }
    let tenant = common::tenant(app, headers).map_err(|e| fail(app, route, "", e))?;
    let raw = common::read_body(app, headers, body, arrived, deadline)
        .await
        .map_err(|e| fail(app, route, "", e))?;
    let request: R::Request = common::parse(&raw).map_err(|e| fail(app, route, "", e))?;
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
                Ok(mut stream) => {
                    let a = *stream.admission();
                    model.metrics.success(
                        true,
                        started.elapsed(),
                        a.quota_wait,
                        a.concurrency_wait,
                    );
                    // The tenant's permit lives and ends with the stream,
                    // even one nobody polls (SPEC POOL-1, GW-17).
                    stream.hold(tenant_lease);
                    // A client that stops reading cannot keep its
                    // connection past the deadline either.
                    let close = arrival
                        .zip(deadline.instant())
                        .map(|(a, at)| a.connection.close_at(at.checked_add(LINGER).unwrap_or(at)));
                    let body =
                        SseBody::new(stream, app.metrics.clone(), Arc::clone(&model.name), close);
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

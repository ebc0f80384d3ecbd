//! Steps every model route shares: the deadline (made first), identity,
//! body parsing, tenant admission, and the fallback chain.

use std::sync::Arc;

use axum::extract::rejection::BytesRejection;
use bytes::Bytes;
use http::HeaderMap;
use serde::de::DeserializeOwned;
use tollgate::clock::Instant;
use tollgate::lifecycle::{CallError, GiveUp};
use tollgate::{Call, Deadline, Lease, TokenEstimate, Usage};

use crate::error::ApiError;
use crate::provider::Started;
use crate::state::{AppState, Model, ModelKind};

/// The request's deadline, made once on arrival (SPEC DL-1, GW-3).
pub fn deadline(app: &AppState, headers: &HeaderMap, arrived: Instant) -> Deadline {
    crate::deadline::request_deadline(
        headers,
        arrived,
        app.bounds.default_timeout,
        app.bounds.max_timeout,
    )
}

/// The tenant of the request, from its API key only (SPEC GW-2, POOL-2).
pub fn tenant(app: &AppState, headers: &HeaderMap) -> Result<usize, ApiError> {
    let header = headers
        .get(http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok());
    app.auth
        .authenticate(header)
        .map(|t| t.index())
        .map_err(|_| ApiError::unauthorized())
}

/// Parses a JSON body, turning an oversized body into 413 and bad JSON into
/// 400 (SPEC GW-7).
pub fn body<T: DeserializeOwned>(
    app: &AppState,
    body: Result<Bytes, BytesRejection>,
) -> Result<(T, Bytes), ApiError> {
    let bytes = body.map_err(|r| match r {
        BytesRejection::FailedToBufferBody(_) => ApiError::too_large(app.bounds.max_body_bytes),
        other => ApiError::bad_request(other.body_text()),
    })?;
    let parsed = serde_json::from_slice(&bytes)
        .map_err(|e| ApiError::bad_request(format!("Invalid JSON body: {e}")))?;
    Ok((parsed, bytes))
}

/// The model the request names, served on `kind`'s route (SPEC GW-1).
pub fn model(app: &AppState, name: &str, kind: ModelKind) -> Result<Arc<Model>, ApiError> {
    app.models
        .get(name)
        .filter(|m| m.kind == kind)
        .cloned()
        .ok_or_else(|| ApiError::model_not_found(name))
}

/// Admits the call for its tenant: the tenant's quota, then its pool
/// permit, held until the call is terminal (SPEC POOL-1). A refusal here
/// happens before any upstream work and consumes nothing upstream.
pub async fn admit_tenant(
    app: &AppState,
    tenant: usize,
    estimate: TokenEstimate,
    deadline: Deadline,
) -> Result<Lease, ApiError> {
    let Some(slot) = app.tenant_slots.get(tenant) else {
        return Err(ApiError::unauthorized());
    };
    let mut call = Call::new(slot.scope).with_estimate(estimate);
    call.pool = slot.pool;
    app.tenants.acquire(&call, deadline).await.map_err(|e| {
        let err = ApiError::from_admission(&e, Instant::now());
        app.metrics.rejected(err.reason());
        err
    })
}

/// The models to try, the requested one first, then its fallbacks (once
/// each, in order; SPEC GW-10).
pub fn chain(app: &AppState, first: &Arc<Model>) -> Vec<Arc<Model>> {
    let mut out = vec![Arc::clone(first)];
    for name in &first.fallbacks {
        if let Some(m) = app.models.get(&**name)
            && m.kind == first.kind
            && !out.iter().any(|o| Arc::ptr_eq(o, m))
        {
            out.push(Arc::clone(m));
        }
    }
    out
}

/// Whether a model's failure lets the call move to its fallback: attempts
/// exhausted with a retryable error, or an open circuit (SPEC GW-10).
pub fn falls_back(e: &CallError) -> bool {
    match e {
        CallError::CircuitOpen(_) => true,
        CallError::Provider { error, gave_up, .. } => {
            error.is_retryable() && matches!(gave_up, GiveUp::Exhausted | GiveUp::WaitTooLong)
        }
        _ => false,
    }
}

/// Settles the tenant's lease of a call that failed: when no attempt
/// reached an upstream no tokens were used, so the tenant's token
/// reservation is refunded in full (known zero, SPEC Q-5); otherwise what
/// the upstream used is unknown and the estimate stays charged. The request
/// unit stays spent (SPEC Q-9). Dropping the lease then releases the
/// tenant permit.
pub fn settle_failed(mut tenant_lease: Lease, started: &Started) {
    let used = if started.count() == 0 {
        Usage::known(0)
    } else {
        Usage::UNKNOWN
    };
    let _ = tenant_lease.reconcile(used);
}

/// Records and returns an error.
pub fn fail(app: &AppState, route: &'static str, model: &str, err: ApiError) -> ApiError {
    app.metrics.request(route, model, err.status.as_u16());
    err
}

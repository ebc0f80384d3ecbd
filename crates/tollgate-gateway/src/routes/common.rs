//! Steps every model route shares: the deadline (made first), identity,
//! body parsing, tenant admission, and the fallback chain.

use std::sync::Arc;

use axum::body::Body;
use bytes::{Bytes, BytesMut};
use futures_util::StreamExt;
use http::HeaderMap;
use serde::de::DeserializeOwned;
use tollgate::clock::Instant;
use tollgate::lifecycle::{CallError, GiveUp};
use tollgate::{Deadline, Flow, Priority, ReservePrice, TokenEstimate};

use crate::config::ApiRoute;
use crate::error::{ApiError, Dialect};
use crate::spend;
use crate::state::{AppState, Model};
use crate::tenants::TenantLeases;

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
///
/// The header is checked as raw bytes: a value that is not UTF-8 is a
/// malformed key (401), never "no header" (which may mean anonymous).
///
/// On Anthropic's dialect the key may come as `x-api-key: <key>` instead
/// (what its SDKs send, SPEC WIRE-3); a request with both headers is judged
/// by `Authorization`.
pub fn tenant(app: &AppState, headers: &HeaderMap, dialect: Dialect) -> Result<usize, ApiError> {
    let header = headers
        .get(http::header::AUTHORIZATION)
        .map(http::HeaderValue::as_bytes);
    let api_key = || headers.get("x-api-key").map(http::HeaderValue::as_bytes);
    let tenant = match (header, dialect) {
        (None, Dialect::Anthropic) => match api_key() {
            Some(key) => app.auth.authenticate_api_key(key),
            None => app.auth.authenticate_bytes(None),
        },
        _ => app.auth.authenticate_bytes(header),
    };
    tenant
        .map(|t| t.index())
        .map_err(|_| ApiError::unauthorized())
}

/// The request header asking for a lower priority class (SPEC FAIR-7);
/// the response carries the class used under the same name.
pub const PRIORITY_HEADER: &str = "x-tollgate-priority";

/// The flow of a call of `tenant` (SPEC FAIR-7): the tenant's own, in the
/// class `x-tollgate-priority` asks for when it is not above the tenant's
/// (a higher one is lowered to the tenant's). A value that is not a class
/// name is a client error (400).
pub fn flow(app: &AppState, tenant: usize, headers: &HeaderMap) -> Result<Flow, ApiError> {
    let own = app
        .tenant_slots
        .get(tenant)
        .map_or(Flow::DEFAULT, |t| t.flow);
    let Some(asked) = headers.get(PRIORITY_HEADER) else {
        return Ok(own);
    };
    let asked: Priority = asked
        .to_str()
        .ok()
        .and_then(|v| v.parse().ok())
        .ok_or_else(|| {
            ApiError::bad_request(
                "invalid_priority",
                format!("The {PRIORITY_HEADER} header must be interactive, standard or batch."),
            )
        })?;
    Ok(own.with_priority(asked.at_most(own.priority())))
}

/// Reads the request body (SPEC GW-7, GW-17): at most
/// `server.max_body_bytes` (413 past it, without reading on when
/// `content-length` already says so), and only until the earlier of
/// `server.body_read_timeout` after the head arrived and the request's
/// deadline (408 `request_timeout` then). Call it after authentication, so
/// an unauthenticated client never gets to upload.
///
/// # Cancel safety
///
/// Dropping the future stops reading; nothing is held.
pub async fn read_body(
    app: &AppState,
    headers: &HeaderMap,
    body: Body,
    arrived: Instant,
    deadline: Deadline,
) -> Result<Bytes, ApiError> {
    let limit = app.bounds.max_body_bytes;
    let announced = headers
        .get(http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok());
    if announced.is_some_and(|n| n > limit as u64) {
        return Err(ApiError::too_large(limit));
    }
    let by_timeout = arrived
        .checked_add(app.bounds.body_read_timeout)
        .unwrap_or(arrived);
    let (until, by_deadline) = match deadline.instant() {
        Some(d) if d < by_timeout => (d, true),
        _ => (by_timeout, false),
    };
    match tokio::time::timeout_at(until, collect(body, limit)).await {
        Ok(Ok(bytes)) => Ok(bytes),
        Ok(Err(Collect::TooLarge)) => Err(ApiError::too_large(limit)),
        Ok(Err(Collect::Failed(e))) => Err(ApiError::bad_request(
            "body_read_failed",
            format!("Failed to read the request body: {e}"),
        )),
        Err(_) if by_deadline => Err(ApiError::request_timeout(
            "The request's deadline ran out while its body was being received.",
        )),
        Err(_) => Err(ApiError::request_timeout(format!(
            "The request body did not arrive within {}.",
            humantime::format_duration(app.bounds.body_read_timeout)
        ))),
    }
}

enum Collect {
    TooLarge,
    Failed(axum::Error),
}

/// The whole body, refusing more than `limit` bytes.
async fn collect(body: Body, limit: usize) -> Result<Bytes, Collect> {
    let mut frames = body.into_data_stream();
    let mut first: Option<Bytes> = None;
    let mut rest = BytesMut::new();
    let mut len = 0usize;
    while let Some(frame) = frames.next().await {
        let frame = frame.map_err(Collect::Failed)?;
        len = len.saturating_add(frame.len());
        if len > limit {
            return Err(Collect::TooLarge);
        }
        match &first {
            None => first = Some(frame),
            Some(f) => {
                if rest.is_empty() {
                    rest.reserve(len);
                    rest.extend_from_slice(f);
                }
                rest.extend_from_slice(&frame);
            }
        }
    }
    Ok(if rest.is_empty() {
        first.unwrap_or_default()
    } else {
        rest.freeze()
    })
}

/// Parses a JSON body (400 when it is not valid JSON for the route).
pub fn parse<T: DeserializeOwned>(bytes: &Bytes) -> Result<T, ApiError> {
    serde_json::from_slice(bytes)
        .map_err(|e| ApiError::bad_request("invalid_body", format!("Invalid JSON body: {e}")))
}

/// The model the request names, if it serves `route` (SPEC GW-1, WIRE-4),
/// if `tenant` may call it: a model the tenant may not call is unknown
/// to it, so model names do not leak (GW-12).
pub fn model(
    app: &AppState,
    tenant: usize,
    name: &str,
    route: ApiRoute,
) -> Result<Arc<Model>, ApiError> {
    app.models
        .get(name)
        .filter(|m| m.serves(route) && allowed(app, tenant, &m.name))
        .cloned()
        .ok_or_else(|| ApiError::model_not_found(name))
}

/// Whether `tenant` may call `model` (SPEC GW-12).
pub fn allowed(app: &AppState, tenant: usize, model: &str) -> bool {
    app.tenant_slots
        .get(tenant)
        .is_some_and(|t| t.allows(model))
}

/// Admits the call of `model` for its tenant: the tenant's quota, its
/// pool permit (held until the call is terminal, SPEC POOL-1) and its
/// per-model quota (GW-12). A refusal here happens before any upstream
/// work and consumes nothing upstream.
pub async fn admit_tenant(
    app: &AppState,
    tenant: usize,
    model: &str,
    estimate: TokenEstimate,
    price: Option<ReservePrice>,
    deadline: Deadline,
) -> Result<TenantLeases, ApiError> {
    let Some(slot) = app.tenant_slots.get(tenant) else {
        return Err(ApiError::unauthorized());
    };
    slot.admit(model, estimate, price, deadline)
        .await
        .map_err(|(e, scope)| {
            let now = Instant::now();
            // A budget names itself (SPEC BUD-4).
            let err = if spend::is_budget(&e) {
                spend::budget_exceeded(&e, &slot.controller, scope, &slot.budget_name(scope), now)
            } else {
                ApiError::from_admission(&e, now)
            };
            app.metrics.rejected(err.reason());
            err
        })
}

/// Admits the call on `tenant`'s limits of `model`, a fallback of the
/// model it was admitted for, if it has some (SPEC GW-10, GW-12): `None`
/// when it has none; a refusal names its scope.
pub async fn admit_model(
    app: &AppState,
    tenant: usize,
    model: &str,
    estimate: TokenEstimate,
    price: Option<ReservePrice>,
    deadline: Deadline,
) -> Result<Option<tollgate::Lease>, (tollgate::AdmissionError, tollgate::ScopeId)> {
    let Some(slot) = app.tenant_slots.get(tenant) else {
        return Ok(None);
    };
    slot.admit_model(model, estimate, price, deadline).await
}

/// The answer to a call of `tenant` that `scope`, one of its scopes,
/// refused with `e` after its admission (a fallback's per-model limits, a
/// budget that cannot take a retry): a budget names itself (SPEC BUD-4).
pub fn tenant_refusal(
    app: &AppState,
    tenant: usize,
    e: &tollgate::AdmissionError,
    scope: tollgate::ScopeId,
    now: Instant,
) -> ApiError {
    let err = match app.tenant_slots.get(tenant) {
        Some(slot) if spend::is_budget(e) => {
            spend::budget_exceeded(e, &slot.controller, scope, &slot.budget_name(scope), now)
        }
        _ => ApiError::from_admission(e, now),
    };
    app.metrics.rejected(err.reason());
    err
}

/// The models to try, the requested one first, then its fallbacks that
/// serve `route` and `tenant` may call (once each, in order; SPEC GW-10,
/// GW-12, WIRE-4).
pub fn chain(
    app: &AppState,
    tenant: usize,
    first: &Arc<Model>,
    route: ApiRoute,
) -> Vec<Arc<Model>> {
    let mut out = vec![Arc::clone(first)];
    for name in &first.fallbacks {
        if let Some(m) = app.models.get(&**name)
            && m.serves(route)
            && allowed(app, tenant, name)
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

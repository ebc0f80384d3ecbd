//! The status page (SPEC OBS-6): `GET /status` (HTML) and `GET
//! /status/json` (what the page polls).
//!
//! On the main listener both need the admin key, as `Authorization:
//! Bearer <key>` or as the password of HTTP Basic (any user name): a
//! browser shows its own login prompt on the 401's `WWW-Authenticate`
//! and then sends the key with the page's requests, so it never appears
//! in a URL, the page or its storage. 404 when no admin key is
//! configured. On `server.metrics_listen` they are served without a key,
//! like `/metrics` there.

use std::sync::Arc;

use axum::extract::{RawQuery, State};
use axum::response::{IntoResponse, Response};
use http::{HeaderMap, HeaderValue, StatusCode, header};

use super::admin::admin_with;
use crate::error::ApiError;
use crate::live::Live;
use crate::status;

/// What the browser may load for the page: nothing from elsewhere.
const PAGE_POLICY: &str = "default-src 'none'; style-src 'unsafe-inline'; \
    script-src 'unsafe-inline'; connect-src 'self'; img-src data:; base-uri 'none'; \
    form-action 'none'; frame-ancestors 'none'";

/// Checks the admin key: `None` when it is right, else the refusal (a 401
/// asks a browser for it, HTTP Basic).
fn refusal(live: &Live, headers: &HeaderMap) -> Option<Response> {
    admin_with(&live.current(), headers, true).err().map(|e| {
        let unauthorized = e.status == StatusCode::UNAUTHORIZED;
        let mut response = e.into_response();
        if unauthorized {
            response.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                HeaderValue::from_static("Basic realm=\"tollgate status\", charset=\"UTF-8\""),
            );
        }
        response
    })
}

/// `GET /status` with the admin key.
pub async fn page(State(live): State<Arc<Live>>, headers: HeaderMap) -> Response {
    match refusal(&live, &headers) {
        None => page_open().await,
        Some(refused) => refused,
    }
}

/// `GET /status/json` with the admin key.
pub async fn json(State(live): State<Arc<Live>>, headers: HeaderMap, query: RawQuery) -> Response {
    match refusal(&live, &headers) {
        None => json_open(State(live), query).await,
        Some(refused) => refused,
    }
}

/// `GET /status` on the metrics listener.
pub async fn page_open() -> Response {
    (
        [
            (header::CONTENT_TYPE, "text/html; charset=utf-8"),
            (header::CACHE_CONTROL, "no-store"),
            (header::CONTENT_SECURITY_POLICY, PAGE_POLICY),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        ],
        status::page(),
    )
        .into_response()
}

/// `GET /status/json` on the metrics listener. `?since=<ms>` keeps only
/// the history points later than that instant (milliseconds since the
/// Unix epoch, as `t_ms` gives them).
pub async fn json_open(State(live): State<Arc<Live>>, RawQuery(query): RawQuery) -> Response {
    let mut since = 0;
    for (k, v) in form_urlencoded::parse(query.as_deref().unwrap_or_default().as_bytes()) {
        if k == "since" {
            match v.parse::<u64>() {
                Ok(ms) => since = ms,
                Err(_) => {
                    return ApiError::bad_request(
                        "invalid_since",
                        "since must be a time in milliseconds since the Unix epoch",
                    )
                    .into_response();
                }
            }
        }
    }
    let body = status::report(&live.current(), live.history(), since);
    ([(header::CACHE_CONTROL, "no-store")], axum::Json(body)).into_response()
}

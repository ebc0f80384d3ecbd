//! Azure OpenAI's shape of the OpenAI routes: the deployment in the path,
//! the `api-version` query parameter, the `api-key` header, and Azure's
//! error bodies `{"error":{"code":"<status>","message":...}}` for 401, 404
//! and 429. Request and success bodies are OpenAI's (the deployment name
//! stands for the model).

use axum::Json;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::json;

use crate::duration::ceil_secs;
use crate::headers::add_rejection_headers;
use crate::referee::{RejectCause, Rejection};
use crate::state::Shared;

/// The deployment and API version of one Azure request.
#[derive(Debug, Clone)]
pub(crate) struct AzureTarget {
    pub(crate) deployment: String,
    pub(crate) api_version: String,
}

/// Azure's message for a refused key.
const ACCESS_DENIED: &str = "Access denied due to invalid subscription key or wrong API endpoint. \
     Make sure to provide a valid key for an active subscription and use a correct regional API \
     endpoint for your resource.";

/// An Azure-format error: `{"error":{"code":"<status>","message":...}}`.
fn error(status: StatusCode, message: &str) -> Response {
    let code = status.as_u16().to_string();
    (
        status,
        Json(json!({"error": {"code": code, "message": message}})),
    )
        .into_response()
}

/// The non-empty `api-version` value of a raw query string, if any (taken
/// as written: API versions need no percent-decoding).
pub(crate) fn api_version(query: Option<&str>) -> Option<String> {
    query?
        .split('&')
        .filter_map(|pair| pair.split_once('='))
        .find(|(key, value)| *key == "api-version" && !value.is_empty())
        .map(|(_, value)| value.to_owned())
}

/// A request refused before it reaches the OpenAI route's work.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub(crate) enum AzureRefusal {
    /// No `api-version` query parameter: Azure's 404 "Resource not found".
    #[error("Resource not found")]
    MissingApiVersion,
    /// Missing or wrong `api-key`, or an `Authorization` header: 401.
    #[error("{ACCESS_DENIED}")]
    AccessDenied,
}

impl IntoResponse for AzureRefusal {
    fn into_response(self) -> Response {
        let status = match self {
            AzureRefusal::MissingApiVersion => StatusCode::NOT_FOUND,
            AzureRefusal::AccessDenied => StatusCode::UNAUTHORIZED,
        };
        error(status, &self.to_string())
    }
}

/// When an Azure key is configured: the request must carry it in `api-key`
/// and must not carry `Authorization` (a bearer key sent instead of, or
/// besides, the Azure key is refused: it would be a client's key leaking
/// upstream). Counts the 401.
pub(crate) fn authorize(shared: &Shared, headers: &HeaderMap) -> Result<(), AzureRefusal> {
    let Some(key) = &shared.config.azure_key else {
        return Ok(());
    };
    let given = headers.get("api-key").and_then(|v| v.to_str().ok());
    if given == Some(key.as_str()) && !headers.contains_key(header::AUTHORIZATION) {
        return Ok(());
    }
    shared.count(|c| c.unauthorized += 1);
    Err(AzureRefusal::AccessDenied)
}

/// Azure's 429: its error body naming the operation and API version, with
/// "Please retry after N seconds." when the wait is known, plus the same
/// headers as the OpenAI route (`retry-after`, `retry-after-ms`,
/// `x-ratelimit-*`, `x-sim-reject-cause`).
pub(crate) fn rejection_response(
    rejection: &Rejection,
    target: &AzureTarget,
    operation: &str,
    seq: u64,
) -> Response {
    let limit = match rejection.cause {
        RejectCause::Requests => "call rate limit",
        RejectCause::Tokens | RejectCause::TooLarge => "token rate limit",
        RejectCause::Concurrency => "concurrent request limit",
    };
    let advice = match (rejection.cause, rejection.retry_after) {
        (RejectCause::TooLarge, _) => {
            " The request is larger than the whole limit and can never fit.".to_owned()
        }
        (_, Some(wait)) => format!(" Please retry after {} seconds.", ceil_secs(wait)),
        (_, None) => " Please retry later.".to_owned(),
    };
    let message = format!(
        "Requests to the {operation} Operation under Azure OpenAI API version {} have exceeded \
         {limit} of your current pricing tier (deployment {}, simulated).{advice}",
        target.api_version, target.deployment
    );
    let mut response = error(StatusCode::TOO_MANY_REQUESTS, &message);
    add_rejection_headers(response.headers_mut(), rejection, seq);
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn api_version_is_found_among_other_parameters() {
        assert_eq!(
            api_version(Some("api-version=2024-10-21")).as_deref(),
            Some("2024-10-21")
        );
        assert_eq!(
            api_version(Some("x=1&api-version=2025-01-01-preview&y")).as_deref(),
            Some("2025-01-01-preview")
        );
        for missing in [None, Some(""), Some("api-version="), Some("apiversion=1")] {
            assert_eq!(api_version(missing), None, "{missing:?}");
        }
    }
}

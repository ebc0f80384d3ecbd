//! The OpenAI error body: `{"error": {"message", "type", "param", "code"}}`.

use std::fmt;

use serde::{Deserialize, Deserializer, Serialize};
use serde_json::{Map, Value};

/// An OpenAI-format error response body.
///
/// The HTTP status is not part of the body; the gateway picks it (SPEC GW-4)
/// and uses these constructors for the body.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ErrorResponse {
    /// The error.
    pub error: ErrorBody,
    /// Every other top-level field, kept verbatim.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

/// The inner `error` object.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ErrorBody {
    /// Human-readable message.
    #[serde(default)]
    pub message: String,
    /// Error type (`invalid_request_error`, `rate_limit_error`, …).
    #[serde(default, rename = "type")]
    pub kind: String,
    /// The request parameter at fault; written as `null` when `None`.
    #[serde(default, deserialize_with = "lenient_string")]
    pub param: Option<String>,
    /// Machine-readable code; written as `null` when `None`. A numeric code
    /// from a provider is read as its decimal string.
    #[serde(default, deserialize_with = "lenient_string")]
    pub code: Option<String>,
    /// Every other field, kept verbatim.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

/// Reads a string, or a number as its decimal text; anything else is `None`.
fn lenient_string<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Option<String>, D::Error> {
    Ok(match Value::deserialize(deserializer)? {
        Value::String(s) => Some(s),
        Value::Number(n) => Some(n.to_string()),
        _ => None,
    })
}

impl ErrorResponse {
    /// `invalid_request_error`: malformed body, bad parameter (HTTP 400/404).
    pub const INVALID_REQUEST: &'static str = "invalid_request_error";
    /// `authentication_error` (HTTP 401).
    pub const AUTHENTICATION: &'static str = "authentication_error";
    /// `rate_limit_error` (HTTP 429).
    pub const RATE_LIMIT: &'static str = "rate_limit_error";
    /// `server_error` (HTTP 5xx).
    pub const SERVER: &'static str = "server_error";
    /// `timeout_error` (HTTP 504).
    pub const TIMEOUT: &'static str = "timeout_error";

    /// An error with a type and a message, no param, no code.
    pub fn new(kind: impl Into<String>, message: impl Into<String>) -> Self {
        ErrorResponse {
            error: ErrorBody {
                message: message.into(),
                kind: kind.into(),
                param: None,
                code: None,
                extra: Map::new(),
            },
            extra: Map::new(),
        }
    }

    /// Sets `code`.
    pub fn with_code(mut self, code: impl Into<String>) -> Self {
        self.error.code = Some(code.into());
        self
    }

    /// Sets `param`.
    pub fn with_param(mut self, param: impl Into<String>) -> Self {
        self.error.param = Some(param.into());
        self
    }

    /// `invalid_request_error` with a message.
    pub fn invalid_request(message: impl Into<String>) -> Self {
        Self::new(Self::INVALID_REQUEST, message)
    }

    /// The 401 body for a missing or unknown API key: type
    /// `authentication_error`, code `invalid_api_key`.
    pub fn invalid_api_key() -> Self {
        Self::new(Self::AUTHENTICATION, "Missing or incorrect API key.")
            .with_code("invalid_api_key")
    }

    /// The 404 body for an unknown model: code `model_not_found`, param
    /// `model` (SPEC GW-1).
    pub fn model_not_found(model: &str) -> Self {
        Self::invalid_request(format!("The model `{model}` does not exist."))
            .with_param("model")
            .with_code("model_not_found")
    }

    /// `rate_limit_error` with a code, e.g. `admission_rejected` or
    /// `admission_wait_deadline_exceeded` (SPEC GW-4).
    pub fn rate_limited(code: impl Into<String>, message: impl Into<String>) -> Self {
        Self::new(Self::RATE_LIMIT, message).with_code(code)
    }

    /// `server_error` with a code, e.g. `circuit_open` or `upstream_error`.
    pub fn server_error(code: impl Into<String>, message: impl Into<String>) -> Self {
        Self::new(Self::SERVER, message).with_code(code)
    }

    /// `timeout_error` with code `deadline_exceeded` (SPEC GW-4, 504).
    pub fn deadline_exceeded(message: impl Into<String>) -> Self {
        Self::new(Self::TIMEOUT, message).with_code("deadline_exceeded")
    }
}

impl fmt::Display for ErrorResponse {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.error.kind, self.error.message)?;
        if let Some(code) = &self.error.code {
            write!(f, " ({code})")?;
        }
        Ok(())
    }
}

impl std::error::Error for ErrorResponse {}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    // proves: GW-1
    #[test]
    fn constructors_write_the_openai_shape() {
        assert_eq!(
            serde_json::to_value(ErrorResponse::model_not_found("gpt-x")).expect("serialize"),
            json!({"error": {"message": "The model `gpt-x` does not exist.",
                             "type": "invalid_request_error", "param": "model",
                             "code": "model_not_found"}})
        );
        assert_eq!(
            serde_json::to_value(ErrorResponse::rate_limited(
                "admission_rejected",
                "queue full"
            ))
            .expect("serialize"),
            json!({"error": {"message": "queue full", "type": "rate_limit_error",
                             "param": null, "code": "admission_rejected"}})
        );
        assert_eq!(
            ErrorResponse::invalid_api_key().error.code.as_deref(),
            Some("invalid_api_key")
        );
        assert_eq!(
            ErrorResponse::deadline_exceeded("late").error.kind,
            "timeout_error"
        );
        assert_eq!(
            ErrorResponse::server_error("circuit_open", "down")
                .error
                .kind,
            "server_error"
        );
        assert_eq!(
            ErrorResponse::invalid_request("bad").to_string(),
            "invalid_request_error: bad"
        );
        assert_eq!(
            ErrorResponse::rate_limited("c", "m").to_string(),
            "rate_limit_error: m (c)"
        );
    }

    #[test]
    fn provider_errors_parse_leniently_and_keep_unknown_fields() {
        let raw = json!({"error": {"message": "Rate limit reached", "type": "tokens",
                                   "param": null, "code": "rate_limit_exceeded", "x": 1},
                         "request_id": "req_1"});
        let e: ErrorResponse = serde_json::from_value(raw.clone()).expect("error");
        assert_eq!(e.error.code.as_deref(), Some("rate_limit_exceeded"));
        assert_eq!(serde_json::to_value(&e).expect("serialize"), raw);

        let e: ErrorResponse =
            serde_json::from_value(json!({"error": {"code": 429, "message": "slow down"}}))
                .expect("error");
        assert_eq!(e.error.code.as_deref(), Some("429"));
        assert_eq!(e.error.kind, "");
        assert!(serde_json::from_value::<ErrorResponse>(json!({"message": "x"})).is_err());
    }
}

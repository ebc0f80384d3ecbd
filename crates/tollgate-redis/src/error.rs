//! Errors of building a backend, and how Redis failures become
//! [`StoreError`]s.

use std::time::Duration;

use tollgate::quota::StoreError;

/// A Redis backend could not be built.
#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    /// The URL is not a Redis URL.
    #[error("invalid redis url: {0}")]
    Url(String),
    /// The backend needs a tokio runtime (its reconnect and subscriber
    /// tasks run on it).
    #[error("a redis backend must be built inside a tokio runtime")]
    NoRuntime,
    /// The connection settings were refused.
    #[error("redis connection settings: {0}")]
    Connection(String),
    /// Several URLs without `cluster`, or a cluster without any.
    #[error("redis deployment: {0}")]
    Deployment(String),
    /// The TLS settings were refused (the CA file cannot be read or holds
    /// no certificate).
    #[error("redis TLS settings: {0}")]
    Tls(String),
    /// The key prefix is empty or holds `:`, `{` or `}`: keys are
    /// `{prefix:scope}:…`, so a prefix with `:` could share keys with
    /// another prefix and scope (`a` + `b:c` and `a:b` + `c`).
    #[error("invalid key prefix {0:?}: it must be non-empty, without `:`, `{{` or `}}`")]
    Prefix(String),
}

/// A Redis error as the engine sees it: the store did not answer usefully.
pub(crate) fn unavailable(e: &redis::RedisError) -> StoreError {
    StoreError::Unavailable(e.to_string())
}

/// A reply that is not what the script returns (never a panic).
pub(crate) fn malformed(what: &str) -> StoreError {
    StoreError::Unavailable(format!("malformed reply from the quota script: {what}"))
}

/// Runs `fut` within `budget`: a Redis failure or the budget running out
/// is a [`StoreError`], never a wait beyond it (SPEC DQ-5).
///
/// A zero budget fails at once without polling `fut`: `timeout` polls the
/// operation before its timer, and an elapsed timer fires only at the
/// timer driver's next tick, so the command was sent and could run in
/// Redis, or even answer (measured: a zero-budget reservation granted).
pub(crate) async fn bounded<T>(
    budget: Duration,
    fut: impl Future<Output = redis::RedisResult<T>>,
) -> Result<T, StoreError> {
    if budget.is_zero() {
        return Err(StoreError::Timeout(budget));
    }
    match tokio::time::timeout(budget, fut).await {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(unavailable(&e)),
        Err(_) => Err(StoreError::Timeout(budget)),
    }
}

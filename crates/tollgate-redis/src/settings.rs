//! What a [`RedisBackend`](crate::RedisBackend) is built from.

use std::sync::Arc;
use std::time::Duration;

use tollgate::clock::{SharedClock, TokioClock};
use tollgate::quota::Unavailable;

/// The default key prefix.
pub const DEFAULT_PREFIX: &str = "tollgate";
/// The default per-operation timeout (SPEC DQ-5).
pub const DEFAULT_TIMEOUT: Duration = Duration::from_millis(50);

/// Settings of a Redis quota store (SPEC DQ-1, DQ-3, DQ-5).
///
/// ```
/// use std::time::Duration;
/// use tollgate::quota::Unavailable;
/// use tollgate_redis::RedisSettings;
/// let settings = RedisSettings::new("redis://127.0.0.1:6379")
///     .prefix("prod")
///     .timeout(Duration::from_millis(30))
///     .on_unavailable(Unavailable::FailOpenLocal { replicas: 3 });
/// assert_eq!(settings.prefix_str(), "prod");
/// ```
#[derive(Debug, Clone)]
pub struct RedisSettings {
    pub(crate) url: String,
    pub(crate) prefix: String,
    pub(crate) timeout: Duration,
    pub(crate) on_unavailable: Unavailable,
    pub(crate) clock: SharedClock,
}

impl RedisSettings {
    /// Settings for the server at `url` (`redis://host:port/db`), with the
    /// default prefix (`tollgate`), timeout (50 ms) and `fail_closed`.
    pub fn new(url: impl Into<String>) -> Self {
        RedisSettings {
            url: url.into(),
            prefix: DEFAULT_PREFIX.to_owned(),
            timeout: DEFAULT_TIMEOUT,
            on_unavailable: Unavailable::default(),
            clock: Arc::new(TokioClock),
        }
    }

    /// The prefix of every key and channel (deployments sharing one Redis
    /// keep apart by prefix).
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// The most one operation may take before the call's deadline clips it.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// What shared scopes do while Redis is unavailable (SPEC DQ-3).
    pub fn on_unavailable(mut self, on_unavailable: Unavailable) -> Self {
        self.on_unavailable = on_unavailable;
        self
    }

    /// The local clock that stamps answers (default: tokio's). Only the
    /// local instants of what the store returns come from it; every
    /// decision uses Redis `TIME` (SPEC DQ-5).
    pub fn clock(mut self, clock: SharedClock) -> Self {
        self.clock = clock;
        self
    }

    /// The server's URL.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The key prefix.
    pub fn prefix_str(&self) -> &str {
        &self.prefix
    }
}

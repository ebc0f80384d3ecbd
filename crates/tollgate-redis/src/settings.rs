//! What a [`RedisBackend`](crate::RedisBackend) is built from.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tollgate::clock::{SharedClock, TokioClock};
use tollgate::quota::Unavailable;

/// The default key prefix.
pub const DEFAULT_PREFIX: &str = "tollgate";
/// The default per-operation timeout (SPEC DQ-5).
pub const DEFAULT_TIMEOUT: Duration = Duration::from_millis(50);

/// Settings of a Redis quota store (SPEC DQ-1, DQ-3, DQ-5, DQ-7).
///
/// The deployment (SPEC DQ-7) follows from the URL and two settings: one
/// `redis://` (or `rediss://`, TLS) URL is a single node; with
/// [`cluster`](Self::cluster) the URL is one or more seed nodes of a Redis
/// Cluster, comma-separated; [`ca_file`](Self::ca_file) names the PEM file
/// of the certificate authority a `rediss://` server's certificate is
/// checked against (else the system's roots).
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
    pub(crate) cluster: bool,
    pub(crate) ca_file: Option<PathBuf>,
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
            cluster: false,
            ca_file: None,
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

    /// Whether the URL names seed nodes of a Redis Cluster (SPEC DQ-7):
    /// keys are then routed by slot, MOVED and ASK redirections followed,
    /// and scripts loaded on every node. Default: a single node.
    pub fn cluster(mut self, cluster: bool) -> Self {
        self.cluster = cluster;
        self
    }

    /// The PEM file of the certificate authorities that a `rediss://`
    /// server's certificate must chain to (default: the system's roots).
    pub fn ca_file(mut self, path: impl Into<PathBuf>) -> Self {
        self.ca_file = Some(path.into());
        self
    }

    /// The server's URL (a cluster's seed URLs, comma-separated).
    pub fn url(&self) -> &str {
        &self.url
    }

    /// Each URL of [`url`](Self::url): one for a single node, the seeds of
    /// a cluster.
    pub fn urls(&self) -> impl Iterator<Item = &str> {
        self.url.split(',').map(str::trim).filter(|u| !u.is_empty())
    }

    /// Whether the URL names a cluster's seeds.
    pub fn is_cluster(&self) -> bool {
        self.cluster
    }

    /// The certificate authorities' PEM file, if set.
    pub fn ca_file_path(&self) -> Option<&Path> {
        self.ca_file.as_deref()
    }

    /// The key prefix.
    pub fn prefix_str(&self) -> &str {
        &self.prefix
    }
}

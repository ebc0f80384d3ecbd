//! [`RedisBackend`]: one multiplexed connection, reconnected in the
//! background, shared by every scope.

use std::sync::Arc;
use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use tollgate::config::ScopeConfig;
use tollgate::quota::{RemoteBackend, RemoteQuota, StoreError, Unavailable};

use crate::changes::{Notices, Subscriber};
use crate::error::{BuildError, bounded};
use crate::quota::RedisQuota;
use crate::scripts::Scripts;
use crate::settings::RedisSettings;

/// How long one connection attempt may take (in the background: an
/// operation never waits longer than its own budget).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);

/// What every store of a backend shares.
#[derive(Debug)]
pub(crate) struct Shared {
    pub(crate) settings: RedisSettings,
    pub(crate) conn: ConnectionManager,
    pub(crate) scripts: Arc<Scripts>,
    notices: Arc<Notices>,
    _subscriber: Subscriber,
}

/// A quota store on Redis, shared by every process pointed at the same
/// server and prefix (SPEC DQ-1).
///
/// Built without a round trip: the connection is made on first use and
/// remade in the background whenever it breaks, so a backend built while
/// Redis is down starts answering by itself once Redis is up. Meanwhile
/// every operation fails with a [`StoreError`] within its budget.
#[derive(Debug, Clone)]
pub struct RedisBackend {
    shared: Arc<Shared>,
}

impl RedisBackend {
    /// A backend for `settings`. Must be called inside a tokio runtime
    /// (the reconnect and subscriber tasks run on it).
    pub fn new(settings: RedisSettings) -> Result<Self, BuildError> {
        if tokio::runtime::Handle::try_current().is_err() {
            return Err(BuildError::NoRuntime);
        }
        let prefix = &settings.prefix;
        if prefix.is_empty() || prefix.contains([':', '{', '}']) {
            return Err(BuildError::Prefix(prefix.clone()));
        }
        let client = redis::Client::open(settings.url.as_str())
            .map_err(|e| BuildError::Url(e.to_string()))?;
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(CONNECT_TIMEOUT))
            // Each operation is bounded by its own budget (the configured
            // timeout, clipped by the call's deadline); the client's own
            // 500 ms default would cut a longer one short.
            .set_response_timeout(None)
            .set_number_of_retries(2)
            .set_min_delay(Duration::from_millis(10))
            .set_max_delay(Duration::from_millis(500));
        let conn = ConnectionManager::new_lazy_with_config(client.clone(), config)
            .map_err(|e| BuildError::Connection(e.to_string()))?;
        let notices = Arc::new(Notices::default());
        let scripts = Arc::new(Scripts::new());
        let subscriber = Subscriber::spawn(
            client,
            &settings.prefix,
            notices.clone(),
            Arc::clone(&scripts),
        );
        Ok(RedisBackend {
            shared: Arc::new(Shared {
                settings,
                conn,
                scripts,
                notices,
                _subscriber: subscriber,
            }),
        })
    }

    /// The shared store of `scope`, typed (what [`RemoteBackend::open`]
    /// returns erased).
    pub fn open_scope(&self, scope: &ScopeConfig) -> RedisQuota {
        let notify = self.shared.notices.register(scope.name());
        RedisQuota::new(self.shared.clone(), scope, notify)
    }

    /// One PING within `budget`: whether Redis answers now (for readiness
    /// checks while a scope is in its fallback mode).
    pub async fn ping(&self, budget: Duration) -> Result<(), StoreError> {
        let mut conn = self.shared.conn.clone();
        bounded(budget, redis::cmd("PING").query_async::<()>(&mut conn)).await
    }

    /// The settings the backend was built from.
    pub fn settings(&self) -> &RedisSettings {
        &self.shared.settings
    }
}

impl RemoteBackend for RedisBackend {
    fn open(&self, scope: &ScopeConfig) -> Arc<dyn RemoteQuota> {
        Arc::new(self.open_scope(scope))
    }

    fn timeout(&self) -> Duration {
        self.shared.settings.timeout
    }

    fn on_unavailable(&self) -> Unavailable {
        self.shared.settings.on_unavailable
    }

    fn name(&self) -> &'static str {
        "redis"
    }
}

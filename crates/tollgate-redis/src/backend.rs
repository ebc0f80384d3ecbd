//! [`RedisBackend`]: one connection (to a single node or a cluster, see
//! `connect.rs`), reconnected in the background, shared by every scope.

use std::sync::Arc;
use std::time::Duration;

use tollgate::config::ScopeConfig;
use tollgate::quota::{RemoteBackend, RemoteQuota, StoreError, Unavailable};

use crate::carry::Opened;
use crate::changes::{Notices, Subscriber};
use crate::connect::{CONNECT_TIMEOUT, Conn, connect};
use crate::error::{BuildError, bounded};
use crate::quota::RedisQuota;
use crate::scripts::Scripts;
use crate::settings::RedisSettings;

/// What every store of a backend shares.
#[derive(Debug)]
pub(crate) struct Shared {
    pub(crate) settings: RedisSettings,
    pub(crate) conn: Conn,
    pub(crate) scripts: Arc<Scripts>,
    /// The limits each scope was last opened with (`carry.rs`).
    pub(crate) opened: Opened,
    notices: Arc<Notices>,
    _subscriber: Subscriber,
}

/// A quota store on Redis, shared by every process pointed at the same
/// server (or cluster) and prefix (SPEC DQ-1, DQ-7).
///
/// Built without a round trip: the connection is made in the background
/// at once and remade whenever it breaks, so a backend built while
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
        let connections = connect(&settings)?;
        // Connects now, in the background, rather than on the first call
        // (whose budget is a few milliseconds).
        let mut warm = connections.conn.clone();
        tokio::spawn(async move {
            let ping = redis::cmd("PING");
            let _ = tokio::time::timeout(CONNECT_TIMEOUT, ping.query_async::<()>(&mut warm)).await;
        });
        let notices = Arc::new(Notices::default());
        let scripts = Arc::new(Scripts::new());
        let subscriber = Subscriber::spawn(
            connections.clients,
            connections.conn.clone(),
            &settings.prefix,
            notices.clone(),
            Arc::clone(&scripts),
        );
        Ok(RedisBackend {
            shared: Arc::new(Shared {
                settings,
                conn: connections.conn,
                scripts,
                opened: Opened::default(),
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

    /// One PING within `budget` (to every primary of a cluster): whether
    /// Redis answers now (for readiness checks while a scope is in its
    /// fallback mode).
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

//! Notices that quota came back, across processes (SPEC DQ-4).
//!
//! The refund, release and reconcile scripts PUBLISH on the scope's
//! channel when they give quota back. One subscriber task per backend
//! listens on every channel of its prefix and wakes the waiters of the
//! scope (`Notify::notify_waiters`), which then retry before the instant
//! they were told.
//!
//! Notices are a shortcut, never needed for correctness: a waiter always
//! sleeps until the exact instant the reserve script returned, so a lost
//! notice (Redis down, the subscriber reconnecting, a waiter that was not
//! yet waiting) only means that waiter wakes at that instant. A waiter
//! whose wait had no instant (`at: None`, only a pending reservation's
//! lease or refund frees room) is woken by that lease's process or by its
//! own timer/deadline. After the subscriber (re)connects it wakes every
//! scope once, as notices may have been lost meanwhile.
//!
//! The same task loads every script into the server (every node of a
//! cluster) whenever it (re)connects (a restarted Redis has forgotten
//! them; see [`Scripts::load_all`]).
//!
//! In a Redis Cluster every PUBLISH reaches the subscribers of every node,
//! so the task listens on one node, the next seed when that one fails.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use parking_lot::Mutex;
use tokio::sync::Notify;
use tokio::task::JoinHandle;

use crate::connect::Conn;
use crate::keys::{channel_pattern, channel_prefix};
use crate::scripts::Scripts;

/// How long loading the scripts and subscribing may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
const MIN_BACKOFF: Duration = Duration::from_millis(50);
const MAX_BACKOFF: Duration = Duration::from_secs(1);

/// The waiters' `Notify` of every scope opened on a backend.
#[derive(Debug, Default)]
pub(crate) struct Notices {
    scopes: Mutex<HashMap<String, Arc<Notify>>>,
}

impl Notices {
    /// The `Notify` of `scope`, shared by every store of it.
    pub(crate) fn register(&self, scope: &str) -> Arc<Notify> {
        self.scopes
            .lock()
            .entry(scope.to_owned())
            .or_default()
            .clone()
    }

    fn notify(&self, scope: &str) {
        if let Some(n) = self.scopes.lock().get(scope) {
            n.notify_waiters();
        }
    }

    fn notify_all(&self) {
        for n in self.scopes.lock().values() {
            n.notify_waiters();
        }
    }
}

/// The subscriber task; aborted when dropped.
#[derive(Debug)]
pub(crate) struct Subscriber(JoinHandle<()>);

impl Drop for Subscriber {
    fn drop(&mut self) {
        self.0.abort();
    }
}

impl Subscriber {
    /// Listens through `clients` (one at a time, the next when one fails)
    /// and loads the scripts through `conn` for a cluster.
    pub(crate) fn spawn(
        clients: Vec<redis::Client>,
        conn: Conn,
        prefix: &str,
        notices: Arc<Notices>,
        scripts: Arc<Scripts>,
    ) -> Self {
        let pattern = channel_pattern(prefix);
        let head = channel_prefix(prefix);
        Subscriber(tokio::spawn(run(
            clients, conn, pattern, head, notices, scripts,
        )))
    }
}

/// Loads every script into the server behind `client`, or every node of
/// the cluster behind `conn`.
async fn load_scripts(
    client: &redis::Client,
    conn: &Conn,
    scripts: &Scripts,
) -> redis::RedisResult<()> {
    match conn {
        Conn::Single(_) => {
            let mut fresh = client.get_multiplexed_async_connection().await?;
            scripts.load_all(&mut fresh).await
        }
        Conn::Cluster(_) => scripts.load_all(&mut conn.clone()).await,
    }
}

/// Loads the scripts, subscribes, dispatches notices until the connection
/// ends, and reconnects (to the next client) with a capped backoff,
/// forever.
async fn run(
    clients: Vec<redis::Client>,
    conn: Conn,
    pattern: String,
    head: String,
    notices: Arc<Notices>,
    scripts: Arc<Scripts>,
) {
    let mut backoff = MIN_BACKOFF;
    for client in clients.iter().cycle() {
        let connect = async {
            // Not fatal (a server whose ACL refuses SCRIPT LOAD still runs
            // EVALSHA, which loads a script itself while its caller waits).
            if let Err(e) = load_scripts(client, &conn, &scripts).await {
                tracing::warn!(error = %e, "quota scripts not preloaded");
            }
            let mut pubsub = client.get_async_pubsub().await?;
            pubsub.psubscribe(&pattern).await?;
            Ok::<_, redis::RedisError>(pubsub)
        };
        if let Ok(Ok(pubsub)) = tokio::time::timeout(CONNECT_TIMEOUT, connect).await {
            backoff = MIN_BACKOFF;
            notices.notify_all();
            let mut messages = pubsub.into_on_message();
            while let Some(msg) = messages.next().await {
                if let Some(scope) = msg.get_channel_name().strip_prefix(head.as_str()) {
                    notices.notify(scope);
                }
            }
            tracing::debug!("quota change subscriber disconnected; reconnecting");
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(MAX_BACKOFF);
    }
}

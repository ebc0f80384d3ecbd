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
//! The same task loads every script into the server whenever it
//! (re)connects (a restarted Redis has forgotten them; see
//! [`Scripts::load_all`]).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use parking_lot::Mutex;
use tokio::sync::Notify;
use tokio::task::JoinHandle;

use crate::keys::{channel_pattern, channel_prefix};
use crate::scripts::Scripts;

const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);
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
    pub(crate) fn spawn(
        client: redis::Client,
        prefix: &str,
        notices: Arc<Notices>,
        scripts: Arc<Scripts>,
    ) -> Self {
        let pattern = channel_pattern(prefix);
        let head = channel_prefix(prefix);
        Subscriber(tokio::spawn(run(client, pattern, head, notices, scripts)))
    }
}

/// Loads the scripts, subscribes, dispatches notices until the connection
/// ends, and reconnects with a capped backoff, forever.
async fn run(
    client: redis::Client,
    pattern: String,
    head: String,
    notices: Arc<Notices>,
    scripts: Arc<Scripts>,
) {
    let mut backoff = MIN_BACKOFF;
    loop {
        let connect = async {
            let mut conn = client.get_multiplexed_async_connection().await?;
            // Not fatal (a server whose ACL refuses SCRIPT LOAD still runs
            // EVALSHA, which loads a script itself while its caller waits).
            if let Err(e) = scripts.load_all(&mut conn).await {
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

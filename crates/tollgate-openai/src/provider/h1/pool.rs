//! Idle HTTP/1.1 connections of the driven path, per upstream host.
//!
//! At most `max_idle_per_host` stay per host. Connections past the idle
//! timeout are dropped when their host is next used (taken or given
//! back), and by a reaper task: while the pool holds idle connections, it
//! wakes every half idle timeout, drops the expired ones and those the
//! server closed, and ends when the pool is empty or dropped (it holds the
//! pool only weakly). So an upstream that is no longer called keeps no
//! socket open past the timeout (plus half of it).

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::task::{Context, Waker};
use std::time::Duration;

use bytes::Bytes;
use http::uri::{Authority, Scheme};
use http_body_util::Full;
use hyper::client::conn::http1::{Connection, SendRequest};
use hyper_rustls::MaybeHttpsStream;
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;
use tokio::time::Instant;

/// The transport of a connection: TCP, or TLS over TCP (possibly through a
/// proxy's tunnel).
pub(super) type Io = MaybeHttpsStream<TokioIo<TcpStream>>;

/// Which connections may serve a request: same scheme and authority, and
/// the same thread shard (see [`pin_to_thread`](crate::provider::pin_to_thread)).
pub(super) type Key = (Scheme, Authority, usize);

/// Idle connections by key. Keys are the configured upstream hosts, not
/// input, so the map uses a fast hash (it is looked up twice per request).
type IdleMap = HashMap<Key, Vec<Idle>, rustc_hash::FxBuildHasher>;

/// One HTTP/1.1 connection: the handle that sends requests and the state
/// machine that does its I/O, polled by the connection's current user.
/// Boxed: the state is large (hyper's buffers, and a TLS session inline),
/// and a connection changes hands several times per request.
pub(super) struct Conn(Box<ConnState>);

struct ConnState {
    sender: SendRequest<Full<Bytes>>,
    driver: Connection<Io, Full<Bytes>>,
    /// The driver completed: the connection is over, never polled again.
    ended: bool,
}

impl Conn {
    pub(super) fn new(
        sender: SendRequest<Full<Bytes>>,
        driver: Connection<Io, Full<Bytes>>,
    ) -> Self {
        Conn(Box::new(ConnState {
            sender,
            driver,
            ended: false,
        }))
    }

    /// The handle that sends requests on the connection.
    pub(super) fn sender(&mut self) -> &mut SendRequest<Full<Bytes>> {
        &mut self.0.sender
    }

    /// Does the connection's pending I/O (writes the request, reads and
    /// decodes what arrived, handing it to the response or its body).
    /// Its failures reach the response or the body; once it completed it
    /// is not polled again.
    pub(super) fn drive(&mut self, cx: &mut Context<'_>) {
        let state = &mut *self.0;
        if !state.ended && Pin::new(&mut state.driver).poll(cx).is_ready() {
            state.ended = true;
        }
    }

    /// Whether the connection is over (closed, failed or shut down).
    pub(super) fn ended(&self) -> bool {
        self.0.ended
    }

    /// Whether the connection can take another request now. Polls it once
    /// without a waker (nobody is to be woken for an idle connection), so
    /// that a close or a finished exchange is noticed.
    fn reusable(&mut self) -> bool {
        let mut cx = Context::from_waker(Waker::noop());
        self.drive(&mut cx);
        !self.0.ended && self.0.sender.is_ready()
    }
}

struct Idle {
    conn: Conn,
    since: Instant,
}

/// Idle connections per host (see the module documentation of `h1`).
/// Clones share the pool.
#[derive(Clone)]
pub(super) struct Pool {
    /// Per host, oldest first.
    idle: Arc<Mutex<IdleMap>>,
    max_idle_per_host: usize,
    idle_timeout: Option<Duration>,
    /// A reaper task is running.
    reaping: Arc<AtomicBool>,
}

impl Pool {
    pub(super) fn new(max_idle_per_host: usize, idle_timeout: Option<Duration>) -> Self {
        Pool {
            idle: Arc::new(Mutex::new(IdleMap::default())),
            max_idle_per_host,
            idle_timeout,
            reaping: Arc::new(AtomicBool::new(false)),
        }
    }

    fn expired(&self, idle: &Idle) -> bool {
        self.idle_timeout.is_some_and(|t| idle.since.elapsed() >= t)
    }

    /// The most recently used idle connection to `key` that is still
    /// usable. Stale ones are closed on the way (outside the lock).
    pub(super) fn take(&self, key: &Key) -> Option<Conn> {
        loop {
            let idle = {
                let mut map = self.idle.lock().unwrap_or_else(PoisonError::into_inner);
                let list = map.get_mut(key)?;
                let newest = list.pop()?;
                if self.expired(&newest) {
                    // The newest is too old, so are all the others.
                    let stale = std::mem::take(list);
                    drop(map);
                    drop(stale);
                    return None;
                }
                newest
            };
            let mut conn = idle.conn;
            if conn.reusable() {
                return Some(conn);
            }
        }
    }

    /// Keeps `conn` for the next request to `key`, if it can take one and
    /// the host has room; closes it otherwise.
    pub(super) fn put(&self, key: Key, mut conn: Conn) {
        if self.max_idle_per_host == 0 || !conn.reusable() {
            return;
        }
        let mut map = self.idle.lock().unwrap_or_else(PoisonError::into_inner);
        let list = map.entry(key).or_default();
        // The expired ones (oldest first), and the oldest past the cap.
        let expired = list.iter().take_while(|idle| self.expired(idle)).count();
        let over = (list.len() - expired + 1).saturating_sub(self.max_idle_per_host);
        let dropped: Vec<Idle> = list.drain(..expired + over).collect();
        list.push(Idle {
            conn,
            since: Instant::now(),
        });
        drop(map);
        drop(dropped);
        self.start_reaper();
    }

    /// Starts the reaper unless one runs, there is no idle timeout or no
    /// runtime to run it on.
    fn start_reaper(&self) {
        let Some(timeout) = self.idle_timeout else {
            return;
        };
        // The usual case, without touching the runtime's context.
        if self.reaping.load(Ordering::Acquire) {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        if self.reaping.swap(true, Ordering::AcqRel) {
            return;
        }
        let idle = Arc::downgrade(&self.idle);
        // Made before the task: it clears the flag even if the task is
        // dropped unpolled (its runtime ending first).
        let running = Running(Some(Arc::clone(&self.reaping)));
        let period = (timeout / 2).max(Duration::from_millis(1));
        runtime.spawn(reap(idle, running, timeout, period));
    }

    /// Idle connections held for `key` (for tests).
    #[cfg(test)]
    pub(super) fn idle(&self, key: &Key) -> usize {
        let map = self.idle.lock().unwrap_or_else(PoisonError::into_inner);
        map.get(key).map_or(0, Vec::len)
    }
}

/// Clears a pool's `reaping` flag when its reaper ends, however it ends
/// (its task dropped with its runtime included), so that a later `put`
/// starts another.
struct Running(Option<Arc<AtomicBool>>);

impl Running {
    /// Clears the flag now (the reaper found nothing left, under the lock).
    fn clear(&mut self) {
        if let Some(flag) = self.0.take() {
            flag.store(false, Ordering::Release);
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.clear();
    }
}

/// The reaper (see the module documentation): every `period`, drops the
/// connections idle for `timeout` or more and those no longer usable; ends
/// when nothing is idle or the pool is gone, clearing `reaping`.
async fn reap(
    idle: Weak<Mutex<IdleMap>>,
    mut running: Running,
    timeout: Duration,
    period: Duration,
) {
    loop {
        tokio::time::sleep(period).await;
        let Some(idle) = idle.upgrade() else {
            return;
        };
        let mut dropped = Vec::new();
        let mut map = idle.lock().unwrap_or_else(PoisonError::into_inner);
        for list in map.values_mut() {
            let mut kept = Vec::with_capacity(list.len());
            for mut entry in list.drain(..) {
                if entry.since.elapsed() >= timeout || !entry.conn.reusable() {
                    dropped.push(entry);
                } else {
                    kept.push(entry);
                }
            }
            *list = kept;
        }
        map.retain(|_, list| !list.is_empty());
        let empty = map.is_empty();
        if empty {
            // Cleared under the lock: a `put` after it starts a new reaper.
            running.clear();
        }
        drop(map);
        drop(dropped);
        if empty {
            return;
        }
    }
}

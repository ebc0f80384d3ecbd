//! Seeing the gateway close a connection whose client reads nothing.
//!
//! A client that stops reading cannot see the server's FIN: it waits in
//! the socket behind the data the client never read. The server's own
//! side of the connection shows it at once, though: once the gateway
//! closes (or resets) its socket, the kernel's row for it in
//! `/proc/net/tcp` leaves `ESTABLISHED` (FIN_WAIT1 while unsent data
//! remains, or gone). Both ends live on this machine, so one reader of
//! that table, polled every `POLL`, tells every stalled client when the
//! gateway let go of it. Linux only.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::sync::oneshot;
use tokio::time::Instant;

/// How often the table is read while anyone waits.
const POLL: Duration = Duration::from_millis(50);

/// `st` of an established TCP socket in `/proc/net/tcp`.
const ESTABLISHED: u8 = 0x01;

type Waiters = HashMap<u16, oneshot::Sender<Instant>>;

/// Shared by every stalled client of a run.
#[derive(Clone)]
pub struct CloseWatcher {
    gateway_port: u16,
    waiters: Arc<Mutex<Waiters>>,
}

impl CloseWatcher {
    /// A watcher of connections to `gateway_port`, with its polling task.
    pub fn spawn(gateway_port: u16) -> Self {
        let watcher = Self {
            gateway_port,
            waiters: Arc::new(Mutex::new(HashMap::new())),
        };
        let w = watcher.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(POLL);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                if w.lock().is_empty() {
                    continue;
                }
                // Blocking file read of a few hundred kB at most.
                let Ok(table) = tokio::fs::read_to_string("/proc/net/tcp").await else {
                    continue;
                };
                let now = Instant::now();
                let open = established_peers(&table, w.gateway_port);
                let mut waiters = w.lock();
                let closed: Vec<u16> = waiters
                    .keys()
                    .copied()
                    .filter(|port| !open.contains(port))
                    .collect();
                for port in closed {
                    if let Some(tx) = waiters.remove(&port) {
                        let _ = tx.send(now);
                    }
                }
            }
        });
        watcher
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Waiters> {
        self.waiters.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Whether the table can be read here at all.
    pub fn available() -> bool {
        std::fs::read_to_string("/proc/net/tcp").is_ok()
    }

    /// Waits until the gateway's side of the connection from local port
    /// `client_port` is no longer established, or until `until`. Returns
    /// when the close was first seen.
    pub async fn closed(&self, client_port: u16, until: Instant) -> Option<Instant> {
        let (tx, rx) = oneshot::channel();
        self.lock().insert(client_port, tx);
        let seen = tokio::time::timeout_at(until, rx)
            .await
            .ok()
            .and_then(Result::ok);
        self.lock().remove(&client_port);
        seen
    }
}

/// Remote ports of the established sockets whose local port is `port`.
pub fn established_peers(table: &str, port: u16) -> std::collections::HashSet<u16> {
    let mut peers = std::collections::HashSet::new();
    for line in table.lines().skip(1) {
        let mut fields = line.split_whitespace();
        let (Some(_sl), Some(local), Some(remote), Some(state)) =
            (fields.next(), fields.next(), fields.next(), fields.next())
        else {
            continue;
        };
        let port_of = |addr: &str| {
            addr.rsplit_once(':')
                .and_then(|(_, p)| u16::from_str_radix(p, 16).ok())
        };
        if port_of(local) == Some(port)
            && u8::from_str_radix(state, 16) == Ok(ESTABLISHED)
            && let Some(peer) = port_of(remote)
        {
            peers.insert(peer);
        }
    }
    peers
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_gateway_side_rows() {
        let table = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n\
   0: 0100007F:474A 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1 1\n\
   1: 0100007F:474A 0100007F:9C40 01 00001000:00000000 00:00000000 00000000     0        0 2 1\n\
   2: 0100007F:474A 0100007F:9C41 04 00002000:00000000 00:00000000 00000000     0        0 3 1\n\
   3: 0100007F:9C42 0100007F:474A 01 00000000:00000000 00:00000000 00000000     0        0 4 1\n";
        let peers = established_peers(table, 0x474A);
        assert_eq!(peers.len(), 1);
        assert!(peers.contains(&0x9C40));
    }

    #[tokio::test]
    async fn sees_a_real_close() {
        if !CloseWatcher::available() {
            return;
        }
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let watcher = CloseWatcher::spawn(listener.local_addr().expect("addr").port());
        let client = tokio::net::TcpStream::connect(listener.local_addr().expect("addr"))
            .await
            .expect("connect");
        let (server, _) = listener.accept().await.expect("accept");
        let port = client.local_addr().expect("addr").port();
        let soon = Instant::now() + Duration::from_millis(300);
        assert_eq!(watcher.closed(port, soon).await, None, "still open");
        drop(server);
        let later = Instant::now() + Duration::from_secs(5);
        assert!(watcher.closed(port, later).await.is_some());
        drop(client);
    }
}

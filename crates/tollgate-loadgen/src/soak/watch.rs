//! Seeing the gateway close a connection whose client reads nothing.
//!
//! A client that stops reading cannot see the server's FIN: it waits in
//! the socket behind the data the client never read. The server's own
//! side of the connection shows it at once, though: once the gateway
//! closes (or resets) its socket, the kernel's row for it in
//! `/proc/net/tcp` leaves `ESTABLISHED` (FIN_WAIT1 while unsent data
//! remains, or gone). Both ends live on this machine, so one reader of
//! that table, polled every `POLL` (100 ms), tells every stalled client
//! when the gateway let go of it. Linux only.
//!
//! The table is read with `ss` when it is installed (iproute2: the kernel
//! filters the sockets by port, while `/proc/net/tcp` formats
//! every socket of the machine, tens of thousands in TIME_WAIT during a
//! long soak), else from `/proc/net/tcp`. Either is written a chunk at a
//! time, so a row can be missing from one read while connections come and
//! go: a connection counts as closed when its row is there in another
//! state, or missing from two reads in a row.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::sync::oneshot;
use tokio::time::Instant;

/// How often the table is read while anyone waits.
const POLL: Duration = Duration::from_millis(100);

/// `st` of an established TCP socket in `/proc/net/tcp`.
const ESTABLISHED: u8 = 0x01;

/// Per client port: whom to tell, and whether the last read missed it.
type Waiters = HashMap<u16, (oneshot::Sender<Instant>, bool)>;

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
        let use_ss = std::process::Command::new("ss")
            .args(["-tnH", "( sport = :1 )"])
            .output()
            .is_ok_and(|o| o.status.success());
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(POLL);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                if w.lock().is_empty() {
                    continue;
                }
                let rows = if use_ss {
                    let Ok(out) = tokio::process::Command::new("ss")
                        .args([
                            "-tnH".to_owned(),
                            format!("( sport = :{} )", w.gateway_port),
                        ])
                        .output()
                        .await
                    else {
                        continue;
                    };
                    if !out.status.success() {
                        continue;
                    }
                    ss_peers(&String::from_utf8_lossy(&out.stdout))
                } else {
                    let Ok(table) = tokio::fs::read_to_string("/proc/net/tcp").await else {
                        continue;
                    };
                    peers(&table, w.gateway_port)
                };
                let now = Instant::now();
                let mut waiters = w.lock();
                let mut closed = Vec::new();
                for (port, (_, missed)) in waiters.iter_mut() {
                    match rows.get(port) {
                        Some(&established) => {
                            *missed = false;
                            if !established {
                                closed.push(*port);
                            }
                        }
                        None if *missed => closed.push(*port),
                        None => *missed = true,
                    }
                }
                for port in closed {
                    if let Some((tx, _)) = waiters.remove(&port) {
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
        self.lock().insert(client_port, (tx, false));
        let seen = tokio::time::timeout_at(until, rx)
            .await
            .ok()
            .and_then(Result::ok);
        self.lock().remove(&client_port);
        seen
    }
}

/// Remote ports in the output of `ss -tnH '( sport = :PORT )'`, with
/// whether each is established: `State Recv-Q Send-Q Local:Port Peer:Port`
/// per line.
pub fn ss_peers(out: &str) -> HashMap<u16, bool> {
    let mut peers = HashMap::new();
    for line in out.lines() {
        let fields: Vec<&str> = line.split_whitespace().collect();
        let (Some(state), Some(peer)) = (fields.first(), fields.get(4)) else {
            continue;
        };
        if let Some(port) = peer.rsplit_once(':').and_then(|(_, p)| p.parse().ok()) {
            *peers.entry(port).or_insert(false) |= *state == "ESTAB";
        }
    }
    peers
}

/// Remote ports of the sockets whose local port is `port`, with whether
/// each is established.
pub fn peers(table: &str, port: u16) -> HashMap<u16, bool> {
    let mut peers = HashMap::new();
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
            && let Some(peer) = port_of(remote)
            && peer != 0
        {
            let established = u8::from_str_radix(state, 16) == Ok(ESTABLISHED);
            // A port seen twice (an old connection in TIME_WAIT and a new
            // one): established wins.
            *peers.entry(peer).or_insert(established) |= established;
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
        let peers = peers(table, 0x474A);
        assert_eq!(peers.len(), 2);
        assert_eq!(peers.get(&0x9C40), Some(&true));
        assert_eq!(peers.get(&0x9C41), Some(&false));
        let ss = ss_peers(
            "ESTAB      0      0      127.0.0.1:18282 127.0.0.1:40000\n\
             FIN-WAIT-1 0 4096 127.0.0.1:18282 127.0.0.1:40001\n",
        );
        assert_eq!(ss.len(), 2);
        assert_eq!(ss.get(&40000), Some(&true));
        assert_eq!(ss.get(&40001), Some(&false));
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

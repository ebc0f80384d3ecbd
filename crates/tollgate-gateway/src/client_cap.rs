//! The per-client connection cap, `server.max_connections_per_client`
//! (SPEC GW-17, GW-7).
//!
//! `server.max_connections` bounds the connections served at once, and its
//! slots are taken before a request is read, so before anyone is
//! authenticated: without a cap per client, one address opening that many
//! connections (and sending its request heads slowly, each within the
//! header read timeout) would keep every other client's connections in the
//! listen backlog. With this cap, a connection from a client that already
//! holds its share gives its slot back at once (the excess costs only its
//! sender) and is answered, as soon as its request starts arriving and
//! without parsing it, with a fixed 429 `too_many_connections`
//! ([`crate::error::too_many_connections`]) and closed.
//!
//! A client is its peer address: an IPv4 address (an IPv4-mapped IPv6
//! address counts as that IPv4 address), or an IPv6 address's /64 prefix,
//! the block one host usually controls ([`client_of`]). The count of each
//! client is kept while it holds a connection and removed when its last one
//! closes, so the map holds at most `max_connections` entries.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv6Addr};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::Semaphore;

/// The longest a refusal may take: writing the 429, closing the write
/// side, and reading (and dropping) what the client sent meanwhile, so
/// that closing the socket does not reset the connection before the
/// client has the answer.
pub const REFUSE_TIMEOUT: Duration = Duration::from_secs(1);

/// At most this many refusals run at once; past it a refused connection
/// is closed at once without the answer (each running refusal keeps a
/// file descriptor for up to [`REFUSE_TIMEOUT`]).
pub const MAX_REFUSING: usize = 64;

/// At most this many of the running refusals are one client's; past it
/// that client's refused connection is closed at once without the
/// answer. A client that opens refused connections and never closes them
/// holds only these, not every refusal: another client's connection past
/// its cap is still answered (SPEC GW-17).
pub const MAX_REFUSING_PER_CLIENT: usize = 4;

/// Most bytes a refusal reads and drops after its answer.
const DRAIN_BYTES: usize = 64 * 1024;

/// The client a peer address belongs to: an IPv4 address as it is (also
/// when it arrives IPv4-mapped on a dual-stack listener), an IPv6 address
/// as its /64 prefix (the host bits zeroed).
pub fn client_of(peer: IpAddr) -> IpAddr {
    match peer.to_canonical() {
        IpAddr::V4(v4) => IpAddr::V4(v4),
        IpAddr::V6(v6) => IpAddr::V6(Ipv6Addr::from(u128::from(v6) & !u128::from(u64::MAX))),
    }
}

/// How many connections each client holds, under a cap, and the refusal
/// of the connections past it.
#[derive(Debug)]
pub struct ClientCap {
    cap: usize,
    held: Mutex<HashMap<IpAddr, usize>>,
    /// `tollgate_connection_clients`: clients holding a connection.
    clients: metrics::Gauge,
    /// `tollgate_connections_refused_total`.
    refused: metrics::Counter,
    /// Refusals running (at most [`MAX_REFUSING`]).
    refusing: Arc<Semaphore>,
    /// Refusals running per client (each at most
    /// [`MAX_REFUSING_PER_CLIENT`]; an entry goes with its last one, so
    /// at most [`MAX_REFUSING`] entries).
    refusing_by: Mutex<HashMap<IpAddr, usize>>,
    /// The fixed 429.
    answer: bytes::Bytes,
}

impl ClientCap {
    /// A cap of `cap` connections per client (at least 1).
    pub fn new(cap: usize) -> Arc<Self> {
        Arc::new(ClientCap {
            cap: cap.max(1),
            held: Mutex::new(HashMap::new()),
            clients: metrics::gauge!("tollgate_connection_clients"),
            refused: metrics::counter!("tollgate_connections_refused_total"),
            refusing: Arc::new(Semaphore::new(MAX_REFUSING)),
            refusing_by: Mutex::new(HashMap::new()),
            answer: crate::error::too_many_connections(),
        })
    }

    /// Refuses `stream`, a connection from `peer` that [`ClientCap::take`]
    /// turned down: counts it, and on a task of its own (the caller goes
    /// on accepting) answers it with the fixed 429 and closes it within
    /// [`REFUSE_TIMEOUT`]; with [`MAX_REFUSING`] refusals already running,
    /// or [`MAX_REFUSING_PER_CLIENT`] of its client's, closes it at once
    /// without the answer.
    pub fn refuse(self: &Arc<Self>, stream: TcpStream, peer: IpAddr) {
        self.refused.increment(1);
        let client = client_of(peer);
        tracing::debug!(client = %client, "refusing a connection: its client holds its cap");
        let Some(own) = self.refusing_of(client) else {
            return;
        };
        if let Ok(running) = Arc::clone(&self.refusing).try_acquire_owned() {
            let answer = self.answer.clone();
            tokio::spawn(async move {
                let _running = (running, own);
                answer_and_close(stream, &answer).await;
            });
        }
    }

    /// One more running refusal of `client`, or `None` when it already
    /// runs [`MAX_REFUSING_PER_CLIENT`].
    fn refusing_of(self: &Arc<Self>, client: IpAddr) -> Option<Refusing> {
        let mut by = self.refusing_by.lock();
        let count = by.entry(client).or_insert(0);
        if *count >= MAX_REFUSING_PER_CLIENT {
            return None;
        }
        *count += 1;
        Some(Refusing {
            cap: Arc::clone(self),
            client,
        })
    }

    /// One more connection of the client of `peer`, or `None` when that
    /// client already holds the cap. The connection counts until the
    /// returned slot is dropped.
    pub fn take(self: &Arc<Self>, peer: IpAddr) -> Option<ClientSlot> {
        let client = client_of(peer);
        let mut held = self.held.lock();
        let count = held.entry(client).or_insert(0);
        if *count >= self.cap {
            return None;
        }
        *count += 1;
        self.clients.set(held.len() as f64);
        Some(ClientSlot {
            cap: Arc::clone(self),
            client,
        })
    }

    /// Clients holding at least one connection.
    pub fn clients(&self) -> usize {
        self.held.lock().len()
    }
}

/// One connection counted against its client; dropping it gives the
/// connection back (and forgets the client once it holds none).
#[derive(Debug)]
pub struct ClientSlot {
    cap: Arc<ClientCap>,
    client: IpAddr,
}

impl Drop for ClientSlot {
    fn drop(&mut self) {
        let mut held = self.cap.held.lock();
        if let Some(count) = held.get_mut(&self.client) {
            *count = count.saturating_sub(1);
            if *count == 0 {
                held.remove(&self.client);
            }
        }
        self.cap.clients.set(held.len() as f64);
    }
}

/// One running refusal counted against its client; dropping it gives it
/// back (and forgets the client once it runs none).
#[derive(Debug)]
struct Refusing {
    cap: Arc<ClientCap>,
    client: IpAddr,
}

impl Drop for Refusing {
    fn drop(&mut self) {
        let mut by = self.cap.refusing_by.lock();
        if let Some(count) = by.get_mut(&self.client) {
            *count = count.saturating_sub(1);
            if *count == 0 {
                by.remove(&self.client);
            }
        }
    }
}

/// Answers `stream` with `response` (the fixed 429) and closes it, all
/// within [`REFUSE_TIMEOUT`]. The answer waits until the client has sent
/// something (its request, or the start of it): an answer that arrives
/// before a client has written its request is, to an HTTP/1.1 client
/// such as hyper's, an unexpected message and no 429 at all. Then the
/// write side is shut, and whatever the client sent (up to 64 KiB) read
/// and dropped until it closes too, so that the close does not reset the
/// connection under the answer. A client that sends nothing, or closes
/// first, is closed without the answer.
async fn answer_and_close(mut stream: TcpStream, response: &[u8]) {
    let refusal = async {
        let mut sink = [0u8; 4096];
        let mut drained = match stream.read(&mut sink).await? {
            0 => return Ok(()),
            n => n,
        };
        stream.write_all(response).await?;
        stream.shutdown().await?;
        while drained < DRAIN_BYTES {
            match stream.read(&mut sink).await? {
                0 => break,
                n => drained += n,
            }
        }
        Ok::<_, std::io::Error>(())
    };
    match tokio::time::timeout(REFUSE_TIMEOUT, refusal).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => tracing::debug!(error = %e, "refusing a connection failed"),
        Err(_) => tracing::debug!("refusing a connection took too long; closing it"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // proves: GW-17 (a client is an IPv4 address, or an IPv6 /64 prefix;
    // an IPv4-mapped address is its IPv4 client)
    #[test]
    fn clients_are_ipv4_addresses_and_ipv6_prefixes() {
        let ip = |s: &str| s.parse::<IpAddr>().expect("address");
        assert_eq!(client_of(ip("192.0.2.7")), ip("192.0.2.7"));
        assert_eq!(client_of(ip("::ffff:192.0.2.7")), ip("192.0.2.7"));
        assert_eq!(
            client_of(ip("2001:db8:1:2:aa:bb:cc:dd")),
            ip("2001:db8:1:2::")
        );
        assert_eq!(
            client_of(ip("2001:db8:1:2::1")),
            client_of(ip("2001:db8:1:2:ffff::9"))
        );
        assert_ne!(
            client_of(ip("2001:db8:1:2::1")),
            client_of(ip("2001:db8:1:3::1"))
        );
    }

    // proves: GW-17, GW-7 (a client holds at most the cap; a slot given
    // back makes room; a client holding nothing is forgotten)
    #[test]
    fn cap_counts_per_client_and_forgets_idle_clients() {
        let cap = ClientCap::new(2);
        let a: IpAddr = "10.0.0.1".parse().expect("address");
        let b: IpAddr = "10.0.0.2".parse().expect("address");
        let first = cap.take(a).expect("first");
        let second = cap.take(a).expect("second");
        assert!(cap.take(a).is_none(), "a third connection of a");
        let other = cap.take(b).expect("b has its own count");
        assert_eq!(cap.clients(), 2);
        drop(first);
        let third = cap.take(a).expect("room again");
        drop((second, third, other));
        assert_eq!(cap.clients(), 0, "clients holding nothing are forgotten");
    }

    // proves: GW-17 (one client runs at most MAX_REFUSING_PER_CLIENT
    // refusals, whatever it leaves open; another client has its own, and
    // a client running none is forgotten)
    #[test]
    fn refusals_are_bounded_per_client() {
        let cap = ClientCap::new(1);
        let a: IpAddr = "10.0.0.1".parse().expect("address");
        let b: IpAddr = "10.0.0.2".parse().expect("address");
        let mut running: Vec<_> = (0..MAX_REFUSING_PER_CLIENT)
            .map(|_| cap.refusing_of(a).expect("within a's share"))
            .collect();
        assert!(cap.refusing_of(a).is_none(), "past a's share");
        let other = cap.refusing_of(b).expect("b has its own share");
        running.pop();
        running.push(cap.refusing_of(a).expect("room again"));
        drop((running, other));
        assert!(
            cap.refusing_by.lock().is_empty(),
            "clients running none are forgotten"
        );
    }
}

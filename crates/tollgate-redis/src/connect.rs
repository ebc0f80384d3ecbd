//! The connections of a backend (SPEC DQ-7): a single node or a Redis
//! Cluster, over TCP (`redis://`) or TLS (`rediss://`).
//!
//! Both are made without a round trip and remade in the background:
//!
//! - a single node: one multiplexed connection (`ConnectionManager`),
//!   reconnected whenever it breaks;
//! - a cluster: the `redis` crate's cluster client, which connects to the
//!   seeds in the background, learns the slot map, sends each command to
//!   the node of its first key's slot, follows MOVED (and refreshes the
//!   map) and ASK, waits out TRYAGAIN during a slot's migration, and
//!   reconnects to nodes that went away. It resends a command after a
//!   dropped connection, which is why every script is idempotent (SPEC
//!   DQ-6). `SCRIPT LOAD` goes to every node.
//!
//! Every key a script touches carries its scope's hash tag, so one scope
//! lives on one slot and its scripts never cross slots.

use std::time::Duration;

use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::cluster::{ClusterClientBuilder, ClusterConfig};
use redis::cluster_async::ClusterConnection;
use redis::{Cmd, Pipeline, RedisFuture, TlsCertificates, Value};

use crate::error::BuildError;
use crate::settings::RedisSettings;

/// How long one connection attempt may take (in the background: an
/// operation never waits longer than its own budget).
pub(crate) const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);
/// A cluster node's answer to one attempt of a command.
const CLUSTER_RESPONSE_TIMEOUT: Duration = Duration::from_secs(1);
/// Attempts of a command after the first in a cluster (redirections,
/// TRYAGAIN, reconnections), a few milliseconds apart: bounded, so a copy
/// of a command never arrives long after it was sent (far within the
/// scripts' marker lifetime, DQ-6).
const CLUSTER_RETRIES: u32 = 10;

/// The connection every operation of a backend uses.
#[derive(Clone)]
pub(crate) enum Conn {
    /// One server.
    Single(ConnectionManager),
    /// A Redis Cluster.
    Cluster(ClusterConnection),
}

impl std::fmt::Debug for Conn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Conn::Single(_) => "Conn::Single",
            Conn::Cluster(_) => "Conn::Cluster",
        })
    }
}

impl ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Conn::Single(c) => c.req_packed_command(cmd),
            Conn::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Conn::Single(c) => c.req_packed_commands(pipeline, offset, count),
            Conn::Cluster(c) => c.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Conn::Single(c) => c.get_db(),
            Conn::Cluster(c) => c.get_db(),
        }
    }
}

/// What a backend connects with.
#[derive(Debug)]
pub(crate) struct Connections {
    /// The connection of every operation.
    pub(crate) conn: Conn,
    /// One client per URL. The change subscriber listens through one of
    /// them, the next one when it fails (a cluster delivers every PUBLISH
    /// to every node's subscribers).
    pub(crate) clients: Vec<redis::Client>,
}

/// The connections `settings` describe, made lazily (no round trip here).
pub(crate) fn connect(settings: &RedisSettings) -> Result<Connections, BuildError> {
    let urls: Vec<&str> = settings.urls().collect();
    if urls.is_empty() {
        return Err(BuildError::Url("no URL".into()));
    }
    if urls.len() > 1 && !settings.cluster {
        return Err(BuildError::Deployment(
            "several URLs are a cluster's seeds: set cluster".into(),
        ));
    }
    let tls = urls.iter().filter(|u| u.starts_with("rediss://")).count();
    if tls != 0 && tls != urls.len() {
        return Err(BuildError::Deployment(
            "every URL must use TLS (rediss://) or none".into(),
        ));
    }
    let certificates = match &settings.ca_file {
        None => None,
        Some(_) if tls == 0 => {
            return Err(BuildError::Tls("a CA file needs rediss:// URLs".into()));
        }
        Some(path) => {
            let pem = std::fs::read(path)
                .map_err(|e| BuildError::Tls(format!("{}: {e}", path.display())))?;
            if !String::from_utf8_lossy(&pem).contains("-----BEGIN CERTIFICATE-----") {
                return Err(BuildError::Tls(format!(
                    "{}: no PEM certificate",
                    path.display()
                )));
            }
            Some(TlsCertificates {
                client_tls: None,
                root_cert: Some(pem),
            })
        }
    };
    if tls != 0 {
        ensure_crypto_provider();
    }
    let clients = urls
        .iter()
        .map(|url| client(url, certificates.as_ref()))
        .collect::<Result<Vec<_>, _>>()?;
    let conn = if settings.cluster {
        let mut builder = ClusterClientBuilder::new(urls.iter().copied())
            .retries(CLUSTER_RETRIES)
            .min_retry_wait(5)
            .max_retry_wait(100)
            .overall_response_timeout(None);
        if let Some(certificates) = certificates {
            builder = builder.certs(certificates);
        }
        let client = builder
            .build()
            .map_err(|e| BuildError::Url(e.to_string()))?;
        let config = ClusterConfig::new()
            .set_connection_timeout(CONNECT_TIMEOUT)
            .set_response_timeout(CLUSTER_RESPONSE_TIMEOUT);
        Conn::Cluster(client.get_pending_async_connection_with_config(config))
    } else {
        // Each operation is bounded by its own budget (`bounded`, SPEC
        // DQ-5), and by nothing shorter: the client's own response timeout
        // (500 ms by default) would fail an operation whose budget is
        // longer as `Unavailable` (the store marked down) while Redis was
        // merely slow. A timeout is not a dropped connection, so turning it
        // off loses no reconnection.
        let config = ConnectionManagerConfig::new()
            .set_response_timeout(None)
            .set_connection_timeout(Some(CONNECT_TIMEOUT))
            .set_number_of_retries(2)
            .set_min_delay(Duration::from_millis(10))
            .set_max_delay(Duration::from_millis(500));
        let manager = ConnectionManager::new_lazy_with_config(clients[0].clone(), config)
            .map_err(|e| BuildError::Connection(e.to_string()))?;
        Conn::Single(manager)
    };
    Ok(Connections { conn, clients })
}

/// A client for `url`, checking a TLS server against `certificates` when
/// given (else the system's roots).
fn client(url: &str, certificates: Option<&TlsCertificates>) -> Result<redis::Client, BuildError> {
    let made = match certificates {
        Some(c) => redis::Client::build_with_tls(url, c.clone()),
        None => redis::Client::open(url),
    };
    made.map_err(|e| BuildError::Url(format!("{url}: {e}")))
}

/// TLS needs a process-wide crypto provider: rustls picks one by itself
/// only when exactly one is compiled in, so one is installed when none is
/// (aws-lc-rs, as the gateway's upstream client uses).
pub(crate) fn ensure_crypto_provider() {
    if rustls::crypto::CryptoProvider::get_default().is_none() {
        // Another thread may have installed one meanwhile: either serves.
        let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
    }
}

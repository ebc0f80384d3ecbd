//! [`RedisCluster`]: a throwaway Redis Cluster of three primaries.

use std::io;
use std::time::{Duration, Instant};

use redis::FromRedisValue;

use std::path::Path;
use std::sync::Arc;

use super::certs::Certificates;
use super::cluster_view::{self, View};
use super::server::RedisServer;
use super::{binary, or_skip};

/// Slots of each of the three primaries.
const RANGES: [(u16, u16); 3] = [(0, 5460), (5461, 10922), (10923, 16383)];

/// A Redis Cluster of three primaries (no replicas) on free loopback
/// ports, without persistence; stopped when dropped.
///
/// ```no_run
/// let Some(cluster) = tollgate_redis::RedisCluster::start_or_skip("my_test") else {
///     return; // redis-server is missing and not required: skipped
/// };
/// let seeds = cluster.urls(); // "redis://127.0.0.1:P1,redis://127.0.0.1:P2,..."
/// # let _ = seeds;
/// ```
#[derive(Debug)]
pub struct RedisCluster {
    nodes: Vec<RedisServer>,
}

impl RedisCluster {
    /// Starts a cluster, or returns `None` (after printing why) when
    /// `redis-server` is missing and not required.
    ///
    /// # Panics
    ///
    /// When the cluster cannot be started and `TOLLGATE_REQUIRE_REDIS=1`,
    /// or `redis-server` was found but the cluster did not form: that is
    /// the test's failure.
    pub fn start_or_skip(test: &str) -> Option<RedisCluster> {
        or_skip(
            test,
            &format!("a cluster of {}", binary()),
            RedisCluster::start(),
        )
    }

    /// Starts a cluster that speaks TLS only (clients and the cluster bus;
    /// see [`RedisServer::start_tls`]), or returns `None` (after printing
    /// why) when `redis-server` or `openssl` is missing and not required.
    ///
    /// # Panics
    ///
    /// As [`start_or_skip`](Self::start_or_skip).
    pub fn start_tls_or_skip(test: &str) -> Option<RedisCluster> {
        let started =
            Certificates::make().and_then(|c| RedisCluster::start_with(Some(&Arc::new(c))));
        or_skip(test, "a TLS cluster", started)
    }

    /// Starts three cluster nodes, gives each a third of the slots and its
    /// own config epoch, joins them, and waits until every node sees the
    /// cluster whole and knows every node's config epoch.
    pub fn start() -> io::Result<RedisCluster> {
        RedisCluster::start_with(None)
    }

    fn start_with(certs: Option<&Arc<Certificates>>) -> io::Result<RedisCluster> {
        let nodes = (0..RANGES.len())
            .map(|_| RedisServer::start_node(certs))
            .collect::<io::Result<Vec<_>>>()?;
        let cluster = RedisCluster { nodes };
        for (i, (lo, hi)) in RANGES.iter().enumerate() {
            let () = cluster.query(
                i,
                &["CLUSTER", "ADDSLOTSRANGE", &lo.to_string(), &hi.to_string()],
            )?;
            // Distinct config epochs from the start, as `redis-cli --cluster
            // create` gives them: left at 0, the nodes settle their
            // collisions by gossip, after the cluster already looks whole,
            // and a slot moved meanwhile can go back to its old owner (see
            // `start_moving`).
            let () = cluster.query(i, &["CLUSTER", "SET-CONFIG-EPOCH", &(i + 1).to_string()])?;
        }
        for node in &cluster.nodes[1..] {
            let bus = node
                .bus_port()
                .ok_or_else(|| io::Error::other("a node without a bus port"))?;
            let () = cluster.query(
                0,
                &[
                    "CLUSTER",
                    "MEET",
                    "127.0.0.1",
                    &node.port().to_string(),
                    &bus.to_string(),
                ],
            )?;
        }
        cluster.wait_until_whole()?;
        cluster.wait_until_agreed()?;
        Ok(cluster)
    }

    /// The certificate authority's PEM file of a TLS cluster.
    pub fn ca_file(&self) -> Option<&Path> {
        self.nodes.first().and_then(RedisServer::ca_file)
    }

    /// Waits until every node knows every other and serves every slot.
    fn wait_until_whole(&self) -> io::Result<()> {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let mut whole = true;
            for i in 0..self.nodes.len() {
                let info: String = self.query(i, &["CLUSTER", "INFO"])?;
                whole &= info.contains("cluster_state:ok")
                    && info.contains(&format!("cluster_known_nodes:{}", self.nodes.len()));
            }
            if whole {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "the cluster did not form within 30 s",
                ));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Every node's URL, comma-separated: the seeds a client starts from.
    pub fn urls(&self) -> String {
        self.nodes
            .iter()
            .map(RedisServer::url)
            .collect::<Vec<_>>()
            .join(",")
    }

    /// The nodes, in the order they were given slots.
    pub fn nodes(&self) -> &[RedisServer] {
        &self.nodes
    }

    /// Runs one command on node `node` (a blocking round trip).
    pub fn query<T: FromRedisValue>(&self, node: usize, args: &[&str]) -> io::Result<T> {
        let server = self
            .nodes
            .get(node)
            .ok_or_else(|| io::Error::other(format!("no node {node}")))?;
        let mut conn = server
            .client()?
            .get_connection_with_timeout(Duration::from_secs(5))
            .map_err(io::Error::other)?;
        let mut cmd = redis::cmd(args.first().copied().unwrap_or("PING"));
        for a in args.iter().skip(1) {
            cmd.arg(*a);
        }
        cmd.query(&mut conn).map_err(io::Error::other)
    }

    /// The slot of `key`.
    pub fn slot(&self, key: &str) -> io::Result<u16> {
        self.query(0, &["CLUSTER", "KEYSLOT", key])
    }

    /// The node that serves `slot` now (as node 0 sees it).
    pub fn owner(&self, slot: u16) -> io::Result<usize> {
        self.owner_seen_by(0, slot)
    }

    /// The node that serves `slot` now, as node `node` sees it.
    pub fn owner_seen_by(&self, node: usize, slot: u16) -> io::Result<usize> {
        // Each range: start, end, then the primary as [ip, port, id, ...].
        let ranges: Vec<Vec<redis::Value>> = self.query(node, &["CLUSTER", "SLOTS"])?;
        let port = ranges
            .iter()
            .find_map(|range| {
                let lo = u16::from_redis_value_ref(range.first()?).ok()?;
                let hi = u16::from_redis_value_ref(range.get(1)?).ok()?;
                let primary = Vec::<redis::Value>::from_redis_value_ref(range.get(2)?).ok()?;
                let port = u16::from_redis_value_ref(primary.get(1)?).ok()?;
                (lo..=hi).contains(&slot).then_some(port)
            })
            .ok_or_else(|| io::Error::other(format!("slot {slot} unserved")))?;
        self.nodes
            .iter()
            .position(|n| n.port() == port)
            .ok_or_else(|| io::Error::other(format!("no node on port {port}")))
    }

    /// Each node's own config epoch, in the order of [`nodes`](Self::nodes).
    pub fn config_epochs(&self) -> io::Result<Vec<u64>> {
        Ok(self.views()?.iter().map(View::own_epoch).collect())
    }

    /// Every node's view of the cluster.
    fn views(&self) -> io::Result<Vec<View>> {
        (0..self.nodes.len())
            .map(|n| View::parse(&self.query::<String>(n, &["CLUSTER", "NODES"])?))
            .collect()
    }

    /// Waits until every node sees the same config epoch and slots of
    /// every node, and the config epochs are distinct (gossip settled).
    pub fn wait_until_agreed(&self) -> io::Result<()> {
        let deadline = Instant::now() + Duration::from_secs(30);
        while !cluster_view::agreed(&self.views()?) {
            if Instant::now() > deadline {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "the nodes did not agree on config epochs and slots within 30 s",
                ));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(())
    }

    fn id(&self, node: usize) -> io::Result<String> {
        self.query(node, &["CLUSTER", "MYID"])
    }

    /// Starts moving `slot` from its owner to node `to` (resharding): the
    /// owner is MIGRATING it, `to` IMPORTING it, and its keys move with
    /// [`migrate_keys`](Self::migrate_keys); until
    /// [`finish_moving`](Self::finish_moving), commands on the slot are
    /// answered ASK or TRYAGAIN.
    ///
    /// First waits until every node knows every node's config epoch (as
    /// after an earlier move's gossip has settled). The move ends with
    /// `to` giving itself a config epoch above the greatest it knows of,
    /// unless it already holds the greatest; with a stale view (say, of an
    /// earlier move's new owner) it can end at or below the old owner's,
    /// and then a message the old owner sent before it was told the slot
    /// moved gives the slot back to it on some nodes: a MOVED loop between
    /// two nodes, for good.
    pub fn start_moving(&self, slot: u16, to: usize) -> io::Result<usize> {
        self.wait_until_agreed()?;
        let from = self.owner(slot)?;
        let (from_id, to_id) = (self.id(from)?, self.id(to)?);
        let slot = slot.to_string();
        let () = self.query(to, &["CLUSTER", "SETSLOT", &slot, "IMPORTING", &from_id])?;
        let () = self.query(from, &["CLUSTER", "SETSLOT", &slot, "MIGRATING", &to_id])?;
        Ok(from)
    }

    /// Moves every key of `slot` from node `from` to node `to` (MIGRATE).
    pub fn migrate_keys(&self, slot: u16, from: usize, to: usize) -> io::Result<()> {
        let port = self.nodes[to].port().to_string();
        loop {
            let keys: Vec<String> = self.query(
                from,
                &["CLUSTER", "GETKEYSINSLOT", &slot.to_string(), "100"],
            )?;
            if keys.is_empty() {
                return Ok(());
            }
            let mut args = vec!["MIGRATE", "127.0.0.1", &port, "", "0", "5000", "KEYS"];
            args.extend(keys.iter().map(String::as_str));
            let () = self.query(from, &args)?;
        }
    }

    /// Ends a move: `slot` is node `to`'s, as every node is told.
    pub fn finish_moving(&self, slot: u16, from: usize, to: usize) -> io::Result<()> {
        let to_id = self.id(to)?;
        let slot = slot.to_string();
        let mut order = vec![to, from];
        order.extend((0..self.nodes.len()).filter(|n| *n != to && *n != from));
        for node in order {
            let () = self.query(node, &["CLUSTER", "SETSLOT", &slot, "NODE", &to_id])?;
        }
        Ok(())
    }

    /// Moves `slot` with its keys to node `to`, at once.
    pub fn move_slot(&self, slot: u16, to: usize) -> io::Result<()> {
        let from = self.start_moving(slot, to)?;
        self.migrate_keys(slot, from, to)?;
        self.finish_moving(slot, from, to)
    }
}

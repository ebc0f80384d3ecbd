//! Redis Cluster (SPEC DQ-7): a cluster of three primaries that the tests
//! start. Each scope's keys live on one slot (its hash tag), wherever that
//! slot is; a slot moved to another node while a backend holds the old
//! slot map is followed (MOVED, and ASK/TRYAGAIN while it moves); scripts
//! are loaded again on every node after `SCRIPT FLUSH`.

mod common;

use std::collections::BTreeSet;
use std::time::Duration;

use tollgate::config::ScopeConfig;
use tollgate::quota::{Actual, Demand, HoldId, OpId, RemoteHold, RemoteQuota, Reservation};
use tollgate_redis::{RedisBackend, RedisCluster, RedisQuota, RedisSettings};

use common::BUDGET;

const MINUTE: Duration = Duration::from_secs(60);

fn scope(name: &str) -> ScopeConfig {
    ScopeConfig::new(name)
        .requests(10, MINUTE)
        .tokens(1_000, MINUTE)
}

async fn granted(store: &RedisQuota, tokens: u64, hold: RemoteHold) -> Reservation {
    let answer = store.reserve(Demand::new(tokens, 0), hold, BUDGET).await;
    answer.expect("answered").expect("granted")
}

async fn available(store: &RedisQuota) -> (i64, i64) {
    let limits = store.snapshot(BUDGET).await.expect("snapshot");
    (limits[0].available, limits[1].available)
}

/// Runs every operation once on `store`: a leased reservation reconciled
/// (100 → 40 tokens), a pending one leased, one forgotten, one refunded.
/// Leaves 8 requests and 920 tokens available.
async fn every_operation(store: &RedisQuota) {
    let r = granted(store, 100, RemoteHold::Leased).await;
    store
        .reconcile(r, Actual::total(40), OpId::new(), BUDGET)
        .await
        .expect("reconcile");
    let id = HoldId::new();
    let pending = RemoteHold::Pending { id, ttl: MINUTE };
    let p = granted(store, 40, pending).await;
    store
        .lease(p, id, BUDGET)
        .await
        .expect("lease")
        .expect("held");
    let gone = HoldId::new();
    granted(
        store,
        10,
        RemoteHold::Pending {
            id: gone,
            ttl: MINUTE,
        },
    )
    .await;
    assert!(store.forget(gone, BUDGET).await.expect("forget"));
    let back = granted(store, 10, RemoteHold::Leased).await;
    store
        .refund(back, OpId::new(), BUDGET)
        .await
        .expect("refund");
    assert_eq!(available(store).await, (8, 920));
}

/// The node that holds `store`'s scope.
fn node_of(cluster: &RedisCluster, store: &RedisQuota) -> usize {
    let slot = cluster.slot(&store.keys()[0]).expect("slot");
    cluster.owner(slot).expect("owner")
}

// proves: DQ-7, DQ-5 (scopes on every node of a cluster: every operation
// runs on the node of the scope's slot (no CROSSSLOT: every key a script
// touches, markers included, carries the scope's tag), keeps the scope's
// own counts, and leaves its keys on that node only)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scopes_on_every_node_keep_their_own_counts() {
    let Some(cluster) = common::cluster("scopes_on_every_node_keep_their_own_counts") else {
        return;
    };
    let backend = common::cluster_backend(&cluster, "spread");
    let mut nodes = BTreeSet::new();
    for i in 0..12 {
        let store = backend.open_scope(&scope(&format!("scope-{i}")));
        every_operation(&store).await;
        let node = node_of(&cluster, &store);
        nodes.insert(node);
        let tag = format!("{{spread:scope-{i}}}");
        for (n, _) in cluster.nodes().iter().enumerate() {
            let keys: Vec<String> = cluster
                .query(n, &["KEYS", &format!("*scope-{i}}}*")])
                .expect("KEYS");
            if n == node {
                assert!(!keys.is_empty(), "scope-{i} has no keys on its node {n}");
                assert!(keys.iter().all(|k| k.starts_with(&tag)), "{keys:?}");
                // On a cluster every operation is named (its client may
                // resend one): four reserves, a lease, a forget, a refund
                // and a reconcile.
                let markers = keys.iter().filter(|k| k.contains("}:op:")).count();
                assert_eq!(markers, 8, "{keys:?}");
            } else {
                assert!(keys.is_empty(), "scope-{i} has keys on node {n}: {keys:?}");
            }
        }
    }
    assert_eq!(nodes.len(), 3, "the scopes spread over every node");
}

// proves: DQ-7 (a scope's slot moved to another node, with its keys, while
// the backend still routes by the old slot map: the next operation follows
// MOVED and counts on from what the scope held; an operation sent while
// the slot is migrating waits out ASK/TRYAGAIN and lands once)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_moved_slot_is_followed() {
    let Some(cluster) = common::cluster("a_moved_slot_is_followed") else {
        return;
    };
    let backend = common::cluster_backend(&cluster, "moving");
    let store = backend.open_scope(&scope("moving"));
    every_operation(&store).await;
    let slot = cluster.slot(&store.keys()[0]).expect("slot");
    let first = node_of(&cluster, &store);
    let second = (first + 1) % 3;
    cluster.move_slot(slot, second).expect("moved");
    assert_eq!(cluster.owner(slot).expect("owner"), second);
    // The backend's slot map still says `first`.
    let before = errors(&cluster);
    granted(&store, 20, RemoteHold::Leased).await;
    assert!(errors(&cluster)[0] > before[0], "answered MOVED");
    assert_eq!(available(&store).await, (7, 900), "counted on, once");

    // Now while it moves back: started, an operation in flight, keys
    // moved, finished.
    let third = first;
    let from = cluster.start_moving(slot, third).expect("start");
    let in_flight = {
        let store = backend.open_scope(&scope("moving"));
        tokio::spawn(async move {
            let r = granted(&store, 30, RemoteHold::Leased).await;
            (store, r)
        })
    };
    // Moved on once the operation met the migration (TRYAGAIN: some of
    // its keys are here, its marker is not).
    let before = errors(&cluster);
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while errors(&cluster)[2] == before[2] {
        assert!(
            std::time::Instant::now() < deadline,
            "never answered TRYAGAIN"
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    cluster.migrate_keys(slot, from, third).expect("keys");
    cluster.finish_moving(slot, from, third).expect("finish");
    let (_, r) = in_flight.await.expect("task");
    assert!(r.tick > 0);
    assert_eq!(
        available(&store).await,
        (6, 870),
        "the operation landed once"
    );
    assert_eq!(node_of(&cluster, &store), third);
    eprintln!("MOVED, ASK, TRYAGAIN answered: {:?}", errors(&cluster));
}

// proves: DQ-7 (the cluster the tests move slots on behaves as a real one:
// a slot moved as `redis-cli --cluster reshard` moves it, several times in
// quick succession, leaves its new owner with a config epoch above every
// other node's, so no late word from an old owner takes the slot back and
// every node ends up sending clients to the new owner; a slot taken back
// is a MOVED loop between two nodes that no client can follow)
#[test]
fn a_moved_slot_stays_with_its_new_owner() {
    let Some(cluster) = common::cluster("a_moved_slot_stays_with_its_new_owner") else {
        return;
    };
    let slot = 100;
    assert_eq!(cluster.owner(slot).expect("owner"), 0);
    for to in [1, 2, 0].repeat(3) {
        cluster.move_slot(slot, to).expect("moved");
        let epochs = cluster.config_epochs().expect("epochs");
        for (n, epoch) in epochs.iter().enumerate() {
            assert!(
                n == to || *epoch < epochs[to],
                "slot {slot} moved to node {to}, whose config epoch is not the greatest: {epochs:?}"
            );
        }
    }
    cluster.wait_until_agreed().expect("the nodes agree");
    for n in 0..3 {
        let owner = cluster.owner_seen_by(n, slot).expect("owner");
        assert_eq!(owner, 0, "the owner of slot {slot} as node {n} sees it");
    }
}

/// How many MOVED, ASK and TRYAGAIN answers the nodes gave, in total.
fn errors(cluster: &RedisCluster) -> [u64; 3] {
    let mut out = [0; 3];
    for n in 0..cluster.nodes().len() {
        let info: String = cluster.query(n, &["INFO", "errorstats"]).expect("INFO");
        for (i, kind) in ["MOVED", "ASK", "TRYAGAIN"].iter().enumerate() {
            let count = info
                .lines()
                .find_map(|l| l.strip_prefix(&format!("errorstat_{kind}:count=")))
                .and_then(|c| c.trim().parse::<u64>().ok());
            out[i] += count.unwrap_or(0);
        }
    }
    out
}

// proves: DQ-7, DQ-1 (scripts are loaded again on every node: after
// SCRIPT FLUSH on all three, operations on scopes of every node succeed)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scripts_are_reloaded_on_every_node() {
    let Some(cluster) = common::cluster("scripts_are_reloaded_on_every_node") else {
        return;
    };
    let backend = common::cluster_backend(&cluster, "noscript");
    let stores: Vec<RedisQuota> = (0..9)
        .map(|i| backend.open_scope(&scope(&format!("s{i}"))))
        .collect();
    for store in &stores {
        granted(store, 1, RemoteHold::Leased).await;
    }
    for n in 0..3 {
        let () = cluster.query(n, &["SCRIPT", "FLUSH"]).expect("flush");
    }
    let mut nodes = BTreeSet::new();
    for store in &stores {
        every_operation_after(store).await;
        nodes.insert(node_of(&cluster, store));
    }
    assert_eq!(nodes.len(), 3, "scopes on every node");
}

/// [`every_operation`] on a scope that already holds 1 request and 1 token.
async fn every_operation_after(store: &RedisQuota) {
    let r = granted(store, 100, RemoteHold::Leased).await;
    store
        .reconcile(r, Actual::total(40), OpId::new(), BUDGET)
        .await
        .expect("reconcile");
    assert_eq!(available(store).await, (8, 959));
}

// proves: DQ-7 (a Redis Cluster over TLS, clients and cluster bus, its
// seeds given as `rediss://` URLs with the CA file: scopes on every node
// run every operation)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tls_cluster_serves_scopes_on_every_node() {
    let Some(cluster) =
        RedisCluster::start_tls_or_skip("a_tls_cluster_serves_scopes_on_every_node")
    else {
        return;
    };
    assert!(cluster.urls().starts_with("rediss://"));
    let settings = RedisSettings::new(cluster.urls())
        .cluster(true)
        .prefix("tls-cluster")
        .ca_file(cluster.ca_file().expect("a TLS cluster"));
    let backend = RedisBackend::new(settings).expect("backend");
    let mut nodes = BTreeSet::new();
    for i in 0..9 {
        let store = backend.open_scope(&scope(&format!("t{i}")));
        every_operation(&store).await;
        nodes.insert(node_of(&cluster, &store));
    }
    assert_eq!(nodes.len(), 3, "scopes on every node");
}

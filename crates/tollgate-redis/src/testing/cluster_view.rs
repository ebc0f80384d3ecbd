//! What one node of a [`RedisCluster`](super::RedisCluster) believes of the
//! whole (`CLUSTER NODES`): every node's config epoch and slots.

use std::collections::{BTreeMap, BTreeSet};
use std::io;

/// One node's view of the cluster.
#[derive(Debug)]
pub(super) struct View {
    /// The ID of the node whose view this is.
    me: String,
    /// Per node ID: its config epoch and the slots it serves.
    nodes: BTreeMap<String, (u64, Vec<String>)>,
}

impl View {
    /// Parses a `CLUSTER NODES` answer: `<id> <address> <flags> <primary>
    /// <ping-sent> <pong-received> <config-epoch> <link-state> <slot>...`.
    pub(super) fn parse(text: &str) -> io::Result<View> {
        let bad = |line: &str| io::Error::other(format!("unexpected CLUSTER NODES line: {line}"));
        let mut me = None;
        let mut nodes = BTreeMap::new();
        for line in text.lines().filter(|l| !l.trim().is_empty()) {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let (Some(id), Some(flags), Some(epoch)) =
                (fields.first(), fields.get(2), fields.get(6))
            else {
                return Err(bad(line));
            };
            let epoch = epoch.parse::<u64>().map_err(|_| bad(line))?;
            if flags.split(',').any(|f| f == "myself") {
                me = Some((*id).to_owned());
            }
            // A slot being moved (`[slot->-id]`, `[slot-<-id]`) is not owned.
            let slots = fields
                .iter()
                .skip(8)
                .filter(|s| !s.starts_with('['))
                .map(|s| (*s).to_owned())
                .collect();
            nodes.insert((*id).to_owned(), (epoch, slots));
        }
        let me = me.ok_or_else(|| io::Error::other("CLUSTER NODES without myself"))?;
        Ok(View { me, nodes })
    }

    /// The config epoch of the node whose view this is.
    pub(super) fn own_epoch(&self) -> u64 {
        self.nodes.get(&self.me).map_or(0, |(epoch, _)| *epoch)
    }
}

/// Whether every node sees the same config epoch and slots of every node,
/// and no two nodes share a config epoch: then a node that takes a slot
/// over gives itself a config epoch above every other node's, and nothing
/// an old owner says can take the slot back.
pub(super) fn agreed(views: &[View]) -> bool {
    let Some(first) = views.first() else {
        return true;
    };
    let epochs: BTreeSet<u64> = first.nodes.values().map(|(epoch, _)| *epoch).collect();
    views.iter().all(|v| v.nodes == first.nodes) && epochs.len() == first.nodes.len()
}

//! Key and channel names.
//!
//! Every key of a scope carries the hash tag `{prefix:scope}`, so a scope
//! lives on one Redis Cluster slot and its scripts may touch all its keys:
//!
//! - `{prefix:scope}:meta`: the scope's epoch and latest instant;
//! - `{prefix:scope}:<algo>:<dimension>:<window µs>`: one limit's state,
//!   and for a sliding window `...:log`, its slot log (a list). The
//!   limit's amount (and a bucket's burst and tick) is not in the key (it
//!   is passed by the caller), its algorithm, dimension and window are:
//!   replicas with different windows never read each other's state, and
//!   a reload that changes a window seeds the new key (`carry.rs`);
//! - `...:pend` and `...:pendx`: the limit's pending holds (id → stamp and
//!   amount) and their expiry instants (a sorted set). Kept per limit, so
//!   whichever script touches a limit gives back its expired holds, even
//!   when replicas configure different sets of limits;
//! - `{prefix:scope}:op:<id>`: the marker of one operation that changed
//!   the scope, holding its answer (SPEC DQ-6), kept a few minutes.
//!
//! Notices that quota came back go to `prefix:changes:scope`.

use tollgate::quota::OpId;

use crate::limits::LimitParams;

/// The names of one scope.
#[derive(Debug, Clone)]
pub(crate) struct ScopeKeys {
    /// The meta key first, then four per limit in configuration order: its
    /// state, its slot log (written by sliding windows only), its pending
    /// holds and their expiry instants.
    pub(crate) keys: Vec<String>,
    pub(crate) channel: String,
    /// `{prefix:scope}`.
    tag: String,
}

impl ScopeKeys {
    pub(crate) fn new(prefix: &str, scope: &str, limits: &[LimitParams]) -> Self {
        let tag = format!("{{{prefix}:{scope}}}");
        let mut keys = Vec::with_capacity(4 * limits.len() + 1);
        keys.push(format!("{tag}:meta"));
        for l in limits {
            let key = format!("{tag}:{}", l.key_suffix());
            keys.push(format!("{key}:log"));
            keys.push(format!("{key}:pend"));
            keys.push(format!("{key}:pendx"));
            keys.insert(keys.len() - 3, key);
        }
        ScopeKeys {
            keys,
            channel: format!("{}{scope}", channel_prefix(prefix)),
            tag,
        }
    }

    /// The marker key of operation `op` (SPEC DQ-6).
    pub(crate) fn marker(&self, op: OpId) -> String {
        format!("{}:op:{op}", self.tag)
    }
}

/// What every channel of `prefix` starts with.
pub(crate) fn channel_prefix(prefix: &str) -> String {
    format!("{prefix}:changes:")
}

/// The pattern matching every channel of `prefix` (glob characters in
/// the prefix escaped).
pub(crate) fn channel_pattern(prefix: &str) -> String {
    let mut out = String::with_capacity(prefix.len() + 10);
    for c in channel_prefix(prefix).chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
    out.push('*');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The hash tag Redis Cluster hashes `key` by: what lies between its
    /// first `{` and the first `}` after it, if not empty.
    fn hash_tag(key: &str) -> Option<&str> {
        let open = key.find('{')?;
        let close = key[open + 1..].find('}')? + open + 1;
        (close > open + 1).then(|| &key[open + 1..close])
    }

    // proves: DQ-5, DQ-7 (every key a script of a scope with limits
    // touches (meta, each limit's state, log, holds and their expiries,
    // an operation's marker) hashes by the one tag of its prefix and
    // scope, so the scope lives on one Cluster slot)
    #[test]
    fn keys_share_the_scope_hash_tag() {
        use std::time::Duration;
        use tollgate::config::{Algorithm, ScopeConfig};

        for algorithm in [
            Algorithm::SlidingWindow,
            Algorithm::TokenBucket { burst: None },
            Algorithm::FixedWindow,
        ] {
            let scope = ScopeConfig::new("s")
                .algorithm(algorithm)
                .requests(10, Duration::from_secs(60))
                .tokens(1_000, Duration::from_secs(60))
                .input_tokens(800, Duration::from_secs(3_600));
            let mut local =
                tollgate::quota::LocalQuota::new(&scope, tollgate::clock::Instant::now());
            let (limits, _) = LimitParams::of(&scope, &mut local);
            let keys = ScopeKeys::new("p", "s", &limits);
            assert_eq!(keys.keys.len(), 1 + 4 * 3);
            assert_eq!(keys.keys[0], "{p:s}:meta");
            let mut all = keys.keys.clone();
            all.push(keys.marker(OpId::new()));
            for key in &all {
                assert_eq!(hash_tag(key), Some("p:s"), "{key}");
            }
            let mut unique = all.clone();
            unique.sort();
            unique.dedup();
            assert_eq!(unique.len(), all.len(), "{all:?}");
        }
        let keys = ScopeKeys::new("p", "s", &[]);
        assert_eq!(keys.channel, "p:changes:s");
        assert_eq!(channel_pattern("a*b"), "a\\*b:changes:*");
        // A brace in a scope's name leaves every key of it on one tag.
        let odd = ScopeKeys::new("p", "a}b", &[]);
        assert_eq!(hash_tag(&odd.keys[0]), hash_tag(&odd.marker(OpId::new())));
    }
}

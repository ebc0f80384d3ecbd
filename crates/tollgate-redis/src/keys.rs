//! Key and channel names.
//!
//! Every key of a scope carries the hash tag `{prefix:scope}`, so a scope
//! lives on one Redis Cluster slot and its scripts may touch all its keys:
//!
//! - `{prefix:scope}:meta`: the scope's epoch and latest instant;
//! - `{prefix:scope}:<algo>:<dimension>:<window µs>[:<tick>]`: one limit's
//!   state, and for a sliding window `...:log`, its slot log (a list). The
//!   limit's amount is not in the key (it is passed by the caller), its
//!   algorithm, dimension and window are: replicas with different
//!   configurations never read each other's state;
//! - `...:pend` and `...:pendx`: the limit's pending holds (id → stamp and
//!   amount) and their expiry instants (a sorted set). Kept per limit, so
//!   whichever script touches a limit gives back its expired holds, even
//!   when replicas configure different sets of limits.
//!
//! Notices that quota came back go to `prefix:changes:scope`.

use crate::limits::LimitParams;

/// The names of one scope.
#[derive(Debug, Clone)]
pub(crate) struct ScopeKeys {
    /// The meta key first, then four per limit in configuration order: its
    /// state, its slot log (written by sliding windows only), its pending
    /// holds and their expiry instants.
    pub(crate) keys: Vec<String>,
    pub(crate) channel: String,
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
        }
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

    // proves: DQ-5 (every key of a scope shares one hash tag)
    #[test]
    fn keys_share_the_scope_hash_tag() {
        let keys = ScopeKeys::new("p", "s", &[]);
        assert_eq!(keys.keys, vec!["{p:s}:meta".to_owned()]);
        assert_eq!(keys.channel, "p:changes:s");
        assert_eq!(channel_pattern("a*b"), "a\\*b:changes:*");
    }
}

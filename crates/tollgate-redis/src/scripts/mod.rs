//! The Lua scripts, one per operation, each prefixed by the shared
//! arithmetic (`common.lua`). Loaded once per server and called with
//! EVALSHA; `redis::Script` loads a script again when the server answers
//! NOSCRIPT (after a restart or `SCRIPT FLUSH`).

use redis::Script;

const COMMON: &str = include_str!("common.lua");

/// One operation of the store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Op {
    Reserve,
    Lease,
    Refund,
    Reconcile,
    Release,
    Recount,
    Snapshot,
}

impl Op {
    const ALL: [Op; 7] = [
        Op::Reserve,
        Op::Lease,
        Op::Refund,
        Op::Reconcile,
        Op::Release,
        Op::Recount,
        Op::Snapshot,
    ];

    fn body(self) -> &'static str {
        match self {
            Op::Reserve => include_str!("reserve.lua"),
            Op::Lease => include_str!("lease.lua"),
            Op::Refund => include_str!("refund.lua"),
            Op::Reconcile => include_str!("reconcile.lua"),
            Op::Release => include_str!("release.lua"),
            Op::Recount => include_str!("recount.lua"),
            Op::Snapshot => include_str!("snapshot.lua"),
        }
    }
}

/// Every script, with its SHA1 computed once.
#[derive(Debug)]
pub(crate) struct Scripts {
    scripts: [Script; 7],
}

impl Scripts {
    pub(crate) fn new() -> Self {
        Scripts {
            scripts: Op::ALL.map(|op| Script::new(&format!("{COMMON}\n{}", op.body()))),
        }
    }

    pub(crate) fn get(&self, op: Op) -> &Script {
        // `ALL` lists every variant in declaration order.
        &self.scripts[op as usize]
    }
}

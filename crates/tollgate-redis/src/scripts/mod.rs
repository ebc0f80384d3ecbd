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
    Forget,
    Refund,
    Reconcile,
    Release,
    Recount,
    Snapshot,
    Observe,
    Cool,
    Debt,
}

impl Op {
    const ALL: [Op; 11] = [
        Op::Reserve,
        Op::Lease,
        Op::Forget,
        Op::Refund,
        Op::Reconcile,
        Op::Release,
        Op::Recount,
        Op::Snapshot,
        Op::Observe,
        Op::Cool,
        Op::Debt,
    ];

    /// Whether the script reads the clock and so seeds every limit whose
    /// state is missing (`common.lua`, Seeds).
    pub(crate) fn seeds(self) -> bool {
        !matches!(self, Op::Reconcile | Op::Release | Op::Cool)
    }

    fn body(self) -> &'static str {
        match self {
            Op::Reserve => include_str!("reserve.lua"),
            Op::Lease => include_str!("lease.lua"),
            Op::Forget => include_str!("forget.lua"),
            Op::Refund => include_str!("refund.lua"),
            Op::Reconcile => include_str!("reconcile.lua"),
            Op::Release => include_str!("release.lua"),
            Op::Recount => include_str!("recount.lua"),
            Op::Snapshot => include_str!("snapshot.lua"),
            Op::Observe => include_str!("observe.lua"),
            Op::Cool => include_str!("cool.lua"),
            Op::Debt => include_str!("debt.lua"),
        }
    }
}

/// Every script, with its SHA1 computed once.
#[derive(Debug)]
pub(crate) struct Scripts {
    scripts: [Script; 11],
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

    /// Loads every script into the server behind `conn` (SCRIPT LOAD).
    ///
    /// EVALSHA reloads a script the server does not know (NOSCRIPT) and
    /// runs it again, but only while its caller still waits: an operation
    /// sent to a server that has just restarted, whose caller gave up
    /// before the answer (a deadline, a stall), would never run. So every
    /// script is loaded whenever a connection to the server is (re)made.
    pub(crate) async fn load_all<C>(&self, conn: &mut C) -> redis::RedisResult<()>
    where
        C: redis::aio::ConnectionLike,
    {
        for script in &self.scripts {
            script.load_async(conn).await?;
        }
        Ok(())
    }
}

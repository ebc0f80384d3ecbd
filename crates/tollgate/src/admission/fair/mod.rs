//! Fair share of a scope between flows (SPEC §15).
//!
//! # Implementation notes
//!
//! A scope's waiting calls are grouped into *flows* (tenant, class): each
//! flow is a FIFO line in one shared store of nodes (`queue.rs`), so a
//! waiting call costs the same memory whatever the number of flows. The
//! scheduler only decides which waiting call is the *head*; whether and
//! when the head fits stays the quota arithmetic of `quota/` (FAIR-1).
//!
//! * **Choosing the head** ([`FairQueue::head`]): (1) a backlogged class
//!   below the top that received less than its `min_share` of the cost the
//!   scope admitted over its share window (`share.rs`, bucketed) goes
//!   first, the highest such; else (2) the highest backlogged class;
//!   (3) within it, the flow with the smallest virtual counter (ties: the
//!   one backlogged first); (4) that flow's first call (FAIR-2, FAIR-3).
//! * **Holding the line.** Once chosen, a call stays its class's chosen
//!   call until it is granted or leaves: no call of its own or a lower
//!   class is chosen before it. A call of a higher class arriving takes the
//!   head's turn (the chosen call keeps its place in its class). So one
//!   head arms one timer at its exact instant, as with FIFO.
//! * **Counters** (FAIR-3): a grant adds cost / weight to its flow's
//!   counter (scaled integers, `u128`); settlement adds (actual −
//!   estimate) / weight, and a reservation given back whole takes its
//!   cost off again. A flow that becomes backlogged starts at no less than
//!   the smallest counter of its class's backlogged flows (or the class's
//!   virtual time, the counter of its last grant, when none is): idle time
//!   banks no credit. A flow without waiting calls is forgotten once its
//!   counter is at or below that floor (it would be lifted there anyway),
//!   and every idle flow is forgotten when nobody waits, so memory follows
//!   the waiting flows.
//! * **Fast path.** An arrival reserves at once only when nobody waits.
//!   Such a grant charges no flow (nobody was waiting to be treated fairly
//!   against it) but counts in its class's admitted cost for `min_share`.
//!
//! Why it is fair and starvation-free is written out in docs/design.md
//! ("Fair share between flows").

mod flows;
mod share;
mod turn;

use crate::quota::{Actual, Demand};

/// How a grant's flow was charged (SPEC FAIR-3, GW-15): under which cost
/// model and at which weight. A reload that changes what a grant costs (a
/// token limit added or removed) starts a new model: every counter in the
/// old unit is set back to zero, and a correction of a grant charged under
/// another model is skipped, since its charge went with the old counters.
/// A correction divides by the weight the grant was charged at, not the
/// flow's weight now (a reload may have changed it): it never takes off
/// more than the grant added, nor adds debt at another rate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Charged {
    /// The cost model.
    pub(crate) model: u32,
    /// The flow's weight when it was charged; 0 when no flow was charged
    /// (then nothing is corrected).
    pub(crate) weight: u32,
}

/// What a grant costs its flow (SPEC FAIR-3): its token estimate (at least
/// 1) in a scope with a token limit, 1 per request otherwise.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Costs {
    /// The scope limits tokens.
    pub(crate) tokens: bool,
}

impl Costs {
    /// The cost of a grant of `tokens` tokens.
    #[inline]
    pub(crate) fn of(self, tokens: u64) -> u64 {
        if self.tokens { tokens.max(1) } else { 1 }
    }

    /// The (estimated, actual) cost of a charged grant of `demand` that
    /// used `actual` (`None`: given back whole); `None` when nothing
    /// changes (requests are never reconciled).
    pub(crate) fn correction(self, demand: &Demand, actual: Option<&Actual>) -> Option<(u64, u64)> {
        let estimated = self.of(demand.tokens());
        match actual {
            None => Some((estimated, 0)),
            Some(_) if !self.tokens => None,
            Some(a) => Some((estimated, self.of(a.tokens))),
        }
    }
}

pub(crate) use flows::{FairQueue, FlowView};
pub(crate) use turn::{FairTurn, TurnDone, room_for};

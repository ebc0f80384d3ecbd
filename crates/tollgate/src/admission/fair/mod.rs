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
//!   scope admitted over its shortest window (`share.rs`, bucketed) goes
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

pub(crate) use flows::{FairQueue, FlowView};
pub(crate) use turn::{FairTurn, TurnDone, room_for};

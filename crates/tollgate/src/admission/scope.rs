//! One quota scope inside the controller: its store, its waiting calls and
//! cooldown.
//!
//! # Implementation notes
//!
//! Everything below is guarded by the scope's one mutex; no field is touched
//! without it.
//!
//! * The waiting calls are grouped by flow (SPEC FAIR-1, `fair/`): FIFO
//!   within a flow, and the fair scheduler chooses which call is the
//!   *head* (ADM-4). A scope used by one flow is plain FIFO. With the
//!   `reject` overflow policy at most `capacity` calls wait, shared between
//!   flows (FAIR-10); with `wait`, calls beyond `capacity` count as waiting
//!   for a slot (ADM-5). An arrival takes the fast path (reserve at once)
//!   only when nobody waits, so no call overtakes a waiting one of its own
//!   or a higher class, whatever their sizes.
//! * Whoever changes the scope's state *drains* it under the lock: grants go
//!   to the head while its demand fits, each granted waiter is woken, and
//!   the first head that does not fit holds the line with an exact
//!   `ready_at` (SPEC Q-4) until it is granted, leaves, or a call of a
//!   higher class arrives; with no `ready_at` it may still have a
//!   `recheck_at` (a learning scope's provisional stand-in frees then,
//!   unless the provider answers first), a timer but never a verdict
//!   . Only the head arms a timer; every other waiter
//!   sleeps until woken or until its own deadline, so a refill never wakes
//!   more than the calls it admits (no thundering herd).
//! * A waiter whose demand can never fit (a limit went down under it: SPEC
//!   ) is unlinked and woken with `Outcome::Unfit`, by the drain
//!   when it becomes the head with no instant, and by `fail_unfit` for
//!   every flow's line when a learned limit is confirmed lower: no head
//!   waits with no timer until its deadline.
//! * A granted reservation is *pending* until its call has its concurrency
//!   permit and is leased; the waiter keeps its node (unlinked) until it
//!   collects the grant, so a cancelled waiter can always give it back.

use parking_lot::Mutex;
use std::sync::Arc;
use std::task::Waker;

use super::fair::{Charged, Costs, FairQueue, room_for};
use super::pool_set::PoolSet;
use super::shared::SharedScope;
use crate::call::ScopeId;
use crate::clock::Instant;
use crate::config::ScopeConfig;
use crate::error::{AdmissionError, ExceedsLimit};
use crate::flow::{Flow, FlowKey};
use crate::quota::{Actual, Demand, Hold, LimitedBy, QuotaStore, Reservation};

/// Queue lengths up to which a stale projection is rebuilt for an early
/// verdict (SPEC Q-11); longer queues fall back to judging the demand alone,
/// which is still a valid lower bound.
pub(super) const REBUILD_LIMIT: usize = 256;
/// Steps a projection may take per demand before it gives up.
const PROJECTION_STEPS: usize = 1024;

/// A granted call's concurrency permit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PermitSlot {
    /// Held (or no concurrency limit).
    Held,
    /// Queued for a permit under this key, in grant order.
    Queued(u32),
}

impl PermitSlot {
    /// Permit queue keys fit in `u32`: the queue refuses to grow past it.
    pub(crate) fn queued(key: usize) -> Self {
        PermitSlot::Queued(u32::try_from(key).unwrap_or(u32::MAX))
    }
}

/// What a queued waiter learns.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Outcome {
    /// Still waiting.
    Waiting,
    /// Granted a pending reservation of its demand at `stamp`, with its
    /// place for a concurrency permit.
    Granted {
        stamp: Instant,
        tick: u64,
        generation: u64,
        order: u64,
        permit: PermitSlot,
        /// The cost model its flow was charged under.
        charged: Charged,
    },
    /// The controller closed.
    Closed,
    /// Granted, but the pool's waiting line was full (SPEC POOL-3): the
    /// reservation was refunded.
    PoolFull,
    /// Refused to make room for a call of a flow holding less than its
    /// share of a full queue (SPEC FAIR-10, overflow policy `reject`).
    Displaced,
    /// A limit went down while it waited and its demand can never fit now
    /// (SPEC ); it held no quota.
    Unfit(ExceedsLimit),
    /// A reconfiguration made the scope need what the call lacks (a token
    /// estimate, a price: SPEC Q-3, BUD-1); it held no quota.
    Lacking(Needs),
}

/// What a scope needs every call to bring (SPEC Q-3: a token estimate
/// where it limits tokens; BUD-1: a price where it has a budget), or what
/// a call lacks of them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Needs {
    pub(crate) estimate: bool,
    pub(crate) price: bool,
}

impl Needs {
    /// What `call` lacks.
    pub(crate) fn lacked_by(call: &crate::Call) -> Self {
        Needs {
            estimate: call.estimate.is_none(),
            price: call.price.is_none(),
        }
    }

    /// What a call lacking `self` misses of what a scope needing `needs`
    /// asks for; `None` when nothing.
    pub(crate) fn missing(self, needs: Needs) -> Option<Needs> {
        let m = Needs {
            estimate: self.estimate && needs.estimate,
            price: self.price && needs.price,
        };
        (m != Needs::default()).then_some(m)
    }

    /// The refusal of a call missing `self` in `scope`.
    pub(crate) fn error(self, scope: ScopeId) -> AdmissionError {
        if self.estimate {
            AdmissionError::TokenEstimateRequired { scope }
        } else {
            AdmissionError::PriceRequired { scope }
        }
    }
}

/// A granted reservation and the cooldown generation it was granted under.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Grant {
    pub(crate) reservation: Reservation,
    pub(crate) generation: u64,
    /// Its place in the scope's grant order.
    pub(crate) order: u64,
    /// The flow it was granted to.
    pub(crate) flow: FlowKey,
    /// The cost model the grant was charged to the flow's counter under
    /// (FAIR-3): every grant to a waiting call is charged; a fast-path
    /// grant, made while nobody waits, is not (`None`).
    pub(crate) charged: Option<Charged>,
}

#[derive(Debug)]
pub(crate) struct Waiter {
    /// The demand's input and output tokens and its cost (every attempt
    /// takes one request unit): kept small, one per queued call.
    pub(crate) input: u64,
    pub(crate) output: u64,
    pub(crate) cost: u64,
    /// The pool it takes a permit from once granted.
    pub(crate) pool: Option<u32>,
    /// Its flow (its line is found by it even after the grant unlinked it).
    pub(crate) flow: FlowKey,
    pub(crate) waker: Option<Waker>,
    pub(crate) outcome: Outcome,
    pub(crate) limited_by: LimitedBy,
    pub(crate) waited_for_cooldown: bool,
    /// What the call lacks (a reconfiguration may make the scope need it).
    pub(crate) lacks: Needs,
}

impl Waiter {
    pub(crate) fn new(demand: Demand, pool: Option<u32>, flow: FlowKey, lacks: Needs) -> Self {
        Waiter {
            input: demand.input,
            output: demand.output,
            cost: demand.cost,
            pool,
            flow,
            waker: None,
            outcome: Outcome::Waiting,
            limited_by: LimitedBy::default(),
            waited_for_cooldown: false,
            lacks,
        }
    }

    /// The grant this waiter collects, if any.
    pub(crate) fn grant(&self) -> Option<(Grant, PermitSlot)> {
        match self.outcome {
            Outcome::Granted {
                stamp,
                tick,
                generation,
                order,
                permit,
                charged,
            } => Some((
                Grant {
                    reservation: Reservation {
                        stamp,
                        tick,
                        demand: self.demand(),
                        hold: Hold::Pending,
                        seq: 0,
                    },
                    generation,
                    order,
                    flow: self.flow,
                    charged: Some(charged),
                },
                permit,
            )),
            _ => None,
        }
    }

    pub(crate) fn demand(&self) -> Demand {
        Demand::new(self.input, self.output).with_cost(self.cost)
    }

    pub(crate) fn wake(&mut self) {
        if let Some(w) = self.waker.take() {
            w.wake();
        }
    }
}

/// Coordinated cooldown of a scope (SPEC CD-1, CD-2).
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct Cooldown {
    pub(crate) until: Option<Instant>,
    /// Bumped each time a cooldown starts.
    pub(crate) generation: u64,
    /// Consecutive hintless cooldowns (the backoff exponent).
    pub(crate) strikes: u32,
}

impl Cooldown {
    pub(crate) fn active(&self, now: Instant) -> Option<Instant> {
        self.until.filter(|u| *u > now)
    }
}

/// Projection of when queued demands will fit (SPEC Q-11).
#[derive(Debug, Default)]
struct Projection {
    /// The flow it was made for.
    flow: Option<FlowKey>,
    /// The store with every demand that certainly goes before the next call
    /// of `flow` committed at its projected instant.
    shadow: Option<Box<dyn QuotaStore>>,
    /// The projected admission of the last queued demand.
    tail: Option<Instant>,
}

/// Counters kept per scope for the snapshot (SPEC OBS-1, issue of tokens).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct ScopeCounters {
    /// Attempts leased.
    pub admitted: u64,
    /// Attempts preempted by a cooldown before they started (CD-3).
    pub preempted: u64,
    /// Reservations refunded in full before their lease.
    pub refunded_reservations: u64,
    /// Tokens (input plus output) reserved by leased attempts; the token
    /// counters count totals whatever the scope's token dimensions.
    pub tokens_reserved: u64,
    /// Tokens providers reported for settled attempts (totals).
    pub tokens_reported: u64,
    /// Tokens given back by settlements below the estimate (totals).
    pub tokens_refunded: u64,
    /// Tokens charged beyond the estimate (totals).
    pub tokens_debt: u64,
    /// Settlements with unknown usage (the estimate was kept).
    pub unknown_usage: u64,
    /// Settlements with known zero usage.
    pub known_zero: u64,
    /// Cooldowns started by 429s.
    pub cooldowns: u64,
    /// 429s from attempts older than the running cooldown (CD-2).
    pub stale_rate_limits: u64,
    /// Refused attempts whose charge was given back.
    pub refusals_released: u64,
    /// Request units taken out because the provider had less left.
    pub gap_requests: u64,
    /// Tokens taken out because the provider had less left, from
    /// limits of any token dimension.
    pub gap_tokens: u64,
    /// Limits adopted or changed from the provider's advertisement.
    pub limits_adopted: u64,
    /// Cost admitted per priority class since the start (SPEC FAIR-8;
    /// indexed by [`Priority::index`](crate::Priority::index)): each grant's
    /// token estimate (at least 1), or 1 per request in a scope without
    /// token limits.
    pub served_cost: [u64; 3],
    /// Operations on the scope's shared store that failed or timed out
    /// (SPEC DQ-3, DQ-5; always 0 for an in-process scope).
    pub store_errors: u64,
    /// Admissions refused because the shared store was unavailable and the
    /// scope fails closed (DQ-3).
    pub store_unavailable: u64,
    /// Reservations taken from the local fallback share while the shared
    /// store was unavailable (`fail_open_local`, DQ-3).
    pub fallback_admissions: u64,
    /// Settlements or refunds that did not reach the shared store; their
    /// amounts stay counted there (never over a quota).
    pub settlements_failed: u64,
    /// Pending holds the shared store had let expire before their call
    /// leased them (the call reserved again; DQ-5).
    pub holds_expired: u64,
    /// Micro-dollars reserved by leased attempts (their worst cases, SPEC
    /// BUD-2).
    pub cost_reserved: u64,
    /// Micro-dollars of priced usage of settled attempts.
    pub cost_reported: u64,
    /// Micro-dollars given back: settlements priced below the
    /// reservation, and refusals (never billed, SPEC BUD-5).
    pub cost_refunded: u64,
    /// Micro-dollars charged beyond the reservation (debt).
    pub cost_debt: u64,
}

impl ScopeCounters {
    /// An attempt was leased with `demand`.
    pub(crate) fn leased(&mut self, demand: &Demand) {
        self.admitted += 1;
        self.tokens_reserved = self.tokens_reserved.saturating_add(demand.tokens());
        self.cost_reserved = self.cost_reserved.saturating_add(demand.cost);
    }

    /// An attempt leased with `demand` was refused by the provider: its
    /// cost comes back (SPEC BUD-5); `released` when requests or tokens
    /// come back too (SPEC Q-16).
    pub(crate) fn refused(&mut self, demand: &Demand, released: bool) {
        self.cost_refunded = self.cost_refunded.saturating_add(demand.cost);
        if released {
            self.refusals_released += 1;
        }
    }

    pub(crate) fn settle(&mut self, s: &crate::usage::Settlement) {
        if let Some(c) = s.cost.reported {
            self.cost_reported = self.cost_reported.saturating_add(c);
            self.cost_refunded = self.cost_refunded.saturating_add(s.cost.refunded);
            self.cost_debt = self.cost_debt.saturating_add(s.cost.debt);
        }
        match s.reported {
            None => self.unknown_usage += 1,
            Some(r) => {
                self.tokens_reported = self.tokens_reported.saturating_add(r);
                self.tokens_refunded = self.tokens_refunded.saturating_add(s.refunded);
                self.tokens_debt = self.tokens_debt.saturating_add(s.debt);
                if r == 0 {
                    self.known_zero += 1;
                }
            }
        }
    }
}

#[derive(Debug)]
pub(crate) struct ScopeState {
    pub(crate) store: Box<dyn QuotaStore>,
    pub(crate) queue: FairQueue<Waiter>,
    /// What every call must bring, as of the last (re)configuration: a
    /// call that entered before it changed is judged again under the lock.
    pub(crate) needs: Needs,
    /// What a grant costs its flow.
    costs: Costs,
    pub(crate) cooldown: Cooldown,
    /// When the head's demand may fit (`None`: when a pending reservation is
    /// leased or refunded).
    pub(crate) ready_at: Option<Instant>,
    /// When the head looks again although `ready_at` tells no instant: a
    /// provisional stand-in's unit ages out then (SPEC; see
    /// `QuotaStore::recheck_at`). A wake-up only: never an early verdict
    /// or a retry hint (SPEC Q-11).
    pub(crate) recheck_at: Option<Instant>,
    /// The instant the head last armed its timer for.
    pub(crate) head_armed: Option<Instant>,
    /// Why the queue last had to wait for quota (reported to waiters that
    /// waited behind the head, SPEC OBS-4).
    last_limited: LimitedBy,
    /// Granted reservations not yet leased or refunded.
    pub(crate) pending: usize,
    /// Arrivals so far (the next arrival's ticket).
    pub(crate) tickets: u64,
    /// Grants so far (the next grant's order).
    pub(crate) grants: u64,
    pub(crate) closed: bool,
    pub(crate) counters: ScopeCounters,
    projection: Projection,
    /// The controller's concurrency pools, joined in grant order.
    pub(crate) pools: Arc<PoolSet>,
}

/// See the module documentation.
#[derive(Debug)]
pub(crate) struct Scope {
    pub(crate) id: ScopeId,
    pub(crate) name: Arc<str>,
    /// Whether a call must bring a token estimate (the scope limits
    /// tokens); changed by a reconfiguration.
    pub(crate) needs_estimate: std::sync::atomic::AtomicBool,
    /// Whether a call must bring a price (the scope has a cost limit, SPEC
    /// BUD-2); changed by a reconfiguration.
    pub(crate) needs_price: std::sync::atomic::AtomicBool,
    /// Still waiting for the provider's first answer to learn its limits
    /// (SPEC Q-14).
    pub(crate) learning: std::sync::atomic::AtomicBool,
    /// Queued calls it holds (ADM-5); changed by a reconfiguration.
    pub(crate) capacity: std::sync::atomic::AtomicUsize,
    /// Removed by a reconfiguration: no longer found by name; whoever
    /// still holds its ordinal finishes there (`reconfigure.rs`).
    pub(crate) retired: std::sync::atomic::AtomicBool,
    pub(crate) state: Mutex<ScopeState>,
    /// The shared store keeping this scope's quota, if any (SPEC DQ-1);
    /// `state.store` is then its local fallback share.
    pub(crate) shared: Option<Arc<SharedScope>>,
}

impl Scope {
    pub(crate) fn new(
        id: ScopeId,
        config: &ScopeConfig,
        capacity: usize,
        store: Box<dyn QuotaStore>,
        pools: Arc<PoolSet>,
    ) -> Self {
        Scope {
            id,
            name: Arc::from(config.name()),
            needs_estimate: std::sync::atomic::AtomicBool::new(config.needs_estimate()),
            needs_price: std::sync::atomic::AtomicBool::new(config.has_cost_limit()),
            learning: std::sync::atomic::AtomicBool::new(config.learns().is_some()),
            capacity: std::sync::atomic::AtomicUsize::new(capacity),
            retired: std::sync::atomic::AtomicBool::new(false),
            state: Mutex::new(ScopeState {
                store,
                needs: Needs {
                    estimate: config.needs_estimate(),
                    price: config.has_cost_limit(),
                },
                queue: FairQueue::new(config.min_shares(), config.share_window()),
                costs: Costs {
                    tokens: config.has_token_limit(),
                },
                cooldown: Cooldown::default(),
                ready_at: None,
                recheck_at: None,
                head_armed: None,
                last_limited: LimitedBy::default(),
                pending: 0,
                tickets: 0,
                grants: 0,
                closed: false,
                counters: ScopeCounters::default(),
                projection: Projection::default(),
                pools,
            }),
            shared: None,
        }
    }

    /// Queued calls it holds (ADM-5).
    pub(crate) fn capacity(&self) -> usize {
        self.capacity.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Whether a call must bring a token estimate.
    pub(crate) fn needs_estimate(&self) -> bool {
        self.needs_estimate
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Whether a call must bring a price.
    pub(crate) fn needs_price(&self) -> bool {
        self.needs_price.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Whether a reconfiguration removed it.
    pub(crate) fn is_retired(&self) -> bool {
        self.retired.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Keeps the scope's quota in `shared`.
    pub(crate) fn with_shared(mut self, shared: SharedScope) -> Self {
        self.shared = Some(Arc::new(shared));
        self
    }
}

impl ScopeState {
    /// Queued calls (those holding one of the `capacity` slots).
    pub(crate) fn queued(&self, capacity: usize) -> usize {
        self.queue.len().min(capacity)
    }

    /// What a grant of `demand` costs its flow (SPEC FAIR-3): its token
    /// estimate (at least 1), or 1 in a scope without token limits.
    #[inline]
    pub(crate) fn cost(&self, tokens: u64) -> u64 {
        self.costs.of(tokens)
    }

    /// Counts a fast-path grant (nobody waits, so no flow is charged) in
    /// its class's admitted cost (FAIR-2).
    #[inline]
    pub(crate) fn record_fast(&mut self, flow: Flow, demand: &Demand, now: Instant) {
        let cost = self.cost(demand.tokens());
        self.queue.share.add(flow.priority(), cost, now);
    }

    /// Corrects the counter of `flow`, charged for `demand`, by what the
    /// grant really cost (FAIR-3): `actual` usage, `None` for a reservation
    /// given back whole.
    pub(crate) fn correct(
        &mut self,
        flow: FlowKey,
        charged: Charged,
        demand: &Demand,
        actual: Option<&Actual>,
    ) {
        // Nobody waits: no flow is kept, nothing to correct.
        if self.queue.is_empty() {
            return;
        }
        if let Some((estimated, actual)) = self.costs.correction(demand, actual) {
            self.queue.correct(flow, charged, estimated, actual);
        }
    }

    /// Takes the scheduler settings of a scope's new configuration (SPEC
    /// GW-15, FAIR-2, FAIR-3): `min_share` per class, its window and what a
    /// grant costs. Lines and flow counters stay, unless what a grant
    /// costs changes: then the counters start again in the new unit (see
    /// [`Charged`]).
    pub(crate) fn reconfigure_flows(&mut self, config: &ScopeConfig) {
        self.queue
            .reconfigure(config.min_shares(), config.share_window());
        let costs = Costs {
            tokens: config.has_token_limit(),
        };
        if costs != self.costs {
            self.costs = costs;
            self.queue.new_model();
        }
    }

    /// Grants the head for as long as its demand fits; arms the next head.
    pub(crate) fn drain(&mut self, now: Instant) {
        loop {
            let Some(key) = self.queue.head(now) else {
                self.ready_at = None;
                self.recheck_at = None;
                self.projection = Projection::default();
                return;
            };
            if let Some(until) = self.cooldown.active(now) {
                self.arm_head(key, Some(until), None, LimitedBy::default(), true);
                return;
            }
            let Some((demand, pool, flow)) =
                self.queue.get(key).map(|w| (w.demand(), w.pool, w.flow))
            else {
                return;
            };
            match self.store.reserve(&demand, now, Hold::Pending) {
                Ok(reservation) => {
                    let cost = self.cost(demand.tokens());
                    let charged = self.queue.granted(key, cost);
                    self.head_armed = None;
                    // Join the permit queue now, under the scope lock, so
                    // permits follow the grant order (SPEC ADM-4).
                    let permit = match self.pools.register(pool, flow.holder()) {
                        Ok(None) => Ok(PermitSlot::Held),
                        Ok(Some(k)) => Ok(PermitSlot::queued(k)),
                        Err(e) => Err(e),
                    };
                    let outcome = match permit {
                        Ok(permit) => {
                            self.queue.share.add(flow.priority, cost, now);
                            self.pending += 1;
                            self.grants += 1;
                            Outcome::Granted {
                                stamp: reservation.stamp,
                                tick: reservation.tick,
                                generation: self.cooldown.generation,
                                order: self.grants - 1,
                                permit,
                                charged,
                            }
                        }
                        Err(e) => {
                            // Never admitted: given back whole, with
                            // its flow's charge, and the projection that
                            // counted it; its class was not served.
                            self.store.refund(&reservation, now);
                            self.queue.correct(flow, charged, cost, 0);
                            self.counters.refunded_reservations += 1;
                            self.invalidate_projection();
                            match e {
                                AdmissionError::PoolFull { .. } => Outcome::PoolFull,
                                _ => Outcome::Closed,
                            }
                        }
                    };
                    let last_limited = self.last_limited;
                    if let Some(w) = self.queue.get_mut(key) {
                        if w.limited_by == LimitedBy::default() {
                            w.limited_by = last_limited;
                        }
                        w.outcome = outcome;
                        w.wake();
                    }
                }
                Err(not_until) => {
                    // No instant: a pending lease decides, or a limit went
                    // down under the head and it can never fit.
                    if not_until.at.is_none()
                        && let Err(e) = self.store.check(&demand)
                    {
                        self.fail_waiter(key, Outcome::Unfit(e));
                        continue;
                    }
                    let recheck = match not_until.at {
                        None => self.store.recheck_at(&demand, now),
                        Some(_) => None,
                    };
                    let limited_by = not_until.limited_by;
                    self.arm_head(key, not_until.at, recheck, limited_by, false);
                    return;
                }
            }
        }
    }

    /// Makes `key` the head that waits until `at` (a lower bound, or
    /// `None`), looking again at `recheck` when `at` is `None` (see
    /// `recheck_at`); wakes it when its timer must change.
    fn arm_head(
        &mut self,
        key: usize,
        at: Option<Instant>,
        recheck: Option<Instant>,
        limited_by: LimitedBy,
        cooldown: bool,
    ) {
        self.ready_at = at;
        self.recheck_at = recheck;
        if !cooldown {
            self.last_limited = limited_by;
        }
        let changed = self.head_armed != at.or(recheck);
        if let Some(w) = self.queue.get_mut(key) {
            w.limited_by = w.limited_by.union(limited_by);
            w.waited_for_cooldown |= cooldown;
            if changed {
                w.wake();
            }
        }
    }

    /// Fails every queued call, of every flow, whose demand can no longer
    /// fit, whatever the wait (a limit went down: SPEC ), then
    /// drains, so the next
    /// waiter becomes the head with an exact wake-up. Waiters hold
    /// no quota, so nothing is refunded; each failed one is unlinked and
    /// woken, and collects its error (and frees its node) when it is
    /// polled, as a granted waiter collects its grant. Call after any
    /// change that makes a limit refuse more.
    pub(crate) fn fail_unfit(&mut self, now: Instant) {
        for key in self.queue.keys() {
            let Some(w) = self.queue.get(key) else {
                continue;
            };
            if let Some(missing) = w.lacks.missing(self.needs) {
                self.fail_waiter(key, Outcome::Lacking(missing));
            } else if let Err(e) = self.store.check(&w.demand()) {
                self.fail_waiter(key, Outcome::Unfit(e));
            }
        }
        self.drain(now);
    }

    /// Takes a waiter that can never be granted out of the queue and wakes
    /// it with `outcome`.
    fn fail_waiter(&mut self, key: usize, outcome: Outcome) {
        if self.queue.is_head(key) {
            self.head_armed = None;
        }
        self.queue.unlink(key);
        if let Some(w) = self.queue.get_mut(key) {
            w.outcome = outcome;
            w.wake();
        }
        self.invalidate_projection();
    }

    /// Gives a granted, never-leased reservation back (SPEC Q-9) and lets
    /// the queue use the room.
    pub(crate) fn refund_pending(&mut self, grant: &Grant, now: Instant) {
        self.store.refund(&grant.reservation, now);
        if let Some(charged) = grant.charged {
            self.correct(grant.flow, charged, &grant.reservation.demand, None);
        }
        self.pending = self.pending.saturating_sub(1);
        self.counters.refunded_reservations += 1;
        self.invalidate_projection();
        self.drain(now);
    }

    /// Gives back a granted call's permit or its place in the permit queue.
    pub(crate) fn return_permit(&self, pool: Option<u32>, permit: PermitSlot, flow: FlowKey) {
        match permit {
            PermitSlot::Held => self.pools.release(pool, flow.holder()),
            PermitSlot::Queued(key) => self.pools.cancel(pool, key as usize),
        }
    }

    /// A cooldown began: every queued call now waits for it (SPEC OBS-4).
    pub(crate) fn mark_cooldown(&mut self) {
        for key in self.queue.keys() {
            if let Some(w) = self.queue.get_mut(key) {
                w.waited_for_cooldown = true;
            }
        }
    }

    /// Something gave room back: projections made before are too late.
    #[inline]
    pub(crate) fn invalidate_projection(&mut self) {
        if self.projection.shadow.is_some() || self.projection.tail.is_some() {
            self.projection = Projection::default();
        }
    }

    /// Removes a waiter that gives up (deadline, cancellation), returning
    /// any grant it had not collected.
    pub(crate) fn abandon(&mut self, key: usize, now: Instant) {
        let was_head = self.queue.is_head(key);
        let grant = self
            .queue
            .get(key)
            .and_then(|w| w.grant().map(|g| (g, w.pool)));
        self.queue.remove(key);
        if let Some(((grant, permit), pool)) = grant {
            self.return_permit(pool, permit, grant.flow);
            self.refund_pending(&grant, now);
            return;
        }
        self.invalidate_projection();
        if was_head {
            self.head_armed = None;
            self.drain(now);
        }
    }

    /// The waiting call to refuse so that a call of `flow` may wait in a
    /// full queue (SPEC FAIR-10), or `None` when the arrival is refused.
    pub(crate) fn room_for(&self, flow: FlowKey, capacity: usize) -> Option<usize> {
        room_for(&self.queue, flow, capacity)
    }

    /// Refuses a waiting call to make room (FAIR-10).
    pub(crate) fn displace(&mut self, key: usize, now: Instant) {
        let was_head = self.queue.is_head(key);
        self.queue.unlink(key);
        if let Some(w) = self.queue.get_mut(key) {
            w.outcome = Outcome::Displaced;
            w.wake();
        }
        self.invalidate_projection();
        if was_head {
            self.head_armed = None;
            self.drain(now);
        }
    }

    /// The earliest instant at which `demand` of `flow` could be admitted
    /// behind the calls that certainly go before it (SPEC Q-11: the head if
    /// not of a lower class, the call chosen in its class and its own
    /// flow's line; with one flow, the whole queue), or `None` when it
    /// cannot be told. Call before linking the demand. `leaving`: a
    /// waiting call this demand pushes out of a full queue (FAIR-10), not
    /// counted ahead of it.
    pub(crate) fn project(
        &mut self,
        demand: &Demand,
        flow: FlowKey,
        now: Instant,
        leaving: Option<usize>,
    ) -> Option<Instant> {
        let start = self.cooldown.active(now).unwrap_or(now);
        if self.projection.shadow.is_none()
            || self.projection.flow != Some(flow)
            || leaving.is_some()
        {
            let mut shadow = self.store.project()?;
            let mut tail = start;
            match self.queue.ahead_of(flow, REBUILD_LIMIT) {
                Some(ahead) => {
                    for key in ahead.into_iter().filter(|k| Some(*k) != leaving) {
                        let w = self.queue.get(key)?;
                        tail = schedule(shadow.as_mut(), &w.demand(), tail)?;
                    }
                }
                // Judge the demand alone: a valid but looser lower bound.
                None => return schedule(shadow.as_mut(), demand, start),
            }
            self.projection = Projection {
                flow: Some(flow),
                shadow: Some(shadow),
                tail: Some(tail),
            };
        }
        let from = self.projection.tail.map_or(start, |t| t.max(start));
        let shadow = self.projection.shadow.as_mut()?;
        match schedule(shadow.as_mut(), demand, from) {
            Some(t) => {
                self.projection.tail = Some(t);
                Some(t)
            }
            None => {
                self.invalidate_projection();
                None
            }
        }
    }
}

/// Commits `demand` to a projected store at the first instant from `from`
/// at which it fits.
pub(super) fn schedule(
    shadow: &mut dyn QuotaStore,
    demand: &Demand,
    mut from: Instant,
) -> Option<Instant> {
    for _ in 0..PROJECTION_STEPS {
        match shadow.reserve(demand, from, Hold::Leased) {
            Ok(_) => return Some(from),
            Err(n) => match n.at {
                Some(t) if t > from => from = t,
                _ => return None,
            },
        }
    }
    None
}

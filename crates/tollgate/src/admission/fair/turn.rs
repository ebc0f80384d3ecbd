//! The turn of a scope kept in a shared store: one reservation in flight
//! at a time, handed out by the fair scheduler (SPEC FAIR-9, DQ-4).
//!
//! A call of this process holds the turn while it reserves (and while it
//! sleeps until the store's instant); when it gives the turn back, the
//! turn goes to the head chosen by the same rules as a local scope's
//! queue: `min_share`, class, virtual counter, FIFO within a flow. The
//! store stays exact across replicas (DQ-2): each replica only orders its
//! own waiters.
//!
//! The holder is charged its cost when the turn is handed to it from the
//! line (an arrival that finds the turn free and nobody waiting is not);
//! a holder that gives the turn back without a reservation has the charge
//! taken off again. Unlike a local head, a holder keeps the turn while it
//! sleeps even when a call of a higher class arrives: that call is next.
//!
//! # Cancel safety
//!
//! A waiter dropped after the turn was handed to it passes it on (see
//! [`FairTurn::cancel`]); one dropped while waiting leaves its line.

use std::task::{Context, Poll, Waker};

use parking_lot::Mutex;

use super::flows::{FairQueue, FlowView};
use super::{Charged, Costs};
use crate::admission::permits::Refused;
use crate::clock::Instant;
use crate::config::ScopeConfig;
use crate::flow::{Flow, FlowKey};
use crate::quota::{Actual, Demand};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Waiting,
    /// The turn is this waiter's (charged to its flow, under this cost
    /// model).
    Granted(Charged),
    /// Refused to make room for a flow under its share (FAIR-10).
    Displaced,
    Closed,
}

#[derive(Debug)]
struct Waiter {
    waker: Option<Waker>,
    tokens: u64,
    flow: FlowKey,
    state: State,
}

#[derive(Debug)]
struct Turn {
    queue: FairQueue<Waiter>,
    /// Someone holds the turn (or it was handed to a waiter who has not
    /// seen it yet).
    taken: bool,
    closed: bool,
    costs: Costs,
    /// Waiters beyond the holder, at most (FAIR-10 shares them).
    limit: usize,
}

impl Turn {
    fn cost(&self, tokens: u64) -> u64 {
        self.costs.of(tokens)
    }

    /// Gives the free turn to the head of the line, if anyone waits.
    fn hand_over(&mut self, now: Instant) {
        self.taken = false;
        let Some(key) = self.queue.head(now) else {
            return;
        };
        let Some(tokens) = self.queue.get(key).map(|w| w.tokens) else {
            return;
        };
        let cost = self.cost(tokens);
        let charged = self.queue.granted(key, cost);
        if let Some(w) = self.queue.get_mut(key) {
            w.state = State::Granted(charged);
            if let Some(waker) = w.waker.take() {
                waker.wake();
            }
        }
        self.taken = true;
    }
}

/// How the holder of the turn gives it back.
#[derive(Debug, Clone, Copy)]
pub(crate) struct TurnDone {
    pub(crate) flow: Flow,
    pub(crate) tokens: u64,
    /// The turn came from the line: the cost model its flow was charged
    /// under.
    pub(crate) charged: Option<Charged>,
    /// The holder took a reservation with it.
    pub(crate) reserved: bool,
}

/// See the module documentation.
#[derive(Debug)]
pub(crate) struct FairTurn {
    turn: Mutex<Turn>,
}

impl FairTurn {
    /// The turn of `config`'s scope, with at most `limit` waiters.
    pub(crate) fn new(config: &ScopeConfig, limit: usize) -> Self {
        FairTurn {
            turn: Mutex::new(Turn {
                queue: FairQueue::new(config.min_shares(), config.share_window()),
                taken: false,
                closed: false,
                costs: Costs {
                    tokens: config.has_token_limit(),
                },
                limit,
            }),
        }
    }

    /// Takes a new configuration of the scope (SPEC GW-15): its classes'
    /// `min_share`, its window, its cost model and the waiting bound. The
    /// calls in line keep their places and their flows their counters; a
    /// lowered bound refuses only new waiters.
    pub(crate) fn reconfigure(&self, config: &ScopeConfig, limit: usize) {
        let mut t = self.turn.lock();
        t.queue
            .reconfigure(config.min_shares(), config.share_window());
        let costs = Costs {
            tokens: config.has_token_limit(),
        };
        if costs != t.costs {
            // Counters in the old unit mean nothing in the new one.
            t.costs = costs;
            t.queue.new_model();
        }
        t.limit = limit;
    }

    /// Calls waiting for the turn and whether it is held.
    pub(crate) fn queued(&self) -> (usize, bool) {
        let t = self.turn.lock();
        (t.queue.len(), t.taken)
    }

    /// Polls for the turn. `key` starts as `None`; while it is `Some` the
    /// caller waits in line and must [`cancel`](Self::cancel) if it gives
    /// up. `Ready(Ok(charged))`: the turn is the caller's, `charged` (the
    /// cost model its flow was charged under) when it came from the line.
    pub(crate) fn poll_acquire(
        &self,
        cx: &mut Context<'_>,
        key: &mut Option<usize>,
        flow: Flow,
        tokens: u64,
        now: Instant,
    ) -> Poll<Result<Option<Charged>, Refused>> {
        let mut t = self.turn.lock();
        let Some(k) = *key else {
            if t.closed {
                return Poll::Ready(Err(Refused::Closed));
            }
            if !t.taken && t.queue.is_empty() {
                t.taken = true;
                return Poll::Ready(Ok(None));
            }
            let mut victim = None;
            if t.queue.len() >= t.limit {
                victim = Some(room_for(&t.queue, flow.key(), t.limit).ok_or(Refused::Full)?);
            }
            let waiter = Waiter {
                waker: Some(cx.waker().clone()),
                tokens,
                flow: flow.key(),
                state: State::Waiting,
            };
            let Ok(k) = t.queue.push(flow, waiter) else {
                return Poll::Ready(Err(Refused::Full));
            };
            if let Some(v) = victim {
                t.queue.unlink(v);
                if let Some(w) = t.queue.get_mut(v) {
                    w.state = State::Displaced;
                    if let Some(waker) = w.waker.take() {
                        waker.wake();
                    }
                }
            }
            *key = Some(k);
            if !t.taken {
                t.hand_over(now);
            }
            return Self::check(&mut t, cx, key, k);
        };
        Self::check(&mut t, cx, key, k)
    }

    fn check(
        t: &mut Turn,
        cx: &mut Context<'_>,
        key: &mut Option<usize>,
        k: usize,
    ) -> Poll<Result<Option<Charged>, Refused>> {
        let Some(w) = t.queue.get_mut(k) else {
            *key = None;
            return Poll::Ready(Err(Refused::Closed));
        };
        let done = match w.state {
            State::Granted(model) => Ok(Some(model)),
            State::Displaced => Err(Refused::Full),
            State::Closed => Err(Refused::Closed),
            State::Waiting if t.closed => Err(Refused::Closed),
            State::Waiting => {
                match &w.waker {
                    Some(old) if old.will_wake(cx.waker()) => {}
                    _ => w.waker = Some(cx.waker().clone()),
                }
                return Poll::Pending;
            }
        };
        t.queue.remove(k);
        *key = None;
        Poll::Ready(done)
    }

    /// The holder gives the turn back; the next call in line gets it.
    pub(crate) fn release(&self, done: TurnDone, now: Instant) {
        let mut t = self.turn.lock();
        let cost = t.cost(done.tokens);
        if done.reserved {
            t.queue.share.add(done.flow.priority(), cost, now);
        } else if let Some(charged) = done.charged {
            t.queue.correct(done.flow.key(), charged, cost, 0);
        }
        t.hand_over(now);
    }

    /// Leaves the line; a turn handed over meanwhile passes on.
    pub(crate) fn cancel(&self, key: usize, now: Instant) {
        let mut t = self.turn.lock();
        let granted = t.queue.get(key).and_then(|w| match w.state {
            State::Granted(model) => Some((w.flow, w.tokens, model)),
            _ => None,
        });
        t.queue.remove(key);
        if let Some((flow, tokens, model)) = granted {
            let cost = t.cost(tokens);
            t.queue.correct(flow, model, cost, 0);
            t.hand_over(now);
        }
    }

    /// Refuses new waiters and wakes the current ones with `Closed`.
    pub(crate) fn close(&self) {
        let mut t = self.turn.lock();
        t.closed = true;
        for key in t.queue.keys() {
            t.queue.unlink(key);
            if let Some(w) = t.queue.get_mut(key) {
                w.state = State::Closed;
                if let Some(waker) = w.waker.take() {
                    waker.wake();
                }
            }
        }
    }

    /// Corrects a charged flow by what its grant really cost (FAIR-3):
    /// `actual` usage, `None` for a reservation given back whole.
    pub(crate) fn correct(
        &self,
        flow: FlowKey,
        charged: Charged,
        demand: &Demand,
        actual: Option<&Actual>,
    ) {
        let mut t = self.turn.lock();
        if t.queue.is_empty() {
            return;
        }
        if let Some((estimated, actual)) = t.costs.correction(demand, actual) {
            t.queue.correct(flow, charged, estimated, actual);
        }
    }

    /// The flows waiting, and the cost admitted per class so far.
    pub(crate) fn flows(&self) -> (Vec<FlowView>, [u64; 3]) {
        let t = self.turn.lock();
        (t.queue.flows(), t.queue.share.total)
    }
}

/// The call to refuse so that one of `flow` may wait in a full line
/// (SPEC FAIR-10): the last of the flow holding the most, when `flow`
/// holds fewer than an equal share of `capacity` among the backlogged
/// flows; `None` when the arrival itself is refused.
pub(crate) fn room_for<T>(queue: &FairQueue<T>, flow: FlowKey, capacity: usize) -> Option<usize> {
    let own = queue.flow_len(flow);
    let flows = queue.backlogged() + usize::from(own == 0);
    if (own as u128) * (flows as u128) >= capacity as u128 {
        return None;
    }
    let (victim, holds) = queue.largest_tail(flow)?;
    (holds > own).then_some(victim)
}

//! What a caller asks the controller to admit.

use std::fmt;

use crate::flow::Flow;
use crate::price::{Price, ReservePrice};
use crate::quota::Demand;

/// A caller-chosen identity for a call (SPEC ADM-6).
///
/// Only calls that carry an id are checked for conflicts: an id already
/// queued or active is refused with `AdmissionError::Conflict`. Calls without
/// one cannot collide.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CallId(pub u64);

impl fmt::Display for CallId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "call-{}", self.0)
    }
}

/// The ordinal of a quota scope inside its controller.
///
/// Logs, metrics and errors name scopes by this ordinal, never by the
/// configured name or anything derived from credentials (SPEC Q-10).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct ScopeId(pub(crate) u32);

impl ScopeId {
    /// The first scope (the only one when none is configured).
    pub const FIRST: ScopeId = ScopeId(0);

    /// The ordinal.
    pub const fn index(self) -> usize {
        self.0 as usize
    }
}

impl fmt::Display for ScopeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "scope#{}", self.0)
    }
}

/// The ordinal of a concurrency pool inside its controller.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PoolId(pub(crate) u32);

impl PoolId {
    /// A pool id for a pool created outside a controller (see
    /// [`Pool`](crate::Pool)).
    pub const fn new(ordinal: u32) -> Self {
        PoolId(ordinal)
    }

    /// The ordinal.
    pub const fn index(self) -> usize {
        self.0 as usize
    }
}

impl fmt::Display for PoolId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "pool#{}", self.0)
    }
}

/// An attempt's token estimate: input plus expected output (SPEC Q-3).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct TokenEstimate {
    /// Tokens of the request itself.
    pub input: u64,
    /// Output allowance (e.g. `max_tokens`).
    pub output: u64,
}

impl TokenEstimate {
    /// An estimate of `input` plus `output` tokens.
    pub const fn new(input: u64, output: u64) -> Self {
        TokenEstimate { input, output }
    }

    /// What the attempt reserves.
    pub const fn total(&self) -> u64 {
        self.input.saturating_add(self.output)
    }
}

/// One attempt to admit: its scope, its optional id, token estimate and
/// price, its pool and its flow.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Call {
    /// Conflict-checked identity, if the caller has one.
    pub id: Option<CallId>,
    /// The quota scope it spends.
    pub scope: ScopeId,
    /// Required when the scope has a token or cost limit.
    pub estimate: Option<TokenEstimate>,
    /// The concurrency pool each attempt takes a permit from; `None` uses
    /// the controller's default pool, if it has one.
    pub pool: Option<PoolId>,
    /// The prices of its model the attempt is reserved at (SPEC BUD-1,
    /// BUD-2): it takes its worst case from cost limits. Required when the
    /// scope has a cost limit. (Its usage is priced at settlement by
    /// whoever knows the model, see [`Usage::priced`](crate::Usage::priced).)
    pub price: Option<ReservePrice>,
    /// The tenant, class and weight it is scheduled by among the scope's
    /// waiting calls (SPEC FAIR-1); [`Flow::DEFAULT`] unless set.
    pub flow: Flow,
}

impl Call {
    /// A call on `scope` without id, estimate or price.
    pub const fn new(scope: ScopeId) -> Self {
        Call {
            id: None,
            scope,
            estimate: None,
            pool: None,
            price: None,
            flow: Flow::DEFAULT,
        }
    }

    /// Sets the model's price (its [`reserve_price`](Price::reserve_price)).
    pub fn with_price(mut self, price: Price) -> Self {
        self.price = Some(price.reserve_price());
        self
    }

    /// What the attempt takes from its scope's limits: one request unit,
    /// the estimate's tokens and, with a price, their worst-case cost
    /// (SPEC Q-12, BUD-2).
    pub fn demand(&self) -> Demand {
        let (input, output) = self.estimate.map_or((0, 0), |e| (e.input, e.output));
        let cost = self.price.map_or(0, |p| p.worst_case(input, output));
        Demand::new(input, output).with_cost(cost)
    }

    /// Sets the id.
    pub const fn with_id(mut self, id: CallId) -> Self {
        self.id = Some(id);
        self
    }

    /// Sets the token estimate.
    pub const fn with_estimate(mut self, estimate: TokenEstimate) -> Self {
        self.estimate = Some(estimate);
        self
    }

    /// Sets the concurrency pool.
    pub const fn with_pool(mut self, pool: PoolId) -> Self {
        self.pool = Some(pool);
        self
    }

    /// Sets the flow (SPEC FAIR-1).
    pub const fn with_flow(mut self, flow: Flow) -> Self {
        self.flow = flow;
        self
    }

    /// Sets a token estimate with no separate output part.
    pub const fn with_tokens(self, tokens: u64) -> Self {
        self.with_estimate(TokenEstimate::new(tokens, 0))
    }
}

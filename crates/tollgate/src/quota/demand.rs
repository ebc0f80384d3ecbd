//! What one attempt asks of a quota scope, and what it holds once granted.

use std::time::Duration;

use crate::clock::Instant;

/// A quota dimension (SPEC Q-1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Dimension {
    /// Request units: one per physical attempt.
    Requests,
    /// Tokens: estimated input plus expected output, reconciled later.
    Tokens,
}

impl Dimension {
    /// The dimension's stable lower-case name.
    pub const fn as_str(self) -> &'static str {
        match self {
            Dimension::Requests => "requests",
            Dimension::Tokens => "tokens",
        }
    }
}

/// The amounts one attempt reserves from every limit of its scope.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Demand {
    /// Request units (one per attempt).
    pub requests: u64,
    /// Estimated tokens (input plus expected output).
    pub tokens: u64,
}

impl Demand {
    /// One request unit and `tokens` estimated tokens.
    pub const fn new(tokens: u64) -> Self {
        Demand {
            requests: 1,
            tokens,
        }
    }

    /// The amount this demand takes from a limit of `dimension`.
    pub const fn amount(&self, dimension: Dimension) -> u64 {
        match dimension {
            Dimension::Requests => self.requests,
            Dimension::Tokens => self.tokens,
        }
    }
}

/// Whether a reservation is waiting for the rest of its admission or already
/// belongs to a started attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Hold {
    /// Reserved at the head of the queue, not yet leased (the call may still
    /// wait for concurrency). Its amounts stay counted until it is leased or
    /// refunded, even if its window entry ages out meanwhile.
    Pending,
    /// Reserved and leased in one step: the attempt starts now.
    Leased,
}

/// Amounts taken from a scope at `stamp`.
///
/// The stamp locates the reservation in every limit's bookkeeping, so a
/// refund or reconciliation lands where the reservation did (SPEC Q-5).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reservation {
    /// When the amounts were taken (moved to the lease instant by `lease`).
    pub stamp: Instant,
    /// The store's own encoding of `stamp` (for the in-process store,
    /// nanoseconds since its epoch), set by the store whenever it stamps
    /// the reservation, so that settling needs no clock arithmetic.
    pub tick: u64,
    /// What was taken.
    pub demand: Demand,
    /// Pending or leased.
    pub hold: Hold,
}

/// Which dimensions kept a demand from fitting (SPEC OBS-4).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Hash)]
pub struct LimitedBy {
    /// A request limit was short.
    pub requests: bool,
    /// A token limit was short.
    pub tokens: bool,
}

impl LimitedBy {
    pub(crate) fn add(&mut self, dimension: Dimension) {
        match dimension {
            Dimension::Requests => self.requests = true,
            Dimension::Tokens => self.tokens = true,
        }
    }

    /// Merges two observations.
    pub fn union(self, other: LimitedBy) -> LimitedBy {
        LimitedBy {
            requests: self.requests || other.requests,
            tokens: self.tokens || other.tokens,
        }
    }

    /// `"requests"`, `"tokens"`, `"requests+tokens"` or `"none"`.
    pub const fn as_str(&self) -> &'static str {
        match (self.requests, self.tokens) {
            (true, true) => "requests+tokens",
            (true, false) => "requests",
            (false, true) => "tokens",
            (false, false) => "none",
        }
    }
}

/// A demand does not fit now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NotUntil {
    /// The earliest instant at which it can fit given the reservations as
    /// they stand, or `None` when only a pending reservation's lease or refund
    /// can free the room (the waiter is woken by that event).
    pub at: Option<Instant>,
    /// Which dimensions were short.
    pub limited_by: LimitedBy,
}

/// One dimension of a provider's budget as its response told it (SPEC
/// `x-ratelimit-limit-*`, `x-ratelimit-remaining-*` and
/// `x-ratelimit-reset-*` (or another provider's equivalents).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BudgetReport {
    /// Requests or tokens.
    pub dimension: Dimension,
    /// The advertised amount per window.
    pub limit: Option<u64>,
    /// What the provider has left, after the request that got this answer.
    pub remaining: Option<u64>,
    /// How long until the provider's budget is whole again.
    pub reset: Option<Duration>,
}

/// What a scope did with a [`BudgetReport`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Observed {
    /// The limit adopted from the provider's advertisement, if one changed.
    pub adopted: Option<u64>,
    /// Units taken out of the scope's window because the provider had less
    /// left than tollgate's own view (another client, another accounting).
    pub gap: u64,
}

/// What a provider charges its own limiter for a request it refuses with a
/// 429 (SPEC Q-16). tollgate's window is charged exactly that.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum RefusalCost {
    /// The request unit and the whole token charge (the safe default, and
    /// what OpenAI documents: unsuccessful requests count toward the
    /// per-minute limits).
    #[default]
    Full,
    /// The request unit only; no tokens.
    Request,
    /// Nothing: a refused request never counted.
    Free,
}

impl RefusalCost {
    /// The configuration name: `full`, `request`, `free`.
    pub const fn as_str(self) -> &'static str {
        match self {
            RefusalCost::Full => "full",
            RefusalCost::Request => "request",
            RefusalCost::Free => "free",
        }
    }
}

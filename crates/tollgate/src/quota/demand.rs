//! What one attempt asks of a quota scope, and what it holds once granted.

use std::time::Duration;

use crate::clock::Instant;

/// A quota dimension (SPEC ).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Dimension {
    /// Request units: one per physical attempt.
    Requests,
    /// Tokens: estimated input plus expected output, reconciled later.
    Tokens,
    /// Input tokens only: the estimated input, reconciled from the reported
    /// input (providers such as Anthropic limit it on its own, SPEC Q-12).
    InputTokens,
    /// Output tokens only: the output allowance, reconciled from the
    /// reported output.
    OutputTokens,
    /// Money, in micro-dollars (SPEC BUD-2): the attempt's worst-case cost
    /// at its model's price, reconciled from the priced usage. Never
    /// reported or learned from a provider's rate-limit headers.
    Cost,
}

impl Dimension {
    /// Every dimension, in a stable order.
    pub const ALL: [Dimension; 5] = [
        Dimension::Requests,
        Dimension::Tokens,
        Dimension::InputTokens,
        Dimension::OutputTokens,
        Dimension::Cost,
    ];

    /// The dimensions a provider's rate limiter counts (every one but
    /// [`Cost`](Dimension::Cost)), in the order of [`ALL`](Dimension::ALL).
    pub const RATE: [Dimension; 4] = [
        Dimension::Requests,
        Dimension::Tokens,
        Dimension::InputTokens,
        Dimension::OutputTokens,
    ];

    /// The dimension's stable lower-case name: `requests`, `tokens`,
    /// `input_tokens`, `output_tokens` or `cost`.
    pub const fn as_str(self) -> &'static str {
        match self {
            Dimension::Requests => "requests",
            Dimension::Tokens => "tokens",
            Dimension::InputTokens => "input_tokens",
            Dimension::OutputTokens => "output_tokens",
            Dimension::Cost => "cost",
        }
    }

    /// Whether the dimension counts tokens of any kind (reconciled after
    /// the call, given back by a refusal that charges no tokens).
    pub const fn is_tokens(self) -> bool {
        matches!(
            self,
            Dimension::Tokens | Dimension::InputTokens | Dimension::OutputTokens
        )
    }

    /// Whether the dimension counts money (SPEC BUD-2).
    pub const fn is_cost(self) -> bool {
        matches!(self, Dimension::Cost)
    }
}

impl std::fmt::Display for Dimension {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The amounts one attempt reserves from every limit of its scope: one
/// request unit, its input estimate, its output allowance (SPEC Q-12) and
/// its worst-case cost (SPEC BUD-2). A `tokens` limit takes the sum of
/// input and output.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Demand {
    /// Request units (one per attempt).
    pub requests: u64,
    /// Estimated input tokens.
    pub input: u64,
    /// Expected output tokens (the output allowance).
    pub output: u64,
    /// The worst-case cost in micro-dollars (zero for a call without a
    /// price).
    pub cost: u64,
}

impl Demand {
    /// One request unit, `input` estimated input tokens and `output`
    /// expected output tokens, no cost.
    pub const fn new(input: u64, output: u64) -> Self {
        Demand {
            requests: 1,
            input,
            output,
            cost: 0,
        }
    }

    /// The same demand with a worst-case cost of `cost` micro-dollars.
    pub const fn with_cost(mut self, cost: u64) -> Self {
        self.cost = cost;
        self
    }

    /// Input plus output: what a `tokens` limit takes.
    pub const fn tokens(&self) -> u64 {
        self.input.saturating_add(self.output)
    }

    /// The amount this demand takes from a limit of `dimension`.
    pub const fn amount(&self, dimension: Dimension) -> u64 {
        match dimension {
            Dimension::Requests => self.requests,
            Dimension::Tokens => self.tokens(),
            Dimension::InputTokens => self.input,
            Dimension::OutputTokens => self.output,
            Dimension::Cost => self.cost,
        }
    }
}

/// What a started attempt used, per token dimension, as settlement sees it
/// (SPEC ).
///
/// `tokens` is the reported total. `input` and `output` are the reported
/// split when the provider gave one. `None` keeps that dimension's
/// estimate, capped at the total: a provider that reports only a total says
/// nothing about the split, so `input_tokens` and `output_tokens` limits
/// stay as reserved while a `tokens` limit is reconciled to the total,
/// except that neither side can have used more than the whole (a known
/// zero gives every token dimension back, SPEC Q-5).
///
/// `cost` is the priced usage in micro-dollars (SPEC BUD-2); `None` keeps
/// the reserved cost.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Actual {
    /// The reported total.
    pub tokens: u64,
    /// The reported input tokens, if known.
    pub input: Option<u64>,
    /// The reported output tokens, if known.
    pub output: Option<u64>,
    /// The priced usage, if known.
    pub cost: Option<u64>,
}

impl Actual {
    /// Only a total is known: input and output limits keep their estimate
    /// (capped at the total).
    pub const fn total(tokens: u64) -> Self {
        Actual {
            tokens,
            input: None,
            output: None,
            cost: None,
        }
    }

    /// Known input and output; the total is their sum.
    pub const fn split(input: u64, output: u64) -> Self {
        Actual {
            tokens: input.saturating_add(output),
            input: Some(input),
            output: Some(output),
            cost: None,
        }
    }

    /// The same figures with a known cost of `cost` micro-dollars.
    pub const fn with_cost(mut self, cost: u64) -> Self {
        self.cost = Some(cost);
        self
    }

    /// Every token dimension at `estimate` (unchanged) and a known cost:
    /// the tokens are unknown but the money is not (an attempt the
    /// provider refused unbilled, SPEC BUD-5).
    pub const fn keep_tokens(estimate: &Demand, cost: u64) -> Self {
        Actual {
            tokens: estimate.tokens(),
            input: Some(estimate.input),
            output: Some(estimate.output),
            cost: Some(cost),
        }
    }

    /// What settlement makes of reported usage against the reservation's
    /// `estimate`: [`from_usage`](Actual::from_usage), or when the tokens
    /// are unknown but the cost is known, the tokens kept as estimated and
    /// the cost settled; `None` when nothing is known.
    pub fn settling(usage: &crate::usage::Usage, estimate: &Demand) -> Option<Self> {
        match (Actual::from_usage(usage), usage.cost()) {
            (Some(a), _) => Some(a),
            (None, Some(cost)) => Some(Actual::keep_tokens(estimate, cost)),
            (None, None) => None,
        }
    }

    /// What settlement makes of reported usage: `None` when the total is
    /// unknown (the estimate stays). A side that is missing is derived from
    /// the total and the other side when both are known (SPEC Q-6: an
    /// absent counter next to a present one counts as zero), and otherwise
    /// keeps its estimate.
    pub fn from_usage(usage: &crate::usage::Usage) -> Option<Self> {
        let tokens = usage.total()?;
        let (input, output) = match (usage.input(), usage.output()) {
            (Some(i), Some(o)) => (Some(i), Some(o)),
            (Some(i), None) => (Some(i), Some(tokens.saturating_sub(i))),
            (None, Some(o)) => (Some(tokens.saturating_sub(o)), Some(o)),
            (None, None) => (None, None),
        };
        Some(Actual {
            tokens,
            input,
            output,
            cost: usage.cost(),
        })
    }

    /// Whether settling `estimate` to this gives anything back on some
    /// token dimension.
    pub fn refunds(&self, estimate: &Demand) -> bool {
        self.compare(estimate).0
    }

    /// Whether settling `estimate` to this charges debt on some token
    /// dimension.
    pub fn debt(&self, estimate: &Demand) -> bool {
        self.compare(estimate).1
    }

    /// (some dimension below its estimate, some dimension above it).
    fn compare(&self, estimate: &Demand) -> (bool, bool) {
        let (mut below, mut above) = (false, false);
        for d in Dimension::ALL {
            if let Some(used) = self.amount(d, estimate) {
                below |= used < estimate.amount(d);
                above |= used > estimate.amount(d);
            }
        }
        (below, above)
    }

    /// What a limit of `dimension` is settled to, given what `estimate`
    /// reserved on it; `None` for request limits (never reconciled) and for
    /// a cost that is not known (the reservation stays).
    pub const fn amount(&self, dimension: Dimension, estimate: &Demand) -> Option<u64> {
        match dimension {
            Dimension::Requests => None,
            Dimension::Cost => self.cost,
            Dimension::Tokens => Some(self.tokens),
            Dimension::InputTokens => match self.input {
                Some(i) => Some(i),
                None => Some(min(estimate.input, self.tokens)),
            },
            Dimension::OutputTokens => match self.output {
                Some(o) => Some(o),
                None => Some(min(estimate.output, self.tokens)),
            },
        }
    }
}

const fn min(a: u64, b: u64) -> u64 {
    if a < b { a } else { b }
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
    /// A number of the store's own for the reservation: for the
    /// in-process store, the attempt's number in its record of what was
    /// sent (SPEC Q-14), set when the provider's counting instant is known
    /// (0 until then); for the Redis store, the tag of the epoch that
    /// granted it (a reservation of an earlier epoch settles nothing).
    pub seq: u32,
}

/// Which dimensions kept a demand from fitting (SPEC OBS-4, Q-12).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Hash)]
pub struct LimitedBy {
    /// A request limit was short.
    pub requests: bool,
    /// A token limit (input plus output) was short.
    pub tokens: bool,
    /// An input-token limit was short.
    pub input_tokens: bool,
    /// An output-token limit was short.
    pub output_tokens: bool,
    /// A cost limit (a budget, SPEC BUD-2) was short.
    pub cost: bool,
}

impl LimitedBy {
    /// Only `dimension` was short.
    pub fn only(dimension: Dimension) -> LimitedBy {
        let mut l = LimitedBy::default();
        l.add(dimension);
        l
    }

    /// Marks `dimension` as short.
    pub fn add(&mut self, dimension: Dimension) {
        match dimension {
            Dimension::Requests => self.requests = true,
            Dimension::Tokens => self.tokens = true,
            Dimension::InputTokens => self.input_tokens = true,
            Dimension::OutputTokens => self.output_tokens = true,
            Dimension::Cost => self.cost = true,
        }
    }

    /// Whether `dimension` was short.
    pub const fn has(&self, dimension: Dimension) -> bool {
        match dimension {
            Dimension::Requests => self.requests,
            Dimension::Tokens => self.tokens,
            Dimension::InputTokens => self.input_tokens,
            Dimension::OutputTokens => self.output_tokens,
            Dimension::Cost => self.cost,
        }
    }

    /// Whether no dimension was short.
    pub const fn is_none(&self) -> bool {
        !(self.requests || self.tokens || self.input_tokens || self.output_tokens || self.cost)
    }

    /// Merges two observations.
    pub fn union(self, other: LimitedBy) -> LimitedBy {
        LimitedBy {
            requests: self.requests || other.requests,
            tokens: self.tokens || other.tokens,
            input_tokens: self.input_tokens || other.input_tokens,
            output_tokens: self.output_tokens || other.output_tokens,
            cost: self.cost || other.cost,
        }
    }

    /// The short dimensions' names joined by `+` in the order of
    /// [`Dimension::ALL`] (`"requests"`, `"tokens"`, `"requests+tokens"`,
    /// `"input_tokens+output_tokens"`, `"tokens+cost"`...), or `"none"`.
    pub const fn as_str(&self) -> &'static str {
        const NAMES: [&str; 32] = [
            "none",
            "requests",
            "tokens",
            "requests+tokens",
            "input_tokens",
            "requests+input_tokens",
            "tokens+input_tokens",
            "requests+tokens+input_tokens",
            "output_tokens",
            "requests+output_tokens",
            "tokens+output_tokens",
            "requests+tokens+output_tokens",
            "input_tokens+output_tokens",
            "requests+input_tokens+output_tokens",
            "tokens+input_tokens+output_tokens",
            "requests+tokens+input_tokens+output_tokens",
            "cost",
            "requests+cost",
            "tokens+cost",
            "requests+tokens+cost",
            "input_tokens+cost",
            "requests+input_tokens+cost",
            "tokens+input_tokens+cost",
            "requests+tokens+input_tokens+cost",
            "output_tokens+cost",
            "requests+output_tokens+cost",
            "tokens+output_tokens+cost",
            "requests+tokens+output_tokens+cost",
            "input_tokens+output_tokens+cost",
            "requests+input_tokens+output_tokens+cost",
            "tokens+input_tokens+output_tokens+cost",
            "requests+tokens+input_tokens+output_tokens+cost",
        ];
        let bits = self.requests as usize
            | (self.tokens as usize) << 1
            | (self.input_tokens as usize) << 2
            | (self.output_tokens as usize) << 3
            | (self.cost as usize) << 4;
        NAMES[bits]
    }
}

impl std::fmt::Display for LimitedBy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
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
    /// Requests or tokens (a provider's input/output token reports apply
    /// to `input_tokens`/`output_tokens` limits the same way).
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
    /// A new amount is the rate at once, but a demand larger than it is
    /// refused only once a second answer confirms it (SPEC Q-14).
    pub adopted: Option<u64>,
    /// The learned limit a second, distinct answer confirmed: from now on
    /// a demand larger than it fails at once, queued ones included.
    pub confirmed: Option<u64>,
    /// Units more taken out of the scope's window because the provider had
    /// less left than tollgate's own view (another client, another
    /// accounting). The estimate of what others hold replaces the previous
    /// one, so a repeated report takes nothing more.
    pub gap: u64,
    /// Units given back: the provider's answer shows others holding less
    /// than the previous estimate (never more than that estimate: a report
    /// never raises availability above tollgate's own accounting).
    pub freed: u64,
}

/// What a provider charges its own limiter for a request it refuses with a
/// 429 (SPEC Q-16). tollgate's window is charged exactly that. Money is
/// another matter: providers bill nothing for a refused request, so a
/// refusal always gives its reserved cost back (SPEC BUD-5).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum RefusalCost {
    /// The request unit and the whole token charge (the safe default, and
    /// what OpenAI documents: unsuccessful requests count toward the
    /// per-minute limits).
    #[default]
    Full,
    /// The request unit only; no tokens of any dimension (tokens, input,
    /// output).
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::usage::{Counter, Usage};

    // proves: Q-12 (each dimension takes its own amount: requests one unit,
    // tokens input plus output, input and output their own parts)
    #[test]
    fn a_demand_gives_each_dimension_its_amount() {
        let d = Demand::new(300, 40);
        let amounts = Dimension::ALL.map(|dim| d.amount(dim));
        assert_eq!(amounts, [1, 340, 300, 40, 0]);
        assert_eq!(d.with_cost(7).amount(Dimension::Cost), 7);
        let names = Dimension::ALL.map(Dimension::as_str);
        assert_eq!(
            names,
            [
                "requests",
                "tokens",
                "input_tokens",
                "output_tokens",
                "cost"
            ]
        );
        assert_eq!(Dimension::InputTokens.to_string(), "input_tokens");
        assert!(!Dimension::Requests.is_tokens());
        assert!(Dimension::OutputTokens.is_tokens());
        assert!(!Dimension::Cost.is_tokens() && Dimension::Cost.is_cost());
        assert_eq!(&Dimension::ALL[..4], &Dimension::RATE[..]);
    }

    // proves, Q-6 (settlement takes each token limit from its
    // own reported figure; a total-only report keeps the input and output
    // estimates, capped at the total; a missing side next to a present one
    // is the rest of the total)
    #[test]
    fn settlement_figures_per_dimension() {
        let est = Demand::new(100, 50);
        let at = |a: Actual| Dimension::RATE.map(|d| a.amount(d, &est));
        let split = Actual::from_usage(&Usage::from_io(70, 20)).expect("known");
        assert_eq!(at(split), [None, Some(90), Some(70), Some(20)]);
        let total = Actual::from_usage(&Usage::known(120)).expect("known");
        assert_eq!(at(total), [None, Some(120), Some(100), Some(50)]);
        let small = Actual::from_usage(&Usage::known(30)).expect("known");
        assert_eq!(at(small), [None, Some(30), Some(30), Some(30)]);
        let zero = Actual::from_usage(&Usage::known(0)).expect("known");
        assert_eq!(at(zero), [None, Some(0), Some(0), Some(0)]);
        let input_only = Usage::from_counters(
            Counter::Value(90),
            Counter::Value(60),
            Counter::Absent,
            Counter::Absent,
        );
        let one_side = Actual::from_usage(&input_only).expect("known");
        assert_eq!(at(one_side), [None, Some(90), Some(60), Some(30)]);
        assert_eq!(Actual::from_usage(&Usage::UNKNOWN), None);
        // Refund and debt are judged per dimension: less input, more output.
        let mixed = Actual::split(40, 110);
        assert!(mixed.refunds(&est) && mixed.debt(&est));
        let same = Actual::split(100, 50);
        assert!(!same.refunds(&est) && !same.debt(&est));
    }

    // proves: BUD-2, Q-5 (the cost is settled from the priced usage; an
    // unknown cost keeps the reservation; known money with unknown tokens
    // keeps the tokens as estimated)
    #[test]
    fn cost_settles_from_the_priced_usage() {
        let est = Demand::new(100, 50).with_cost(9_000);
        let priced = Usage::from_io(70, 20).priced(&crate::price::Price::new(1_000_000, 1_000_000));
        let a = Actual::settling(&priced, &est).expect("known");
        assert_eq!(a.amount(Dimension::Cost, &est), Some(90));
        assert!(a.refunds(&est));
        let unpriced = Actual::settling(&Usage::from_io(70, 20), &est).expect("known");
        assert_eq!(unpriced.amount(Dimension::Cost, &est), None);
        let refused = Actual::settling(&Usage::UNKNOWN.with_cost(Some(0)), &est).expect("cost");
        assert_eq!(
            Dimension::ALL.map(|d| refused.amount(d, &est)),
            [None, Some(150), Some(100), Some(50), Some(0)]
        );
        assert_eq!(Actual::settling(&Usage::UNKNOWN, &est), None);
    }

    // proves: Q-12, OBS-4 (limited_by names each short dimension)
    #[test]
    fn limited_by_names_every_dimension() {
        assert_eq!(LimitedBy::default().as_str(), "none");
        assert!(LimitedBy::default().is_none());
        let mut l = LimitedBy::only(Dimension::OutputTokens);
        assert_eq!(l.as_str(), "output_tokens");
        assert!(l.has(Dimension::OutputTokens) && !l.has(Dimension::Tokens));
        l.add(Dimension::InputTokens);
        assert_eq!(l.to_string(), "input_tokens+output_tokens");
        let all = l.union(LimitedBy {
            requests: true,
            tokens: true,
            ..LimitedBy::default()
        });
        assert_eq!(all.as_str(), "requests+tokens+input_tokens+output_tokens");
        assert_eq!(LimitedBy::only(Dimension::Cost).as_str(), "cost");
        let mut with_cost = all;
        with_cost.add(Dimension::Cost);
        assert_eq!(
            with_cost.as_str(),
            "requests+tokens+input_tokens+output_tokens+cost"
        );
        // Every combination names its dimensions in order.
        for bits in 0u32..32 {
            let mut l = LimitedBy::default();
            let mut names = Vec::new();
            for (i, d) in Dimension::ALL.into_iter().enumerate() {
                if bits & (1 << i) != 0 {
                    l.add(d);
                    names.push(d.as_str());
                }
            }
            let want = if names.is_empty() {
                "none".to_owned()
            } else {
                names.join("+")
            };
            assert_eq!(l.as_str(), want);
        }
        assert_eq!(LimitedBy::only(Dimension::Requests).as_str(), "requests");
        assert_eq!(LimitedBy::only(Dimension::Tokens).as_str(), "tokens");
    }
}

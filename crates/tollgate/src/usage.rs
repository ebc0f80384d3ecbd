//! What a provider reports it used, and how it settles a reservation
//! (SPEC ).
//!
//! "Unknown" and "known zero" are different states and cannot be confused:
//! [`Usage::UNKNOWN`] keeps the reservation's estimate (conservative), while
//! [`Usage::known`]`(0)` refunds every reserved token but keeps the request
//! unit, because a provider attempt did start.
//!
//! Beyond the token counts, a usage may carry its [`Parts`] (the tokens by
//! how they are priced) and its cost once priced (SPEC BUD-2): see
//! [`Usage::priced`].

use crate::price::{Parts, Price};

/// One usage counter as found in a provider response.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Counter {
    /// Not present at all.
    #[default]
    Absent,
    /// Present but not a valid non-negative integer (null, negative,
    /// fractional, text...).
    Invalid,
    /// A valid count.
    Value(u64),
}

/// Tokens a provider reported for one attempt.
///
/// Kept as small as a plain count record (it travels in every provider
/// error and stream event): presence bits share a word with the cost, and
/// the priced [`Parts`] are stored as 32-bit numbers (a report of more
/// than four billion tokens of one kind leaves them unknown, so its cost
/// keeps the reservation). Absent values are stored as zero, so equality
/// compares what is known.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Usage {
    total: u64,
    input: u64,
    output: u64,
    /// The cost in micro-dollars (low 56 bits) and which values are known
    /// ([`Known`] bits, high 8 bits).
    tag: u64,
    /// The tokens by how they are priced ([`Parts`] in its field order).
    parts: [u32; 8],
}

/// Presence bits of [`Usage`], kept in the high byte of its `tag`.
struct Known;

impl Known {
    const TOTAL: u64 = 1 << 56;
    const INPUT: u64 = 1 << 57;
    const OUTPUT: u64 = 1 << 58;
    /// A cached count was reported (its value is the parts' cached input).
    const CACHED: u64 = 1 << 59;
    const PARTS: u64 = 1 << 60;
    const COST: u64 = 1 << 61;
    /// The bits of the cost.
    const COST_MASK: u64 = (1 << 56) - 1;
}

/// The largest cost a usage carries: about 72 billion dollars in
/// micro-dollars. A larger one is treated as unknown (the reservation
/// stays).
pub const MAX_USAGE_COST: u64 = Known::COST_MASK;

impl std::fmt::Debug for Usage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Usage")
            .field("total", &self.total())
            .field("input", &self.input())
            .field("output", &self.output())
            .field("cached", &self.cached())
            .field("parts", &self.parts())
            .field("cost", &self.cost())
            .finish()
    }
}

/// `value` when `bit` is set in `tag`.
const fn when(tag: u64, bit: u64, value: u64) -> Option<u64> {
    if tag & bit != 0 { Some(value) } else { None }
}

/// The parts as 32-bit numbers, if every one fits.
const fn pack(p: &Parts) -> Option<[u32; 8]> {
    let all = [
        p.input,
        p.cached_input,
        p.cache_write,
        p.cache_write_1h,
        p.input_audio,
        p.output,
        p.reasoning,
        p.output_audio,
    ];
    let mut out = [0u32; 8];
    let mut i = 0;
    while i < 8 {
        if all[i] > u32::MAX as u64 {
            return None;
        }
        out[i] = all[i] as u32;
        i += 1;
    }
    Some(out)
}

impl Usage {
    /// Nothing usable was reported: the estimate is kept.
    pub const UNKNOWN: Usage = Usage {
        total: 0,
        input: 0,
        output: 0,
        tag: 0,
        parts: [0; 8],
    };

    /// A known total (zero means "known zero": every token is refunded).
    pub const fn known(total: u64) -> Self {
        Usage {
            total,
            tag: Known::TOTAL,
            ..Usage::UNKNOWN
        }
    }

    /// Known input and output counts; the total is their sum. All of them
    /// are plain tokens (see [`with_parts`](Usage::with_parts) for others).
    pub const fn from_io(input: u64, output: u64) -> Self {
        Usage {
            total: input.saturating_add(output),
            input,
            output,
            tag: Known::TOTAL | Known::INPUT | Known::OUTPUT,
            ..Usage::UNKNOWN
        }
        .with_parts(Some(Parts::plain(input, output)))
    }

    /// Applies the extraction rules of SPEC Q-6 to raw counters:
    ///
    /// * a valid explicit total wins;
    /// * a present but invalid total makes the usage unknown;
    /// * otherwise input + output, when at least one of them is valid: an
    ///   absent one counts as zero, an invalid one makes the usage unknown;
    /// * cached-token counters are telemetry, never a charge.
    ///
    /// The priced [`Parts`] follow OpenAI's reports: cached tokens are part
    /// of the input. They are known when input and output are both valid
    /// (or one is valid and the other absent) and the cached count, if
    /// present, is valid and not more than the input; a report nested
    /// otherwise sets them with [`with_parts`](Usage::with_parts).
    pub fn from_counters(total: Counter, input: Counter, output: Counter, cached: Counter) -> Self {
        let value = |c: Counter| match c {
            Counter::Value(v) => Some(v),
            _ => None,
        };
        let cached_raw = cached;
        let cached = value(cached);
        let (input_v, output_v) = (value(input), value(output));
        let total = match total {
            Counter::Value(t) => Some(t),
            Counter::Invalid => None,
            Counter::Absent => match (input, output) {
                (Counter::Invalid, _) | (_, Counter::Invalid) => None,
                (Counter::Absent, Counter::Absent) => None,
                _ => Some(input_v.unwrap_or(0).saturating_add(output_v.unwrap_or(0))),
            },
        };
        let parts = match (input, output, cached_raw) {
            (Counter::Invalid, ..) | (_, Counter::Invalid, _) | (.., Counter::Invalid) => None,
            (Counter::Absent, Counter::Absent, _) => None,
            _ => {
                let (i, o) = (input_v.unwrap_or(0), output_v.unwrap_or(0));
                let c = cached.unwrap_or(0);
                (c <= i).then(|| Parts {
                    cached_input: c,
                    ..Parts::plain(i - c, o)
                })
            }
        };
        let mut usage = Usage::UNKNOWN;
        for (bit, value, slot) in [
            (Known::TOTAL, total, &mut usage.total),
            (Known::INPUT, input_v, &mut usage.input),
            (Known::OUTPUT, output_v, &mut usage.output),
        ] {
            if let Some(v) = value {
                *slot = v;
                usage.tag |= bit;
            }
        }
        if cached.is_some() {
            usage.tag |= Known::CACHED;
        }
        usage.with_parts(parts)
    }

    /// The same counts with the tokens split as `parts` says (`None`: the
    /// split is unknown, so is the cost unless the total is zero); any cost
    /// set before is forgotten.
    pub const fn with_parts(mut self, parts: Option<Parts>) -> Self {
        self.tag &= !(Known::PARTS | Known::COST | Known::COST_MASK);
        self.parts = [0; 8];
        if let Some(p) = parts
            && let Some(packed) = pack(&p)
        {
            self.parts = packed;
            self.tag |= Known::PARTS;
        }
        self
    }

    /// The tokens by how they are priced, when known.
    pub const fn parts(&self) -> Option<Parts> {
        if self.tag & Known::PARTS == 0 {
            return None;
        }
        let p = &self.parts;
        Some(Parts {
            input: p[0] as u64,
            cached_input: p[1] as u64,
            cache_write: p[2] as u64,
            cache_write_1h: p[3] as u64,
            input_audio: p[4] as u64,
            output: p[5] as u64,
            reasoning: p[6] as u64,
            output_audio: p[7] as u64,
        })
    }

    /// The cost in micro-dollars, once priced (SPEC BUD-2).
    pub const fn cost(&self) -> Option<u64> {
        when(self.tag, Known::COST, self.tag & Known::COST_MASK)
    }

    /// The same usage with its cost at `price` (SPEC BUD-2): each kind of
    /// token at its own price when the split is known; zero when the
    /// provider reported known zero usage; otherwise the cost stays
    /// unknown and settlement keeps the reserved cost (SPEC Q-5: a
    /// provider that reports only a total does not say how much of it was
    /// output). A usage already priced keeps its cost.
    pub fn priced(self, price: &Price) -> Self {
        if self.cost().is_some() {
            return self;
        }
        let cost = match (self.parts(), self.total()) {
            (Some(parts), _) => Some(price.charge(&parts)),
            (None, Some(0)) => Some(0),
            (None, _) => None,
        };
        self.with_cost(cost)
    }

    /// The same usage with a known cost, set by whoever priced it (for a
    /// call whose every attempt was refused unbilled: `Some(0)` with the
    /// tokens unknown, SPEC BUD-5).
    pub const fn with_cost(mut self, cost: Option<u64>) -> Self {
        self.tag &= !(Known::COST | Known::COST_MASK);
        if let Some(c) = cost
            && c <= MAX_USAGE_COST
        {
            self.tag |= Known::COST | c;
        }
        self
    }

    /// The charge, when known.
    pub const fn total(&self) -> Option<u64> {
        when(self.tag, Known::TOTAL, self.total)
    }

    /// Whether a total is known (possibly zero).
    pub const fn is_known(&self) -> bool {
        self.tag & Known::TOTAL != 0
    }

    /// Reported input tokens, if valid.
    pub const fn input(&self) -> Option<u64> {
        when(self.tag, Known::INPUT, self.input)
    }

    /// Reported output tokens, if valid.
    pub const fn output(&self) -> Option<u64> {
        when(self.tag, Known::OUTPUT, self.output)
    }

    /// Reported cached input tokens (telemetry only): known when the
    /// provider reported them and the [`parts`](Usage::parts) are known
    /// (they are the parts' cached input).
    pub const fn cached(&self) -> Option<u64> {
        if self.tag & Known::CACHED != 0 && self.tag & Known::PARTS != 0 {
            Some(self.parts[1] as u64)
        } else {
            None
        }
    }
}

/// How one attempt's reservation was settled (SPEC Q-5).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Settlement {
    /// Tokens reserved by the estimate.
    pub estimate: u64,
    /// Tokens the provider reported; `None` when unknown.
    pub reported: Option<u64>,
    /// Tokens given back (reported below the estimate).
    pub refunded: u64,
    /// Tokens charged beyond the estimate.
    pub debt: u64,
    /// What was reported, split as the provider split it, priced when the
    /// lease had a price: other leases of the same call (a tenant's)
    /// settle their input, output and cost limits from it (SPEC Q-12,
    /// BUD-2).
    pub usage: Usage,
    /// The cost (micro-dollars) settled, SPEC BUD-2.
    pub cost: CostSettlement,
}

/// How one attempt's reserved cost was settled (SPEC BUD-2, Q-5), in
/// micro-dollars.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CostSettlement {
    /// The worst case reserved at admission.
    pub reserved: u64,
    /// The priced usage; `None` when unknown (the reservation stays).
    pub reported: Option<u64>,
    /// Given back (priced below the reservation).
    pub refunded: u64,
    /// Charged beyond the reservation.
    pub debt: u64,
}

impl CostSettlement {
    /// What the attempt is charged: the priced usage, or the reservation
    /// when the usage is unknown.
    pub const fn charged(&self) -> u64 {
        match self.reported {
            Some(c) => c,
            None => self.reserved,
        }
    }
}

impl Settlement {
    pub(crate) fn new(estimate: &crate::quota::Demand, usage: Usage) -> Self {
        let reserved = estimate.cost;
        let cost = CostSettlement {
            reserved,
            reported: usage.cost(),
            refunded: usage.cost().map_or(0, |c| reserved.saturating_sub(c)),
            debt: usage.cost().map_or(0, |c| c.saturating_sub(reserved)),
        };
        let estimate = estimate.tokens();
        match usage.total() {
            None => Settlement {
                estimate,
                reported: None,
                refunded: 0,
                debt: 0,
                usage,
                cost,
            },
            Some(actual) => Settlement {
                estimate,
                reported: Some(actual),
                refunded: estimate.saturating_sub(actual),
                debt: actual.saturating_sub(estimate),
                usage,
                cost,
            },
        }
    }
}

/// A lease's usage was already settled: each attempt settles once.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("this attempt's usage was already reconciled")]
pub struct AlreadySettled;

#[cfg(test)]
mod tests {
    use super::Counter::{Absent, Invalid, Value};
    use super::*;

    // proves: BUD-2, Q-5 (a usage is priced from its parts; known zero
    // costs nothing; a total without a split keeps the cost unknown, so
    // the reservation stays; cached tokens are part of the input in
    // OpenAI's counters and priced apart)
    #[test]
    fn pricing_a_usage() {
        let price = Price {
            cached_input: Some(500_000),
            ..Price::new(1_000_000, 2_000_000)
        };
        let u = Usage::from_counters(Absent, Value(1_000), Value(100), Value(400)).priced(&price);
        assert_eq!(
            u.parts(),
            Some(Parts {
                cached_input: 400,
                ..Parts::plain(600, 100)
            })
        );
        // 600 * 1 + 400 * 0.5 + 100 * 2 = 1000 µ$.
        assert_eq!(u.cost(), Some(1_000));
        assert_eq!(Usage::known(0).priced(&price).cost(), Some(0));
        assert_eq!(Usage::known(10).priced(&price).cost(), None);
        assert_eq!(Usage::UNKNOWN.priced(&price).cost(), None);
        // More cached than input: the split is not trusted.
        let odd = Usage::from_counters(Absent, Value(10), Value(1), Value(11));
        assert_eq!(odd.parts(), None);
        assert_eq!(odd.total(), Some(11));
        // Invalid cached counter: no split.
        assert_eq!(
            Usage::from_counters(Absent, Value(10), Value(1), Invalid).parts(),
            None
        );
        // Priced once: a second price does not change it.
        let again = u.priced(&Price::new(9_000_000, 9_000_000));
        assert_eq!(again.cost(), Some(1_000));
        // A cost set by hand with unknown tokens (an unbilled refusal).
        assert_eq!(Usage::UNKNOWN.with_cost(Some(0)).cost(), Some(0));
        assert_eq!(Usage::UNKNOWN.with_cost(Some(0)).total(), None);
        // Beyond the bound, a cost is unknown; the parts too when a kind
        // does not fit in 32 bits.
        assert_eq!(
            Usage::UNKNOWN.with_cost(Some(MAX_USAGE_COST)).cost(),
            Some(MAX_USAGE_COST)
        );
        assert_eq!(
            Usage::UNKNOWN.with_cost(Some(MAX_USAGE_COST + 1)).cost(),
            None
        );
        let huge = Usage::from_io(1 << 40, 1);
        assert_eq!((huge.total(), huge.parts()), (Some((1 << 40) + 1), None));
        assert_eq!(std::mem::size_of::<Usage>(), 64, "as small as before parts");
        let s = Settlement::new(&crate::quota::Demand::new(10, 10).with_cost(5_000), u);
        assert_eq!(s.cost.reserved, 5_000);
        assert_eq!(
            (s.cost.refunded, s.cost.debt, s.cost.charged()),
            (4_000, 0, 1_000)
        );
        let kept = Settlement::new(
            &crate::quota::Demand::new(10, 10).with_cost(5_000),
            Usage::UNKNOWN,
        );
        assert_eq!(kept.cost.charged(), 5_000);
    }

    // proves: Q-6 (the usage table, row by row)
    #[test]
    fn extraction_table() {
        let rows: [(&str, Usage, Option<u64>); 9] = [
            (
                "absent",
                Usage::from_counters(Absent, Absent, Absent, Absent),
                None,
            ),
            (
                "cached only",
                Usage::from_counters(Absent, Absent, Absent, Value(40)),
                None,
            ),
            (
                "explicit total zero",
                Usage::from_counters(Value(0), Absent, Absent, Absent),
                Some(0),
            ),
            (
                "input and output",
                Usage::from_counters(Absent, Value(7), Value(3), Absent),
                Some(10),
            ),
            (
                "input only",
                Usage::from_counters(Absent, Value(7), Absent, Absent),
                Some(7),
            ),
            (
                "explicit total wins",
                Usage::from_counters(Value(12), Value(7), Value(3), Absent),
                Some(12),
            ),
            (
                "invalid input",
                Usage::from_counters(Absent, Invalid, Value(3), Absent),
                None,
            ),
            (
                "invalid total",
                Usage::from_counters(Invalid, Value(7), Value(3), Absent),
                None,
            ),
            (
                "cached is not a charge",
                Usage::from_counters(Absent, Value(7), Value(3), Value(5)),
                Some(10),
            ),
        ];
        for (name, usage, want) in rows {
            assert_eq!(usage.total(), want, "{name}");
        }
        // Cached tokens are telemetry kept with the split they belong to.
        assert_eq!(
            Usage::from_counters(Absent, Value(50), Absent, Value(40)).cached(),
            Some(40)
        );
        assert_eq!(
            Usage::from_counters(Absent, Absent, Absent, Value(40)).cached(),
            None
        );
    }

    // proves: Q-5 (unknown keeps the estimate; known zero refunds every token)
    #[test]
    fn unknown_and_known_zero_differ() {
        assert_ne!(Usage::UNKNOWN, Usage::known(0));
        assert!(!Usage::UNKNOWN.is_known());
        assert!(Usage::known(0).is_known());
        let est = crate::quota::Demand::new(100, 0);
        let s = Settlement::new(&est, Usage::UNKNOWN);
        assert_eq!((s.refunded, s.debt, s.reported), (0, 0, None));
        let s = Settlement::new(&est, Usage::known(0));
        assert_eq!((s.refunded, s.debt, s.reported), (100, 0, Some(0)));
        let s = Settlement::new(&est, Usage::from_io(80, 60));
        assert_eq!((s.refunded, s.debt), (0, 40));
    }
}

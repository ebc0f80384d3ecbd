//! What a provider reports it used, and how it settles a reservation
//! (SPEC ).
//!
//! "Unknown" and "known zero" are different states and cannot be confused:
//! [`Usage::UNKNOWN`] keeps the reservation's estimate (conservative), while
//! [`Usage::known`]`(0)` refunds every reserved token but keeps the request
//! unit, because a provider attempt did start.

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
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Usage {
    total: Option<u64>,
    input: Option<u64>,
    output: Option<u64>,
    cached: Option<u64>,
}

impl Usage {
    /// Nothing usable was reported: the estimate is kept.
    pub const UNKNOWN: Usage = Usage {
        total: None,
        input: None,
        output: None,
        cached: None,
    };

    /// A known total (zero means "known zero": every token is refunded).
    pub const fn known(total: u64) -> Self {
        Usage {
            total: Some(total),
            input: None,
            output: None,
            cached: None,
        }
    }

    /// Known input and output counts; the total is their sum.
    pub const fn from_io(input: u64, output: u64) -> Self {
        Usage {
            total: Some(input.saturating_add(output)),
            input: Some(input),
            output: Some(output),
            cached: None,
        }
    }

    /// Applies the extraction rules of SPEC Q-6 to raw counters:
    ///
    /// * a valid explicit total wins;
    /// * a present but invalid total makes the usage unknown;
    /// * otherwise input + output, when at least one of them is valid: an
    ///   absent one counts as zero, an invalid one makes the usage unknown;
    /// * cached-token counters are telemetry, never a charge.
    pub fn from_counters(total: Counter, input: Counter, output: Counter, cached: Counter) -> Self {
        let value = |c: Counter| match c {
            Counter::Value(v) => Some(v),
            _ => None,
        };
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
        Usage {
            total,
            input: input_v,
            output: output_v,
            cached,
        }
    }

    /// The charge, when known.
    pub const fn total(&self) -> Option<u64> {
        self.total
    }

    /// Whether a total is known (possibly zero).
    pub const fn is_known(&self) -> bool {
        self.total.is_some()
    }

    /// Reported input tokens, if valid.
    pub const fn input(&self) -> Option<u64> {
        self.input
    }

    /// Reported output tokens, if valid.
    pub const fn output(&self) -> Option<u64> {
        self.output
    }

    /// Reported cached input tokens (telemetry only).
    pub const fn cached(&self) -> Option<u64> {
        self.cached
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
    /// What was reported, split as the provider split it: other leases of
    /// the same call (a tenant's) settle their input and output limits from
    /// it (SPEC Q-12).
    pub usage: Usage,
}

impl Settlement {
    pub(crate) fn new(estimate: u64, usage: Usage) -> Self {
        match usage.total() {
            None => Settlement {
                estimate,
                reported: None,
                refunded: 0,
                debt: 0,
                usage,
            },
            Some(actual) => Settlement {
                estimate,
                reported: Some(actual),
                refunded: estimate.saturating_sub(actual),
                debt: actual.saturating_sub(estimate),
                usage,
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
        assert_eq!(
            Usage::from_counters(Absent, Absent, Absent, Value(40)).cached(),
            Some(40)
        );
    }

    // proves: Q-5 (unknown keeps the estimate; known zero refunds every token)
    #[test]
    fn unknown_and_known_zero_differ() {
        assert_ne!(Usage::UNKNOWN, Usage::known(0));
        assert!(!Usage::UNKNOWN.is_known());
        assert!(Usage::known(0).is_known());
        let s = Settlement::new(100, Usage::UNKNOWN);
        assert_eq!((s.refunded, s.debt, s.reported), (0, 0, None));
        let s = Settlement::new(100, Usage::known(0));
        assert_eq!((s.refunded, s.debt, s.reported), (100, 0, Some(0)));
        let s = Settlement::new(100, Usage::from_io(80, 60));
        assert_eq!((s.refunded, s.debt), (0, 40));
    }
}

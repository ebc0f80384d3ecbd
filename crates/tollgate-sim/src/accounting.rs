//! How the simulated provider counts a request at its limiter, as opposed to
//! what it bills: where it counts (an ingress delay after receipt), what it
//! charges (its token accounting, with or without later reconciliation) and
//! what a refusal costs. See the crate README, "Behaviour and decisions".

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use crate::duration::{go_duration, parse_duration};

/// The longest ingress delay accepted (one hour).
pub const MAX_INGRESS_DELAY: Duration = Duration::from_secs(3600);

/// Delay between receiving a request and counting it at the limiter, drawn
/// uniformly from `[min, max]` per request (seeded, reproducible).
///
/// Parsed from `"20ms..300ms"` or a single value such as `"100ms"` (then
/// `min == max`). The default is no delay.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct IngressDelay {
    /// Shortest delay.
    pub min: Duration,
    /// Longest delay (inclusive).
    pub max: Duration,
}

impl IngressDelay {
    /// A fixed delay.
    pub const fn fixed(delay: Duration) -> Self {
        Self {
            min: delay,
            max: delay,
        }
    }

    /// A delay drawn uniformly from `min..=max`.
    pub const fn range(min: Duration, max: Duration) -> Self {
        Self { min, max }
    }

    /// Whether no request is ever delayed.
    pub fn is_zero(&self) -> bool {
        self.max.is_zero()
    }

    /// The delay of API request `seq` under `seed`: uniform over
    /// `[min, max]` at nanosecond resolution, from a generator seeded by
    /// `(seed, seq)` and independent of the fault draws. The same seed and
    /// sequence number always give the same delay.
    pub fn draw(&self, seed: u64, seq: u64) -> Duration {
        if self.max <= self.min {
            return self.min;
        }
        let low = nanos(self.min);
        let high = nanos(self.max);
        let mut rng = fastrand::Rng::with_seed(mix(seed ^ INGRESS_STREAM, seq));
        Duration::from_nanos(rng.u64(low..=high))
    }
}

/// Distinguishes the ingress draws from the fault draws of the same
/// `(seed, seq)`.
const INGRESS_STREAM: u64 = 0x1D6E_55DE_1A75_0001;

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// SplitMix64 finaliser over `(seed, seq)`.
fn mix(seed: u64, seq: u64) -> u64 {
    let mut z = seed ^ seq.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

impl fmt::Display for IngressDelay {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.min == self.max {
            f.write_str(&go_duration(self.min))
        } else {
            write!(f, "{}..{}", go_duration(self.min), go_duration(self.max))
        }
    }
}

impl FromStr for IngressDelay {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let parse = |part: &str| parse_duration(part).map_err(|e| e.to_string());
        match s.split_once("..") {
            Some((min, max)) => Ok(Self::range(parse(min)?, parse(max)?)),
            None => Ok(Self::fixed(parse(s)?)),
        }
    }
}

/// What the rate limiter charges a request's tokens at its counting instant.
///
/// Whatever the mode, the `usage` in responses is the simulator's billing
/// count (prompt + generated completion, [`crate::tokens`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ChargeMode {
    /// Prompt tokens by the simulator's count plus the completion it will
    /// generate: exactly the reported usage (the default).
    #[default]
    Usage,
    /// `ceil(characters of the message contents / chars_per_token)`, plus
    /// the request's `max_completion_tokens` / `max_tokens` when `output` is
    /// set (the configured `completion_tokens` when the request sets
    /// neither). Embeddings: `ceil(characters of the string inputs /
    /// chars_per_token)` plus the number of token ids, never an output.
    Chars {
        /// Characters per token (at least 1).
        chars_per_token: u32,
        /// Whether the output allowance is added.
        output: bool,
    },
}

impl ChargeMode {
    /// The rate-limit charge of a chat request: `chars` characters of
    /// message content, `requested` its `max_completion_tokens` /
    /// `max_tokens`, `usage` its billing total, `default_output` the output
    /// allowance used when the request sets no maximum.
    pub fn chat(&self, chars: u64, requested: Option<u64>, usage: u64, default_output: u64) -> u64 {
        match *self {
            Self::Usage => usage,
            Self::Chars {
                chars_per_token,
                output,
            } => {
                let input = chars.div_ceil(u64::from(chars_per_token.max(1)));
                if output {
                    input.saturating_add(requested.unwrap_or(default_output))
                } else {
                    input
                }
            }
        }
    }

    /// The rate-limit charge of an embeddings request: `chars` characters of
    /// its string inputs, `ids` token ids of its token-id inputs, `usage`
    /// its billing total.
    pub fn embeddings(&self, chars: u64, ids: u64, usage: u64) -> u64 {
        match *self {
            Self::Usage => usage,
            Self::Chars {
                chars_per_token, ..
            } => chars
                .div_ceil(u64::from(chars_per_token.max(1)))
                .saturating_add(ids),
        }
    }
}

impl fmt::Display for ChargeMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Self::Usage => f.write_str("usage"),
            Self::Chars {
                chars_per_token,
                output: true,
            } => write!(f, "chars:{chars_per_token}+max_tokens"),
            Self::Chars {
                chars_per_token,
                output: false,
            } => write!(f, "chars:{chars_per_token}"),
        }
    }
}

impl FromStr for ChargeMode {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad =
            || format!("invalid charge mode {s:?} (expected usage, chars:N or chars:N+max_tokens)");
        let s = s.trim();
        if s == "usage" {
            return Ok(Self::Usage);
        }
        let rest = s.strip_prefix("chars:").ok_or_else(bad)?;
        let (n, output) = match rest.split_once('+') {
            Some((n, "max_tokens")) => (n, true),
            Some(_) => return Err(bad()),
            None => (rest, false),
        };
        let chars_per_token = n.trim().parse::<u32>().map_err(|_| bad())?;
        Ok(Self::Chars {
            chars_per_token,
            output,
        })
    }
}

/// What a request refused with 429 still costs in the windows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum RefusalCharge {
    /// Nothing (the default).
    #[default]
    None,
    /// One request unit.
    Requests,
    /// One request unit and the request's token charge (except a
    /// `too_large` refusal, whose tokens can never fit: request unit only).
    All,
}

impl fmt::Display for RefusalCharge {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::None => "none",
            Self::Requests => "requests",
            Self::All => "all",
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // proves: SIM-2 (ingress delay: a uniform, seeded, reproducible draw; Q-15)
    #[test]
    fn ingress_draws_are_uniform_bounded_and_reproducible() {
        let d = IngressDelay::range(Duration::from_millis(50), Duration::from_millis(100));
        let a: Vec<_> = (0..2_000).map(|seq| d.draw(7, seq)).collect();
        let b: Vec<_> = (0..2_000).map(|seq| d.draw(7, seq)).collect();
        let c: Vec<_> = (0..2_000).map(|seq| d.draw(8, seq)).collect();
        assert_eq!(a, b);
        assert_ne!(a, c);
        assert!(a.iter().all(|x| (d.min..=d.max).contains(x)));
        // Roughly uniform: each fifth of the range gets 400 ± 100 draws.
        let mut buckets = [0u32; 5];
        for x in &a {
            let i = (x.as_nanos() - d.min.as_nanos()) * 5 / (d.max - d.min).as_nanos();
            buckets[usize::try_from(i).unwrap_or(4).min(4)] += 1;
        }
        assert!(
            buckets.iter().all(|n| (300..500).contains(n)),
            "{buckets:?}"
        );
        let fixed = IngressDelay::fixed(Duration::from_millis(30));
        assert_eq!(fixed.draw(1, 2), Duration::from_millis(30));
        assert!(IngressDelay::default().is_zero());
    }

    #[test]
    fn ingress_delay_parses_a_range_or_a_value() {
        assert_eq!(
            "20ms..300ms".parse(),
            Ok(IngressDelay::range(
                Duration::from_millis(20),
                Duration::from_millis(300)
            ))
        );
        assert_eq!(
            "100ms".parse(),
            Ok(IngressDelay::fixed(Duration::from_millis(100)))
        );
        assert!("20ms..".parse::<IngressDelay>().is_err());
        assert!("fast".parse::<IngressDelay>().is_err());
        assert_eq!(
            IngressDelay::range(Duration::from_millis(20), Duration::from_millis(300)).to_string(),
            "20ms..300ms"
        );
    }

    // proves: SIM-2 (the limiter's token accounting formulas; Q-16)
    #[test]
    fn charge_modes_parse_and_follow_their_formulas() {
        assert_eq!("usage".parse(), Ok(ChargeMode::Usage));
        let openai: ChargeMode = "chars:4+max_tokens".parse().expect("valid");
        assert_eq!(
            openai,
            ChargeMode::Chars {
                chars_per_token: 4,
                output: true
            }
        );
        let input_only: ChargeMode = "chars:3".parse().expect("valid");
        for bad in ["", "chars", "chars:", "chars:x", "chars:4+output", "tokens"] {
            assert!(bad.parse::<ChargeMode>().is_err(), "{bad}");
        }
        for mode in [ChargeMode::Usage, openai, input_only] {
            assert_eq!(mode.to_string().parse(), Ok(mode));
        }
        // 13 characters, max_tokens 100, billing usage 26, default output 16.
        assert_eq!(ChargeMode::Usage.chat(13, Some(100), 26, 16), 26);
        assert_eq!(openai.chat(13, Some(100), 26, 16), 4 + 100);
        assert_eq!(openai.chat(13, None, 26, 16), 4 + 16);
        assert_eq!(input_only.chat(13, Some(100), 26, 16), 5);
        assert_eq!(openai.embeddings(9, 2, 5), 3 + 2);
        assert_eq!(ChargeMode::Usage.embeddings(9, 2, 5), 5);
    }
}

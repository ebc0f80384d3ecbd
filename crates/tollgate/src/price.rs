//! Money (SPEC BUD-1, BUD-2): prices per token kind and the cost of a call,
//! in integers only.
//!
//! Units:
//!
//! * a **cost** is in micro-units of the currency, here micro-dollars
//!   (µUSD): `1_000_000` is one dollar;
//! * a **price** is in micro-dollars per million tokens (so `2_500_000` is
//!   $2.50 per million tokens, OpenAI's and Anthropic's own way of writing
//!   prices). A price has six decimals of a dollar per million tokens; no
//!   published price needs more.
//!
//! A cost is `ceil(Σ tokens × price / 1_000_000)`: the products are summed
//! exactly in 128 bits and divided once, rounding **up**, so a call is
//! never charged less than its exact price (at most one micro-dollar
//! more), and a reservation priced the same way never under-counts.
//!
//! The worst case of an attempt ([`Price::worst_case`]) prices each input
//! token at the dearest input kind the model has (plain, cached, cache
//! write, audio) and each token of the output allowance at the dearest
//! output kind (plain, reasoning, audio): whatever the provider reports
//! later, priced at [`Price::charge`], cannot exceed it unless the
//! provider counted more tokens than the estimate.

use std::fmt;

/// A model's prices, in micro-dollars per million tokens (see the module
/// documentation). A kind left `None` is priced like the kind it is a
/// special case of: cached input, cache writes and input audio like
/// input; one-hour cache writes like cache writes; reasoning and output
/// audio like output.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Price {
    /// Plain (uncached) input tokens.
    pub input: u64,
    /// Input tokens read from the provider's prompt cache.
    pub cached_input: Option<u64>,
    /// Input tokens written to the prompt cache (Anthropic: the default
    /// five-minute cache).
    pub cache_write: Option<u64>,
    /// Input tokens written to a one-hour cache (Anthropic's `ttl: 1h`).
    pub cache_write_1h: Option<u64>,
    /// Audio input tokens.
    pub input_audio: Option<u64>,
    /// Plain output tokens.
    pub output: u64,
    /// Reasoning (thinking) tokens, where a provider prices them apart
    /// from the output (OpenAI and Anthropic bill them as output).
    pub reasoning: Option<u64>,
    /// Audio output tokens.
    pub output_audio: Option<u64>,
}

/// Tokens of one attempt by how they are priced. The kinds are disjoint:
/// `input` excludes cached, cache-written and audio input, `output`
/// excludes reasoning and audio output (the provider's own reports nest
/// them differently; the wire layer takes them apart).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Parts {
    /// Plain input tokens.
    pub input: u64,
    /// Input tokens read from the cache.
    pub cached_input: u64,
    /// Input tokens written to the (five-minute) cache.
    pub cache_write: u64,
    /// Input tokens written to a one-hour cache.
    pub cache_write_1h: u64,
    /// Audio input tokens.
    pub input_audio: u64,
    /// Plain output tokens.
    pub output: u64,
    /// Reasoning tokens.
    pub reasoning: u64,
    /// Audio output tokens.
    pub output_audio: u64,
}

impl Parts {
    /// Plain input and output only.
    pub const fn plain(input: u64, output: u64) -> Self {
        Parts {
            input,
            cached_input: 0,
            cache_write: 0,
            cache_write_1h: 0,
            input_audio: 0,
            output,
            reasoning: 0,
            output_audio: 0,
        }
    }

    /// Every input token, whatever its kind.
    pub const fn input_total(&self) -> u64 {
        self.input
            .saturating_add(self.cached_input)
            .saturating_add(self.cache_write)
            .saturating_add(self.cache_write_1h)
            .saturating_add(self.input_audio)
    }

    /// Every output token, whatever its kind.
    pub const fn output_total(&self) -> u64 {
        self.output
            .saturating_add(self.reasoning)
            .saturating_add(self.output_audio)
    }
}

/// One million: prices are per million tokens.
const PER: u128 = 1_000_000;

impl Price {
    /// A price of `input` and `output` micro-dollars per million tokens,
    /// every other kind priced like them.
    pub const fn new(input: u64, output: u64) -> Self {
        Price {
            input,
            cached_input: None,
            cache_write: None,
            cache_write_1h: None,
            input_audio: None,
            output,
            reasoning: None,
            output_audio: None,
        }
    }

    /// The price of cached input (input's when not set).
    pub const fn cached_input_or_input(&self) -> u64 {
        match self.cached_input {
            Some(p) => p,
            None => self.input,
        }
    }

    /// The price of a cache write (input's when not set).
    pub const fn cache_write_or_input(&self) -> u64 {
        match self.cache_write {
            Some(p) => p,
            None => self.input,
        }
    }

    /// The price of a one-hour cache write (a cache write's when not set).
    pub const fn cache_write_1h_or_write(&self) -> u64 {
        match self.cache_write_1h {
            Some(p) => p,
            None => self.cache_write_or_input(),
        }
    }

    /// The price of audio input (input's when not set).
    pub const fn input_audio_or_input(&self) -> u64 {
        match self.input_audio {
            Some(p) => p,
            None => self.input,
        }
    }

    /// The price of reasoning (output's when not set).
    pub const fn reasoning_or_output(&self) -> u64 {
        match self.reasoning {
            Some(p) => p,
            None => self.output,
        }
    }

    /// The price of audio output (output's when not set).
    pub const fn output_audio_or_output(&self) -> u64 {
        match self.output_audio {
            Some(p) => p,
            None => self.output,
        }
    }

    /// The dearest price an input token can have.
    pub fn max_input(&self) -> u64 {
        self.input
            .max(self.cached_input_or_input())
            .max(self.cache_write_or_input())
            .max(self.cache_write_1h_or_write())
            .max(self.input_audio_or_input())
    }

    /// The dearest price an output token can have.
    pub fn max_output(&self) -> u64 {
        self.output
            .max(self.reasoning_or_output())
            .max(self.output_audio_or_output())
    }

    /// The prices an attempt of this model is reserved at.
    pub fn reserve_price(&self) -> ReservePrice {
        ReservePrice {
            input: self.max_input(),
            output: self.max_output(),
        }
    }

    /// The most an attempt of `input` estimated input tokens and an
    /// `output` allowance can cost, in micro-dollars, rounded up (what
    /// admission reserves, SPEC BUD-2). Saturates at `u64::MAX`.
    pub fn worst_case(&self, input: u64, output: u64) -> u64 {
        self.reserve_price().worst_case(input, output)
    }

    /// What `parts` cost, in micro-dollars, rounded up (SPEC BUD-2: each
    /// kind at its own price). Saturates at `u64::MAX`.
    pub fn charge(&self, parts: &Parts) -> u64 {
        let terms = [
            (parts.input, self.input),
            (parts.cached_input, self.cached_input_or_input()),
            (parts.cache_write, self.cache_write_or_input()),
            (parts.cache_write_1h, self.cache_write_1h_or_write()),
            (parts.input_audio, self.input_audio_or_input()),
            (parts.output, self.output),
            (parts.reasoning, self.reasoning_or_output()),
            (parts.output_audio, self.output_audio_or_output()),
        ];
        let sum = terms.iter().fold(0u128, |s, &(n, p)| {
            s.saturating_add(u128::from(n) * u128::from(p))
        });
        micros_up(sum)
    }

    /// A price at least as dear as both `self` and `other` for every kind:
    /// its worst case covers either model's (a call that may fall back
    /// from one model to another reserves that, SPEC GW-10).
    pub fn max(&self, other: &Price) -> Price {
        Price {
            input: self.input.max(other.input),
            cached_input: Some(
                self.cached_input_or_input()
                    .max(other.cached_input_or_input()),
            ),
            cache_write: Some(
                self.cache_write_or_input()
                    .max(other.cache_write_or_input()),
            ),
            cache_write_1h: Some(
                self.cache_write_1h_or_write()
                    .max(other.cache_write_1h_or_write()),
            ),
            input_audio: Some(
                self.input_audio_or_input()
                    .max(other.input_audio_or_input()),
            ),
            output: self.output.max(other.output),
            reasoning: Some(self.reasoning_or_output().max(other.reasoning_or_output())),
            output_audio: Some(
                self.output_audio_or_output()
                    .max(other.output_audio_or_output()),
            ),
        }
    }
}

/// What admission prices an attempt at (SPEC BUD-2): its model's dearest
/// input and dearest output price, in micro-dollars per million tokens
/// (see [`Price::reserve_price`]). Small, so that every queued call can
/// carry it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct ReservePrice {
    /// The dearest price of an input token.
    pub input: u64,
    /// The dearest price of an output token.
    pub output: u64,
}

impl ReservePrice {
    /// The most `input` input tokens and `output` output tokens can cost,
    /// in micro-dollars, rounded up. Saturates at `u64::MAX`.
    pub fn worst_case(&self, input: u64, output: u64) -> u64 {
        let sum = (u128::from(input) * u128::from(self.input))
            .saturating_add(u128::from(output) * u128::from(self.output));
        micros_up(sum)
    }
}

/// `sum` (micro-dollars times a million) in micro-dollars, rounded up,
/// saturating.
fn micros_up(sum: u128) -> u64 {
    u64::try_from(sum.div_ceil(PER)).unwrap_or(u64::MAX)
}

/// A decimal amount of dollars that could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{reason}")]
pub struct MoneyError {
    /// What is wrong with it (the text itself is not repeated).
    pub reason: String,
}

impl MoneyError {
    fn new(reason: impl Into<String>) -> Self {
        MoneyError {
            reason: reason.into(),
        }
    }
}

/// Reads a decimal amount of dollars, such as `50`, `0.15` or `2.5`, into
/// micro-dollars, exactly (no floating point): at most six decimals, no
/// sign, no exponent. Fails above `max` micro-dollars.
///
/// ```
/// use tollgate::price::parse_usd;
/// assert_eq!(parse_usd("2.50", u64::MAX), Ok(2_500_000));
/// assert_eq!(parse_usd("0.000001", u64::MAX), Ok(1));
/// assert!(parse_usd("0.0000001", u64::MAX).is_err());
/// assert!(parse_usd("-1", u64::MAX).is_err());
/// ```
pub fn parse_usd(text: &str, max: u64) -> Result<u64, MoneyError> {
    let text = text.trim();
    let (whole, frac) = match text.split_once('.') {
        Some((w, f)) => (w, f),
        None => (text, ""),
    };
    let digits = |s: &str| s.bytes().all(|b| b.is_ascii_digit());
    if text.starts_with('-') {
        return Err(MoneyError::new("must not be negative"));
    }
    if (whole.is_empty() && frac.is_empty()) || !digits(whole) || !digits(frac) {
        return Err(MoneyError::new(
            "is not a decimal number of dollars (write e.g. 50, 2.5 or 0.15)",
        ));
    }
    if frac.len() > 6 {
        return Err(MoneyError::new(
            "has more than six decimals (money is counted in micro-dollars)",
        ));
    }
    let too_large = || {
        MoneyError::new(format!(
            "is too large (at most {} dollars)",
            format_usd(max)
        ))
    };
    let whole: u128 = if whole.is_empty() {
        0
    } else {
        whole.parse().map_err(|_| too_large())?
    };
    let mut frac_micros: u128 = 0;
    for (i, b) in frac.bytes().enumerate() {
        frac_micros += u128::from(b - b'0') * 10u128.pow(5 - i as u32);
    }
    let micros = whole
        .checked_mul(PER)
        .and_then(|w| w.checked_add(frac_micros))
        .ok_or_else(too_large)?;
    u64::try_from(micros)
        .ok()
        .filter(|m| *m <= max)
        .ok_or_else(too_large)
}

/// Micro-dollars as a decimal number of dollars with the trailing zeros
/// of the decimals dropped: `1500000` → `1.5`, `150` → `0.00015`, `0` →
/// `0`.
pub fn format_usd(micros: u64) -> String {
    Usd(micros).to_string()
}

/// Displays micro-dollars as [`format_usd`] does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Usd(pub u64);

impl fmt::Display for Usd {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (whole, frac) = (self.0 / 1_000_000, self.0 % 1_000_000);
        if frac == 0 {
            return write!(f, "{whole}");
        }
        let frac = format!("{frac:06}");
        write!(f, "{whole}.{}", frac.trim_end_matches('0'))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // proves: BUD-1 (money is integers: decimals read exactly, six
    // decimals at most, never negative, never past the bound)
    #[test]
    fn dollars_are_read_exactly() {
        let max = u64::MAX;
        assert_eq!(parse_usd("50", max), Ok(50_000_000));
        assert_eq!(parse_usd(" 0.15 ", max), Ok(150_000));
        assert_eq!(parse_usd(".5", max), Ok(500_000));
        assert_eq!(parse_usd("3.", max), Ok(3_000_000));
        assert_eq!(parse_usd("0", max), Ok(0));
        assert_eq!(parse_usd("0.1", max), Ok(100_000));
        assert_eq!(parse_usd("18446744073709.551615", max), Ok(u64::MAX));
        for bad in [
            "",
            ".",
            "-1",
            "1e3",
            "1,5",
            "abc",
            "1.0000001",
            "+1",
            " ",
            "18446744073710",
        ] {
            assert!(parse_usd(bad, max).is_err(), "{bad:?}");
        }
        assert!(parse_usd("10.01", 10_000_000).is_err());
        assert_eq!(parse_usd("10", 10_000_000), Ok(10_000_000));
        assert_eq!(format_usd(1_500_000), "1.5");
        assert_eq!(format_usd(150), "0.00015");
        assert_eq!(format_usd(0), "0");
        assert_eq!(format_usd(50_000_000), "50");
    }

    // proves: BUD-1, BUD-2 (each kind at its own price, summed exactly and
    // rounded up once; unset kinds fall back to their parent's price)
    #[test]
    fn charges_price_each_kind_and_round_up_once() {
        // gpt-4o-mini: $0.15 input, $0.075 cached, $0.60 output per 1M.
        let p = Price {
            cached_input: Some(75_000),
            ..Price::new(150_000, 600_000)
        };
        // 1,000 plain input, 3,000 cached, 500 output:
        // 1000*0.15 + 3000*0.075 + 500*0.6 = 150 + 225 + 300 = 675 µ$.
        let parts = Parts {
            cached_input: 3_000,
            ..Parts::plain(1_000, 500)
        };
        assert_eq!(p.charge(&parts), 675);
        // One plain input token: 0.15 µ$, rounded up to 1.
        assert_eq!(p.charge(&Parts::plain(1, 0)), 1);
        // Seven tokens: 1.05 µ$ → 2 (rounded once on the sum).
        assert_eq!(p.charge(&Parts::plain(7, 0)), 2);
        assert_eq!(p.charge(&Parts::default()), 0);
        // Unset kinds: reasoning and audio like output, writes like input.
        let q = Price::new(1_000_000, 4_000_000);
        let all = Parts {
            input: 1,
            cached_input: 1,
            cache_write: 1,
            cache_write_1h: 1,
            input_audio: 1,
            output: 1,
            reasoning: 1,
            output_audio: 1,
        };
        assert_eq!(q.charge(&all), 5 + 12);
        // Huge counts saturate instead of wrapping.
        let huge = Price::new(u64::MAX, u64::MAX);
        assert_eq!(huge.charge(&Parts::plain(u64::MAX, u64::MAX)), u64::MAX);
        assert_eq!(huge.worst_case(u64::MAX, u64::MAX), u64::MAX);
    }

    // proves: BUD-2 (the worst case covers any report of no more tokens
    // than estimated, whatever its kinds)
    #[test]
    fn the_worst_case_covers_every_split() {
        let p = Price {
            cached_input: Some(300_000),
            cache_write: Some(3_750_000),
            cache_write_1h: Some(6_000_000),
            ..Price::new(3_000_000, 15_000_000)
        };
        assert_eq!(p.max_input(), 6_000_000);
        assert_eq!(p.max_output(), 15_000_000);
        let worst = p.worst_case(1_000, 200);
        assert_eq!(worst, 6_000 + 3_000);
        for split in 0..=1_000u64 {
            let parts = Parts {
                cache_write: split,
                cache_write_1h: 1_000 - split,
                ..Parts::plain(0, 200)
            };
            assert!(p.charge(&parts) <= worst);
        }
        let m = p.max(&Price::new(5_000_000, 1_000_000));
        assert_eq!(m.input, 5_000_000);
        assert_eq!(m.output, 15_000_000);
        assert!(m.worst_case(10, 10) >= p.worst_case(10, 10));
        assert!(m.worst_case(10, 10) >= Price::new(5_000_000, 1_000_000).worst_case(10, 10));
    }
}

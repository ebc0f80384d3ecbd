//! The hints struct and its header extraction.

use std::time::{Duration, SystemTime};

use http::HeaderMap;

use super::parse;

/// What a provider said about one limited dimension (requests, tokens, …).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct DimensionHints {
    /// The limit of the window.
    pub limit: Option<u64>,
    /// What is left in the current window.
    pub remaining: Option<u64>,
    /// Time until the dimension is fully replenished (OpenAI) or until it
    /// resets (Anthropic), measured from the response.
    pub reset: Option<Duration>,
}

impl DimensionHints {
    /// `true` when nothing is known about the dimension.
    pub fn is_empty(&self) -> bool {
        self.limit.is_none() && self.remaining.is_none() && self.reset.is_none()
    }

    /// `true` when the provider reported fewer than `needed` units left
    /// (`needed` is treated as at least 1, so a reported zero always counts).
    pub fn is_short_of(&self, needed: u64) -> bool {
        self.remaining.is_some_and(|r| r < needed.max(1))
    }

    /// Fills the fields that are still `None` from `other`.
    fn or(self, other: DimensionHints) -> DimensionHints {
        DimensionHints {
            limit: self.limit.or(other.limit),
            remaining: self.remaining.or(other.remaining),
            reset: self.reset.or(other.reset),
        }
    }
}

/// Rate-limit hints of one provider response (SPEC RT-3).
///
/// OpenAI and Anthropic headers fill the same dimensions; when a response
/// carries both spellings, OpenAI's wins field by field. Anthropic's
/// `input-tokens`/`output-tokens` have no OpenAI counterpart.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct RateLimitHints {
    /// `retry-after` (delta seconds, decimal accepted, or HTTP-date).
    pub retry_after: Option<Duration>,
    /// `retry-after-ms`.
    pub retry_after_ms: Option<Duration>,
    /// Request dimension: `x-ratelimit-*-requests`,
    /// `anthropic-ratelimit-requests-*`.
    pub requests: DimensionHints,
    /// Token dimension: `x-ratelimit-*-tokens`, `anthropic-ratelimit-tokens-*`.
    pub tokens: DimensionHints,
    /// `anthropic-ratelimit-input-tokens-*`.
    pub input_tokens: DimensionHints,
    /// `anthropic-ratelimit-output-tokens-*`.
    pub output_tokens: DimensionHints,
}

/// The headers [`RateLimitHints::from_headers`] reads (lowercase), by
/// position: each dimension's limit, remaining and reset follow one
/// another.
pub const HEADER_NAMES: [&str; 20] = [
    "retry-after",
    "retry-after-ms",
    "x-ratelimit-limit-requests",
    "x-ratelimit-remaining-requests",
    "x-ratelimit-reset-requests",
    "x-ratelimit-limit-tokens",
    "x-ratelimit-remaining-tokens",
    "x-ratelimit-reset-tokens",
    "anthropic-ratelimit-requests-limit",
    "anthropic-ratelimit-requests-remaining",
    "anthropic-ratelimit-requests-reset",
    "anthropic-ratelimit-tokens-limit",
    "anthropic-ratelimit-tokens-remaining",
    "anthropic-ratelimit-tokens-reset",
    "anthropic-ratelimit-input-tokens-limit",
    "anthropic-ratelimit-input-tokens-remaining",
    "anthropic-ratelimit-input-tokens-reset",
    "anthropic-ratelimit-output-tokens-limit",
    "anthropic-ratelimit-output-tokens-remaining",
    "anthropic-ratelimit-output-tokens-reset",
];
const RETRY_AFTER: usize = 0;
const RETRY_AFTER_MS: usize = 1;
const OPENAI_REQUESTS: usize = 2;
const OPENAI_TOKENS: usize = 5;
const ANTHROPIC_REQUESTS: usize = 8;
const ANTHROPIC_TOKENS: usize = 11;
const ANTHROPIC_INPUT_TOKENS: usize = 14;
const ANTHROPIC_OUTPUT_TOKENS: usize = 17;

impl RateLimitHints {
    /// Reads every known rate-limit header. `now` is the wall-clock time of
    /// the response, used to turn absolute dates (HTTP-date `retry-after`,
    /// Anthropic RFC 3339 resets) into durations. Headers that are missing,
    /// not UTF-8 or invalid leave their field `None`; when a header is
    /// repeated, the first value counts.
    pub fn from_headers(headers: &HeaderMap, now: SystemTime) -> Self {
        // One pass over the response's headers, the names matched as they
        // are (no name is parsed or hashed per lookup: this runs for every
        // upstream response). Only the first value of a name is looked at,
        // as `HeaderMap::get` would.
        // Per name: `None` until seen, then its first value if it is text.
        let mut first: [Option<Option<&str>>; HEADER_NAMES.len()] = [None; HEADER_NAMES.len()];
        for (name, v) in headers {
            let name = name.as_str();
            if !(name.starts_with("x-ratelimit-")
                || name.starts_with("anthropic-ratelimit-")
                || name.starts_with("retry-after"))
            {
                continue;
            }
            if let Some(i) = HEADER_NAMES.iter().position(|n| *n == name)
                && first[i].is_none()
            {
                first[i] = Some(std::str::from_utf8(v.as_bytes()).ok());
            }
        }
        let get = |i: usize| first[i].flatten();
        let openai = |at: usize| DimensionHints {
            limit: get(at).and_then(parse::count),
            remaining: get(at + 1).and_then(parse::count),
            reset: get(at + 2).and_then(parse::go_duration),
        };
        let anthropic = |at: usize| DimensionHints {
            limit: get(at).and_then(parse::count),
            remaining: get(at + 1).and_then(parse::count),
            reset: get(at + 2).and_then(|v| parse::rfc3339_until(v, now)),
        };
        RateLimitHints {
            retry_after: get(RETRY_AFTER).and_then(|v| parse::retry_after(v, now)),
            retry_after_ms: get(RETRY_AFTER_MS).and_then(parse::retry_after_ms),
            requests: openai(OPENAI_REQUESTS).or(anthropic(ANTHROPIC_REQUESTS)),
            tokens: openai(OPENAI_TOKENS).or(anthropic(ANTHROPIC_TOKENS)),
            input_tokens: anthropic(ANTHROPIC_INPUT_TOKENS),
            output_tokens: anthropic(ANTHROPIC_OUTPUT_TOKENS),
        }
    }

    /// `true` when no hint at all was found.
    pub fn is_empty(&self) -> bool {
        self.retry_after.is_none()
            && self.retry_after_ms.is_none()
            && self.requests.is_empty()
            && self.tokens.is_empty()
            && self.input_tokens.is_empty()
            && self.output_tokens.is_empty()
    }

    /// The server's floor for the next retry delay or cooldown (SPEC RT-3,
    /// CD-1), in this order of precedence:
    ///
    /// 1. `retry-after-ms` (the most precise explicit answer);
    /// 2. `retry-after`;
    /// 3. the longest `reset` among the dimensions reported as exhausted
    ///    (`remaining == 0`);
    /// 4. `None`: no usable hint (the caller falls back to its backoff).
    ///
    /// An explicit retry-after wins over resets even when a reset is longer:
    /// it is the server's answer for this very request, while the reset
    /// headers describe windows that may not be what blocked it.
    pub fn retry_floor(&self) -> Option<Duration> {
        self.retry_floor_for(0)
    }

    /// As [`RateLimitHints::retry_floor`], but a token dimension
    /// (`tokens`, `input_tokens`) also counts as exhausted when its
    /// `remaining` is below `needed_tokens`: a request estimated at 3,000
    /// tokens cannot start while 1,000 remain. `output_tokens` counts only
    /// when it reports zero (the output a request will use is not known).
    pub fn retry_floor_for(&self, needed_tokens: u64) -> Option<Duration> {
        self.retry_after_ms.or(self.retry_after).or_else(|| {
            [
                (self.requests, 1),
                (self.tokens, needed_tokens),
                (self.input_tokens, needed_tokens),
                (self.output_tokens, 1),
            ]
            .into_iter()
            .filter(|(dim, needed)| dim.is_short_of(*needed))
            .filter_map(|(dim, _)| dim.reset)
            .max()
        })
    }

    /// The longest `reset` of any dimension, exhausted or not: when every
    /// reported window will be full again.
    pub fn longest_reset(&self) -> Option<Duration> {
        [
            self.requests,
            self.tokens,
            self.input_tokens,
            self.output_tokens,
        ]
        .into_iter()
        .filter_map(|d| d.reset)
        .max()
    }
}

impl DimensionHints {
    /// The engine's budget report for `dimension`, if anything is known
    /// (SPEC Q-14).
    pub fn report(&self, dimension: tollgate::Dimension) -> Option<tollgate::BudgetReport> {
        (self.limit.is_some() || self.remaining.is_some()).then_some(tollgate::BudgetReport {
            dimension,
            limit: self.limit,
            remaining: self.remaining,
            reset: self.reset,
        })
    }
}

impl RateLimitHints {
    /// What the response said about the provider's request and token
    /// budgets, for the engine (SPEC Q-14): Anthropic's separate input and
    /// output token budgets go to the matching dimensions, so a
    /// scope's `itpm` / `otpm` limits learn another client's spending from
    /// them as a `tpm` limit does from OpenAI's token budget.
    pub fn budgets(&self) -> tollgate::lifecycle::Budgets {
        tollgate::lifecycle::Budgets {
            requests: self.requests.report(tollgate::Dimension::Requests),
            tokens: self.tokens.report(tollgate::Dimension::Tokens),
            input_tokens: self.input_tokens.report(tollgate::Dimension::InputTokens),
            output_tokens: self.output_tokens.report(tollgate::Dimension::OutputTokens),
        }
    }
}

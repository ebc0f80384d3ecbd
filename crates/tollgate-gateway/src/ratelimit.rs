//! Rate-limit headers for clients (SPEC GW-13): the tenant's tightest
//! request limit and tightest token limit, in the names and formats the
//! OpenAI SDKs read.
//!
//! | header | value |
//! |---|---|
//! | `x-ratelimit-limit-requests` / `-tokens` | the amount of the tightest limit |
//! | `x-ratelimit-remaining-requests` / `-tokens` | what it has left now (0 while in debt) |
//! | `x-ratelimit-reset-requests` / `-tokens` | how long until the tenant could start another request (of this request's size, for tokens): `0s` when it could now, else the instant from the engine's projection (SPEC Q-11), e.g. `6m0s`, `1.5s`, `150ms` |
//!
//! The tightest limit of a dimension is the one with the least left among
//! the tenant's own limits and its limits on the requested model (ties: the
//! longer window). A tenant without limits of a dimension is told the
//! account's instead, as the provider itself would tell it: the limits of
//! the upstream quota scope its call spent (the deployment that answered,
//! else the model's first). A scope kept in a shared store (Redis) shows
//! no limits without a round trip, so it gives no headers; a dimension
//! neither limits gets none.
//!
//! Budgets (SPEC BUD-4) get `x-ratelimit-limit-usd`,
//! `x-ratelimit-remaining-usd` and `x-ratelimit-reset-usd`: the tenant's
//! tightest cost limit (the least left, among its own and its limits on
//! the model), in dollars with up to six decimals (`50`, `12.5`,
//! `0.000150`; `0` while in debt), the reset being when a call of this
//! request's worst case could start. An account's budget is not shown to
//! tenants.
//!
//! The `-tokens` headers describe `tokens` (input plus output) limits only,
//! as OpenAI's do. Input-token and output-token limits (SPEC Q-12, `itpm` /
//! `otpm`) get headers of their own in the same pattern,
//! `x-ratelimit-{limit,remaining,reset}-input-tokens` and
//! `...-output-tokens`, so a tenant with only those limits gets no
//! `-tokens` headers rather than numbers that mean something else (the
//! OpenAI SDKs ignore the extra names).

use std::cmp::Reverse;
use std::time::Duration;

use http::{HeaderMap, HeaderName, HeaderValue};
use tollgate::clock::Instant;
use tollgate::price::{ReservePrice, format_usd};
use tollgate::quota::Dimension;
use tollgate::{AdmissionController, Call, LimitSnapshot, ScopeId, TokenEstimate};

use crate::tenants::TenantSlot;

/// The header names of one dimension: limit, remaining, reset (constants:
/// no name is parsed per response).
fn names(dimension: Dimension) -> [HeaderName; 3] {
    const REQUESTS: [HeaderName; 3] = [
        HeaderName::from_static("x-ratelimit-limit-requests"),
        HeaderName::from_static("x-ratelimit-remaining-requests"),
        HeaderName::from_static("x-ratelimit-reset-requests"),
    ];
    const TOKENS: [HeaderName; 3] = [
        HeaderName::from_static("x-ratelimit-limit-tokens"),
        HeaderName::from_static("x-ratelimit-remaining-tokens"),
        HeaderName::from_static("x-ratelimit-reset-tokens"),
    ];
    const INPUT_TOKENS: [HeaderName; 3] = [
        HeaderName::from_static("x-ratelimit-limit-input-tokens"),
        HeaderName::from_static("x-ratelimit-remaining-input-tokens"),
        HeaderName::from_static("x-ratelimit-reset-input-tokens"),
    ];
    const OUTPUT_TOKENS: [HeaderName; 3] = [
        HeaderName::from_static("x-ratelimit-limit-output-tokens"),
        HeaderName::from_static("x-ratelimit-remaining-output-tokens"),
        HeaderName::from_static("x-ratelimit-reset-output-tokens"),
    ];
    const USD: [HeaderName; 3] = [
        HeaderName::from_static("x-ratelimit-limit-usd"),
        HeaderName::from_static("x-ratelimit-remaining-usd"),
        HeaderName::from_static("x-ratelimit-reset-usd"),
    ];
    match dimension {
        Dimension::Requests => REQUESTS,
        Dimension::Tokens => TOKENS,
        Dimension::InputTokens => INPUT_TOKENS,
        Dimension::OutputTokens => OUTPUT_TOKENS,
        Dimension::Cost => USD,
    }
}

/// Where the headers of a dimension come from: a controller and the
/// limits of one or two of its scopes, as they are now.
struct Budget<'a> {
    controller: &'a AdmissionController,
    /// The limits of `first` (the first `split`), then those of `second`.
    limits: Vec<LimitSnapshot>,
    first: ScopeId,
    split: usize,
    second: Option<ScopeId>,
}

impl<'a> Budget<'a> {
    /// The limits of `first` and `second` in `controller`, each scope read
    /// on its own (not the whole controller's snapshot: this runs for every
    /// response).
    fn of(controller: &'a AdmissionController, first: ScopeId, second: Option<ScopeId>) -> Self {
        let mut limits = Vec::with_capacity(8);
        controller.scope_limits(first, &mut limits);
        let split = limits.len();
        if let Some(second) = second {
            controller.scope_limits(second, &mut limits);
        }
        Budget {
            controller,
            limits,
            first,
            split,
            second,
        }
    }

    /// The limit of `dimension` with the least left (ties: the longer
    /// window, then the first scope), and its scope.
    fn tightest(&self, dimension: Dimension) -> Option<(ScopeId, &LimitSnapshot)> {
        let (i, limit) = self
            .limits
            .iter()
            .enumerate()
            .filter(|(_, l)| l.dimension == dimension)
            .min_by_key(|(_, l)| (l.available, Reverse(l.window)))?;
        let scope = match self.second {
            Some(second) if i >= self.split => second,
            _ => self.first,
        };
        Some((scope, limit))
    }
}

/// Adds the rate-limit headers to `headers`: the tenant's, and for a
/// dimension it does not limit, the account's (never for money: an
/// account's budget is the operator's). `model` is the requested model
/// (when known), `account` the upstream controller and quota scope the
/// call spent (or would have), `estimate` the request's estimate and
/// `price` the prices the tenant reserved it at.
pub fn add(
    slot: &TenantSlot,
    model: Option<&str>,
    account: Option<(&AdmissionController, ScopeId)>,
    estimate: TokenEstimate,
    price: Option<ReservePrice>,
    headers: &mut HeaderMap,
) {
    let model_scope = model.and_then(|m| slot.model_scope(m));
    let tenant = Budget::of(&slot.controller, slot.scope, model_scope);
    let mut upstream: Option<Budget<'_>> = None;
    for dimension in Dimension::ALL {
        let (budget, (scope, limit)) = match tenant.tightest(dimension) {
            Some(t) => (&tenant, t),
            None if dimension.is_cost() => continue,
            None => {
                let Some((controller, scope)) = account else {
                    continue;
                };
                let budget = upstream.get_or_insert_with(|| Budget::of(controller, scope, None));
                match budget.tightest(dimension) {
                    Some(t) => (&*budget, t),
                    None => continue,
                }
            }
        };
        let mut call = Call::new(scope);
        call.estimate = Some(estimate);
        call.price = price;
        insert(budget.controller, &call, limit, dimension, headers);
    }
}

/// The three headers of `dimension` from `limit` of `call`'s scope.
fn insert(
    controller: &AdmissionController,
    call: &Call,
    limit: &LimitSnapshot,
    dimension: Dimension,
    headers: &mut HeaderMap,
) {
    let remaining = u64::try_from(limit.available).unwrap_or(0);
    // A request's size on this dimension, and the demand whose start
    // the reset forecasts: one request unit, or the whole request.
    let need = call.demand().amount(dimension).max(1);
    let forecast = if dimension == Dimension::Requests {
        Call::new(call.scope)
    } else {
        *call
    };
    let reset = if remaining >= need {
        Duration::ZERO
    } else {
        let now = Instant::now();
        controller
            .forecast_call(&forecast)
            .and_then(|f| f.ready_at)
            .map_or(limit.window, |at| at.saturating_duration_since(now))
    };
    let [l, r, t] = names(dimension);
    if dimension.is_cost() {
        let usd = |micros: u64| HeaderValue::from_str(&format_usd(micros));
        if let (Ok(l_value), Ok(r_value)) = (usd(limit.limit), usd(remaining)) {
            headers.insert(l, l_value);
            headers.insert(r, r_value);
        }
    } else {
        headers.insert(l, HeaderValue::from(limit.limit));
        headers.insert(r, HeaderValue::from(remaining));
    }
    let reset = if reset.is_zero() {
        Ok(HeaderValue::from_static("0s"))
    } else {
        HeaderValue::from_str(&format_reset(reset))
    };
    if let Ok(v) = reset {
        headers.insert(t, v);
    }
}

/// A duration as OpenAI writes its resets: `0s`, `150ms`, `1.5s`, `6m0s`,
/// `1h2m3s` (milliseconds, rounded up).
pub fn format_reset(d: Duration) -> String {
    let ms = d.as_nanos().div_ceil(1_000_000);
    if ms == 0 {
        return "0s".to_owned();
    }
    if ms < 1_000 {
        return format!("{ms}ms");
    }
    let (h, rest) = (ms / 3_600_000, ms % 3_600_000);
    let (m, rest) = (rest / 60_000, rest % 60_000);
    let (s, frac) = (rest / 1_000, rest % 1_000);
    let mut out = String::new();
    if h > 0 {
        out.push_str(&format!("{h}h"));
    }
    if h > 0 || m > 0 {
        out.push_str(&format!("{m}m"));
    }
    if frac == 0 {
        out.push_str(&format!("{s}s"));
    } else {
        let frac = format!("{frac:03}");
        out.push_str(&format!("{s}.{}s", frac.trim_end_matches('0')));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    // proves: GW-13 (resets in the format OpenAI's headers use)
    #[test]
    fn resets_read_like_openai_durations() {
        let ms = Duration::from_millis;
        assert_eq!(format_reset(Duration::ZERO), "0s");
        assert_eq!(format_reset(Duration::from_nanos(1)), "1ms");
        assert_eq!(format_reset(ms(150)), "150ms");
        assert_eq!(format_reset(ms(1_500)), "1.5s");
        assert_eq!(format_reset(ms(360_000)), "6m0s");
        assert_eq!(format_reset(ms(3_723_040)), "1h2m3.04s");
        assert_eq!(format_reset(ms(86_400_000)), "24h0m0s");
    }
}

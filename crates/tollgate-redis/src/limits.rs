//! Each limit of a scope in the scripts' units: microseconds of the
//! store's clock, integers that Lua's doubles hold exactly.
//!
//! The in-process store counts nanoseconds; Redis `TIME` has microseconds,
//! and Lua numbers are exact below 2^53 (2^53 µs is 285 years, 2^53 ns only
//! 104 days). Every conversion rounds so that amounts are counted longer,
//! never shorter (SPEC Q-7): windows round up to a whole microsecond, the
//! sliding window's slot span (`window / 512`) rounds down (less merging),
//! and a token bucket whose level `capacity x window` would leave the exact
//! range refills in coarser ticks (later, never earlier).

use std::time::Duration;

use tollgate::Dimension;
use tollgate::config::{Algorithm, ScopeConfig};
use tollgate::quota::{LimitSnapshot, LocalQuota, QuotaStore};

/// Slots per window: the same bounded log as the in-process store.
const SLOTS: u64 = 512;
/// Above this a quantity is treated as this (an amount or limit that
/// large is unlimited in practice; clipping a limit only admits less).
pub(crate) const MAX_EXACT: u64 = 1 << 52;
/// A bucket's scaled level stays below this, leaving room for debt.
const BUCKET_RANGE: u64 = 1 << 50;

/// How a limit counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Sliding,
    Bucket,
    Fixed,
}

impl Kind {
    fn code(self) -> &'static str {
        match self {
            Kind::Sliding => "s",
            Kind::Bucket => "b",
            Kind::Fixed => "f",
        }
    }
}

/// One limit, as the scripts take it.
#[derive(Debug, Clone)]
pub(crate) struct LimitParams {
    pub(crate) kind: Kind,
    pub(crate) dimension: Dimension,
    /// The configured window (for snapshots and errors).
    pub(crate) config_window: Duration,
    /// The window in microseconds, rounded up.
    pub(crate) window_us: u64,
    /// Sliding: the slot span (µs); bucket: the tick length (µs);
    /// fixed: 1.
    pub(crate) res: u64,
    /// The window in the algorithm's time unit (bucket: ticks).
    pub(crate) window: u64,
    pub(crate) limit: u64,
    pub(crate) capacity: u64,
}

impl LimitParams {
    /// The limits of `scope`, in configuration order, with the scope's
    /// algorithm (and a token bucket's capacity) as the in-process store
    /// computes them.
    pub(crate) fn of(scope: &ScopeConfig, local: &mut LocalQuota) -> (Vec<Self>, Algorithm) {
        let mut snapshot: Vec<LimitSnapshot> = Vec::new();
        local.snapshot(tollgate::clock::Instant::now(), &mut snapshot);
        let algorithm = snapshot
            .first()
            .map_or(Algorithm::SlidingWindow, |s| s.algorithm);
        let params = scope
            .limits()
            .iter()
            .zip(snapshot.iter())
            .map(|(l, s)| {
                // The store keeps no calendar: a calendar window is a
                // sliding window of its longest period, which never admits
                // more than the calendar would (it frees later); a rolling
                // budget is a sliding window whatever the scope's
                // algorithm, as in process (`Limit::without_calendar`, the
                // same rule the engine checks duplicates by).
                let (counted, window) = l.without_calendar(algorithm);
                let capacity = if l.calendar.is_some() {
                    l.amount
                } else {
                    s.capacity
                };
                LimitParams::new(l.dimension, l.amount, window, capacity, counted)
            })
            .collect();
        (params, algorithm)
    }

    fn new(
        dimension: Dimension,
        amount: u64,
        window: Duration,
        capacity: u64,
        algorithm: Algorithm,
    ) -> Self {
        let window_us = micros_up(window).clamp(1, MAX_EXACT);
        let limit = amount.min(MAX_EXACT);
        let capacity = capacity.min(MAX_EXACT);
        let (kind, res, unit_window) = match algorithm {
            Algorithm::SlidingWindow => (Kind::Sliding, (window_us / SLOTS).max(1), window_us),
            Algorithm::FixedWindow => (Kind::Fixed, 1, window_us),
            Algorithm::TokenBucket { .. } => {
                let tick = bucket_tick(window_us, limit.max(capacity));
                (Kind::Bucket, tick, window_us.div_ceil(tick))
            }
        };
        LimitParams {
            kind,
            dimension,
            config_window: window,
            window_us,
            res,
            window: unit_window,
            limit,
            capacity,
        }
    }

    /// The part of the key that tells this limit's state apart: its
    /// algorithm, dimension and window. The amount (and a bucket's burst
    /// and tick) are not in it: another amount reads the same count
    /// (SPEC GW-15, DQ-8); another window or algorithm counts apart and
    /// is seeded (see `RedisQuota`).
    pub(crate) fn key_suffix(&self) -> String {
        format!(
            "{}:{}:{}",
            self.kind.code(),
            self.dimension.as_str(),
            self.window_us
        )
    }

    /// The eight script arguments of this limit, with the operation's
    /// `amount` and the limit its state is seeded from (`source`: 1-based
    /// among the limits passed, 0 for none, -1 for a transitional limit).
    pub(crate) fn push_args(&self, amount: u64, source: i64, out: &mut Vec<String>) {
        out.push(self.kind.code().to_owned());
        out.push(self.window.to_string());
        out.push(self.res.to_string());
        out.push(self.limit.to_string());
        out.push(self.capacity.to_string());
        out.push(dimension_code(self.dimension).to_owned());
        out.push(amount.min(MAX_EXACT).to_string());
        out.push(source.to_string());
    }
}

/// The shortest power-of-two tick (µs) that keeps `(2 * big) x window`
/// ticks below [`BUCKET_RANGE`].
fn bucket_tick(window_us: u64, big: u64) -> u64 {
    let big = u128::from(big.max(1)) * 2;
    let mut tick = 1u64;
    while tick < window_us && big * u128::from(window_us.div_ceil(tick)) > u128::from(BUCKET_RANGE)
    {
        tick *= 2;
    }
    tick
}

/// A duration in whole microseconds, rounded up (counted longer).
/// A dimension's code in the scripts' arguments.
pub(crate) fn dimension_code(dimension: Dimension) -> &'static str {
    match dimension {
        Dimension::Requests => "r",
        Dimension::Tokens => "t",
        Dimension::InputTokens => "i",
        Dimension::OutputTokens => "o",
        Dimension::Cost => "c",
    }
}

pub(crate) fn micros_up(d: Duration) -> u64 {
    u64::try_from(d.as_nanos().div_ceil(1_000)).unwrap_or(u64::MAX)
}

/// A duration in whole microseconds, rounded down.
pub(crate) fn micros_down(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

/// The TTL of every key of a scope, in milliseconds: two of its longest
/// windows, or longer while a token bucket emptied by its last write would
/// still be refilling (a burst of hours on a minute's rate), plus an hour
/// (room for pending reservations). Refreshed on every write, so only an
/// abandoned scope expires, and not before a fresh scope (every window
/// empty, every bucket full) counts what it would have counted. A bucket
/// in debt deeper than its capacity when abandoned is the exception
/// (docs/redis.md).
pub(crate) fn ttl_ms(limits: &[LimitParams]) -> u64 {
    let longest = limits
        .iter()
        .map(|l| {
            let windows = l.window_us.saturating_mul(2);
            match l.kind {
                Kind::Bucket => windows.max(refill_us(l)),
                Kind::Sliding | Kind::Fixed => windows,
            }
        })
        .max()
        .unwrap_or(0);
    (longest / 1_000).saturating_add(3_600_000)
}

/// How long a bucket takes to refill from empty, in µs (rounded up).
fn refill_us(l: &LimitParams) -> u64 {
    let us =
        (u128::from(l.capacity) * u128::from(l.window_us)).div_ceil(u128::from(l.limit.max(1)));
    u64::try_from(us).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    // proves: Q-7 (conversions to the store's units only ever count longer)
    #[test]
    fn conversions_round_towards_counting_longer() {
        assert_eq!(micros_up(Duration::from_nanos(1_500)), 2);
        assert_eq!(micros_down(Duration::from_nanos(1_500)), 1);
        let l = LimitParams::new(
            Dimension::Tokens,
            1_000,
            Duration::from_secs(60),
            1_000,
            Algorithm::SlidingWindow,
        );
        assert_eq!(l.window_us, 60_000_000);
        // 117,187.5 µs rounds down: slots merge less, never more.
        assert_eq!(l.res, 117_187);
    }

    // proves: Q-12, DQ-1 (input and output token limits reach the scripts
    // with their own dimension codes and keep their state under keys of
    // their own, apart from the token limit of the same window)
    #[test]
    fn input_and_output_limits_have_their_own_codes_and_keys() {
        let minute = Duration::from_secs(60);
        let params = |d| LimitParams::new(d, 1_000, minute, 1_000, Algorithm::SlidingWindow);
        let code = |d| {
            let mut args = Vec::new();
            params(d).push_args(7, 0, &mut args);
            (args[5].clone(), args[6].clone())
        };
        assert_eq!(code(Dimension::Tokens), ("t".to_owned(), "7".to_owned()));
        assert_eq!(code(Dimension::InputTokens).0, "i");
        assert_eq!(code(Dimension::OutputTokens).0, "o");
        assert_eq!(code(Dimension::Requests).0, "r");
        let keys: Vec<String> = Dimension::ALL
            .iter()
            .map(|&d| params(d).key_suffix())
            .collect();
        assert_eq!(keys[2], "s:input_tokens:60000000");
        assert_eq!(keys[3], "s:output_tokens:60000000");
        let mut unique = keys.clone();
        unique.sort();
        unique.dedup();
        assert_eq!(unique.len(), keys.len());
    }

    // proves: BUD-3, BUD-2, Q-7 (the store keeps no calendar: a calendar
    // window of a shared scope is a sliding window of its longest period,
    // an hour longer in a zone with daylight saving, whatever the scope's
    // algorithm, so no calendar period admits more than its amount; a
    // rolling budget is a sliding window in every scope too; other limits
    // keep the scope's algorithm and their keys)
    #[test]
    fn calendar_windows_and_budgets_are_sliding_windows_in_the_store() {
        use tollgate::config::{Calendar, Limit, Period, ScopeConfig, Zone};
        let day = Calendar::new(Period::Day);
        let paris = Calendar::new(Period::Month).zone(Zone::named("Europe/Paris").unwrap());
        for algorithm in [
            Algorithm::FixedWindow,
            Algorithm::TokenBucket { burst: None },
            Algorithm::SlidingWindow,
        ] {
            let scope = ScopeConfig::new("s")
                .requests(100, Duration::from_secs(60))
                .limit(Limit::per(Dimension::Tokens, 1_000, day))
                .limit(Limit::per(Dimension::Cost, 5_000, paris))
                .cost(9_000, Duration::from_secs(86_400))
                .algorithm(algorithm);
            let mut local = LocalQuota::new(&scope, tollgate::clock::Instant::now());
            let (params, _) = LimitParams::of(&scope, &mut local);
            let kinds: Vec<String> = params.iter().map(LimitParams::key_suffix).collect();
            let scope_kind = match algorithm {
                Algorithm::FixedWindow => "f",
                Algorithm::TokenBucket { .. } => "b",
                Algorithm::SlidingWindow => "s",
            };
            assert!(kinds[0].starts_with(scope_kind), "{algorithm:?}: {kinds:?}");
            assert_eq!(kinds[1], "s:tokens:86400000000", "{algorithm:?}");
            assert_eq!(
                kinds[2],
                format!("s:cost:{}", (31 * 86_400 + 3_600) * 1_000_000_u64)
            );
            // A rolling budget is a sliding window in every scope (BUD-3).
            assert!(kinds[3].starts_with("s:cost:"), "{algorithm:?}: {kinds:?}");
        }
    }

    // proves: DQ-5 (a scope's keys outlive the time its token bucket
    // takes to refill from empty: a burst of three hours on a rate of 100
    // a minute keeps them three hours and an hour, not two minutes and an
    // hour; windows keep two windows and an hour)
    #[test]
    fn keys_outlive_a_long_burst() {
        let minute = Duration::from_secs(60);
        let bucket = |capacity| {
            LimitParams::new(
                Dimension::Tokens,
                100,
                minute,
                capacity,
                Algorithm::TokenBucket { burst: None },
            )
        };
        let hour_ms = 3_600_000;
        assert_eq!(ttl_ms(&[bucket(18_000)]), 3 * hour_ms + hour_ms);
        assert_eq!(ttl_ms(&[bucket(100)]), 2 * 60_000 + hour_ms);
        let day = LimitParams::new(
            Dimension::Requests,
            5,
            Duration::from_secs(86_400),
            5,
            Algorithm::SlidingWindow,
        );
        assert_eq!(ttl_ms(&[bucket(18_000), day]), 48 * hour_ms + hour_ms);
    }

    // proves: DQ-1 (a bucket's level stays exact in Lua: a large daily
    // token limit refills in coarser ticks instead)
    #[test]
    fn bucket_ticks_keep_the_level_exact() {
        let day = Duration::from_secs(86_400);
        let l = LimitParams::new(
            Dimension::Tokens,
            50_000_000,
            day,
            50_000_000,
            Algorithm::TokenBucket { burst: None },
        );
        assert!(l.res > 1);
        assert!(u128::from(l.capacity) * u128::from(l.window) < 1 << 53);
        let small = LimitParams::new(
            Dimension::Requests,
            500,
            Duration::from_secs(60),
            500,
            Algorithm::TokenBucket { burst: None },
        );
        assert_eq!(small.res, 1);
        assert_eq!(small.window, 60_000_000);
    }
}

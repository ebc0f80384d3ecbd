//! Parsers for single header values. Each returns `None` for an invalid
//! value and never panics; durations are clamped to [`MAX_HINT`].

use std::time::{Duration, SystemTime};

/// The largest duration a hint can carry; larger values are clamped to it.
pub const MAX_HINT: Duration = Duration::from_secs(7 * 24 * 60 * 60);

const NANOS_PER_MICRO: u128 = 1_000;
const NANOS_PER_MILLI: u128 = 1_000_000;
const NANOS_PER_SEC: u128 = 1_000_000_000;

/// A `retry-after` value: non-negative delta seconds (`"30"`, also a
/// decimal such as `"1.5"`) or an HTTP-date, which is converted against
/// `now` (a date in the past gives zero).
pub fn retry_after(value: &str, now: SystemTime) -> Option<Duration> {
    let value = value.trim();
    if let Some(delay) = decimal(value, NANOS_PER_SEC) {
        return Some(delay);
    }
    let at = httpdate::parse_http_date(value).ok()?;
    Some(until(at, now))
}

/// A `retry-after-ms` value: non-negative (decimal) milliseconds.
pub fn retry_after_ms(value: &str) -> Option<Duration> {
    decimal(value.trim(), NANOS_PER_MILLI)
}

/// A non-negative integer count (`x-ratelimit-remaining-tokens: 1200`).
pub fn count(value: &str) -> Option<u64> {
    let value = value.trim();
    if value.is_empty() || !value.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    value.parse().ok()
}

/// A Go duration as OpenAI writes its reset headers: a sequence of
/// `<number><unit>` with units `h`, `m`, `s`, `ms`, `us`, `µs`, `μs`, `ns`
/// and decimal numbers allowed (`"1s"`, `"6m0s"`, `"150ms"`, `"1.5s"`,
/// `"1h2m3.5s"`); a bare `"0"` is zero. Signs are not accepted (a reset is
/// never negative).
pub fn go_duration(value: &str) -> Option<Duration> {
    let value = value.trim();
    if value == "0" {
        return Some(Duration::ZERO);
    }
    if value.is_empty() {
        return None;
    }
    let mut total: u128 = 0;
    let mut rest = value;
    while !rest.is_empty() {
        let (int_part, frac_part, after) = split_number(rest)?;
        let (unit, after) = split_unit(after)?;
        total = total.saturating_add(scaled(int_part, frac_part, unit));
        rest = after;
    }
    Some(from_nanos_clamped(total))
}

/// An RFC 3339 timestamp (`2025-01-01T00:00:30Z`, fractional seconds and
/// numeric offsets such as `+02:00` accepted), converted to the duration
/// from `now` until then (zero when it is in the past).
pub fn rfc3339_until(value: &str, now: SystemTime) -> Option<Duration> {
    Some(until(rfc3339(value.trim())?, now))
}

fn rfc3339(value: &str) -> Option<SystemTime> {
    if !value.is_ascii() {
        return None;
    }
    if let Ok(at) = humantime::parse_rfc3339(value) {
        return Some(at);
    }
    // humantime knows `Z` and `+00:00` only: apply any other offset here.
    let split = value.len().checked_sub(6)?;
    let (stamp, offset) = (value.get(..split)?, value.get(split..)?);
    let bytes = offset.as_bytes();
    let sign = match bytes.first()? {
        b'+' => 1i64,
        b'-' => -1i64,
        _ => return None,
    };
    if bytes.get(3) != Some(&b':') {
        return None;
    }
    let hours = count(offset.get(1..3)?)?;
    let minutes = count(offset.get(4..6)?)?;
    if hours > 23 || minutes > 59 {
        return None;
    }
    let local = humantime::parse_rfc3339(&format!("{stamp}Z")).ok()?;
    let offset = Duration::from_secs(hours * 3600 + minutes * 60);
    // Local time = UTC + offset, so UTC = local - offset.
    if sign > 0 {
        local.checked_sub(offset)
    } else {
        local.checked_add(offset)
    }
}

fn until(at: SystemTime, now: SystemTime) -> Duration {
    at.duration_since(now)
        .unwrap_or(Duration::ZERO)
        .min(MAX_HINT)
}

/// `digits[.digits]` (either side may be empty, not both) in `unit`
/// nanoseconds, nothing else allowed.
fn decimal(value: &str, unit: u128) -> Option<Duration> {
    let (int_part, frac_part, rest) = split_number(value)?;
    if !rest.is_empty() {
        return None;
    }
    Some(from_nanos_clamped(scaled(int_part, frac_part, unit)))
}

/// Splits a leading `digits[.digits]` off `s`. Returns `None` when there is
/// no digit at all.
fn split_number(s: &str) -> Option<(&str, &str, &str)> {
    let int_len = s.bytes().take_while(u8::is_ascii_digit).count();
    // ASCII digits, so `int_len` is a char boundary.
    let (int_part, after) = s.split_at_checked(int_len)?;
    let (frac_part, after) = match after.strip_prefix('.') {
        Some(frac) => {
            let frac_len = frac.bytes().take_while(u8::is_ascii_digit).count();
            frac.split_at_checked(frac_len)?
        }
        None => ("", after),
    };
    if int_part.is_empty() && frac_part.is_empty() {
        return None;
    }
    Some((int_part, frac_part, after))
}

/// Splits a leading Go duration unit off `s`, returning its length in
/// nanoseconds.
fn split_unit(s: &str) -> Option<(u128, &str)> {
    const UNITS: [(&str, u128); 8] = [
        ("ns", 1),
        ("us", NANOS_PER_MICRO),
        ("\u{b5}s", NANOS_PER_MICRO),
        ("\u{3bc}s", NANOS_PER_MICRO),
        ("ms", NANOS_PER_MILLI),
        ("s", NANOS_PER_SEC),
        ("m", 60 * NANOS_PER_SEC),
        ("h", 3600 * NANOS_PER_SEC),
    ];
    // `ms` is tried before `m`, so `m` never swallows the `m` of `ms`.
    UNITS
        .iter()
        .find_map(|&(name, nanos)| s.strip_prefix(name).map(|rest| (nanos, rest)))
}

/// `int.frac * unit` in nanoseconds, saturating. Fraction digits beyond 18
/// are below a nanosecond for every unit and are dropped.
fn scaled(int_part: &str, frac_part: &str, unit: u128) -> u128 {
    let int_value = int_part.bytes().fold(0u128, |acc, d| {
        acc.saturating_mul(10)
            .saturating_add(u128::from(d.saturating_sub(b'0')))
    });
    let mut frac_value: u128 = 0;
    let mut frac_scale: u128 = 1;
    for d in frac_part.bytes().take(18) {
        frac_value = frac_value * 10 + u128::from(d.saturating_sub(b'0'));
        frac_scale *= 10;
    }
    int_value
        .saturating_mul(unit)
        .saturating_add(frac_value.saturating_mul(unit) / frac_scale)
}

fn from_nanos_clamped(nanos: u128) -> Duration {
    match u64::try_from(nanos) {
        Ok(n) => Duration::from_nanos(n).min(MAX_HINT),
        Err(_) => MAX_HINT,
    }
}

//! Durations in and out: parsing command-line values and writing the Go
//! duration form that OpenAI uses in `x-ratelimit-reset-*` headers.

use std::fmt::Write as _;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// A duration flag that could not be parsed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid duration {input:?}: {reason} (examples: 60s, 1m, 500ms, 1.5s, 1m30s)")]
pub struct DurationParseError {
    input: String,
    reason: String,
}

/// Parses a human duration such as `60s`, `1m`, `500ms`, `1.5s`, `1m30s` or
/// `0`.
///
/// A bare number other than `0` is refused: `--window 60` is ambiguous
/// (seconds? milliseconds?) and a silent guess is worse than an error.
pub fn parse_duration(input: &str) -> Result<Duration, DurationParseError> {
    humantime::parse_duration(input.trim()).map_err(|e| DurationParseError {
        input: input.to_owned(),
        reason: e.to_string(),
    })
}

/// Formats a duration the way Go's `time.Duration.String` does, which is the
/// form OpenAI sends in `x-ratelimit-reset-requests` / `-tokens`: `6m0s`,
/// `1.5s`, `150ms`, `2µs`, `0s`.
pub fn go_duration(d: Duration) -> String {
    let nanos = d.as_nanos();
    if nanos == 0 {
        return "0s".to_owned();
    }
    let mut out = String::new();
    if nanos < 1_000 {
        let _ = write!(out, "{nanos}ns");
    } else if nanos < 1_000_000 {
        push_fraction(&mut out, nanos, 1_000);
        out.push_str("µs");
    } else if nanos < 1_000_000_000 {
        push_fraction(&mut out, nanos, 1_000_000);
        out.push_str("ms");
    } else {
        let whole_secs = d.as_secs();
        let hours = whole_secs / 3600;
        let minutes = (whole_secs % 3600) / 60;
        if hours > 0 {
            let _ = write!(out, "{hours}h");
        }
        if hours > 0 || minutes > 0 {
            let _ = write!(out, "{minutes}m");
        }
        let secs_nanos = u128::from(whole_secs % 60) * 1_000_000_000 + u128::from(d.subsec_nanos());
        push_fraction(&mut out, secs_nanos, 1_000_000_000);
        out.push('s');
    }
    out
}

/// Writes `value / unit` as a decimal with trailing zeros removed.
fn push_fraction(out: &mut String, value: u128, unit: u128) {
    let whole = value / unit;
    let frac = value % unit;
    let _ = write!(out, "{whole}");
    if frac != 0 {
        let width = unit.ilog10() as usize;
        let digits = format!("{frac:0width$}");
        out.push('.');
        out.push_str(digits.trim_end_matches('0'));
    }
}

/// Whole seconds, rounded up (the `retry-after` header).
pub(crate) fn ceil_secs(d: Duration) -> u64 {
    let secs = d.as_secs();
    if d.subsec_nanos() > 0 {
        secs.saturating_add(1)
    } else {
        secs
    }
}

/// Whole milliseconds, rounded up (the `retry-after-ms` header).
pub(crate) fn ceil_millis(d: Duration) -> u128 {
    d.as_nanos().div_ceil(1_000_000)
}

/// `t` as an RFC 3339 UTC timestamp rounded *up* to the whole second
/// (`2026-11-30T12:00:05Z`), the form of Anthropic's
/// `anthropic-ratelimit-*-reset` headers. Rounding up means a client that
/// waits until the stamp is never early. Instants before 1970 print as the
/// epoch.
pub fn rfc3339(t: SystemTime) -> String {
    let since = t.duration_since(UNIX_EPOCH).unwrap_or(Duration::ZERO);
    let secs = ceil_secs(since);
    let days = secs / 86_400;
    let rem = secs % 86_400;
    let (year, month, day) = civil_from_days(days);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        (rem % 3600) / 60,
        rem % 60
    )
}

/// The proleptic Gregorian date of `days` after 1970-01-01 (Howard
/// Hinnant's `civil_from_days`, for non-negative day counts).
fn civil_from_days(days: u64) -> (u64, u64, u64) {
    let z = days + 719_468;
    let era = z / 146_097;
    let doe = z % 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + u64::from(month <= 2);
    (year, month, day)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc3339_matches_known_dates_and_rounds_up() {
        let at = |secs: u64, nanos: u32| UNIX_EPOCH + Duration::new(secs, nanos);
        assert_eq!(rfc3339(at(0, 0)), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339(at(0, 1)), "1970-01-01T00:00:01Z");
        assert_eq!(rfc3339(at(951_782_400, 0)), "2000-02-29T00:00:00Z");
        assert_eq!(rfc3339(at(1_704_067_199, 500)), "2024-01-01T00:00:00Z");
        assert_eq!(
            rfc3339(at(1_798_761_600 + 3_723, 0)),
            "2027-01-01T01:02:03Z"
        );
    }

    #[test]
    fn parses_the_documented_forms() {
        assert_eq!(parse_duration("60s"), Ok(Duration::from_secs(60)));
        assert_eq!(parse_duration("1m"), Ok(Duration::from_secs(60)));
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("1.5s"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_duration("1m30s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_duration("0"), Ok(Duration::ZERO));
        assert_eq!(parse_duration(" 2h "), Ok(Duration::from_secs(7200)));
    }

    #[test]
    fn refuses_garbage_and_bare_numbers() {
        for bad in ["", "abc", "60", "-1s", "1 parsec"] {
            let err = parse_duration(bad).expect_err(bad);
            assert!(err.to_string().contains("invalid duration"), "{err}");
        }
    }

    #[test]
    fn formats_like_go() {
        let cases = [
            (Duration::ZERO, "0s"),
            (Duration::from_nanos(2), "2ns"),
            (Duration::from_nanos(1_500), "1.5µs"),
            (Duration::from_millis(150), "150ms"),
            (Duration::from_micros(1_250), "1.25ms"),
            (Duration::from_millis(1_500), "1.5s"),
            (Duration::from_secs(1), "1s"),
            (Duration::from_secs(59), "59s"),
            (Duration::from_secs(360), "6m0s"),
            (Duration::from_millis(60_001), "1m0.001s"),
            (Duration::from_secs(3_600), "1h0m0s"),
            (Duration::from_secs(3_725), "1h2m5s"),
        ];
        for (d, want) in cases {
            assert_eq!(go_duration(d), want, "{d:?}");
        }
    }

    #[test]
    fn rounds_up() {
        assert_eq!(ceil_secs(Duration::from_millis(1)), 1);
        assert_eq!(ceil_secs(Duration::from_secs(2)), 2);
        assert_eq!(ceil_secs(Duration::from_millis(2_001)), 3);
        assert_eq!(ceil_millis(Duration::from_nanos(1)), 1);
        assert_eq!(ceil_millis(Duration::from_millis(7)), 7);
        assert_eq!(ceil_millis(Duration::ZERO), 0);
    }
}

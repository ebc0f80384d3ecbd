//! Durations in and out: parsing command-line values and writing the Go
//! duration form that OpenAI uses in `x-ratelimit-reset-*` headers.

use std::fmt::Write as _;
use std::time::Duration;

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

#[cfg(test)]
mod tests {
    use super::*;

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

//! Header parsing tests.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use http::{HeaderMap, HeaderName, HeaderValue};
use proptest::prelude::*;

use super::parse::{count, go_duration, retry_after, retry_after_ms, rfc3339_until};
use super::*;

/// 2023-11-14T22:13:20Z.
fn now() -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(1_700_000_000)
}

fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
    let mut map = HeaderMap::new();
    for (name, value) in pairs {
        map.append(
            HeaderName::from_bytes(name.as_bytes()).expect("name"),
            HeaderValue::from_bytes(value.as_bytes()).expect("value"),
        );
    }
    map
}

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}

// proves: RT-3
#[test]
fn go_durations_as_openai_writes_them() {
    let cases = [
        ("1s", Some(secs(1))),
        ("6m0s", Some(secs(360))),
        ("150ms", Some(ms(150))),
        ("1.5s", Some(ms(1500))),
        ("1h2m3.5s", Some(ms(3_723_500))),
        ("0s", Some(Duration::ZERO)),
        ("0", Some(Duration::ZERO)),
        ("20us", Some(Duration::from_micros(20))),
        ("20\u{b5}s", Some(Duration::from_micros(20))),
        ("20\u{3bc}s", Some(Duration::from_micros(20))),
        ("7ns", Some(Duration::from_nanos(7))),
        (".5s", Some(ms(500))),
        ("2.s", Some(secs(2))),
        ("1m30s", Some(secs(90))),
        ("1ms1ns", Some(Duration::from_nanos(1_000_001))),
        ("0.000000001s", Some(Duration::from_nanos(1))),
        (" 17.002s ", Some(ms(17_002))),
        ("", None),
        ("s", None),
        ("1", None),
        ("10", None),
        ("-1s", None),
        ("+1s", None),
        ("1x", None),
        ("1s ", Some(secs(1))),
        ("1 s", None),
        ("1.5.5s", None),
        (".s", None),
        ("1sms", None),
        ("1d", None),
        ("NaNs", None),
    ];
    for (raw, expected) in cases {
        assert_eq!(go_duration(raw), expected, "{raw:?}");
    }
}

// proves: RT-3
#[test]
fn absurd_durations_saturate_at_the_cap() {
    assert_eq!(
        go_duration("99999999999999999999999999999h"),
        Some(MAX_HINT)
    );
    assert_eq!(go_duration("200h"), Some(MAX_HINT));
    assert_eq!(retry_after("1e9", now()), None);
    assert_eq!(
        retry_after("100000000000000000000000", now()),
        Some(MAX_HINT)
    );
    assert_eq!(retry_after_ms("18446744073709551616000"), Some(MAX_HINT));
    assert_eq!(count("18446744073709551616"), None);
    assert_eq!(count("18446744073709551615"), Some(u64::MAX));
}

// proves: RT-3
#[test]
fn retry_after_seconds_decimals_and_http_dates() {
    let cases = [
        ("30", Some(secs(30))),
        ("0", Some(Duration::ZERO)),
        (" 2 ", Some(secs(2))),
        ("1.5", Some(ms(1500))),
        ("0.25", Some(ms(250))),
        // 2023-11-14T22:13:50Z is 30 s after `now`.
        ("Tue, 14 Nov 2023 22:13:50 GMT", Some(secs(30))),
        // In the past: no wait.
        ("Tue, 14 Nov 2023 22:00:00 GMT", Some(Duration::ZERO)),
        ("-5", None),
        ("soon", None),
        ("1e3", None),
        ("inf", None),
        ("NaN", None),
        ("", None),
        ("30s", None),
        ("Tue, 32 Nov 2023 22:13:50 GMT", None),
    ];
    for (raw, expected) in cases {
        assert_eq!(retry_after(raw, now()), expected, "{raw:?}");
    }
    assert_eq!(retry_after_ms("250"), Some(ms(250)));
    assert_eq!(retry_after_ms("0.5"), Some(Duration::from_micros(500)));
    assert_eq!(retry_after_ms("-1"), None);
    assert_eq!(retry_after_ms("abc"), None);
}

// proves: RT-3
#[test]
fn anthropic_rfc3339_resets() {
    let cases = [
        ("2023-11-14T22:13:50Z", Some(secs(30))),
        ("2023-11-14T22:13:20.5Z", Some(ms(500))),
        ("2023-11-14T22:13:50+00:00", Some(secs(30))),
        ("2023-11-15T00:13:50+02:00", Some(secs(30))),
        ("2023-11-14T20:13:50-02:00", Some(secs(30))),
        ("2023-11-14T22:00:00Z", Some(Duration::ZERO)),
        ("2023-11-14T22:13:50+24:00", None),
        ("2023-11-14T22:13:50", Some(secs(30)).filter(|_| false)),
        ("yesterday", None),
        ("", None),
        ("2023-11-14T22:13:50Zé", None),
        ("é2023-11-14T22:13:50+02:00", None),
    ];
    for (raw, expected) in cases {
        assert_eq!(rfc3339_until(raw, now()), expected, "{raw:?}");
    }
}

// proves: RT-3
#[test]
fn openai_headers() {
    let h = headers(&[
        ("x-ratelimit-limit-requests", "500"),
        ("x-ratelimit-remaining-requests", "499"),
        ("x-ratelimit-reset-requests", "120ms"),
        ("x-ratelimit-limit-tokens", "30000"),
        ("x-ratelimit-remaining-tokens", "0"),
        ("x-ratelimit-reset-tokens", "6m0s"),
    ]);
    let hints = RateLimitHints::from_headers(&h, now());
    assert_eq!(
        hints.requests,
        DimensionHints {
            limit: Some(500),
            remaining: Some(499),
            reset: Some(ms(120))
        }
    );
    assert_eq!(
        hints.tokens,
        DimensionHints {
            limit: Some(30_000),
            remaining: Some(0),
            reset: Some(secs(360))
        }
    );
    assert_eq!(hints.retry_after, None);
    // Tokens are exhausted: their reset is the floor.
    assert_eq!(hints.retry_floor(), Some(secs(360)));
    assert_eq!(hints.longest_reset(), Some(secs(360)));
    assert!(!hints.is_empty());
}

// proves: RT-3
#[test]
fn anthropic_headers() {
    let h = headers(&[
        ("anthropic-ratelimit-requests-limit", "50"),
        ("anthropic-ratelimit-requests-remaining", "0"),
        ("anthropic-ratelimit-requests-reset", "2023-11-14T22:13:30Z"),
        ("anthropic-ratelimit-tokens-remaining", "100"),
        ("anthropic-ratelimit-tokens-reset", "2023-11-14T22:14:20Z"),
        ("anthropic-ratelimit-input-tokens-limit", "40000"),
        ("anthropic-ratelimit-input-tokens-remaining", "39000"),
        (
            "anthropic-ratelimit-input-tokens-reset",
            "2023-11-14T22:13:21Z",
        ),
        ("anthropic-ratelimit-output-tokens-remaining", "0"),
        (
            "anthropic-ratelimit-output-tokens-reset",
            "2023-11-14T22:13:40Z",
        ),
    ]);
    let hints = RateLimitHints::from_headers(&h, now());
    assert_eq!(
        hints.requests,
        DimensionHints {
            limit: Some(50),
            remaining: Some(0),
            reset: Some(secs(10))
        }
    );
    assert_eq!(hints.tokens.reset, Some(secs(60)));
    assert_eq!(hints.input_tokens.limit, Some(40_000));
    assert_eq!(hints.input_tokens.reset, Some(secs(1)));
    assert_eq!(hints.output_tokens.reset, Some(secs(20)));
    // Exhausted: requests (10 s) and output tokens (20 s) → 20 s.
    assert_eq!(hints.retry_floor(), Some(secs(20)));
    // Needing 500 tokens while 100 remain also waits for the token reset.
    assert_eq!(hints.retry_floor_for(500), Some(secs(60)));
    assert_eq!(hints.longest_reset(), Some(secs(60)));
    // Each budget goes to its own dimension (SPEC ).
    let budgets = hints.budgets();
    let input = budgets.input_tokens.expect("input budget");
    assert_eq!(input.dimension, tollgate::Dimension::InputTokens);
    assert_eq!(
        (input.limit, input.remaining, input.reset),
        (Some(40_000), Some(39_000), Some(secs(1)))
    );
    let output = budgets.output_tokens.expect("output budget");
    assert_eq!(output.dimension, tollgate::Dimension::OutputTokens);
    assert_eq!(output.remaining, Some(0));
    assert_eq!(budgets.requests.map(|r| r.remaining), Some(Some(0)));
}

// proves: RT-3
#[test]
fn retry_after_precedence() {
    let exhausted = [
        ("x-ratelimit-remaining-requests", "0"),
        ("x-ratelimit-reset-requests", "20s"),
    ];
    let only_resets = RateLimitHints::from_headers(&headers(&exhausted), now());
    assert_eq!(only_resets.retry_floor(), Some(secs(20)));

    let mut with_after = exhausted.to_vec();
    with_after.push(("retry-after", "3"));
    let hints = RateLimitHints::from_headers(&headers(&with_after), now());
    assert_eq!(hints.retry_after, Some(secs(3)));
    assert_eq!(hints.retry_floor(), Some(secs(3)));

    with_after.push(("retry-after-ms", "2500"));
    let hints = RateLimitHints::from_headers(&headers(&with_after), now());
    assert_eq!(hints.retry_floor(), Some(ms(2500)));

    // A reset of a dimension that is not exhausted is no floor.
    let h = headers(&[
        ("x-ratelimit-remaining-requests", "10"),
        ("x-ratelimit-reset-requests", "20s"),
        ("x-ratelimit-reset-tokens", "1s"),
    ]);
    let hints = RateLimitHints::from_headers(&h, now());
    assert_eq!(hints.retry_floor(), None);
    assert_eq!(hints.longest_reset(), Some(secs(20)));
}

// proves: RT-3
#[test]
fn invalid_values_are_ignored() {
    let h = headers(&[
        ("retry-after", "later"),
        ("retry-after-ms", "-10"),
        ("x-ratelimit-limit-requests", "-1"),
        ("x-ratelimit-remaining-requests", "1.5"),
        ("x-ratelimit-reset-requests", "soon"),
        ("x-ratelimit-remaining-tokens", ""),
        ("x-ratelimit-reset-tokens", "5"),
        ("anthropic-ratelimit-requests-reset", "not a date"),
        ("anthropic-ratelimit-tokens-limit", "ten"),
    ]);
    let hints = RateLimitHints::from_headers(&h, now());
    assert_eq!(hints, RateLimitHints::default());
    assert!(hints.is_empty());
    assert_eq!(hints.retry_floor(), None);
    // Non-UTF-8 bytes are ignored too.
    let mut h = HeaderMap::new();
    h.insert(
        "retry-after",
        HeaderValue::from_bytes(b"\xff\xfe").expect("opaque value"),
    );
    assert!(RateLimitHints::from_headers(&h, now()).is_empty());
}

#[test]
fn openai_wins_over_anthropic_field_by_field_and_first_value_counts() {
    let h = headers(&[
        ("x-ratelimit-remaining-tokens", "5"),
        ("anthropic-ratelimit-tokens-remaining", "9"),
        ("anthropic-ratelimit-tokens-limit", "100"),
        ("retry-after", "4"),
        ("retry-after", "8"),
    ]);
    let hints = RateLimitHints::from_headers(&h, now());
    assert_eq!(hints.tokens.remaining, Some(5));
    assert_eq!(hints.tokens.limit, Some(100));
    assert_eq!(hints.retry_after, Some(secs(4)));
}

// proves: RT-3 (the first value of a repeated header counts, even when
// it is not text: a later value never stands in for it)
#[test]
fn a_first_value_that_is_not_text_is_not_replaced_by_a_later_one() {
    let mut h = HeaderMap::new();
    let name = HeaderName::from_static("x-ratelimit-limit-requests");
    h.append(&name, HeaderValue::from_bytes(b"\xff7").expect("value"));
    h.append(&name, HeaderValue::from_static("7"));
    h.append(
        "x-ratelimit-remaining-requests",
        HeaderValue::from_static("3"),
    );
    let hints = RateLimitHints::from_headers(&h, now());
    assert_eq!(hints.requests.limit, None);
    assert_eq!(hints.requests.remaining, Some(3));
}

/// What `from_headers` must read: each field from the first value of its
/// own header, found by name (the reference its one pass is checked
/// against).
fn by_name(h: &HeaderMap, now: SystemTime) -> RateLimitHints {
    let get = |name: &str| {
        h.get(name)
            .and_then(|v| std::str::from_utf8(v.as_bytes()).ok())
    };
    let dim = |prefix: &str, suffix: &str, anthropic: bool| {
        let name = |part: &str| {
            if anthropic {
                format!("anthropic-ratelimit-{suffix}-{part}")
            } else {
                format!("{prefix}-{part}-{suffix}")
            }
        };
        DimensionHints {
            limit: get(&name("limit")).and_then(count),
            remaining: get(&name("remaining")).and_then(count),
            reset: get(&name("reset")).and_then(|v| {
                if anthropic {
                    rfc3339_until(v, now)
                } else {
                    go_duration(v)
                }
            }),
        }
    };
    let pick = |a: DimensionHints, b: DimensionHints| DimensionHints {
        limit: a.limit.or(b.limit),
        remaining: a.remaining.or(b.remaining),
        reset: a.reset.or(b.reset),
    };
    RateLimitHints {
        retry_after: get("retry-after").and_then(|v| retry_after(v, now)),
        retry_after_ms: get("retry-after-ms").and_then(retry_after_ms),
        requests: pick(
            dim("x-ratelimit", "requests", false),
            dim("", "requests", true),
        ),
        tokens: pick(dim("x-ratelimit", "tokens", false), dim("", "tokens", true)),
        input_tokens: dim("", "input-tokens", true),
        output_tokens: dim("", "output-tokens", true),
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1024))]

    // proves: RT-3 (invalid values never panic)
    #[test]
    fn arbitrary_strings_never_panic(s in ".{0,40}", secs_since_epoch in any::<u64>()) {
        let now = UNIX_EPOCH.checked_add(Duration::from_secs(secs_since_epoch % (1u64 << 40)))
            .unwrap_or(UNIX_EPOCH);
        let _ = go_duration(&s);
        let _ = retry_after(&s, now);
        let _ = retry_after_ms(&s);
        let _ = count(&s);
        if let Some(d) = rfc3339_until(&s, now) {
            prop_assert!(d <= MAX_HINT);
        }
        if let Ok(value) = HeaderValue::from_str(&s) {
            let mut h = HeaderMap::new();
            for name in ["retry-after", "retry-after-ms", "x-ratelimit-reset-tokens",
                         "x-ratelimit-remaining-tokens", "anthropic-ratelimit-tokens-reset"] {
                h.insert(name, value.clone());
            }
            let hints = RateLimitHints::from_headers(&h, now);
            if let Some(d) = hints.retry_floor() {
                prop_assert!(d <= MAX_HINT);
            }
        }
    }

    #[test]
    fn duration_like_strings_never_panic_and_stay_capped(
        s in "[0-9.]{0,25}(h|m|s|ms|us|\u{b5}s|ns|x|)([0-9.]{0,5}(s|m|h))?",
    ) {
        if let Some(d) = go_duration(&s) {
            prop_assert!(d <= MAX_HINT);
        }
        if let Some(d) = retry_after(&s, now()) {
            prop_assert!(d <= MAX_HINT);
        }
    }

    #[test]
    fn go_durations_of_whole_units_parse_exactly(h in 0u64..100, m in 0u64..60, s in 0u64..60, millis in 0u64..1000) {
        let text = format!("{h}h{m}m{s}.{millis:03}s");
        let expected = Duration::from_secs(h * 3600 + m * 60 + s) + Duration::from_millis(millis);
        prop_assert_eq!(go_duration(&text), Some(expected.min(MAX_HINT)));
    }

    // proves: RT-3 (every hint header is read, from its first value, in
    // one pass over the response's headers)
    #[test]
    fn one_pass_reads_what_lookups_by_name_read(
        pairs in proptest::collection::vec((0usize..24, prop_oneof![
            Just("7".to_owned()), Just("0".to_owned()), Just("1.5s".to_owned()),
            Just("6m0s".to_owned()), Just("2023-11-14T22:13:30Z".to_owned()),
            Just("nope".to_owned()), Just("7é".to_owned()), "[0-9]{1,4}(ms|s|m)?",
        ]), 0..16),
    ) {
        const EXTRA: [&str; 4] = ["content-type", "x-ratelimit-limit-other", "retry-afterwards", "anthropic-ratelimit-x"];
        let mut h = HeaderMap::new();
        for (i, v) in &pairs {
            let name = HEADER_NAMES.get(*i).copied().unwrap_or_else(|| EXTRA[i % EXTRA.len()]);
            h.append(HeaderName::from_bytes(name.as_bytes()).expect("name"), HeaderValue::from_str(v).expect("value"));
        }
        prop_assert_eq!(RateLimitHints::from_headers(&h, now()), by_name(&h, now()));
    }
}

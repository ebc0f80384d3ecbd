//! Rate-limit header parsing: arbitrary values under every header name, and
//! the value parsers directly. Checks no panic and the duration cap.

use std::time::{Duration, UNIX_EPOCH};

use http::{HeaderMap, HeaderValue};
use tollgate_openai::rate_limit::{HEADER_NAMES as NAMES, MAX_HINT, RateLimitHints, parse};

/// Checks one input; panics on a finding.
pub fn check(data: &[u8]) {
    let Some((&clock, rest)) = data.split_first() else {
        return;
    };
    // A wall clock anywhere from 1970 to ~2100.
    let now = UNIX_EPOCH + Duration::from_secs(u64::from(clock) * 16_000_000);

    // Values separated by NUL go to successive header names.
    let mut headers = HeaderMap::new();
    for (name, value) in NAMES.iter().zip(rest.split(|&b| b == 0)) {
        if let Ok(value) = HeaderValue::from_bytes(value) {
            headers.append(*name, value);
        }
    }
    let hints = RateLimitHints::from_headers(&headers, now);
    for d in [
        hints.retry_floor(),
        hints.retry_floor_for(u64::MAX),
        hints.longest_reset(),
    ]
    .into_iter()
    .flatten()
    {
        assert!(d <= MAX_HINT);
    }

    let text = String::from_utf8_lossy(rest);
    for d in [
        parse::go_duration(&text),
        parse::retry_after(&text, now),
        parse::retry_after_ms(&text),
        parse::rfc3339_until(&text, now),
    ]
    .into_iter()
    .flatten()
    {
        assert!(d <= MAX_HINT);
    }
    let _ = parse::count(&text);
}

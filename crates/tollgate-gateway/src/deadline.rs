//! The request deadline (SPEC GW-3, DL-1): made once, when the request
//! arrives, from `x-request-timeout` (seconds) capped by configuration.

use std::time::Duration;

use http::HeaderMap;
use tollgate::Deadline;
use tollgate::clock::Instant;

/// The header a client may send to shorten or lengthen its budget.
pub const REQUEST_TIMEOUT_HEADER: &str = "x-request-timeout";

/// The deadline of a request that arrived at `now`: the client's
/// `x-request-timeout` (positive seconds, fractions allowed) capped by
/// `max`, else `default`. An unreadable header is ignored.
pub fn request_deadline(
    headers: &HeaderMap,
    now: Instant,
    default: Duration,
    max: Duration,
) -> Deadline {
    let asked = headers
        .get(REQUEST_TIMEOUT_HEADER)
        .and_then(|v| v.to_str().ok())
        .and_then(|s| s.trim().parse::<f64>().ok())
        .filter(|s| s.is_finite() && *s > 0.0)
        .map(|s| Duration::try_from_secs_f64(s).unwrap_or(Duration::MAX));
    let timeout = asked.map_or(default, |a| a.min(max));
    Deadline::from_timeout(Some(timeout), now)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(v: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(REQUEST_TIMEOUT_HEADER, v.parse().unwrap());
        h
    }

    // proves: GW-3 (client timeout capped by the maximum; default otherwise)
    #[test]
    fn client_timeout_is_capped() {
        let now = Instant::now();
        let (d, m) = (Duration::from_secs(60), Duration::from_secs(300));
        let at = |h: &HeaderMap| request_deadline(h, now, d, m).remaining(now);
        assert_eq!(at(&HeaderMap::new()), Some(d));
        assert_eq!(at(&headers("2.5")), Some(Duration::from_millis(2_500)));
        assert_eq!(at(&headers("9000")), Some(m));
        assert_eq!(
            at(&headers("1e20")),
            Some(m),
            "too large for a Duration: the cap"
        );
        assert_eq!(at(&headers("-1")), Some(d));
        assert_eq!(at(&headers("soon")), Some(d));
    }
}

//! SIM-2 over real sockets: the sliding windows, the concurrency cap and the
//! retry headers.
//!
//! Window tests drive a [`ManualClock`]: the windows then move only when the
//! test says so, whatever tokio's clock does while requests wait on sockets.
//! One test runs on tokio's paused clock instead, to show the default clock
//! follows `tokio::time::advance`.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::*;
use reqwest::StatusCode;
use serde_json::Value;
use tollgate_sim::{ManualClock, REJECT_CAUSE_HEADER, SimConfig};

const W: Duration = Duration::from_secs(60);

// proves: SIM-2
#[tokio::test]
async fn the_first_request_over_rpm_is_refused_until_the_window_slides() {
    let clock = ManualClock::new();
    let config = SimConfig {
        rpm: Some(3),
        window: W,
        ..SimConfig::default()
    };
    let server = start_with_clock(config, Arc::new(clock.clone())).await;
    let body = chat("hi", Some(1));

    for remaining in ["2", "1", "0"] {
        let r = post(&server, "/v1/chat/completions", &body).await;
        assert_eq!(r.status(), StatusCode::OK);
        assert_eq!(header(&r, "x-ratelimit-limit-requests"), Some("3"));
        assert_eq!(
            header(&r, "x-ratelimit-remaining-requests"),
            Some(remaining)
        );
        // Admitted: the window is empty again one full window later.
        assert_eq!(header(&r, "x-ratelimit-reset-requests"), Some("1m0s"));
        // No token limit configured: no token headers.
        assert_eq!(header(&r, "x-ratelimit-limit-tokens"), None);
        clock.advance(Duration::from_secs(10));
    }

    // t = 30 s: the fourth request is over; the first leaves at t = 60 s.
    clock.advance(Duration::from_millis(500)); // t = 30.5 s
    let r = post(&server, "/v1/chat/completions", &body).await;
    assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(header(&r, REJECT_CAUSE_HEADER), Some("rpm"));
    assert_eq!(header(&r, "retry-after"), Some("30")); // 29.5 s rounded up
    assert_eq!(header(&r, "retry-after-ms"), Some("29500"));
    assert_eq!(header(&r, "x-ratelimit-remaining-requests"), Some("0"));
    assert_eq!(header(&r, "x-ratelimit-reset-requests"), Some("29.5s"));
    let error: Value = r.json().await.expect("json error");
    assert_eq!(error["error"]["code"], "rate_limit_exceeded");
    assert_eq!(error["error"]["type"], "requests");
    assert!(error["error"]["param"].is_null());

    let stats = server.stats();
    assert_eq!(stats.rejected_429.rpm, 1);
    assert_eq!(stats.rejected_429.total(), 1);
    assert_eq!((stats.ok, stats.requests_charged), (3, 3));

    // One nanosecond early: still refused. At the instant: admitted.
    clock.advance(Duration::from_millis(29_500) - Duration::from_nanos(1));
    let r = post(&server, "/v1/chat/completions", &body).await;
    assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(header(&r, "retry-after-ms"), Some("1"));
    clock.advance(Duration::from_nanos(1));
    let r = post(&server, "/v1/chat/completions", &body).await;
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(header(&r, "x-ratelimit-remaining-requests"), Some("0"));

    let stats = server.stats();
    assert_eq!(stats.rejected_429.rpm, 2);
    assert_eq!(stats.max_requests_in_window, 3);
    assert_eq!(stats.requests_charged, 4);
}

// proves: SIM-2
#[tokio::test]
async fn the_first_request_over_tpm_is_refused_and_usage_equals_the_charge() {
    let clock = ManualClock::new();
    let config = SimConfig {
        tpm: Some(25),
        window: W,
        ..SimConfig::default()
    };
    let server = start_with_clock(config, Arc::new(clock.clone())).await;
    // "abcd": 1 token + 3 per message + 3 per prompt = 7; 3 completion = 10.
    let body = chat("abcd", Some(3));

    for remaining in ["15", "5"] {
        let r = post(&server, "/v1/chat/completions", &body).await;
        assert_eq!(r.status(), StatusCode::OK);
        assert_eq!(header(&r, "x-ratelimit-limit-tokens"), Some("25"));
        assert_eq!(header(&r, "x-ratelimit-remaining-tokens"), Some(remaining));
        let json: Value = r.json().await.expect("json");
        assert_eq!(json["usage"]["prompt_tokens"], 7);
        assert_eq!(json["usage"]["completion_tokens"], 3);
        assert_eq!(json["usage"]["total_tokens"], 10);
        clock.advance(Duration::from_secs(20));
    }

    // t = 40 s, 20 of 25 used: 10 more does not fit; the first 10 leave at 60 s.
    let r = post(&server, "/v1/chat/completions", &body).await;
    assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(header(&r, REJECT_CAUSE_HEADER), Some("tpm"));
    assert_eq!(header(&r, "retry-after"), Some("20"));
    assert_eq!(header(&r, "retry-after-ms"), Some("20000"));
    assert_eq!(header(&r, "x-ratelimit-remaining-tokens"), Some("5"));
    assert_eq!(header(&r, "x-ratelimit-reset-tokens"), Some("20s"));

    // A request larger than the whole limit can never fit: no retry hint.
    let huge = chat(&"x".repeat(100), Some(1));
    let r = post(&server, "/v1/chat/completions", &huge).await;
    assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(header(&r, REJECT_CAUSE_HEADER), Some("too_large"));
    assert_eq!(header(&r, "retry-after"), None);

    let stats = server.stats();
    assert_eq!(stats.rejected_429.tpm, 1);
    assert_eq!(stats.rejected_429.too_large, 1);
    assert_eq!(stats.tokens_charged, 20);

    clock.advance(Duration::from_secs(20)); // t = 60 s
    let r = post(&server, "/v1/chat/completions", &body).await;
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(header(&r, "x-ratelimit-remaining-tokens"), Some("5"));
    let stats = server.stats();
    assert_eq!(stats.tokens_charged, 30);
    assert_eq!(stats.max_tokens_in_window, 20);
}

// proves: SIM-2
#[tokio::test(start_paused = true)]
async fn the_default_clock_follows_paused_tokio_time() {
    let config = SimConfig {
        rpm: Some(1),
        window: W,
        ..SimConfig::default()
    };
    let server = start(config).await;
    let body = chat("hi", Some(1));
    let r = post(&server, "/v1/chat/completions", &body).await;
    assert_eq!(r.status(), StatusCode::OK);
    let r = post(&server, "/v1/chat/completions", &body).await;
    assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(header(&r, "retry-after"), Some("60"));
    tokio::time::advance(W).await;
    let r = post(&server, "/v1/chat/completions", &body).await;
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(server.stats().rejected_429.rpm, 1);
}

// proves: SIM-2
#[tokio::test]
async fn the_concurrency_cap_counts_streams_until_they_end() {
    let config = SimConfig {
        max_concurrency: Some(2),
        // Streams send headers at once, then wait long before the first chunk.
        ttft: Duration::from_secs(3600),
        ..SimConfig::default()
    };
    let server = start(config).await;
    let body = chat_stream("hi", Some(2), false);
    let first = post(&server, "/v1/chat/completions", &body).await;
    let second = post(&server, "/v1/chat/completions", &body).await;
    assert_eq!(first.status(), StatusCode::OK);
    assert_eq!(second.status(), StatusCode::OK);

    let third = post(&server, "/v1/chat/completions", &chat("hi", Some(1))).await;
    assert_eq!(third.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(header(&third, REJECT_CAUSE_HEADER), Some("concurrency"));
    assert_eq!(header(&third, "retry-after"), None);
    let stats = server.stats();
    assert_eq!((stats.active, stats.max_active), (2, 2));
    assert_eq!(stats.rejected_429.concurrency, 1);

    // The client drops one stream: its slot comes back, and the drop is
    // counted as a client disconnect.
    drop(first);
    wait_for_stats(&server, |s| s.active == 1).await;
    assert_eq!(server.stats().client_disconnects, 1);
    let fourth = post(&server, "/v1/chat/completions", &body).await;
    assert_eq!(fourth.status(), StatusCode::OK);
    assert_eq!(server.stats().max_active, 2);
    drop((second, fourth));
    wait_for_stats(&server, |s| s.active == 0 && s.client_disconnects == 3).await;
}

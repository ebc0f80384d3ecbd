//! The referee at its edges (SPEC SIM-2, SIM-4): amounts near `u64::MAX`,
//! `/reset` with requests in flight, and the background consumer's
//! spacing. Found in review, where the first version panicked (debug) or
//! wrapped its count (release) when huge charges left an unlimited window,
//! let a request settled after a reset erase the charges made since, counted
//! a pre-reset one-shot in the new `ok`, and let the background consumer
//! tick closer than its period (N + 1 ticks in a window, or ticks skipped
//! against its own limit).

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::*;
use reqwest::StatusCode;
use tollgate_sim::{ChargeMode, ManualClock, SimConfig};

/// With an unlimited token window (the documented way to measure a client's
/// peak) and a `chars:N+max_tokens` charge, two requests with huge
/// `max_tokens` saturate `used`; when they leave the window the pruning
/// subtracts more than `used` holds: debug builds panic in the handler (the
/// simulator stops answering), release builds wrap `used` to ~2^64.
// proves: SIM-2 (huge charges leaving an unlimited window neither panic
// nor wrap the count)
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn huge_charges_leave_an_unlimited_window_cleanly() {
    let clock = ManualClock::new();
    let config = SimConfig {
        window: Duration::from_secs(60),
        charge: ChargeMode::Chars {
            chars_per_token: 4,
            output: true,
        },
        ..SimConfig::default()
    };
    let server = start_with_clock(config, Arc::new(clock.clone())).await;
    let huge = 1u64 << 63;
    for _ in 0..2 {
        let r = post(&server, "/v1/chat/completions", &chat("hi", Some(huge))).await;
        assert_eq!(r.status(), StatusCode::OK);
    }
    // Both entries leave the window.
    clock.advance(Duration::from_secs(61));
    let r = client()
        .post(server.url("/v1/chat/completions"))
        .json(&chat("hi", Some(10)))
        .send()
        .await;
    let status = r.as_ref().map(|r| r.status()).map_err(|e| e.to_string());
    assert_eq!(
        status,
        Ok(StatusCode::OK),
        "a small request after the window slid must be admitted"
    );
}

/// `/reset` while a reconciled request is in flight: when that request
/// settles after the reset, `settle` subtracts its pre-reset charge from the
/// post-reset `tokens_charged` (saturating), erasing the charges of requests
/// admitted after the reset.
// proves: SIM-4 (a request settled after `/reset` changes no counter of
// the new period)
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_settlement_after_reset_leaves_the_new_counters() {
    let config = SimConfig {
        ttft: Duration::from_millis(300),
        charge: ChargeMode::Chars {
            chars_per_token: 4,
            output: true,
        },
        reconcile: true,
        ..SimConfig::default()
    };
    let server = Arc::new(start(config).await);
    // A: charge = ceil(2/4) + 1000 = 1001; usage = 3 + 3 + 1 + 16 = 23.
    let a = {
        let server = Arc::clone(&server);
        tokio::spawn(async move {
            let r = post(
                &server,
                "/v1/chat/completions",
                &chat_stream("hi", Some(1000), false),
            )
            .await;
            read_sse(r).await
        })
    };
    wait_for_stats(&server, |s| s.active == 1).await;
    server.reset();
    // B and C after the reset: each charged 1001, settled to 23.
    let mut others = Vec::new();
    for _ in 0..2 {
        let server = Arc::clone(&server);
        others.push(tokio::spawn(async move {
            post(&server, "/v1/chat/completions", &chat("hi", Some(1000)))
                .await
                .status()
        }));
    }
    assert!(!a.await.expect("a").truncated);
    for o in others {
        assert_eq!(o.await.expect("b/c"), StatusCode::OK);
    }
    let stats = server.stats();
    assert_eq!(stats.requests_charged, 2);
    // Post-reset traffic is B + C = 46 (69 if A's settlement is counted);
    // anything below 46 loses charges of admitted requests.
    assert!(
        stats.tokens_charged >= 46,
        "tokens_charged {} < 46 for 2 admitted requests of usage 23: {stats:?}",
        stats.tokens_charged
    );
}

/// The background consumer alone, unlimited windows: the README promises at
/// most N ticks in any window.
// proves: SIM-2 (at most N background ticks in any window)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_background_consumer_never_spends_more_than_n_per_window() {
    let config = SimConfig {
        window: Duration::from_millis(100),
        background_rpm: Some(10),
        ..SimConfig::default()
    };
    let server = start(config).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let stats = server.stats();
    assert!(stats.background_requests >= 25, "{stats:?}");
    assert!(stats.max_requests_in_window <= 10, "{stats:?}");
}

/// Same consumer with `rpm = background_rpm` (allowed by validation) and no
/// client at all: early ticks find the window full and are skipped.
// proves: SIM-2 (a consumer whose rate equals the limit skips no tick
// when alone)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_background_consumer_alone_at_the_limit_skips_nothing() {
    let config = SimConfig {
        rpm: Some(10),
        window: Duration::from_millis(100),
        background_rpm: Some(10),
        ..SimConfig::default()
    };
    let server = start(config).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let stats = server.stats();
    assert_eq!(stats.background_skipped, 0, "{stats:?}");
}

/// A one-shot admitted before `/reset` and finished after it is counted in
/// the post-reset `ok`, so `ok > requests_total`.
// proves: SIM-4 (a one-shot admitted before `/reset` is not counted
// after it)
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_pre_reset_one_shot_is_not_counted_after_it() {
    let config = SimConfig {
        ttft: Duration::from_millis(300),
        ..SimConfig::default()
    };
    let server = Arc::new(start(config).await);
    let a = {
        let server = Arc::clone(&server);
        tokio::spawn(async move {
            post(&server, "/v1/chat/completions", &chat("hi", None))
                .await
                .status()
        })
    };
    wait_for_stats(&server, |s| s.active == 1).await;
    server.reset();
    assert_eq!(a.await.expect("a"), StatusCode::OK);
    let stats = server.stats();
    assert!(stats.ok <= stats.requests_total, "{stats:?}");
}

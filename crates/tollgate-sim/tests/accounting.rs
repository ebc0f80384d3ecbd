//! How the simulator's limiter counts, over real sockets: the ingress delay
//! (where it counts), the charge modes and reconciliation (what it counts),
//! the refusal charge (what a 429 costs) and the background consumer (who
//! else spends the budget). The rules are SIM-2 (strict windows, headers)
//! and the provider behaviours that must cope with.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::*;
use reqwest::StatusCode;
use serde_json::Value;
use tokio::time::Instant;
use tollgate_sim::{
    ChargeMode, IngressDelay, ManualClock, REJECT_CAUSE_HEADER, RefusalCharge, SimConfig,
};

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn num(response: &reqwest::Response, name: &str) -> u64 {
    header(response, name)
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("header {name} missing or not a number"))
}

/// "Hello, world!": 13 characters; prompt = 3 + 3 + ceil(13 / 4) = 10
/// tokens; with the default 16 completion tokens the billing usage is 26.
const TEXT: &str = "Hello, world!";
const USAGE: u64 = 26;

// proves: SIM-2 (ingress delay: a request is counted no earlier than its drawn delay after receipt; Q-15)
#[tokio::test]
async fn a_request_is_counted_only_after_its_ingress_delay() {
    // 200..300 ms rather than tighter: the check below must read the stats
    // before the shortest delay has passed, even on a loaded machine.
    let delay = IngressDelay::range(ms(200), ms(300));
    let config = SimConfig {
        rpm: Some(10),
        window: Duration::from_secs(2),
        ingress_delay: delay,
        seed: 3,
        ..SimConfig::default()
    };
    let server = Arc::new(start(config).await);
    let drawn = delay.draw(3, 0);
    assert!((ms(200)..=ms(300)).contains(&drawn));

    let sent = Instant::now();
    let request = {
        let server = Arc::clone(&server);
        tokio::spawn(async move { post(&server, "/v1/chat/completions", &chat(TEXT, None)).await })
    };
    // Received (counted in requests_total) but not yet charged to a window.
    let mut seen_uncounted = false;
    for _ in 0..200 {
        let stats = server.stats();
        let read = sent.elapsed();
        if stats.requests_total == 1 && read < ms(200) {
            assert_eq!(stats.requests_charged, 0, "charged {read:?} after sending");
            assert_eq!(stats.max_requests_in_window, 0);
            seen_uncounted = true;
        }
        if stats.requests_total == 1 || read >= ms(200) {
            break;
        }
        tokio::time::sleep(ms(2)).await;
    }
    assert!(seen_uncounted, "the request was not received within 200 ms");
    let response = request.await.expect("task");
    let elapsed = sent.elapsed();
    assert_eq!(response.status(), StatusCode::OK);
    assert!(
        elapsed >= drawn,
        "answered after {elapsed:?}, delay {drawn:?}"
    );
    assert_eq!(num(&response, "x-ratelimit-remaining-requests"), 9);
    let stats = server.stats();
    assert_eq!((stats.requests_charged, stats.ok), (1, 1));
}

// proves: SIM-2 (windows slide over counting instants, not receipt instants; Q-15)
#[tokio::test]
async fn windows_slide_over_the_counting_instants() {
    const W: Duration = Duration::from_secs(1);
    let delay = IngressDelay::range(Duration::ZERO, ms(400));
    // A seed where request 0 waits at least 250 ms longer than request 1.
    let seed = (0..10_000)
        .find(|&s| delay.draw(s, 0) >= delay.draw(s, 1) + ms(250))
        .expect("such a seed exists");
    let (d0, d1) = (delay.draw(seed, 0), delay.draw(seed, 1));
    let server = start(SimConfig {
        rpm: Some(1),
        window: W,
        ingress_delay: delay,
        seed,
        ..SimConfig::default()
    })
    .await;
    let body = chat(TEXT, Some(1));

    let t0 = Instant::now();
    let first = post(&server, "/v1/chat/completions", &body).await;
    assert_eq!(first.status(), StatusCode::OK);
    // The second request is received at least 150 ms more than W after the
    // first one's receipt (so a window over receipt instants would admit
    // it), but counted 100 ms before the first one's counting instant + W.
    tokio::time::sleep_until(t0 + W + (d0 - d1) - ms(100)).await;
    let second = post(&server, "/v1/chat/completions", &body).await;
    assert_eq!(second.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(header(&second, REJECT_CAUSE_HEADER), Some("rpm"));
    // About 100 ms, give or take the two requests' connection times.
    let wait = num(&second, "retry-after-ms");
    assert!((1..=300).contains(&wait), "retry-after-ms {wait}");
    assert_eq!(server.stats().rejected_429.rpm, 1);
}

async fn remaining_tokens_after_one_request(
    charge: ChargeMode,
    max_tokens: Option<u64>,
) -> (u64, u64) {
    let server = start_with_clock(
        SimConfig {
            tpm: Some(1_000),
            charge,
            ..SimConfig::default()
        },
        Arc::new(ManualClock::new()),
    )
    .await;
    let r = post(&server, "/v1/chat/completions", &chat(TEXT, max_tokens)).await;
    assert_eq!(r.status(), StatusCode::OK);
    let remaining = num(&r, "x-ratelimit-remaining-tokens");
    let body: Value = r.json().await.expect("json");
    // The reported usage is the billing count, whatever the charge.
    let completion = max_tokens.unwrap_or(16).min(16);
    assert_eq!(body["usage"]["total_tokens"], 10 + completion);
    assert_eq!(server.stats().tokens_charged, 1_000 - remaining);
    (remaining, 1_000 - remaining)
}

// proves: SIM-2 (the token window charges by the configured accounting; headers show it; Q-16)
#[tokio::test]
async fn charge_modes_set_the_remaining_tokens() {
    let openai = ChargeMode::Chars {
        chars_per_token: 4,
        output: true,
    };
    let input_only = ChargeMode::Chars {
        chars_per_token: 4,
        output: false,
    };
    // usage: prompt 10 + completion 16.
    assert_eq!(
        remaining_tokens_after_one_request(ChargeMode::Usage, None).await,
        (1_000 - USAGE, USAGE)
    );
    // chars:4+max_tokens: ceil(13 / 4) + 100 (the request's max_tokens).
    assert_eq!(
        remaining_tokens_after_one_request(openai, Some(100)).await,
        (896, 104)
    );
    // ... or + 16 (--completion-tokens) when the request sets no maximum.
    assert_eq!(
        remaining_tokens_after_one_request(openai, None).await,
        (980, 20)
    );
    // chars:4: ceil(13 / 4) only.
    assert_eq!(
        remaining_tokens_after_one_request(input_only, Some(100)).await,
        (996, 4)
    );
}

// proves: SIM-2 (embeddings under a character-based charge: total characters / N + token ids; Q-16)
#[tokio::test]
async fn embeddings_are_charged_by_characters_in_a_chars_mode() {
    for (charge, expected) in [
        // Billing: ceil(2 / 4) per string + 3 ids = 1 + 1 + 3.
        (ChargeMode::Usage, 5),
        // ceil((2 + 2) / 4) + 3 ids.
        (
            ChargeMode::Chars {
                chars_per_token: 4,
                output: true,
            },
            4,
        ),
    ] {
        let server = start_with_clock(
            SimConfig {
                tpm: Some(100),
                charge,
                ..SimConfig::default()
            },
            Arc::new(ManualClock::new()),
        )
        .await;
        let body = serde_json::json!({"model": "sim-embedding", "input": ["ab", "cd", [1, 2, 3]]});
        let r = post(&server, "/v1/embeddings", &body).await;
        assert_eq!(r.status(), StatusCode::OK);
        assert_eq!(num(&r, "x-ratelimit-remaining-tokens"), 100 - expected);
        let body: Value = r.json().await.expect("json");
        assert_eq!(body["usage"]["total_tokens"], 5);
    }
}

// proves: SIM-2 (reconciliation replaces the admission charge by the usage in the same entry; Q-16)
#[tokio::test]
async fn reconciliation_settles_the_charge_with_the_usage() {
    for reconcile in [false, true] {
        let clock = ManualClock::new();
        let server = start_with_clock(
            SimConfig {
                tpm: Some(1_000),
                charge: ChargeMode::Chars {
                    chars_per_token: 4,
                    output: true,
                },
                reconcile,
                ..SimConfig::default()
            },
            Arc::new(clock.clone()),
        )
        .await;
        let one_shot = post(&server, "/v1/chat/completions", &chat(TEXT, Some(100))).await;
        // Headers show the counting instant: the admission charge 4 + 100.
        assert_eq!(num(&one_shot, "x-ratelimit-remaining-tokens"), 896);
        one_shot.bytes().await.expect("body");
        clock.advance(Duration::from_secs(1));
        let stream = post(
            &server,
            "/v1/chat/completions",
            &chat_stream(TEXT, Some(100), true),
        )
        .await;
        let left = num(&stream, "x-ratelimit-remaining-tokens");
        let sse = read_sse(stream).await;
        assert!(!sse.truncated);
        if reconcile {
            // The one-shot was settled at its usage (26) before the stream
            // was counted.
            assert_eq!(left, 1_000 - USAGE - 104);
            wait_for_stats(&server, |s| s.reconciled == 2).await;
            assert_eq!(server.stats().tokens_charged, 2 * USAGE);
        } else {
            assert_eq!(left, 1_000 - 2 * 104);
            assert_eq!(server.stats().reconciled, 0);
            assert_eq!(server.stats().tokens_charged, 2 * 104);
        }
        // The settled entries keep their counting instants: one full window
        // after the first one, only the stream's charge is left.
        clock.advance(Duration::from_secs(59));
        let r = post(&server, "/v1/chat/completions", &chat(TEXT, Some(1))).await;
        let stream_charge = if reconcile { USAGE } else { 104 };
        // chars:4+max_tokens with max_tokens 1: 4 + 1.
        assert_eq!(
            num(&r, "x-ratelimit-remaining-tokens"),
            1_000 - stream_charge - 5
        );
    }
}

// proves: SIM-2 (what a 429 costs per --charge-refusals, and the hint after that charge; Q-16)
#[tokio::test]
async fn refusals_cost_what_the_mode_says() {
    for (mode, units, tokens, retry_secs) in [
        (RefusalCharge::None, 0, 0, 50),
        (RefusalCharge::Requests, 1, 0, 50),
        (RefusalCharge::All, 1, USAGE, 60),
    ] {
        let clock = ManualClock::new();
        let server = start_with_clock(
            SimConfig {
                rpm: Some(10),
                tpm: Some(50),
                charge_refusals: mode,
                ..SimConfig::default()
            },
            Arc::new(clock.clone()),
        )
        .await;
        let body = chat(TEXT, None);
        let ok = post(&server, "/v1/chat/completions", &body).await;
        assert_eq!(ok.status(), StatusCode::OK);
        clock.advance(Duration::from_secs(10));
        let refused = post(&server, "/v1/chat/completions", &body).await;
        assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS, "{mode}");
        assert_eq!(header(&refused, REJECT_CAUSE_HEADER), Some("tpm"));
        // Headers are after the refusal's own charge.
        assert_eq!(
            num(&refused, "x-ratelimit-remaining-requests"),
            9 - units,
            "{mode}"
        );
        assert_eq!(
            num(&refused, "x-ratelimit-remaining-tokens"),
            (50 - USAGE).saturating_sub(tokens),
            "{mode}"
        );
        // Paying its tokens, the refusal itself must leave before a retry
        // fits (t = 10 s + W); otherwise the first request's departure
        // (t = W) is enough.
        assert_eq!(num(&refused, "retry-after"), retry_secs, "{mode}");
        let stats = server.stats();
        assert_eq!(stats.refusal_requests_charged, units);
        assert_eq!(stats.refusal_tokens_charged, tokens);
        assert_eq!((stats.requests_charged, stats.tokens_charged), (1, USAGE));
        assert_eq!(stats.rejected_429.tpm, 1);
    }
}

// proves: SIM-2 (a background consumer spends ~N per window from the same windows, visible in headers and /stats; Q-14)
#[tokio::test]
async fn the_background_consumer_spends_from_the_same_windows() {
    let server = start(SimConfig {
        rpm: Some(100),
        tpm: Some(10_000),
        window: Duration::from_secs(1),
        background_rpm: Some(10),
        background_tpm: Some(2_000),
        ..SimConfig::default()
    })
    .await;
    // No client traffic: two windows of background spending.
    tokio::time::sleep(ms(2_050)).await;
    let stats = server.stats();
    assert!((18..=21).contains(&stats.background_requests), "{stats:?}");
    assert_eq!(stats.background_tokens, 200 * stats.background_requests);
    assert_eq!(stats.background_skipped, 0);
    assert!(
        (9..=11).contains(&stats.max_requests_in_window),
        "{stats:?}"
    );
    assert_eq!((stats.requests_total, stats.requests_charged), (0, 0));
    assert_eq!(stats.rejected_429.total(), 0);

    // A client sees the consumer's spending in the headers.
    let r = post(&server, "/v1/chat/completions", &chat(TEXT, None)).await;
    assert_eq!(r.status(), StatusCode::OK);
    let requests = num(&r, "x-ratelimit-remaining-requests");
    let tokens = num(&r, "x-ratelimit-remaining-tokens");
    assert!(
        (88..=90).contains(&requests),
        "remaining requests {requests}"
    );
    assert_eq!(10_000 - USAGE - tokens, 200 * (99 - requests));
    server.shutdown().await.expect("shutdown");
}

// proves: SIM-2 (the background consumer never exceeds the windows: it
// skips a tick without room, and spends again once there is room)
#[tokio::test]
async fn the_background_consumer_skips_when_the_window_is_full() {
    let server = start(SimConfig {
        rpm: Some(4),
        window: Duration::from_secs(1),
        background_rpm: Some(4),
        ..SimConfig::default()
    })
    .await;
    // The client fills the window at once. The consumer ticks every
    // 250 ms: on a busy machine a tick may still come first and take a
    // unit, and the client's last request is refused; the window is full
    // either way. (The test used to assume that four requests in a row
    // finish before the first tick, and that nothing leaves the window
    // until a fixed 900 ms sleep is over: not so on two busy cores.)
    let body = chat(TEXT, Some(1));
    let answers = futures_util::future::join_all(
        (0..4).map(|_| post(&server, "/v1/chat/completions", &body)),
    )
    .await;
    let ok = answers
        .iter()
        .filter(|r| r.status() == StatusCode::OK)
        .count() as u64;
    // Ticks without room are skipped.
    wait_for_stats(&server, |s| s.background_skipped >= 2).await;
    let stats = server.stats();
    assert_eq!(stats.max_requests_in_window, 4, "{stats:?}");
    assert_eq!(stats.requests_charged, ok, "{stats:?}");
    // Skipped ticks are not client refusals.
    assert_eq!(stats.rejected_429.total(), 4 - ok, "{stats:?}");
    // Once the client's requests have left, the consumer spends again.
    let spent = stats.background_requests;
    wait_for_stats(&server, |s| s.background_requests > spent).await;
    assert!(server.stats().max_requests_in_window <= 4);
}

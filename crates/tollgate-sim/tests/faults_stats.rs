//! SIM-3 (latency and seeded faults) and SIM-4 (`/stats`, `/reset`) over
//! real sockets.

mod common;

use std::time::Duration;

use common::*;
use reqwest::StatusCode;
use serde_json::Value;
use tokio::time::Instant;
use tollgate_sim::{SimConfig, SimServer, SimStats};

/// What the client saw of one request.
#[derive(Debug, Clone, PartialEq)]
enum Outcome {
    Status(u16),
    Complete(usize),
    Truncated(usize),
}

async fn run_sequence(server: &SimServer, n: usize) -> Vec<Outcome> {
    let mut out = Vec::new();
    for _ in 0..n {
        let r = post(
            server,
            "/v1/chat/completions",
            &chat_stream("hi", None, true),
        )
        .await;
        if r.status() != StatusCode::OK {
            out.push(Outcome::Status(r.status().as_u16()));
            continue;
        }
        let sse = read_sse(r).await;
        if sse.truncated {
            assert!(!sse.events.iter().any(|e| e == "[DONE]"));
            out.push(Outcome::Truncated(sse.events.len()));
        } else {
            assert_eq!(sse.events.last().map(String::as_str), Some("[DONE]"));
            out.push(Outcome::Complete(sse.events.len()));
        }
    }
    out
}

fn faulty(seed: u64) -> SimConfig {
    SimConfig {
        seed,
        completion_tokens: 4,
        error_rate: 0.3,
        disconnect_rate: 0.4,
        ..SimConfig::default()
    }
}

// proves: SIM-3
#[tokio::test]
async fn seeded_faults_repeat_exactly_and_cut_streams_are_truncated() {
    let server = start(faulty(42)).await;
    let first = run_sequence(&server, 40).await;
    let stats = server.stats();

    let errors = first
        .iter()
        .filter(|o| matches!(o, Outcome::Status(_)))
        .count();
    let cuts = first
        .iter()
        .filter(|o| matches!(o, Outcome::Truncated(_)))
        .count();
    assert!(errors > 0 && cuts > 0, "{first:?}");
    assert!(first.iter().all(|o| match o {
        Outcome::Status(s) => *s == 500 || *s == 503,
        // role + 4 content + finish + usage = 7 events at most, at least 1.
        Outcome::Truncated(n) => (1..=7).contains(n),
        Outcome::Complete(n) => *n == 8,
    }));
    assert_eq!(stats.faults.server_error, errors as u64);
    assert_eq!(stats.faults.disconnect, cuts as u64);
    // Injected 5xx are not charged; cut streams are.
    assert_eq!(stats.requests_charged, (40 - errors) as u64);
    assert_eq!(stats.client_disconnects, 0);

    // After a reset the same seed replays the same faults...
    let reset: Value = client()
        .post(server.url("/reset"))
        .send()
        .await
        .expect("sent")
        .json()
        .await
        .expect("json");
    assert_eq!(reset["reset"], true);
    assert_eq!(run_sequence(&server, 40).await, first);

    // ...and another seed does not.
    let other = start(faulty(43)).await;
    assert_ne!(run_sequence(&other, 40).await, first);
}

// proves: SIM-3
#[tokio::test(start_paused = true)]
async fn latency_and_slow_headers_use_tokio_time() {
    let server = start(SimConfig {
        completion_tokens: 5,
        ttft: Duration::from_secs(1),
        per_token: Duration::from_millis(100),
        slow_headers_rate: 1.0,
        slow_headers_delay: Duration::from_secs(10),
        ..SimConfig::default()
    })
    .await;

    // One-shot: slow headers 10 s + ttft 1 s + 5 x 100 ms.
    let start = Instant::now();
    let r = post(&server, "/v1/chat/completions", &chat("hi", None)).await;
    assert_eq!(r.status(), StatusCode::OK);
    let elapsed = start.elapsed();
    assert!(
        elapsed >= Duration::from_millis(11_500) && elapsed < Duration::from_millis(12_500),
        "{elapsed:?}"
    );

    // Stream: headers after 10 s, first chunk 1 s later, done 0.5 s later.
    let start = Instant::now();
    let r = post(
        &server,
        "/v1/chat/completions",
        &chat_stream("hi", None, false),
    )
    .await;
    let headers_at = start.elapsed();
    let sse = read_sse(r).await;
    let done_at = start.elapsed();
    assert!(
        headers_at >= Duration::from_secs(10) && headers_at < Duration::from_secs(11),
        "{headers_at:?}"
    );
    assert!(
        done_at >= Duration::from_millis(11_500) && done_at < Duration::from_millis(12_500),
        "{done_at:?}"
    );
    assert_eq!(sse.events.len(), 5 + 2 + 1);
    assert_eq!(server.stats().faults.slow_headers, 2);
}

// proves: SIM-4
#[tokio::test]
async fn a_client_that_leaves_mid_stream_is_counted() {
    let server = start(SimConfig {
        completion_tokens: 50,
        per_token: Duration::from_millis(20),
        ..SimConfig::default()
    })
    .await;
    let mut r = post(
        &server,
        "/v1/chat/completions",
        &chat_stream("hi", None, false),
    )
    .await;
    let first = r.chunk().await.expect("first chunk").expect("some bytes");
    assert!(first.starts_with(b"data: "));
    assert_eq!(server.stats().active, 1);
    drop(r);
    wait_for_stats(&server, |s| s.client_disconnects == 1 && s.active == 0).await;
    let stats = server.stats();
    assert_eq!(stats.ok, 1);
    assert_eq!(stats.faults.disconnect, 0);
}

// proves: SIM-4
#[tokio::test]
async fn a_client_that_gives_up_on_a_one_shot_is_counted() {
    let server = start(SimConfig {
        ttft: Duration::from_secs(3600),
        ..SimConfig::default()
    })
    .await;
    let gave_up = reqwest::Client::builder()
        .timeout(Duration::from_millis(200))
        .build()
        .expect("client")
        .post(server.url("/v1/chat/completions"))
        .json(&chat("hi", None))
        .send()
        .await;
    assert!(gave_up.is_err_and(|e| e.is_timeout()));
    wait_for_stats(&server, |s| s.client_disconnects == 1 && s.active == 0).await;
    let stats = server.stats();
    // Charged at arrival, never answered.
    assert_eq!((stats.requests_charged, stats.ok), (1, 0));
}

// proves: SIM-4
#[tokio::test]
async fn stats_json_has_every_counter_and_reset_clears_them() {
    let server = start(SimConfig {
        rpm: Some(1),
        tpm: Some(1000),
        ..SimConfig::default()
    })
    .await;
    let body = chat("hi", Some(1));
    assert_eq!(
        post(&server, "/v1/chat/completions", &body).await.status(),
        StatusCode::OK
    );
    assert_eq!(
        post(&server, "/v1/chat/completions", &body).await.status(),
        StatusCode::TOO_MANY_REQUESTS
    );

    let json: Value = client()
        .get(server.url("/stats"))
        .send()
        .await
        .expect("sent")
        .json()
        .await
        .expect("json");
    // The route and the in-process snapshot agree, field for field.
    let parsed: SimStats = serde_json::from_value(json.clone()).expect("SimStats shape");
    assert_eq!(parsed, server.stats());
    for key in [
        "requests_total",
        "ok",
        "rejected_429",
        "unauthorized",
        "bad_request",
        "faults",
        "client_disconnects",
        "active",
        "max_active",
        "requests_charged",
        "tokens_charged",
        "max_requests_in_window",
        "max_tokens_in_window",
        "routes",
        "limits",
    ] {
        assert!(json.get(key).is_some(), "missing {key}");
    }
    assert_eq!(json["rejected_429"]["rpm"], 1);
    assert_eq!(json["limits"]["rpm"], 1);
    assert_eq!(json["limits"]["max_concurrency"], Value::Null);
    assert_eq!(json["limits"]["window_ms"], 60_000);
    assert_eq!(json["max_requests_in_window"], 1);
    assert_eq!(json["max_tokens_in_window"], 1 + 3 + 3 + 1);

    // Reset clears counters and windows: the spent request limit is back.
    server.reset();
    let cleared = server.stats();
    assert_eq!(
        cleared,
        SimStats {
            limits: cleared.limits,
            ..SimStats::default()
        }
    );
    assert_eq!(
        post(&server, "/v1/chat/completions", &body).await.status(),
        StatusCode::OK
    );
    assert_eq!(server.stats().requests_total, 1);
}

// proves: SIM-4
#[tokio::test]
async fn shutdown_is_graceful_and_frees_the_port() {
    let server = start(SimConfig::default()).await;
    let addr = server.local_addr();
    assert_eq!(server.base_url(), format!("http://{addr}"));
    assert_eq!(server.openai_base_url(), format!("http://{addr}/v1"));
    server.shutdown().await.expect("clean shutdown");
    assert!(
        client()
            .get(format!("http://{addr}/stats"))
            .send()
            .await
            .is_err()
    );
}

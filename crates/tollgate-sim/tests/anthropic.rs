//! Anthropic's Messages API (the upstream side of WIRE-3) over real
//! sockets: the one-shot message, the SSE event stream, Anthropic's errors
//! and headers, and its separate request / input-token / output-token
//! buckets (SIM-2), with faults (SIM-3) and `/stats` by cause (SIM-4).

mod common;

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use common::*;
use reqwest::StatusCode;
use serde_json::{Value, json};
use tollgate_sim::{ManualClock, REJECT_CAUSE_HEADER, SimConfig, SimServer};

const PATH: &str = "/v1/messages";
const KEY: (&str, &str) = ("x-api-key", "ant-secret");
const VERSION: (&str, &str) = ("anthropic-version", "2023-06-01");

fn config() -> SimConfig {
    SimConfig {
        completion_tokens: 4,
        anthropic_key: Some("ant-secret".into()),
        ..SimConfig::default()
    }
}

fn body(content: &str, max_tokens: u64, stream: bool) -> String {
    json!({
        "model": "claude-sim",
        "max_tokens": max_tokens,
        "messages": [{"role": "user", "content": content}],
        "stream": stream,
    })
    .to_string()
}

async fn send(server: &SimServer, body: &str) -> reqwest::Response {
    post_with(server, PATH, &[KEY, VERSION], body).await
}

fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("after 1970")
        .as_secs()
}

/// The `anthropic-ratelimit-{bucket}-limit` header.
fn limit<'a>(r: &'a reqwest::Response, bucket: &str) -> Option<&'a str> {
    header(r, &format!("anthropic-ratelimit-{bucket}-limit"))
}

/// The `anthropic-ratelimit-{bucket}-remaining` header.
fn remaining<'a>(r: &'a reqwest::Response, bucket: &str) -> Option<&'a str> {
    header(r, &format!("anthropic-ratelimit-{bucket}-remaining"))
}

/// Seconds from now until the RFC 3339 `reset` header of `bucket`.
fn reset_in(r: &reqwest::Response, bucket: &str) -> u64 {
    let name = format!("anthropic-ratelimit-{bucket}-reset");
    let stamp = header(r, &name).expect("reset header");
    parse_rfc3339(stamp).saturating_sub(now_secs())
}

// proves: SIM-1 (Anthropic one-shot message: shape, usage by the documented count, anthropic-ratelimit-* on the response; WIRE-3)
#[tokio::test]
async fn a_one_shot_message_has_anthropics_shape_and_headers() {
    let clock = ManualClock::new();
    let config = SimConfig {
        anthropic_rpm: Some(10),
        itpm: Some(600),
        otpm: Some(120),
        ..config()
    };
    let server = start_with_clock(config, Arc::new(clock.clone())).await;
    let r = send(&server, &body("hi", 100, false)).await;
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(header(&r, "request-id"), Some("req_sim_0"));
    assert_eq!(limit(&r, "requests"), Some("10"));
    assert_eq!(remaining(&r, "requests"), Some("9"));
    assert_eq!(limit(&r, "input-tokens"), Some("600"));
    // "hi": 3 + 3 + 1 = 7 input tokens.
    assert_eq!(remaining(&r, "input-tokens"), Some("593"));
    assert_eq!(limit(&r, "output-tokens"), Some("120"));
    // max_tokens is reserved at admission: 120 - 100.
    assert_eq!(remaining(&r, "output-tokens"), Some("20"));
    // 100 output tokens back at 2/s: full again in 50 s (RFC 3339, rounded up).
    assert!((49..=52).contains(&reset_in(&r, "output-tokens")));
    assert!(reset_in(&r, "input-tokens") <= 2);
    assert!(reset_in(&r, "requests") <= 7);
    let json: Value = r.json().await.expect("json");
    assert_eq!(json["type"], "message");
    assert_eq!(json["id"], "msg_sim_0");
    assert_eq!(json["role"], "assistant");
    assert_eq!(json["model"], "claude-sim");
    assert_eq!(
        json["content"],
        json!([{"type": "text", "text": "the gate lets each"}])
    );
    assert_eq!(json["stop_reason"], "end_turn");
    assert_eq!(
        json["usage"],
        json!({"input_tokens": 7, "output_tokens": 4})
    );

    // The unused 96 came back when the response ended: 20 + 96 = 116, and
    // this request reserves 2. A system prompt counts: 7 + "Be brief." 3.
    let with_system = json!({
        "model": "claude-sim", "max_tokens": 2, "system": [{"type": "text", "text": "Be brief."}],
        "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}],
    });
    let r = send(&server, &with_system.to_string()).await;
    assert_eq!(remaining(&r, "output-tokens"), Some("114"));
    assert_eq!(remaining(&r, "input-tokens"), Some("583"));
    let json: Value = r.json().await.expect("json");
    assert_eq!(json["stop_reason"], "max_tokens");
    assert_eq!(
        json["usage"],
        json!({"input_tokens": 10, "output_tokens": 2})
    );

    let stats = server.stats();
    assert_eq!(stats.routes.messages, 2);
    assert_eq!((stats.ok, stats.messages_charged), (2, 2));
    assert_eq!(stats.input_tokens_charged, 17);
    assert_eq!(stats.output_tokens_charged, 6);
    assert_eq!(stats.output_tokens_refunded, 96);
    // The OpenAI windows are untouched.
    assert_eq!((stats.requests_charged, stats.tokens_charged), (0, 0));
    assert_eq!(
        (
            stats.limits.anthropic_rpm,
            stats.limits.itpm,
            stats.limits.otpm
        ),
        (Some(10), Some(600), Some(120))
    );
}

// proves: SIM-1 (Anthropic stream: message_start … message_stop with event: lines, usage in message_start and message_delta; WIRE-3)
#[tokio::test]
async fn a_stream_sends_anthropics_events() {
    let server = start(SimConfig {
        otpm: Some(1_000),
        ..config()
    })
    .await;
    let r = send(&server, &body("abcd", 50, true)).await;
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(header(&r, "content-type"), Some("text/event-stream"));
    assert_eq!(remaining(&r, "output-tokens"), Some("950"));
    let sse = read_typed_sse(r).await;
    assert!(!sse.truncated);
    let expected = [
        "message_start",
        "content_block_start",
        "ping",
        "content_block_delta",
        "content_block_delta",
        "content_block_delta",
        "content_block_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
    ];
    assert_eq!(sse.names, expected);
    for (name, data) in sse.names.iter().zip(&sse.data) {
        assert_eq!(data["type"], name.as_str());
    }
    let start = &sse.data[0]["message"];
    assert_eq!(start["type"], "message");
    assert_eq!(start["content"], json!([]));
    assert!(start["stop_reason"].is_null());
    // "abcd": 3 + 3 + 1 = 7.
    assert_eq!(
        start["usage"],
        json!({"input_tokens": 7, "output_tokens": 1})
    );
    assert_eq!(
        sse.data[1]["content_block"],
        json!({"type": "text", "text": ""})
    );
    let text: String = sse.data[3..7]
        .iter()
        .map(|d| {
            assert_eq!(d["delta"]["type"], "text_delta");
            d["delta"]["text"].as_str().expect("text")
        })
        .collect();
    assert_eq!(text, "the gate lets each");
    assert_eq!(sse.data[8]["delta"]["stop_reason"], "end_turn");
    assert_eq!(sse.data[8]["usage"]["output_tokens"], 4);

    wait_for_stats(&server, |s| s.active == 0).await;
    let stats = server.stats();
    assert_eq!(
        (stats.output_tokens_charged, stats.output_tokens_refunded),
        (4, 46)
    );
    assert_eq!(stats.client_disconnects, 0);
}

// proves: SIM-1 (Anthropic errors: 401 authentication_error, 400 invalid_request_error for bad JSON, no max_tokens or no anthropic-version; nothing charged)
#[tokio::test]
async fn bad_requests_get_anthropic_errors() {
    let server = start(config()).await;
    let good = body("hi", 10, false);
    for (headers, status, kind) in [
        (
            &[VERSION][..],
            StatusCode::UNAUTHORIZED,
            "authentication_error",
        ),
        (
            &[("x-api-key", "nope"), VERSION],
            StatusCode::UNAUTHORIZED,
            "authentication_error",
        ),
        (
            &[("authorization", "Bearer ant-secret"), VERSION],
            StatusCode::UNAUTHORIZED,
            "authentication_error",
        ),
        (&[KEY], StatusCode::BAD_REQUEST, "invalid_request_error"),
    ] {
        let r = post_with(&server, PATH, headers, &good).await;
        assert_eq!(r.status(), status, "{headers:?}");
        let error: Value = r.json().await.expect("json");
        assert_eq!(error["type"], "error");
        assert_eq!(error["error"]["type"], kind);
    }
    for (bad, needle) in [
        ("{nope", "JSON"),
        (
            r#"{"model":"m","messages":[{"role":"user","content":"hi"}]}"#,
            "max_tokens",
        ),
        (
            r#"{"model":"m","max_tokens":0,"messages":[{"role":"user","content":"hi"}]}"#,
            "max_tokens",
        ),
        (r#"{"model":"m","max_tokens":"many","messages":[]}"#, "JSON"),
        (
            r#"{"max_tokens":5,"messages":[{"role":"user","content":"hi"}]}"#,
            "model",
        ),
        (r#"{"model":"m","max_tokens":5}"#, "messages"),
        (r#"{"model":"m","max_tokens":5,"messages":[]}"#, "messages"),
        (
            r#"{"model":"m","max_tokens":5,"messages":[{"role":"system","content":"hi"}]}"#,
            "role",
        ),
        (
            r#"{"model":"m","max_tokens":5,"messages":[{"role":"user","content":3}]}"#,
            "content",
        ),
        (
            r#"{"model":"m","max_tokens":5,"messages":[{"role":"user","content":[{"text":"x"}]}]}"#,
            "content",
        ),
        (
            r#"{"model":"m","max_tokens":5,"system":7,"messages":[{"role":"user","content":"hi"}]}"#,
            "system",
        ),
    ] {
        let r = send(&server, bad).await;
        assert_eq!(r.status(), StatusCode::BAD_REQUEST, "{bad}");
        let error: Value = r.json().await.expect("json");
        assert_eq!(error["type"], "error", "{bad}");
        assert_eq!(error["error"]["type"], "invalid_request_error", "{bad}");
        let message = error["error"]["message"].as_str().expect("message");
        assert!(message.contains(needle), "{bad}: {message}");
    }
    let stats = server.stats();
    assert_eq!((stats.unauthorized, stats.bad_request), (3, 12));
    assert_eq!((stats.ok, stats.messages_charged), (0, 0));
}

// proves: SIM-2 (ITPM binds on its own: 429 rate_limit_error, cause itpm, exact retry-after, admitted at the instant; SIM-4 counts it)
#[tokio::test]
async fn the_input_token_bucket_binds_with_an_exact_hint() {
    let clock = ManualClock::new();
    let config = SimConfig {
        itpm: Some(60),
        ..config()
    };
    let server = start_with_clock(config, Arc::new(clock.clone())).await;
    // 200 characters: 50 + 3 + 3 = 56 input tokens.
    let big = body(&"a".repeat(200), 10, false);
    assert_eq!(send(&server, &big).await.status(), StatusCode::OK);
    let r = send(&server, &big).await;
    // 4 left, 56 needed, 1 per second back: 52 s.
    assert_refused(&r, "itpm", Some("52"));
    assert_eq!(remaining(&r, "input-tokens"), Some("4"));
    assert!((55..=58).contains(&reset_in(&r, "input-tokens")));
    assert_eq!(limit(&r, "output-tokens"), None);
    let error: Value = r.json().await.expect("json");
    assert_eq!(error["type"], "error");
    assert_eq!(error["error"]["type"], "rate_limit_error");
    assert!(
        error["error"]["message"]
            .as_str()
            .expect("message")
            .contains("input tokens per minute")
    );

    clock.advance(Duration::from_secs(52) - Duration::from_nanos(1));
    let r = send(&server, &big).await;
    assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(header(&r, "retry-after"), Some("1"));
    clock.advance(Duration::from_nanos(1));
    assert_eq!(send(&server, &big).await.status(), StatusCode::OK);

    // Larger than the whole bucket: never fits, no hint.
    let r = send(&server, &body(&"a".repeat(400), 10, false)).await;
    assert_refused(&r, "too_large", None);

    let stats = server.stats();
    let rejected = stats.rejected_429;
    assert_eq!(
        (rejected.itpm, rejected.otpm, rejected.anthropic_rpm),
        (2, 0, 0)
    );
    assert_eq!(rejected.too_large, 1);
    assert_eq!(rejected.total(), 3);
    assert_eq!(stats.input_tokens_charged, 112);
}

// proves: SIM-2 (OTPM binds on max_tokens reserved at admission; the unused allowance comes back when the response ends; cause otpm)
#[tokio::test]
async fn the_output_token_bucket_reserves_max_tokens_and_refunds_the_rest() {
    let clock = ManualClock::new();
    let config = SimConfig {
        otpm: Some(100),
        itpm: Some(10_000),
        per_token: Duration::from_millis(300),
        ..config()
    };
    let server = start_with_clock(config, Arc::new(clock.clone())).await;
    // A stream holds its whole allowance (60) while it runs.
    let stream = send(&server, &body("hi", 60, true)).await;
    assert_eq!(stream.status(), StatusCode::OK);
    assert_eq!(remaining(&stream, "output-tokens"), Some("40"));
    let r = send(&server, &body("hi", 60, false)).await;
    // 20 more needed at 100 per 60 s: 12 s.
    assert_refused(&r, "otpm", Some("12"));
    assert_eq!(remaining(&r, "output-tokens"), Some("40"));
    let error: Value = r.json().await.expect("json");
    assert!(
        error["error"]["message"]
            .as_str()
            .expect("message")
            .contains("output tokens per minute")
    );
    // The stream ends having generated 4: 56 come back, at once.
    assert!(!read_typed_sse(stream).await.truncated);
    wait_for_stats(&server, |s| s.active == 0).await;
    let r = send(&server, &body("hi", 60, false)).await;
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(remaining(&r, "output-tokens"), Some("36"));
    // After that one's refund: 92 left; 100 is refused, 8 short (4.8 s).
    let r = send(&server, &body("hi", 100, false)).await;
    assert_refused(&r, "otpm", Some("5"));
    assert_eq!(remaining(&r, "output-tokens"), Some("92"));

    let stats = server.stats();
    assert_eq!((stats.rejected_429.otpm, stats.rejected_429.itpm), (2, 0));
    assert_eq!(
        (stats.output_tokens_charged, stats.output_tokens_refunded),
        (8, 112)
    );
}

// proves: SIM-2 (the Anthropic request bucket is separate from the OpenAI RPM window; the concurrency cap is the account's)
#[tokio::test]
async fn the_request_bucket_is_separate_and_concurrency_shared() {
    let clock = ManualClock::new();
    let limited = SimConfig {
        anthropic_rpm: Some(2),
        rpm: Some(1),
        ..config()
    };
    let server = start_with_clock(limited, Arc::new(clock.clone())).await;
    let one = body("hi", 10, false);
    assert_eq!(send(&server, &one).await.status(), StatusCode::OK);
    assert_eq!(send(&server, &one).await.status(), StatusCode::OK);
    let r = send(&server, &one).await;
    // One request back every 30 s.
    assert_refused(&r, "anthropic_rpm", Some("30"));
    assert_eq!(remaining(&r, "requests"), Some("0"));
    // The OpenAI window of 1 request is still free.
    let r = post(&server, "/v1/chat/completions", &chat("hi", None)).await;
    assert_eq!(r.status(), StatusCode::OK);
    let stats = server.stats();
    assert_eq!(
        (stats.rejected_429.anthropic_rpm, stats.rejected_429.rpm),
        (1, 0)
    );

    let server = start(SimConfig {
        max_concurrency: Some(1),
        per_token: Duration::from_millis(300),
        ..config()
    })
    .await;
    let stream = send(&server, &body("hi", 10, true)).await;
    assert_eq!(stream.status(), StatusCode::OK);
    let r = send(&server, &body("hi", 10, false)).await;
    assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(header(&r, REJECT_CAUSE_HEADER), Some("concurrency"));
    let r = post(&server, "/v1/chat/completions", &chat("hi", None)).await;
    assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
    assert!(!read_typed_sse(stream).await.truncated);
    wait_for_stats(&server, |s| s.active == 0).await;
    assert_eq!(
        send(&server, &body("hi", 10, false)).await.status(),
        StatusCode::OK
    );
    let stats = server.stats();
    assert_eq!((stats.rejected_429.concurrency, stats.max_active), (2, 1));
}

// proves: SIM-2 (a Messages load at exactly the buckets' capacity and refill rate, over several periods, gets zero 429s)
#[tokio::test]
async fn a_load_under_the_limits_gets_no_429() {
    let clock = ManualClock::new();
    // Each request: 7 input tokens, 20 reserved, 4 generated (16 back).
    let config = SimConfig {
        anthropic_rpm: Some(5),
        itpm: Some(35),
        otpm: Some(100),
        ..config()
    };
    let server = start_with_clock(config, Arc::new(clock.clone())).await;
    for i in 0..25 {
        // A burst of the whole capacity, then one request per refill time
        // (12 s brings back one request and 7 input tokens).
        if i >= 5 {
            clock.advance(Duration::from_secs(12));
        }
        let r = send(&server, &body("hi", 20, i % 2 == 0)).await;
        assert_eq!(r.status(), StatusCode::OK, "request {i}");
        if i >= 4 {
            assert_eq!(remaining(&r, "requests"), Some("0"));
            assert_eq!(remaining(&r, "input-tokens"), Some("0"));
        }
        if i % 2 == 0 {
            assert!(!read_typed_sse(r).await.truncated);
        }
        wait_for_stats(&server, |s| s.active == 0).await;
    }
    // One more at the same instant is over: the buckets were exactly full.
    let r = send(&server, &body("hi", 20, false)).await;
    assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
    let stats = server.stats();
    assert_eq!(stats.rejected_429.total(), 1);
    assert_eq!(stats.messages_charged, 25);
    assert_eq!(
        (stats.input_tokens_charged, stats.output_tokens_charged),
        (175, 100)
    );
}

// proves: SIM-3 (Anthropic faults: injected 500 api_error / 529 overloaded_error not charged; a cut stream lacks message_stop and still settles)
#[tokio::test]
async fn faults_use_anthropics_errors_and_cut_streams_settle() {
    let server = start(SimConfig {
        error_rate: 1.0,
        itpm: Some(1_000),
        ..config()
    })
    .await;
    let mut seen = Vec::new();
    for _ in 0..8 {
        let r = send(&server, &body("hi", 10, false)).await;
        assert_eq!(remaining(&r, "input-tokens"), Some("1000"));
        let status = r.status().as_u16();
        let error: Value = r.json().await.expect("json");
        let kind = error["error"]["type"].as_str().expect("type").to_owned();
        assert!(matches!(
            (status, kind.as_str()),
            (500, "api_error") | (529, "overloaded_error")
        ));
        seen.push(status);
    }
    assert!(seen.contains(&500) && seen.contains(&529), "{seen:?}");
    let stats = server.stats();
    assert_eq!((stats.faults.server_error, stats.messages_charged), (8, 0));
    assert_eq!(stats.input_tokens_charged, 0);

    let server = start(SimConfig {
        disconnect_rate: 1.0,
        otpm: Some(1_000),
        ..config()
    })
    .await;
    let r = send(&server, &body("hi", 50, true)).await;
    let sse = read_typed_sse(r).await;
    assert!(sse.truncated);
    assert!(!sse.names.is_empty());
    assert!(!sse.names.iter().any(|n| n == "message_stop"));
    wait_for_stats(&server, |s| s.faults.disconnect == 1 && s.active == 0).await;
    let stats = server.stats();
    assert_eq!(
        (stats.output_tokens_charged, stats.output_tokens_refunded),
        (4, 46)
    );
}

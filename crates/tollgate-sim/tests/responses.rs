//! `POST /v1/responses` (the upstream shape of WIRE-1) over real sockets:
//! the one-shot object, the typed event stream, errors, and the same
//! limits, faults and latency as chat completions (SIM-1..4).

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::*;
use reqwest::StatusCode;
use serde_json::{Value, json};
use tollgate_sim::{ManualClock, SimConfig, SimServer};

const W: Duration = Duration::from_secs(60);

fn config(completion_tokens: u32) -> SimConfig {
    SimConfig {
        completion_tokens,
        ..SimConfig::default()
    }
}

async fn respond(server: &SimServer, body: &Value) -> reqwest::Response {
    post(server, "/v1/responses", body).await
}

fn request(input: Value, max_output_tokens: Option<u64>, stream: bool) -> Value {
    let mut body = json!({"model": "sim-chat", "input": input});
    if let Some(m) = max_output_tokens {
        body["max_output_tokens"] = json!(m);
    }
    if stream {
        body["stream"] = json!(true);
    }
    body
}

// proves: SIM-1 (Responses API one-shot: the object's shape, usage by the documented count; WIRE-1)
#[tokio::test]
async fn a_one_shot_response_has_the_responses_shape_and_usage() {
    let server = start(config(4)).await;
    // 13 chars -> 4 tokens, + 3 per item + 3 per prompt = 10.
    let r = respond(&server, &request(json!("Hello, world!"), None, false)).await;
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(header(&r, "x-request-id"), Some("req_sim_0"));
    let json: Value = r.json().await.expect("json");
    assert_eq!(json["object"], "response");
    assert_eq!(json["id"], "resp_sim_0");
    assert_eq!(json["status"], "completed");
    assert_eq!(json["model"], "sim-chat");
    assert!(json["incomplete_details"].is_null());
    let output = json["output"].as_array().expect("output");
    assert_eq!(output.len(), 1);
    assert_eq!(output[0]["type"], "message");
    assert_eq!(output[0]["role"], "assistant");
    assert_eq!(output[0]["content"][0]["type"], "output_text");
    assert_eq!(output[0]["content"][0]["text"], "the gate lets each");
    assert_eq!(json["usage"]["input_tokens"], 10);
    assert_eq!(json["usage"]["output_tokens"], 4);
    assert_eq!(json["usage"]["total_tokens"], 14);

    // Items with content parts and a string content, plus instructions:
    // 3 + (3 + "Be brief." 3) + (3 + "abcd" 1) + (3 + "abcdefgh" 2) = 18.
    let mut body = request(
        json!([
            {"role": "user", "content": [{"type": "input_text", "text": "abcd"}]},
            {"type": "message", "role": "assistant", "content": "abcdefgh"},
        ]),
        Some(2),
        false,
    );
    body["instructions"] = json!("Be brief.");
    let json: Value = respond(&server, &body).await.json().await.expect("json");
    assert_eq!(json["usage"]["input_tokens"], 18);
    assert_eq!(json["usage"]["output_tokens"], 2);
    assert_eq!(json["instructions"], "Be brief.");
    // Cut by max_output_tokens: incomplete, as OpenAI reports it.
    assert_eq!(json["status"], "incomplete");
    assert_eq!(json["incomplete_details"]["reason"], "max_output_tokens");
    assert_eq!(json["output"][0]["content"][0]["text"], "the gate");

    let stats = server.stats();
    assert_eq!(stats.routes.responses, 2);
    assert_eq!((stats.ok, stats.requests_total), (2, 2));
    assert_eq!(stats.tokens_charged, 14 + 20);
}

// proves: SIM-1 (Responses API stream: typed events, each data's `type` its event name, usage in response.completed; WIRE-1)
#[tokio::test]
async fn a_stream_sends_the_typed_events_with_usage_at_the_end() {
    let server = start(config(3)).await;
    let r = respond(&server, &request(json!("abcd"), None, true)).await;
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(header(&r, "content-type"), Some("text/event-stream"));
    let sse = read_typed_sse(r).await;
    assert!(!sse.truncated);
    let expected = [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.delta",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ];
    assert_eq!(sse.names, expected);
    for (i, (name, data)) in sse.names.iter().zip(&sse.data).enumerate() {
        assert_eq!(data["type"], name.as_str());
        assert_eq!(data["sequence_number"], i);
    }
    assert_eq!(sse.data[0]["response"]["status"], "in_progress");
    assert!(sse.data[0]["response"]["usage"].is_null());
    let text: String = sse.data[4..7]
        .iter()
        .map(|d| d["delta"].as_str().expect("delta"))
        .collect();
    assert_eq!(text, "the gate lets");
    assert_eq!(sse.data[7]["text"], "the gate lets");
    let done = &sse.data[10]["response"];
    assert_eq!(done["status"], "completed");
    assert_eq!(done["output"][0]["content"][0]["text"], "the gate lets");
    // "abcd": 3 + 3 + 1 = 7 input tokens.
    assert_eq!(done["usage"]["input_tokens"], 7);
    assert_eq!(done["usage"]["output_tokens"], 3);
    assert_eq!(done["usage"]["total_tokens"], 10);

    // Cut by max_output_tokens: the terminal event is response.incomplete.
    let r = respond(&server, &request(json!("abcd"), Some(1), true)).await;
    let sse = read_typed_sse(r).await;
    assert_eq!(sse.names.len(), 9);
    assert_eq!(
        sse.names.last().map(String::as_str),
        Some("response.incomplete")
    );
    let last = &sse.data[8]["response"];
    assert_eq!(last["status"], "incomplete");
    assert_eq!(last["usage"]["output_tokens"], 1);

    wait_for_stats(&server, |s| s.active == 0).await;
    let stats = server.stats();
    assert_eq!(stats.tokens_charged, 10 + 8);
    assert_eq!(stats.client_disconnects, 0);
}

// proves: SIM-1 (Responses API: malformed or invalid requests get OpenAI-format 400s, a missing key 401, nothing charged)
#[tokio::test]
async fn bad_requests_get_openai_errors_and_are_not_charged() {
    let server = start(SimConfig {
        require_key: Some("sk-sim".into()),
        ..config(4)
    })
    .await;
    let r = respond(&server, &request(json!("hi"), None, false)).await;
    assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
    let error: Value = r.json().await.expect("json");
    assert_eq!(error["error"]["code"], "invalid_api_key");

    let auth = [("authorization", "Bearer sk-sim")];
    for (body, param) in [
        ("{not json", Value::Null),
        (r#"{"model":"m"}"#, json!("input")),
        (r#"{"model":"m","input":5}"#, json!("input")),
        (r#"{"model":"m","input":[]}"#, json!("input")),
        (r#"{"model":"m","input":["hi"]}"#, json!("input")),
        (
            r#"{"model":"m","input":[{"role":"robot","content":"hi"}]}"#,
            json!("input"),
        ),
        (
            r#"{"model":"m","input":[{"role":"user","content":7}]}"#,
            json!("input"),
        ),
        (
            r#"{"model":"m","input":"hi","max_output_tokens":0}"#,
            json!("max_output_tokens"),
        ),
        (r#"{"input":"hi"}"#, json!("model")),
        (
            r#"{"model":"m","input":"hi","max_output_tokens":"x"}"#,
            Value::Null,
        ),
    ] {
        let r = post_with(&server, "/v1/responses", &auth, body).await;
        assert_eq!(r.status(), StatusCode::BAD_REQUEST, "{body}");
        let error: Value = r.json().await.expect("json");
        assert_eq!(error["error"]["type"], "invalid_request_error", "{body}");
        assert_eq!(error["error"]["param"], param, "{body}");
    }
    let stats = server.stats();
    assert_eq!((stats.bad_request, stats.unauthorized), (10, 1));
    assert_eq!((stats.ok, stats.requests_charged), (0, 0));
}

// proves: SIM-2 (Responses share chat's windows: the first request over RPM or TPM is refused with the exact hint and headers)
#[tokio::test]
async fn responses_are_limited_by_the_same_windows_as_chat() {
    let clock = ManualClock::new();
    let config = SimConfig {
        rpm: Some(3),
        tpm: Some(30),
        window: W,
        ..config(4)
    };
    let server = start_with_clock(config, Arc::new(clock.clone())).await;
    // "hi": 3 + 3 + 1 = 7 input + 4 output = 11 tokens each.
    let body = request(json!("hi"), None, false);
    let r = respond(&server, &body).await;
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(header(&r, "x-ratelimit-remaining-requests"), Some("2"));
    assert_eq!(header(&r, "x-ratelimit-remaining-tokens"), Some("19"));
    clock.advance(Duration::from_secs(10));
    // A chat request spends from the same windows (4 + 1 + 3 + 3 = 11).
    let r = post(&server, "/v1/chat/completions", &chat("hi", Some(4))).await;
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(header(&r, "x-ratelimit-remaining-tokens"), Some("8"));
    clock.advance(Duration::from_secs(10));
    // 22 + 11 > 30: refused on tokens; the first entry leaves at t = 60 s,
    // 40 s from now, and then 11 more fit.
    let r = respond(&server, &body).await;
    assert_refused(&r, "tpm", Some("40"));
    assert_eq!(header(&r, "retry-after-ms"), Some("40000"));
    assert_eq!(header(&r, "x-ratelimit-remaining-tokens"), Some("8"));
    let error: Value = r.json().await.expect("json");
    assert_eq!(error["error"]["code"], "rate_limit_exceeded");
    // A smaller one fits: 3 + 3 + 1 + 1 = 8 tokens, the third request.
    let r = respond(&server, &request(json!("hi"), Some(1), false)).await;
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(header(&r, "x-ratelimit-remaining-tokens"), Some("0"));
    let r = respond(&server, &request(json!("hi"), Some(1), true)).await;
    assert_refused(&r, "rpm", Some("40"));
    clock.advance(Duration::from_secs(40));
    let r = respond(&server, &request(json!("hi"), Some(1), true)).await;
    assert_eq!(r.status(), StatusCode::OK);
    assert!(!read_typed_sse(r).await.truncated);

    let stats = server.stats();
    assert_eq!((stats.rejected_429.tpm, stats.rejected_429.rpm), (1, 1));
    assert_eq!(stats.max_requests_in_window, 3);
    assert!(stats.max_tokens_in_window <= 30);
}

// proves: SIM-2 (a Responses load paced under RPM/TPM over several windows gets zero 429s)
#[tokio::test]
async fn a_load_under_the_limits_gets_no_429() {
    let clock = ManualClock::new();
    let config = SimConfig {
        rpm: Some(5),
        tpm: Some(55),
        window: W,
        ..config(4)
    };
    let server = start_with_clock(config, Arc::new(clock.clone())).await;
    for i in 0..20 {
        let r = respond(&server, &request(json!("hi"), None, i % 2 == 0)).await;
        assert_eq!(r.status(), StatusCode::OK, "request {i}");
        if i % 2 == 0 {
            assert!(!read_typed_sse(r).await.truncated);
        }
        clock.advance(W / 5);
    }
    wait_for_stats(&server, |s| s.active == 0).await;
    let stats = server.stats();
    assert_eq!(stats.rejected_429.total(), 0);
    assert_eq!(stats.max_requests_in_window, 5);
    assert_eq!(stats.max_tokens_in_window, 55);
    assert_eq!(stats.ok, 20);
}

// proves: SIM-3 (Responses: seeded 5xx and mid-stream cuts without the terminal event; latency before the first event and per token)
#[tokio::test]
async fn faults_and_latency_apply_to_responses() {
    let server = start(SimConfig {
        disconnect_rate: 1.0,
        ..config(4)
    })
    .await;
    let r = respond(&server, &request(json!("hi"), None, true)).await;
    assert_eq!(r.status(), StatusCode::OK);
    let sse = read_typed_sse(r).await;
    assert!(sse.truncated);
    assert!(!sse.names.is_empty() && sse.names.len() < 12);
    assert!(!sse.names.iter().any(|n| n == "response.completed"));
    wait_for_stats(&server, |s| s.faults.disconnect == 1 && s.active == 0).await;

    let server = start(SimConfig {
        error_rate: 1.0,
        ..config(4)
    })
    .await;
    let r = respond(&server, &request(json!("hi"), None, false)).await;
    assert!(matches!(r.status().as_u16(), 500 | 503));
    let error: Value = r.json().await.expect("json");
    assert_eq!(error["error"]["type"], "server_error");
    let stats = server.stats();
    assert_eq!((stats.faults.server_error, stats.requests_charged), (1, 0));

    let server = start(SimConfig {
        ttft: Duration::from_millis(100),
        per_token: Duration::from_millis(20),
        ..config(4)
    })
    .await;
    let started = tokio::time::Instant::now();
    let r = respond(&server, &request(json!("hi"), None, false)).await;
    assert_eq!(r.status(), StatusCode::OK);
    assert!(started.elapsed() >= Duration::from_millis(180));
    let started = tokio::time::Instant::now();
    let r = respond(&server, &request(json!("hi"), None, true)).await;
    assert_eq!(read_typed_sse(r).await.names.len(), 12);
    assert!(started.elapsed() >= Duration::from_millis(180));
}

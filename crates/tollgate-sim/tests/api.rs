//! SIM-1: the OpenAI-compatible surface — response and stream shapes,
//! usage, embeddings, models, auth and error bodies.

mod common;

use common::*;
use reqwest::StatusCode;
use serde_json::{Value, json};
use tollgate_sim::SimConfig;

fn config(completion_tokens: u32) -> SimConfig {
    SimConfig {
        completion_tokens,
        ..SimConfig::default()
    }
}

fn parse(event: &str) -> Value {
    serde_json::from_str(event).expect("chunk is JSON")
}

// proves: SIM-1
#[tokio::test]
async fn one_shot_usage_equals_the_charged_tokens() {
    let server = start(config(16)).await;
    // 13 chars -> 4 tokens, + 3 + 3 = 10 prompt tokens.
    let r = post(
        &server,
        "/v1/chat/completions",
        &chat("Hello, world!", None),
    )
    .await;
    assert_eq!(r.status(), StatusCode::OK);
    let json: Value = r.json().await.expect("json");
    assert_eq!(json["object"], "chat.completion");
    assert_eq!(json["model"], "sim-chat");
    assert_eq!(json["choices"][0]["message"]["role"], "assistant");
    assert_eq!(json["choices"][0]["finish_reason"], "stop");
    assert_eq!(
        json["usage"],
        json!({"prompt_tokens": 10, "completion_tokens": 16, "total_tokens": 26})
    );
    // max_tokens below the generated length: cut, finish_reason "length".
    let r = post(
        &server,
        "/v1/chat/completions",
        &chat("Hello, world!", Some(2)),
    )
    .await;
    let short: Value = r.json().await.expect("json");
    assert_eq!(short["choices"][0]["finish_reason"], "length");
    assert_eq!(short["choices"][0]["message"]["content"], "the gate");
    assert_eq!(short["usage"]["total_tokens"], 12);

    let stats = server.stats();
    assert_eq!(stats.tokens_charged, 26 + 12);
    assert_eq!(stats.requests_charged, 2);
    assert_eq!(stats.ok, 2);
    assert_eq!(stats.routes.chat_completions, 2);
}

// proves: SIM-1
#[tokio::test]
async fn a_stream_has_role_content_finish_usage_and_done() {
    let server = start(config(3)).await;
    let r = post(
        &server,
        "/v1/chat/completions",
        &chat_stream("abcd", None, true),
    )
    .await;
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(header(&r, "content-type"), Some("text/event-stream"));
    let sse = read_sse(r).await;
    assert!(!sse.truncated);
    // role, 3 content, finish, usage, [DONE]
    assert_eq!(sse.events.len(), 7, "{:?}", sse.events);
    assert_eq!(sse.events.last().map(String::as_str), Some("[DONE]"));

    let chunks: Vec<Value> = sse.events[..6].iter().map(|e| parse(e)).collect();
    for c in &chunks {
        assert_eq!(c["object"], "chat.completion.chunk");
        assert_eq!(c["id"], chunks[0]["id"]);
    }
    assert_eq!(
        chunks[0]["choices"][0]["delta"],
        json!({"role": "assistant", "content": ""})
    );
    let text: String = chunks[1..4]
        .iter()
        .map(|c| {
            c["choices"][0]["delta"]["content"]
                .as_str()
                .expect("content")
        })
        .collect();
    assert_eq!(text, "the gate lets");
    for c in &chunks[..4] {
        assert!(c["choices"][0]["finish_reason"].is_null());
    }
    assert_eq!(chunks[4]["choices"][0]["delta"], json!({}));
    assert_eq!(chunks[4]["choices"][0]["finish_reason"], "stop");
    // With include_usage every chunk carries `usage`: null until the last.
    for c in &chunks[..5] {
        assert!(c.get("usage").is_some_and(Value::is_null), "{c}");
    }
    assert_eq!(chunks[5]["choices"], json!([]));
    // "abcd": 1 + 3 + 3 = 7 prompt tokens.
    assert_eq!(
        chunks[5]["usage"],
        json!({"prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 10})
    );
    wait_for_stats(&server, |s| s.active == 0).await;
    let stats = server.stats();
    assert_eq!(stats.tokens_charged, 10);
    assert_eq!(stats.client_disconnects, 0);
}

// proves: SIM-1
#[tokio::test]
async fn a_stream_has_no_usage_chunk_unless_asked() {
    let server = start(config(2)).await;
    for body in [
        chat_stream("abcd", None, false),
        json!({"model": "m", "messages": [{"role": "user", "content": "abcd"}],
               "stream": true, "stream_options": {"include_usage": false}}),
    ] {
        let sse = read_sse(post(&server, "/v1/chat/completions", &body).await).await;
        // role, 2 content, finish, [DONE]
        assert_eq!(sse.events.len(), 5, "{:?}", sse.events);
        assert_eq!(sse.events[4], "[DONE]");
        for e in &sse.events[..4] {
            let c = parse(e);
            assert!(c.get("usage").is_none(), "{c}");
            assert_eq!(c["choices"].as_array().map(Vec::len), Some(1));
        }
        assert_eq!(parse(&sse.events[3])["choices"][0]["finish_reason"], "stop");
    }
}

// proves: SIM-1
#[tokio::test]
async fn embeddings_return_vectors_and_usage() {
    let server = start(SimConfig {
        embedding_dim: 4,
        ..SimConfig::default()
    })
    .await;
    let r = post(
        &server,
        "/v1/embeddings",
        &json!({"model": "sim-embedding", "input": ["abcdefgh", "abc"]}),
    )
    .await;
    assert_eq!(r.status(), StatusCode::OK);
    let json: Value = r.json().await.expect("json");
    assert_eq!(json["object"], "list");
    assert_eq!(json["data"][1]["index"], 1);
    assert_eq!(
        json["data"][0]["embedding"].as_array().map(Vec::len),
        Some(4)
    );
    assert_eq!(
        json["usage"],
        json!({"prompt_tokens": 3, "total_tokens": 3})
    );

    let r = post(
        &server,
        "/v1/embeddings",
        &json!({"model": "m", "input": "abc", "encoding_format": "base64", "dimensions": 3}),
    )
    .await;
    let json: Value = r.json().await.expect("json");
    // 3 f32 = 12 bytes = 16 base64 characters.
    assert_eq!(
        json["data"][0]["embedding"].as_str().map(str::len),
        Some(16)
    );
    assert_eq!(server.stats().tokens_charged, 4);
    assert_eq!(server.stats().routes.embeddings, 2);
}

// proves: SIM-1
#[tokio::test]
async fn models_are_listed_and_unknown_routes_are_openai_404s() {
    let server = start(SimConfig::default()).await;
    let json: Value = client()
        .get(server.url("/v1/models"))
        .send()
        .await
        .expect("sent")
        .json()
        .await
        .expect("json");
    let ids: Vec<&str> = json["data"]
        .as_array()
        .expect("list")
        .iter()
        .filter_map(|m| m["id"].as_str())
        .collect();
    assert_eq!(ids, ["sim-chat", "sim-embedding"]);

    let r = client()
        .get(server.url("/v1/nope"))
        .send()
        .await
        .expect("sent");
    assert_eq!(r.status(), StatusCode::NOT_FOUND);
    let json: Value = r.json().await.expect("json");
    assert_eq!(json["error"]["code"], "unknown_url");
    let stats = server.stats();
    assert_eq!((stats.routes.models, stats.routes.not_found), (1, 1));
    assert_eq!(stats.requests_total, 0);
}

// proves: SIM-1
#[tokio::test]
async fn bad_requests_get_openai_400s_and_are_not_charged() {
    let server = start(SimConfig::default()).await;
    let raw = client()
        .post(server.url("/v1/chat/completions"))
        .header("content-type", "application/json")
        .body("{not json")
        .send()
        .await
        .expect("sent");
    assert_eq!(raw.status(), StatusCode::BAD_REQUEST);
    let json: Value = raw.json().await.expect("json");
    assert_eq!(json["error"]["type"], "invalid_request_error");
    assert!(json["error"].get("code").is_some());

    let cases = [
        (
            json!({"messages": [{"role": "user", "content": "x"}]}),
            "model",
        ),
        (json!({"model": "m"}), "messages"),
        (json!({"model": "m", "messages": []}), "messages"),
        (
            json!({"model": "m", "messages": [{"role": "user", "content": "x"}], "max_tokens": 0}),
            "max_tokens",
        ),
        (
            json!({"model": "m", "messages": [{"role": "user", "content": "x"}], "n": 2}),
            "n",
        ),
    ];
    for (body, param) in cases {
        let r = post(&server, "/v1/chat/completions", &body).await;
        assert_eq!(r.status(), StatusCode::BAD_REQUEST, "{body}");
        let json: Value = r.json().await.expect("json");
        assert_eq!(json["error"]["param"], param, "{body}");
    }
    let r = post(
        &server,
        "/v1/embeddings",
        &json!({"model": "m", "input": []}),
    )
    .await;
    assert_eq!(r.status(), StatusCode::BAD_REQUEST);

    let stats = server.stats();
    assert_eq!(stats.bad_request, 7);
    assert_eq!(stats.requests_total, 7);
    assert_eq!((stats.requests_charged, stats.ok), (0, 0));
}

// proves: SIM-1
#[tokio::test]
async fn a_required_key_is_enforced_with_401() {
    let server = start(SimConfig {
        require_key: Some("sk-sim".into()),
        ..SimConfig::default()
    })
    .await;
    let url = server.url("/v1/chat/completions");
    let body = chat("hi", Some(1));
    let missing = client().post(&url).json(&body).send().await.expect("sent");
    assert_eq!(missing.status(), StatusCode::UNAUTHORIZED);
    let json: Value = missing.json().await.expect("json");
    assert_eq!(json["error"]["code"], "invalid_api_key");

    let wrong = client()
        .post(&url)
        .bearer_auth("sk-other")
        .json(&body)
        .send()
        .await
        .expect("sent");
    assert_eq!(wrong.status(), StatusCode::UNAUTHORIZED);
    let models = client()
        .get(server.url("/v1/models"))
        .send()
        .await
        .expect("sent");
    assert_eq!(models.status(), StatusCode::UNAUTHORIZED);

    let right = client()
        .post(&url)
        .bearer_auth("sk-sim")
        .json(&body)
        .send()
        .await
        .expect("sent");
    assert_eq!(right.status(), StatusCode::OK);

    // The harness routes need no key.
    let stats: Value = client()
        .get(server.url("/stats"))
        .send()
        .await
        .expect("sent")
        .json()
        .await
        .expect("json");
    assert_eq!(stats["unauthorized"], 3);
    assert_eq!(stats["ok"], 1);
    assert_eq!(stats["requests_charged"], 1);
}

//! End to end through real sockets: one-shot and streaming chat,
//! embeddings, and the informational routes.

mod common;

use std::time::Duration;

use common::upstream::{End, Reply, Scripted, chunk};
use common::*;
use serde_json::{Value, json};

/// One provider, a quota scope with both limits, a chat and an
/// embeddings model, tenants `a` and `b`.
fn config(base_url: &str) -> String {
    format!(
        r#"
[providers.sim]
base_url = "{base_url}"

[scopes.main]
rpm = 1000
tpm = 1000000

[models.chat]
provider = "sim"
upstream_model = "sim-chat"
scope = "main"
concurrency = 8

[models.emb]
provider = "sim"
upstream_model = "sim-embedding"
scope = "main"
kind = "embeddings"

{}
"#,
        tenants("", "")
    )
}

// proves: GW-1 (one-shot chat), GW-5 (usage reconciled), POOL-1 (permits back)
#[tokio::test]
async fn one_shot_chat_round_trip() {
    let sim = fast_sim().await;
    let gw = Gateway::start(&config(&sim.openai_base_url())).await;
    let client = client();

    let resp = post_chat(&client, &gw, Some(KEY_A), &chat("chat", false)).await;
    assert_eq!(resp.status(), 200);
    assert!(
        resp.headers()["content-type"]
            .to_str()
            .unwrap()
            .starts_with("application/json")
    );
    let body: Value = resp.json().await.unwrap();
    assert_eq!(body["object"], "chat.completion");
    assert_eq!(body["model"], "sim-chat", "the upstream model name is sent");
    let text = body["choices"][0]["message"]["content"].as_str().unwrap();
    assert!(!text.is_empty());
    let total = body["usage"]["total_tokens"].as_u64().unwrap();
    assert!(total > 0);

    let stats = sim.stats();
    assert_eq!((stats.requests_total, stats.ok), (1, 1));
    gw.wait_idle().await;
    // The reported usage settled the reservation (GW-5, Q-5).
    let main = gw.upstream_scope("main");
    assert_eq!(main.counters.admitted, 1);
    assert_eq!(main.counters.tokens_reported, total);
    assert_eq!(stats.tokens_charged, total);
}

// proves: GW-1 (streaming SSE), GW-5 (chunks forwarded as they arrive; the usage chunk the gateway asked for is stripped; usage reconciled), POOL-4
#[tokio::test]
async fn stream_chunks_are_forwarded_as_they_arrive() {
    const TOKENS: u32 = 40;
    let sim = slow_sim(Duration::from_millis(50), TOKENS).await;
    let gw = Gateway::start(&config(&sim.openai_base_url())).await;
    let client = client();

    let body = json!({
        "model": "chat",
        "messages": [{"role": "user", "content": "Count."}],
        "stream": true,
    });
    let mut resp = post_chat(&client, &gw, Some(KEY_A), &body).await;
    assert_eq!(resp.status(), 200);
    assert!(
        resp.headers()["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/event-stream")
    );
    // Read until one whole event is in.
    let mut first = String::new();
    while !first.contains("\n\n") {
        let bytes = bounded("first chunk", resp.chunk())
            .await
            .unwrap()
            .expect("the stream has a first chunk");
        first.push_str(&String::from_utf8_lossy(&bytes));
    }
    // The upstream is still producing: the first chunk was not buffered
    // until the end.
    let stats = sim.stats();
    assert_eq!(stats.active, 1, "upstream still streaming: {stats:?}");
    assert_eq!(gw.in_use("model:chat"), 1, "the stream holds its permit");

    let read = read_sse_from(resp.bytes_stream(), first).await;
    assert!(read.completed(), "{read:?}");
    // role chunk, one chunk per token, finish chunk, [DONE]; no usage chunk
    // since the client did not ask for one.
    assert_eq!(read.events.len(), TOKENS as usize + 3, "{:?}", read.events);
    for e in &read.events[..read.events.len() - 1] {
        let v: Value = serde_json::from_str(e).unwrap();
        assert_eq!(v["object"], "chat.completion.chunk");
        assert!(!v["choices"].as_array().unwrap().is_empty(), "{e}");
    }
    assert!(!read.text().is_empty());

    eventually("the simulator finished the stream", || {
        sim.stats().active == 0
    })
    .await;
    gw.wait_idle().await;
    // The gateway asked upstream for usage and settled with it.
    let stats = sim.stats();
    let main = gw.upstream_scope("main");
    assert_eq!(main.counters.tokens_reported, stats.tokens_charged);
    assert_eq!(stats.client_disconnects, 0);
}

// proves: GW-5 (the usage chunk reaches a client that asked for it)
#[tokio::test]
async fn stream_usage_chunk_kept_when_asked() {
    let sim = fast_sim().await;
    let gw = Gateway::start(&config(&sim.openai_base_url())).await;
    let body = json!({
        "model": "chat",
        "messages": [{"role": "user", "content": "Count."}],
        "stream": true,
        "stream_options": {"include_usage": true},
    });
    let resp = post_chat(&client(), &gw, Some(KEY_A), &body).await;
    assert_eq!(resp.status(), 200);
    let read = read_sse(resp).await;
    assert!(read.completed(), "{read:?}");
    let usage: Vec<Value> = read
        .events
        .iter()
        .filter_map(|e| serde_json::from_str::<Value>(e).ok())
        .filter(|v| v["choices"].as_array().is_some_and(Vec::is_empty))
        .collect();
    assert_eq!(usage.len(), 1, "{:?}", read.events);
    assert_eq!(
        usage[0]["usage"]["total_tokens"].as_u64(),
        Some(sim.stats().tokens_charged)
    );
    gw.wait_idle().await;
}

// proves: GW-1 (embeddings)
#[tokio::test]
async fn embeddings_round_trip() {
    let sim = fast_sim().await;
    let gw = Gateway::start(&config(&sim.openai_base_url())).await;
    let resp = client()
        .post(gw.url("/v1/embeddings"))
        .bearer_auth(KEY_B)
        .json(&json!({"model": "emb", "input": ["one", "two"]}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let body: Value = resp.json().await.unwrap();
    assert_eq!(body["data"].as_array().unwrap().len(), 2);
    assert_eq!(sim.stats().routes.embeddings, 1);
    // A chat model is not an embeddings model, and the other way round.
    let resp = client()
        .post(gw.url("/v1/embeddings"))
        .bearer_auth(KEY_B)
        .json(&json!({"model": "chat", "input": "x"}))
        .send()
        .await
        .unwrap();
    let (status, _, error) = error_of(resp).await;
    assert_eq!((status, code(&error)), (404, "model_not_found"));
    let resp = post_chat(&client(), &gw, Some(KEY_B), &chat("emb", false)).await;
    let (status, _, error) = error_of(resp).await;
    assert_eq!((status, code(&error)), (404, "model_not_found"));
    assert_eq!(sim.stats().requests_total, 1);
    gw.wait_idle().await;
}

// proves: GW-1 (`/v1/models` lists the configured models only), GW-2
#[tokio::test]
async fn models_lists_configured_models_only() {
    let sim = fast_sim().await;
    let gw = Gateway::start(&config(&sim.openai_base_url())).await;
    let resp = client()
        .get(gw.url("/v1/models"))
        .bearer_auth(KEY_A)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let body: Value = resp.json().await.unwrap();
    assert_eq!(body["object"], "list");
    let ids: Vec<&str> = body["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["chat", "emb"]);
    // Nothing was asked of the upstream's own list.
    assert_eq!(sim.stats().routes.models, 0);

    let resp = client().get(gw.url("/v1/models")).send().await.unwrap();
    assert_eq!(resp.status(), 401);
}

// proves: OBS-2 (Prometheus text with tollgate_ metrics and no keys), GW-8 (health and readiness)
#[tokio::test]
async fn health_readiness_and_metrics() {
    let sim = fast_sim().await;
    let gw = Gateway::start(&config(&sim.openai_base_url())).await;
    let client = client();

    let resp = client.get(gw.url("/healthz")).send().await.unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.json::<Value>().await.unwrap()["status"], "ok");
    let resp = client.get(gw.url("/readyz")).send().await.unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.json::<Value>().await.unwrap()["status"], "ready");

    // Some traffic, good and bad, so that the metrics have something.
    let resp = post_chat(&client, &gw, Some(KEY_A), &chat("chat", false)).await;
    assert_eq!(resp.status(), 200);
    let resp = post_chat(&client, &gw, Some("sk-not-a-key"), &chat("chat", false)).await;
    assert_eq!(resp.status(), 401);

    let resp = client.get(gw.url("/metrics")).send().await.unwrap();
    assert_eq!(resp.status(), 200);
    assert!(
        resp.headers()["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/plain")
    );
    let text = resp.text().await.unwrap();
    for name in [
        "tollgate_requests_total",
        "tollgate_calls_total",
        "tollgate_pool_in_use",
        "tollgate_quota_available",
        "tollgate_circuit_state",
        // The success path records through pre-registered handles (OBS-4).
        r#"tollgate_requests_total{route="chat",model="chat",status="200"}"#,
        r#"tollgate_upstream_latency_seconds_count{model="chat"}"#,
        r#"tollgate_quota_wait_seconds_count{model="chat"}"#,
        r#"tollgate_concurrency_wait_seconds_count{model="chat"}"#,
    ] {
        assert!(text.contains(name), "{name} missing from:\n{text}");
    }
    for secret in [
        KEY_A,
        KEY_B,
        "sk-not-a-key",
        &key_hash(KEY_A),
        &key_hash(KEY_B),
    ] {
        assert!(!text.contains(secret), "metrics leak {secret}");
    }
    // Every sample line is `name{labels} value` with a tollgate_ name.
    for line in text
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
    {
        assert!(line.starts_with("tollgate_"), "{line}");
    }
}

// proves: GW-2 (the upstream gets the gateway's key, never the client's)
#[tokio::test]
async fn client_key_is_never_forwarded() {
    let upstream = Scripted::start(vec![Reply::Stream {
        events: vec![chunk("hi")],
        end: End::Done,
    }])
    .await;
    let gw = Gateway::start(&format!(
        r#"
[providers.up]
base_url = "{}"
[models.chat]
provider = "up"
{}
"#,
        upstream.base_url,
        tenants("", "")
    ))
    .await;
    let resp = post_chat(&client(), &gw, Some(KEY_A), &chat("chat", true)).await;
    assert_eq!(resp.status(), 200);
    let read = read_sse(resp).await;
    assert!(read.completed(), "{read:?}");
    let seen = upstream.seen();
    assert_eq!(seen.len(), 1);
    // No api_key_env configured: no key at all, and certainly not the
    // client's.
    assert_eq!(seen[0].authorization, None);
    // The gateway asked for the usage chunk (GW-5).
    assert_eq!(seen[0].body["stream_options"]["include_usage"], true);
    gw.wait_idle().await;
}

// proves: GW-7 (a provider's one-shot body is bounded by its
// max_response_bytes: a larger one is a 502, not a body buffered without end)
#[tokio::test]
async fn oversized_upstream_bodies_are_a_502() {
    let sim = fast_sim().await;
    let gw = Gateway::start(&config(&sim.openai_base_url()).replacen(
        "[providers.sim]\n",
        "[providers.sim]\nmax_response_bytes = 64\n",
        1,
    ))
    .await;
    let resp = post_chat(&client(), &gw, Some(KEY_A), &chat("chat", false)).await;
    let (status, _, error) = error_of(resp).await;
    assert_eq!((status, code(&error)), (502, "upstream_error"), "{error}");
    assert_eq!(sim.stats().requests_total, 1, "not retried");
    gw.wait_idle().await;
}

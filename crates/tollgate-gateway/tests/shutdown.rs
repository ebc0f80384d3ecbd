//! Graceful shutdown (SPEC GW-8, LC-7).

mod common;

use std::time::Duration;

use common::*;
use serde_json::Value;

fn config(base_url: &str, grace: &str, a: &str) -> String {
    format!(
        r#"
[server]
shutdown_grace = "{grace}"

[providers.sim]
base_url = "{base_url}"

[models.chat]
provider = "sim"
upstream_model = "sim-chat"
concurrency = 4

{}
"#,
        tenants(a, "")
    )
}

/// A request on a fresh connection: refused (connection error) or 503.
async fn refused(gw: &Gateway) -> bool {
    let fresh = reqwest::Client::builder().no_proxy().build().unwrap();
    match fresh
        .post(gw.url("/v1/chat/completions"))
        .bearer_auth(KEY_A)
        .json(&chat("chat", false))
        .send()
        .await
    {
        Err(e) => e.is_connect(),
        Ok(resp) => resp.status() == 503,
    }
}

// proves: GW-8 (after the signal new requests are refused while the active stream completes normally within the grace period)
#[tokio::test]
async fn active_stream_finishes_after_the_signal() {
    let sim = slow_sim(Duration::from_millis(50), 30).await;
    let mut gw = Gateway::start(&config(&sim.openai_base_url(), "30s", "")).await;
    let client = client();
    let mut resp = post_chat(&client, &gw, Some(KEY_A), &chat("chat", true)).await;
    assert_eq!(resp.status(), 200);
    let first = bounded("first chunk", resp.chunk()).await.unwrap().unwrap();

    gw.begin_shutdown();
    eventually("shutdown began", || gw.app.is_shutting_down()).await;
    assert!(refused(&gw).await, "new requests are refused");

    let read = read_sse_from(resp.bytes_stream(), String::from_utf8_lossy(&first).into()).await;
    assert!(read.completed(), "the active stream completes: {read:?}");
    gw.stopped().await.expect("serve ends cleanly");
    let s = sim.stats();
    assert_eq!((s.requests_total, s.ok, s.client_disconnects), (1, 1, 0));
    assert!(gw.is_idle());
}

// proves: GW-8, LC-7 (queued calls are aborted with 503 on shutdown; the active one goes on)
#[tokio::test]
async fn queued_calls_get_503_on_shutdown() {
    let sim = slow_sim(Duration::from_millis(50), 30).await;
    let mut gw = Gateway::start(&config(
        &sim.openai_base_url(),
        "30s",
        "concurrency = 1\nmax_waiting = 4",
    ))
    .await;
    let client = client();
    let mut resp = post_chat(&client, &gw, Some(KEY_A), &chat("chat", true)).await;
    let first = bounded("first chunk", resp.chunk()).await.unwrap().unwrap();
    let queued = spawn_chat(&gw, KEY_A, chat("chat", false));
    eventually("a call waits for the tenant permit", || {
        gw.pool("tenant:a").waiting == 1
    })
    .await;

    gw.begin_shutdown();
    let answer = bounded("queued call answered", queued)
        .await
        .unwrap()
        .unwrap();
    let (status, _, error) = error_of(answer).await;
    assert_eq!((status, code(&error)), (503, "shutting_down"));

    let read = read_sse_from(resp.bytes_stream(), String::from_utf8_lossy(&first).into()).await;
    assert!(read.completed(), "{read:?}");
    gw.stopped().await.expect("serve ends cleanly");
    assert_eq!(sim.stats().requests_total, 1);
    assert!(gw.is_idle());
}

// proves: GW-8, LC-7 (a stream still running when the grace period ends is cancelled: an error event and an aborted body, the upstream request closed, every permit back)
#[tokio::test]
async fn grace_period_over_cancels_what_is_left() {
    let sim = slow_sim(Duration::from_millis(50), 400).await;
    let mut gw = Gateway::start(&config(&sim.openai_base_url(), "200ms", "")).await;
    let client = client();
    let mut resp = post_chat(&client, &gw, Some(KEY_A), &chat("chat", true)).await;
    let first = bounded("first chunk", resp.chunk()).await.unwrap().unwrap();

    gw.begin_shutdown();
    let read = read_sse_from(resp.bytes_stream(), String::from_utf8_lossy(&first).into()).await;
    assert!(read.end.is_err(), "not a normal end: {read:?}");
    assert!(!read.events.iter().any(|e| e == "[DONE]"));
    let errors = read.errors();
    assert_eq!(errors.len(), 1, "{read:?}");
    assert_eq!(errors[0]["error"]["code"], "shutting_down");
    gw.stopped().await.expect("serve ends");
    assert!(gw.is_idle());
    eventually("the upstream request was closed", || {
        sim.stats().client_disconnects == 1
    })
    .await;
}

// proves: GW-8 (once shutdown began: /readyz is 503, new calls get 503 shutting_down, /healthz stays up)
#[tokio::test]
async fn readiness_and_new_calls_after_shutdown_began() {
    let sim = fast_sim().await;
    let gw = Gateway::start(&config(&sim.openai_base_url(), "30s", "")).await;
    let client = client();
    // The state flips first in a shutdown; the listener here stays open so
    // that the answers can be seen.
    gw.app.begin_shutdown();
    let resp = client.get(gw.url("/readyz")).send().await.unwrap();
    assert_eq!(resp.status(), 503);
    assert_eq!(
        resp.json::<Value>().await.unwrap()["status"],
        "shutting_down"
    );
    let resp = client.get(gw.url("/healthz")).send().await.unwrap();
    assert_eq!(resp.status(), 200);
    let resp = post_chat(&client, &gw, Some(KEY_A), &chat("chat", false)).await;
    let (status, _, error) = error_of(resp).await;
    assert_eq!((status, code(&error)), (503, "shutting_down"));
    let resp = client
        .post(gw.url("/v1/embeddings"))
        .bearer_auth(KEY_A)
        .json(&serde_json::json!({"model": "chat", "input": "x"}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 503);
    assert_eq!(sim.stats().requests_total, 0);
}

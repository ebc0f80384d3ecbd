//! A client that goes away cancels its upstream work and returns every
//! permit (SPEC GW-6, LC-5, DL-7).

mod common;

use std::time::Duration;

use common::*;
use tollgate_sim::SimConfig;

fn config(base_url: &str, a: &str) -> String {
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
concurrency = 4

{}
"#,
        tenants(a, "")
    )
}

// proves: GW-6, LC-5, POOL-4 (a client leaving mid-stream closes the upstream connection and the gateway returns to zero)
#[tokio::test]
async fn client_disconnect_mid_stream_cancels_upstream() {
    let sim = slow_sim(Duration::from_millis(50), 100).await;
    let gw = Gateway::start(&config(&sim.openai_base_url(), "concurrency = 2")).await;
    let client = client();
    let mut resp = post_chat(&client, &gw, Some(KEY_A), &chat("chat", true)).await;
    assert_eq!(resp.status(), 200);
    bounded("first chunk", resp.chunk()).await.unwrap().unwrap();
    assert_eq!(gw.in_use("tenant:a"), 1);
    assert_eq!(gw.in_use("model:chat"), 1);
    assert_eq!(sim.stats().active, 1);

    // The client goes away (its connection is closed, not reused).
    drop(resp);
    drop(client);

    eventually("the simulator saw the upstream connection close", || {
        let s = sim.stats();
        s.client_disconnects == 1 && s.active == 0
    })
    .await;
    gw.wait_idle().await;
    let s = sim.stats();
    assert_eq!(s.requests_total, 1);
    assert_eq!(s.faults.disconnect, 0);
    let metrics = reqwest::get(gw.url("/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(metrics.contains("terminal=\"cancelled\""), "{metrics}");
}

// proves: GW-6, DL-7 (a client leaving while its one-shot call is upstream cancels that request and frees its permits)
#[tokio::test]
async fn client_disconnect_during_one_shot_cancels_upstream() {
    let sim = sim(SimConfig {
        ttft: Duration::from_secs(30),
        ..SimConfig::default()
    })
    .await;
    let gw = Gateway::start(&config(&sim.openai_base_url(), "concurrency = 2")).await;
    let call = spawn_chat(&gw, KEY_A, chat("chat", false));
    eventually("the call is upstream", || sim.stats().active == 1).await;
    assert_eq!(gw.in_use("model:chat"), 1);
    call.abort();
    eventually("the upstream request was cancelled", || {
        let s = sim.stats();
        s.client_disconnects == 1 && s.active == 0
    })
    .await;
    gw.wait_idle().await;
}

// proves: GW-6, POOL-3 (a client leaving while its call waits for a tenant permit leaves the waiting line)
#[tokio::test]
async fn client_disconnect_while_waiting_leaves_the_queue() {
    let sim = slow_sim(Duration::from_millis(50), 100).await;
    let gw = Gateway::start(&config(
        &sim.openai_base_url(),
        "concurrency = 1\nmax_waiting = 4",
    ))
    .await;
    let client = client();
    let mut held = post_chat(&client, &gw, Some(KEY_A), &chat("chat", true)).await;
    bounded("first chunk", held.chunk()).await.unwrap().unwrap();
    let waiting = spawn_chat(&gw, KEY_A, chat("chat", false));
    eventually("a call waits for the tenant permit", || {
        gw.pool("tenant:a").waiting == 1
    })
    .await;
    waiting.abort();
    eventually("the waiting call left", || gw.pool("tenant:a").waiting == 0).await;
    assert_eq!(gw.in_use("tenant:a"), 1, "the stream keeps its permit");
    drop(held);
    gw.wait_idle().await;
    assert_eq!(sim.stats().requests_total, 1);
}

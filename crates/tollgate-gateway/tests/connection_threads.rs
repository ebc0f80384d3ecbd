//! `server.connection_threads`: connections served on threads of their own,
//! each a single-threaded runtime. The same promises hold as on the
//! work-stealing runtime: every call answered, permits back, a client that
//! leaves mid-stream frees its permits, a graceful shutdown lets the active
//! stream finish.

mod common;

use std::time::Duration;

use common::*;

fn config(base_url: &str) -> String {
    format!(
        r#"
[server]
connection_threads = 2

[providers.sim]
base_url = "{base_url}"

[scopes.main]
rpm = 10000

[models.chat]
provider = "sim"
upstream_model = "sim-chat"
scope = "main"
concurrency = 8

{}
"#,
        tenants("", "")
    )
}

// proves: GW-1, POOL-1 (on connection threads every call, one-shot and
// streamed, is answered and every permit comes back), GW-6 (a client that
// leaves mid-stream frees its permits), GW-8 (the active stream finishes
// after the shutdown signal, then serve returns)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connection_threads_keep_every_promise() {
    let sim = slow_sim(Duration::from_millis(5), 10).await;
    let mut gw = Gateway::start(&config(&sim.openai_base_url())).await;

    let mut calls = Vec::new();
    for i in 0..24 {
        let (gw_url, stream) = (gw.url("/v1/chat/completions"), i % 2 == 0);
        calls.push(tokio::spawn(async move {
            let resp = client()
                .post(gw_url)
                .bearer_auth(KEY_A)
                .json(&chat("chat", stream))
                .send()
                .await
                .expect("answered");
            assert_eq!(resp.status(), 200);
            if stream {
                assert!(read_sse(resp).await.completed());
            } else {
                let body: serde_json::Value = resp.json().await.expect("json");
                assert_eq!(body["object"], "chat.completion");
            }
        }));
    }
    for call in calls {
        call.await.expect("call");
    }
    gw.wait_idle().await;

    // A client that reads one chunk and leaves.
    let mut resp = post_chat(&client(), &gw, Some(KEY_A), &chat("chat", true)).await;
    bounded("first chunk", resp.chunk())
        .await
        .expect("chunk")
        .expect("a first chunk");
    drop(resp);
    gw.wait_idle().await;

    // Shutdown with a stream in progress.
    let mut resp = post_chat(&client(), &gw, Some(KEY_A), &chat("chat", true)).await;
    let first = bounded("first chunk", resp.chunk())
        .await
        .expect("chunk")
        .expect("a first chunk");
    gw.begin_shutdown();
    let read = read_sse_from(
        resp.bytes_stream(),
        String::from_utf8_lossy(&first).into_owned(),
    )
    .await;
    assert!(read.completed(), "the active stream completes: {read:?}");
    gw.stopped().await.expect("serve ends cleanly");
    assert!(gw.is_idle());
    assert_eq!(sim.stats().rejected_429.total(), 0);
}

//! Large requests are counted off the async workers (SPEC GW-17): their
//! estimate is the same as if counted inline, and many of them at once,
//! some abandoned by their clients mid-count, lose nothing and leave the
//! gateway idle.

mod common;

use std::time::Duration;

use common::*;
use serde_json::{Value, json};
use tollgate_gateway::counting::OFF_WORKER_BYTES;
use tollgate_openai::wire::ChatCompletionRequest;

/// A chat body of about `bytes` bytes of prose and one long run of
/// letters (the tokenizer's slowest input).
fn large_chat(model: &str, bytes: usize, seed: usize) -> Value {
    let words = ["tollgate ", "admits ", "every ", "call ", "in ", "order. "];
    let mut prose = String::with_capacity(bytes);
    let mut i = seed;
    while prose.len() < bytes / 2 {
        i = i.wrapping_mul(31).wrapping_add(7);
        prose.push_str(words[i % words.len()]);
    }
    let run: String = (0..bytes / 2)
        .map(|k| char::from(b'a' + ((k * 7 + seed) % 26) as u8))
        .collect();
    json!({
        "model": model,
        "messages": [
            {"role": "system", "content": prose},
            {"role": "user", "content": run},
        ],
        "max_tokens": 16,
    })
}

fn config(base_url: &str) -> String {
    format!(
        "[server]\nmax_body_bytes = 4194304\nlog_format = \"json\"\n{}",
        two_models(base_url, "", "")
    )
}

// proves: GW-17 (a body over the off-worker size is estimated exactly as
// the deployment's estimator counts it inline: the tenant reserves the
// same tokens, whichever thread counted them)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_body_is_estimated_as_if_counted_inline() {
    let sim = fast_sim().await;
    let gw = Gateway::start(&config(&sim.openai_base_url())).await;
    let lines = gw.app.access_log.capture();
    let body = large_chat("chat", 3 * OFF_WORKER_BYTES, 1);
    assert!(serde_json::to_vec(&body).unwrap().len() >= OFF_WORKER_BYTES);
    let r = post_chat(&client(), &gw, Some(KEY_A), &body).await;
    assert_eq!(r.status(), 200, "{:?}", r.text().await);
    gw.wait_idle().await;
    eventually("the access line", || lines.lock().len() == 1).await;
    let line: Value = serde_json::from_str(&lines.lock()[0]).unwrap();
    let request: ChatCompletionRequest = serde_json::from_value(body).unwrap();
    let inline = gw.app.models["chat"].deployments[0]
        .estimator
        .chat(&request)
        .total();
    assert!(inline > 3 * OFF_WORKER_BYTES as u64 / 8, "{inline}");
    assert_eq!(line["tokens_estimated"].as_u64(), Some(inline));
}

// proves: GW-17 (many large requests from two tenants at once, more than
// the counting lane runs together, beside small ones, and a third of the
// large ones abandoned by their clients while being counted: every
// request that stays is answered 200, nothing is left reserved, and the
// gateway is idle at the end). Real threads, real clock.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn large_requests_at_once_lose_nothing() {
    let sim = fast_sim().await;
    let gw = Gateway::start(&config(&sim.openai_base_url())).await;
    let client = client();
    let mut kept = Vec::new();
    let mut abandoned = Vec::new();
    for i in 0..12 {
        let key = if i % 2 == 0 { KEY_A } else { KEY_B };
        let model = if i % 2 == 0 { "chat" } else { "other" };
        let body = large_chat(model, 2 * OFF_WORKER_BYTES, i);
        let request = client
            .post(gw.url("/v1/chat/completions"))
            .bearer_auth(key)
            .json(&body);
        let call = tokio::spawn(async move { request.send().await.map(|r| r.status()) });
        if i % 3 == 2 {
            abandoned.push(call);
        } else {
            kept.push(call);
        }
    }
    let small: Vec<_> = (0..8)
        .map(|i| {
            let client = client.clone();
            let key = if i % 2 == 0 { KEY_B } else { KEY_A };
            let request = client
                .post(gw.url("/v1/chat/completions"))
                .bearer_auth(key)
                .json(&chat("chat", false));
            tokio::spawn(async move { request.send().await.map(|r| r.status()) })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(20)).await;
    for call in &abandoned {
        call.abort();
    }
    for call in kept.into_iter().chain(small) {
        let status = bounded("a request answered", call)
            .await
            .expect("the request task")
            .expect("an answer");
        assert_eq!(status, 200);
    }
    gw.wait_idle().await;
    // Once the abandoned counts end, the lane serves again.
    let r = post_chat(
        &client,
        &gw,
        Some(KEY_A),
        &large_chat("chat", OFF_WORKER_BYTES, 99),
    )
    .await;
    assert_eq!(r.status(), 200);
    gw.wait_idle().await;
}

//! The first minute with the built-in default (SPEC GW-9), as a new user
//! meets it: `tollgate serve` without a configuration, its demo tenant
//! and its simulated account, called the way an SDK user would (a burst
//! of concurrent calls, like `asyncio.gather` with the OpenAI SDK).

mod common;

use std::collections::BTreeMap;

use common::*;
use serde_json::json;
use tokio::task::JoinSet;
use tollgate_gateway::config::GatewayConfig;
use tollgate_gateway::server::ServeOptions;
use tollgate_gateway::{DEMO_KEY, embedded_sim_config};

/// The built-in default in front of its simulator, both in this process.
async fn built_in() -> (tollgate_sim::SimServer, Gateway) {
    let sim = sim(embedded_sim_config()).await;
    let config = GatewayConfig::embedded(&sim.openai_base_url(), DEMO_KEY);
    let gw = Gateway::start_config(&config, ServeOptions::from_config(&config.server)).await;
    (sim, gw)
}

// proves: GW-9 (the built-in demo tenant queues a burst of 300 concurrent
// calls within their deadline instead of refusing them: every one is
// answered 200, none 429, and the simulated account draws no 429 either),
// GW-13 (the demo tenant, without limits of its own, is told the account's)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_of_300_calls_waits_instead_of_being_refused() {
    let (sim, gw) = built_in().await;
    let client = client();
    let body = json!({
        "model": "sim-chat",
        "messages": [{"role": "user", "content": "Say hello."}],
    });
    let mut calls = JoinSet::new();
    for _ in 0..300 {
        let request = client
            .post(gw.url("/v1/chat/completions"))
            .bearer_auth(DEMO_KEY)
            .json(&body);
        calls.spawn(async move {
            let r = request.send().await.expect("the call is answered");
            let status = r.status().as_u16();
            let code = if status == 200 {
                String::new()
            } else {
                let (_, _, error) = error_of(r).await;
                code(&error).to_owned()
            };
            (status, code)
        });
    }
    let answers = bounded("the burst is answered", calls.join_all()).await;
    let mut by_answer: BTreeMap<(u16, String), usize> = BTreeMap::new();
    for a in answers {
        *by_answer.entry(a).or_default() += 1;
    }
    assert_eq!(
        by_answer,
        BTreeMap::from([((200, String::new()), 300)]),
        "every call of the burst succeeds"
    );
    assert_eq!(sim.stats().rejected_429.total(), 0);
    gw.wait_idle().await;

    // The demo tenant has no quota of its own: its answers tell the
    // simulated account's budget (SPEC GW-13), which the burst spent.
    let r = client
        .post(gw.url("/v1/chat/completions"))
        .bearer_auth(DEMO_KEY)
        .json(&body)
        .send()
        .await
        .expect("answered");
    assert_eq!(r.status(), 200);
    assert_eq!(number(&r, "x-ratelimit-limit-requests"), 600);
    // Every call of the burst and this one were counted (and what the
    // simulator's own headers said it had counted beyond that, SPEC Q-14).
    let remaining = number(&r, "x-ratelimit-remaining-requests");
    assert!(
        remaining <= 600 - 301,
        "{remaining} left; {:?}",
        sim.stats()
    );
    assert_eq!(number(&r, "x-ratelimit-limit-tokens"), 60_000);
    assert!(number(&r, "x-ratelimit-remaining-tokens") < 60_000);
}

//! Tenant pools and model pools (SPEC POOL-1..POOL-4) seen from outside.

mod common;

use std::time::Duration;

use common::*;
use serde_json::json;
use tollgate_sim::faults::FaultPlan;
use tollgate_sim::{SimConfig, SimServer};

fn provider(base_url: &str) -> String {
    format!("[providers.sim]\nbase_url = \"{base_url}\"\n")
}

/// A gateway in front of `sim` whose model `chat` has a pool of
/// `concurrency` permits and `max_waiting` places in line; tenants a and b
/// without limits of their own.
async fn model_pool_gateway(sim: &SimServer, concurrency: usize, max_waiting: usize) -> Gateway {
    Gateway::start(&format!(
        "{}\n[models.chat]\nprovider = \"sim\"\nupstream_model = \"sim-chat\"\n\
         concurrency = {concurrency}\nmax_waiting = {max_waiting}\n\n{}",
        provider(&sim.openai_base_url()),
        tenants("", "")
    ))
    .await
}

/// A short one-shot request (two completion tokens).
fn short(model: &str) -> serde_json::Value {
    json!({
        "model": model,
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 2,
    })
}

// proves: POOL-1, POOL-2, POOL-3, POOL-4 (tenant a saturating its pool blocks neither tenant b nor anyone else; a stream holds its tenant permit for its whole life)
#[tokio::test]
async fn full_tenant_pool_does_not_block_another_tenant() {
    let sim = slow_sim(Duration::from_millis(50), 40).await;
    let gw = Gateway::start(&format!(
        r#"
{}
[models.chat]
provider = "sim"
upstream_model = "sim-chat"
concurrency = 8

{}
"#,
        provider(&sim.openai_base_url()),
        tenants(
            "concurrency = 1\nmax_waiting = 0",
            "concurrency = 1\nmax_waiting = 0"
        )
    ))
    .await;
    let client = client();

    // Tenant a's only permit is taken by a long stream.
    let mut held = post_chat(&client, &gw, Some(KEY_A), &chat("chat", true)).await;
    assert_eq!(held.status(), 200);
    let first = bounded("first chunk", held.chunk()).await.unwrap().unwrap();
    assert_eq!(gw.in_use("tenant:a"), 1);

    // a is refused at once ...
    let resp = post_chat(&client, &gw, Some(KEY_A), &short("chat")).await;
    let (status, _, error) = error_of(resp).await;
    assert_eq!((status, code(&error)), (429, "admission_rejected"));

    // ... while b is served, with a's stream still running.
    let resp = post_chat(&client, &gw, Some(KEY_B), &short("chat")).await;
    assert_eq!(resp.status(), 200);
    resp.bytes().await.unwrap();
    assert_eq!(
        gw.in_use("tenant:a"),
        1,
        "a's stream still holds its permit"
    );
    assert_eq!(
        sim.stats().active,
        1,
        "a's stream is still running upstream"
    );

    let read = read_sse_from(held.bytes_stream(), String::from_utf8_lossy(&first).into()).await;
    assert!(read.completed(), "{read:?}");
    gw.wait_idle().await;
}

// proves: POOL-1, POOL-3 (a model pool caps attempts across tenants; extra calls wait FIFO instead of failing)
#[tokio::test]
async fn model_pool_caps_attempts_across_tenants() {
    let sim = sim(SimConfig {
        ttft: Duration::from_millis(300),
        ..SimConfig::default()
    })
    .await;
    let gw = model_pool_gateway(&sim, 2, 16).await;
    let mut calls = Vec::new();
    for i in 0..6 {
        let key = if i % 2 == 0 { KEY_A } else { KEY_B };
        calls.push(spawn_chat(&gw, key, short("chat")));
    }
    // The pool fills up and the rest wait for it.
    eventually("two in flight and the others waiting", || {
        let p = gw.pool("model:chat");
        p.available == 0 && p.waiting > 0
    })
    .await;
    for call in calls {
        let resp = bounded("call", call).await.unwrap().unwrap();
        assert_eq!(resp.status(), 200);
    }
    let stats = sim.stats();
    assert_eq!(stats.ok, 6);
    assert_eq!(stats.max_active, 2, "the model pool caps the upstream");
    gw.wait_idle().await;
}

// proves: FAIR-10, POOL-3, FAIR-6 (a model pool's full waiting line is
// shared between tenants: tenant a's backlog fills it, yet b's first call
// waits for its turn instead of a 429, and a's last waiting call is
// refused in its place; the line never holds more than max_waiting)
#[tokio::test]
async fn a_full_model_pool_line_takes_another_tenants_first_call() {
    let sim = slow_sim(Duration::from_millis(50), 40).await;
    let gw = model_pool_gateway(&sim, 1, 2).await;
    let client = client();
    // a's stream holds the model's only permit.
    let mut held = post_chat(&client, &gw, Some(KEY_A), &chat("chat", true)).await;
    assert_eq!(held.status(), 200);
    let first = bounded("first chunk", held.chunk()).await.unwrap().unwrap();
    // Two more of a's calls fill the waiting line, one after the other.
    let a1 = spawn_chat(&gw, KEY_A, short("chat"));
    eventually("a's first call waiting", || {
        gw.pool("model:chat").waiting == 1
    })
    .await;
    let a2 = spawn_chat(&gw, KEY_A, short("chat"));
    eventually("a's second call waiting", || {
        gw.pool("model:chat").waiting == 2
    })
    .await;
    // b's first call takes a2's place.
    let b1 = spawn_chat(&gw, KEY_B, short("chat"));
    let refused = bounded("a's last call refused", a2).await.unwrap().unwrap();
    let (status, _, error) = error_of(refused).await;
    assert_eq!((status, code(&error)), (429, "admission_rejected"));
    assert!(
        error.to_string().contains("waiting for capacity"),
        "{error}"
    );
    assert_eq!(gw.pool("model:chat").waiting, 2, "a1 and b1 wait");
    // The stream ends; a1 and b1 are served in turn.
    let read = read_sse_from(held.bytes_stream(), String::from_utf8_lossy(&first).into()).await;
    assert!(read.completed(), "{read:?}");
    for call in [a1, b1] {
        let resp = bounded("call", call).await.unwrap().unwrap();
        assert_eq!(resp.status(), 200);
        resp.bytes().await.unwrap();
    }
    assert_eq!(
        sim.stats().ok,
        3,
        "the stream, a1 and b1; a2 never went upstream"
    );
    gw.wait_idle().await;
}

// proves: FAIR-10, POOL-3, DL-4, GW-16 (hostile waiters in a full model
// pool line: a's calls with tiny deadlines fill the line and run out of
// time there, each answered with a deadline error at once; their places
// come back, so b's call then waits in line and is served, and the pool
// ends with nobody waiting and nothing held)
#[tokio::test]
async fn tiny_deadlines_in_a_full_pool_line_give_their_places_back() {
    let sim = slow_sim(Duration::from_millis(50), 20).await;
    let gw = model_pool_gateway(&sim, 1, 2).await;
    let client = client();
    let mut held = post_chat(&client, &gw, Some(KEY_A), &chat("chat", true)).await;
    assert_eq!(held.status(), 200);
    let first = bounded("first chunk", held.chunk()).await.unwrap().unwrap();
    let hasty: Vec<_> = (0..2)
        .map(|_| {
            let (client, url) = (client.clone(), gw.url("/v1/chat/completions"));
            tokio::spawn(async move {
                client
                    .post(url)
                    .bearer_auth(KEY_A)
                    .header("x-request-timeout", "0.2")
                    .json(&short("chat"))
                    .send()
                    .await
            })
        })
        .collect();
    for call in hasty {
        let resp = bounded("a hasty call", call).await.unwrap().unwrap();
        let (status, _, error) = error_of(resp).await;
        assert!(code(&error).contains("deadline"), "{status} {error}");
    }
    assert_eq!(gw.pool("model:chat").waiting, 0, "their places came back");
    let b = spawn_chat(&gw, KEY_B, short("chat"));
    eventually("b waiting in line", || gw.pool("model:chat").waiting == 1).await;
    let read = read_sse_from(held.bytes_stream(), String::from_utf8_lossy(&first).into()).await;
    assert!(read.completed(), "{read:?}");
    let resp = bounded("b", b).await.unwrap().unwrap();
    assert_eq!(resp.status(), 200);
    resp.bytes().await.unwrap();
    gw.wait_idle().await;
    let pool = gw.pool("model:chat");
    assert_eq!((pool.waiting, pool.available), (0, pool.limit));
}

/// A simulator seed whose first request fails with a 5xx and whose next
/// ones succeed (faults are a pure function of seed and sequence number).
fn seed_failing_first(config: &SimConfig) -> u64 {
    (0..10_000)
        .find(|&seed| {
            let c = SimConfig {
                seed,
                ..config.clone()
            };
            FaultPlan::draw(&c, 0, 0).server_error.is_some()
                && (1..4).all(|seq| FaultPlan::draw(&c, seq, 0).server_error.is_none())
        })
        .expect("some seed fails only the first request")
}

// proves: POOL-1 (the model permit is per attempt: released during the backoff, taken again by the retry; the tenant permit is held across the retry), RT-1
#[tokio::test]
async fn retry_reacquires_the_model_permit() {
    let mut config = SimConfig {
        error_rate: 0.5,
        ..SimConfig::default()
    };
    config.seed = seed_failing_first(&config);
    let sim = sim(config).await;
    // A model pool of one with no waiting room: if the failed attempt kept
    // its permit, the retry would be refused.
    let gw = Gateway::start(&format!(
        r#"
{}
[retry]
max_attempts = 3
base_delay = "1s"
factor = 1.0
max_delay = "1s"
jitter = 0.0

[models.chat]
provider = "sim"
upstream_model = "sim-chat"
concurrency = 1
max_waiting = 0

{}
"#,
        provider(&sim.openai_base_url()),
        tenants("concurrency = 1\nmax_waiting = 0", "")
    ))
    .await;
    let call = spawn_chat(&gw, KEY_A, short("chat"));
    // During the backoff: the first attempt failed, the model permit is
    // back, the tenant permit is still held.
    eventually("the backoff after the failed attempt", || {
        sim.stats().faults.server_error == 1
            && sim.stats().requests_total == 1
            && gw.in_use("model:chat") == 0
            && gw.in_use("tenant:a") == 1
    })
    .await;
    let resp = bounded("the retried call", call).await.unwrap().unwrap();
    let status = resp.status();
    let body = resp.text().await.unwrap();
    assert_eq!(status, 200, "{body}");
    let stats = sim.stats();
    assert_eq!((stats.requests_total, stats.ok), (2, 1));
    // One admission per attempt upstream, one per call for the tenant.
    assert_eq!(gw.upstream_scope("model:chat").counters.admitted, 2);
    assert_eq!(gw.tenant_scope("tenant:a").counters.admitted, 1);
    gw.wait_idle().await;
}

// proves: POOL-2 (unauthenticated traffic, when allowed, shares one anonymous pool; an authenticated tenant is not part of it), GW-2 (an unknown key is still 401)
#[tokio::test]
async fn anonymous_callers_share_one_pool() {
    let sim = slow_sim(Duration::from_millis(50), 40).await;
    let gw = Gateway::start(&format!(
        r#"
{}
[models.chat]
provider = "sim"
upstream_model = "sim-chat"

[anonymous]
enabled = true
concurrency = 1
max_waiting = 0

{}
"#,
        provider(&sim.openai_base_url()),
        tenants("", "")
    ))
    .await;
    let client = client();
    let mut held = post_chat(&client, &gw, None, &chat("chat", true)).await;
    assert_eq!(held.status(), 200);
    bounded("first chunk", held.chunk()).await.unwrap().unwrap();
    assert_eq!(gw.in_use("tenant:anonymous"), 1);
    // Another caller without a key: same pool.
    let resp = post_chat(&client, &gw, None, &short("chat")).await;
    let (status, _, error) = error_of(resp).await;
    assert_eq!((status, code(&error)), (429, "admission_rejected"));
    // A presented but unknown key is refused, not served as anonymous.
    let resp = post_chat(&client, &gw, Some("sk-unknown"), &short("chat")).await;
    let (status, _, _) = error_of(resp).await;
    assert_eq!(status, 401);
    // A known key is its own tenant.
    let resp = post_chat(&client, &gw, Some(KEY_A), &short("chat")).await;
    assert_eq!(resp.status(), 200);
    resp.bytes().await.unwrap();
    drop(held);
    gw.wait_idle().await;
}

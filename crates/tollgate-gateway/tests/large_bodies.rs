//! Large requests are counted off the async workers (SPEC GW-17): their
//! estimate is the same as if counted inline, and many of them at once,
//! some abandoned by their clients mid-count, lose nothing and leave the
//! gateway idle. (That a count off the worker lets the worker's other
//! connections go on is proved in `counting/mod.rs`; its effect on latency is
//! measured by `benches/gateway/large_prompts.sh`.)

mod common;

use std::time::Duration;

use common::*;
use serde_json::{Value, json};
use tollgate_gateway::counting::{OFF_WORKER_BYTES, PARSE_OFF_WORKER_BYTES};
use tollgate_openai::wire::ChatCompletionRequest;
use tollgate_sim::SimServer;

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

/// Models `gpt-4o` and `gpt-4o-mini` (counted by the `o200k_base`
/// tokenizer: their names pick it) on the simulator; tenants `a` and `b`;
/// `server`: extra `[server]` settings.
fn config(base_url: &str, server: &str) -> String {
    format!(
        r#"
[server]
max_body_bytes = 4194304
log_format = "json"
{server}

[providers.sim]
base_url = "{base_url}"

[models.gpt-4o]
provider = "sim"
upstream_model = "sim-chat"

[models.gpt-4o-mini]
provider = "sim"
upstream_model = "sim-chat"

{}
"#,
        tenants("", "")
    )
}

// proves: GW-17 (a body over the off-worker sizes is parsed and estimated
// exactly as the deployment's estimator counts it inline: the tenant
// reserves the same tokens, whichever thread counted them)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_body_is_estimated_as_if_counted_inline() {
    let sim = fast_sim().await;
    let gw = Gateway::start(&config(&sim.openai_base_url(), "")).await;
    let lines = gw.app.access_log.capture();
    let body = large_chat("gpt-4o", 8 * OFF_WORKER_BYTES, 1);
    // Parsed and counted off the workers, both.
    assert!(serde_json::to_vec(&body).unwrap().len() >= PARSE_OFF_WORKER_BYTES);
    let r = post_chat(&client(), &gw, Some(KEY_A), &body).await;
    assert_eq!(r.status(), 200, "{:?}", r.text().await);
    gw.wait_idle().await;
    eventually("the access line", || lines.lock().len() == 1).await;
    let line: Value = serde_json::from_str(&lines.lock()[0]).unwrap();
    let request: ChatCompletionRequest = serde_json::from_value(body).unwrap();
    let inline = gw.app.models["gpt-4o"].deployments[0]
        .estimator
        .chat(&request)
        .total();
    // The tokenizer counted it: a run of letters is far more tokens than
    // the characters / 4 of the character rule.
    assert!(inline > 8 * OFF_WORKER_BYTES as u64 / 4 + 5_000, "{inline}");
    assert_eq!(line["tokens_estimated"].as_u64(), Some(inline));
}

// proves: GW-17 (many large requests from two tenants at once, more than
// the counting lane runs together, beside small ones, and a third of the
// large ones abandoned by their clients while waiting for or in their
// count: every request that stays is answered 200, nothing is left
// reserved, and the gateway is idle at the end). Real threads, real clock.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn large_requests_at_once_lose_nothing() {
    large_requests_at_once("").await;
}

// proves: GW-17 (the same with connections served on connection threads,
// each a single-threaded runtime with its own blocking pool, sharing one
// lane)
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn large_requests_at_once_on_connection_threads() {
    large_requests_at_once("connection_threads = 2").await;
}

async fn large_requests_at_once(server: &str) {
    let sim = fast_sim().await;
    let gw = Gateway::start(&config(&sim.openai_base_url(), server)).await;
    let client = client();
    let mut kept = Vec::new();
    let mut abandoned = Vec::new();
    for i in 0..12 {
        let key = if i % 2 == 0 { KEY_A } else { KEY_B };
        let model = if i % 2 == 0 { "gpt-4o" } else { "gpt-4o-mini" };
        let body = large_chat(model, 4 * OFF_WORKER_BYTES, i);
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
            let key = if i % 2 == 0 { KEY_B } else { KEY_A };
            let request = client
                .post(gw.url("/v1/chat/completions"))
                .bearer_auth(key)
                .json(&chat("gpt-4o", false));
            tokio::spawn(async move { request.send().await.map(|r| r.status()) })
        })
        .collect();
    // Twelve counts of about 6 ms each (64 KiB, half of it one run of
    // letters) queue on a lane of one or a few: some are still waiting
    // or counting when their clients leave.
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
        &large_chat("gpt-4o", OFF_WORKER_BYTES, 99),
    )
    .await;
    assert_eq!(r.status(), 200);
    gw.wait_idle().await;
}

// proves: GW-17 (a large prompt with a tiny deadline costs only its
// sender: it is answered with a deadline error, nothing is admitted or
// sent upstream, and the lane's place it held comes back for the next
// large prompt)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_prompt_with_a_tiny_deadline_takes_nothing() {
    let sim = fast_sim().await;
    let gw = Gateway::start(&config(&sim.openai_base_url(), "")).await;
    let client = client();
    for _ in 0..3 {
        let r = client
            .post(gw.url("/v1/chat/completions"))
            .bearer_auth(KEY_A)
            .header("x-request-timeout", "0.001")
            .json(&large_chat("gpt-4o", 64 * OFF_WORKER_BYTES, 3))
            .send()
            .await
            .expect("an answer");
        // The deadline ends it while the body arrives (408) or while it
        // is counted (504): either way before admission.
        let status = r.status().as_u16();
        let body: Value = r.json().await.expect("an error body");
        let code = body["error"]["code"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        assert!(
            (status, code.as_str()) == (504, "deadline_exceeded")
                || (status, code.as_str()) == (408, "request_timeout"),
            "{status} {body}"
        );
    }
    nothing_upstream_and_the_lane_serves(&gw, &sim, OFF_WORKER_BYTES).await;
}

// proves: GW-17 (a large body that is not valid JSON, parsed off the async
// workers, gets the same located 400 as a small one, sends nothing
// upstream, and leaves the lane free)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_body_that_is_not_json_is_refused() {
    let sim = fast_sim().await;
    let gw = Gateway::start(&config(&sim.openai_base_url(), "")).await;
    let client = client();
    let mut text = serde_json::to_string(&large_chat("gpt-4o", PARSE_OFF_WORKER_BYTES, 5)).unwrap();
    assert!(text.len() >= PARSE_OFF_WORKER_BYTES);
    text.truncate(text.len() - 3);
    let r = client
        .post(gw.url("/v1/chat/completions"))
        .bearer_auth(KEY_A)
        .header("content-type", "application/json")
        .body(text)
        .send()
        .await
        .expect("an answer");
    assert_eq!(r.status(), 400);
    let body: Value = r.json().await.expect("an error body");
    assert_eq!(body["error"]["code"], "invalid_body", "{body}");
    let message = body["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("line 1 column"), "located: {message}");
    nothing_upstream_and_the_lane_serves(&gw, &sim, PARSE_OFF_WORKER_BYTES).await;
}

/// Once the gateway is idle: nothing went upstream, and a large prompt of
/// about `bytes` is served (the lane is free again).
async fn nothing_upstream_and_the_lane_serves(gw: &Gateway, sim: &SimServer, bytes: usize) {
    gw.wait_idle().await;
    assert_eq!(sim.stats().requests_total, 0, "nothing went upstream");
    let r = post_chat(&client(), gw, Some(KEY_A), &large_chat("gpt-4o", bytes, 4)).await;
    assert_eq!(r.status(), 200, "the lane serves again");
    gw.wait_idle().await;
}

/// The key of tenant `c`, whose prompts wait for admission below.
const KEY_C: &str = "sk-test-tenant-c-0003";
/// The key of tenant `m`, whose jobs are counted below: a tenant of its
/// own, so that its metric series (the recorder is the process's) are
/// that test's alone.
const KEY_M: &str = "sk-test-tenant-m-0004";

/// [`config`] plus tenant `name` with key `key` and `extra` settings.
fn config_with(base_url: &str, name: &str, key: &str, extra: &str) -> String {
    format!(
        "{}\n[tenants.{name}]\nkeys_sha256 = [\"{}\"]\n{extra}\n",
        config(base_url, ""),
        key_hash(key)
    )
}

/// Tenant `m`'s jobs of kind `job` on the counting lane, from `/metrics`.
async fn lane_jobs(gw: &Gateway, job: &str) -> u64 {
    tenant_lane_jobs(gw, "m", job).await
}

/// Tenant `tenant`'s jobs of kind `job` on the counting lane.
async fn tenant_lane_jobs(gw: &Gateway, tenant: &str, job: &str) -> u64 {
    let text = metrics_text(gw).await;
    text.lines()
        .find(|l| {
            l.starts_with("tollgate_large_body_jobs_total{")
                && l.contains(&format!("tenant=\"{tenant}\""))
                && l.contains(&format!("job=\"{job}\""))
        })
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
        .unwrap_or(0)
}

// proves: GW-17 (where each request's work runs: a body of 128 KiB or more
// is parsed and then counted on the lane, off the async workers; a
// smaller one whose count is large enough only counted there; a small one
// neither; the metric of the jobs says so, per tenant)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_bodies_are_parsed_and_counted_on_the_lane() {
    let sim = fast_sim().await;
    let gw = Gateway::start(&config_with(&sim.openai_base_url(), "m", KEY_M, "")).await;
    let client = client();
    let r = post_chat(&client, &gw, Some(KEY_M), &chat("gpt-4o", false)).await;
    assert_eq!(r.status(), 200);
    assert_eq!(
        (lane_jobs(&gw, "parse").await, lane_jobs(&gw, "count").await),
        (0, 0)
    );
    let counted_only = large_chat("gpt-4o", 4 * OFF_WORKER_BYTES, 7);
    assert!(serde_json::to_vec(&counted_only).unwrap().len() < PARSE_OFF_WORKER_BYTES);
    let r = post_chat(&client, &gw, Some(KEY_M), &counted_only).await;
    assert_eq!(r.status(), 200);
    assert_eq!(
        (lane_jobs(&gw, "parse").await, lane_jobs(&gw, "count").await),
        (0, 1)
    );
    let r = post_chat(
        &client,
        &gw,
        Some(KEY_M),
        &large_chat("gpt-4o", PARSE_OFF_WORKER_BYTES, 8),
    )
    .await;
    assert_eq!(r.status(), 200);
    assert_eq!(
        (lane_jobs(&gw, "parse").await, lane_jobs(&gw, "count").await),
        (1, 2)
    );
    gw.wait_idle().await;
}

/// The key of tenant `r`, whose prompts go to a model counted by a
/// `chars` rule below (a tenant of its own for its metric series).
const KEY_R: &str = "sk-test-tenant-r-0005";

// proves: GW-17, Q-16 (a `chars` accounting rule counts characters, in
// microseconds even for a large prompt: its count does not go to the lane,
// while the same prompt to a model counted by the tokenizer does)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chars_rule_counts_large_prompts_on_the_worker() {
    let sim = fast_sim().await;
    let by_chars = format!(
        "[providers.sim-chars]\nbase_url = \"{}\"\naccounting = {{ chars_per_token = 4 }}\n\n\
         [models.gpt-4o-chars]\nprovider = \"sim-chars\"\nupstream_model = \"sim-chat\"\n",
        sim.openai_base_url()
    );
    let gw = Gateway::start(&format!(
        "{}\n{by_chars}",
        config_with(&sim.openai_base_url(), "r", KEY_R, "")
    ))
    .await;
    let cases = [("gpt-4o-chars", 0), ("gpt-4o", 1)];
    counts_on_the_lane(&gw, ("r", KEY_R), &cases, |model| {
        large_chat(model, 4 * OFF_WORKER_BYTES, 9)
    })
    .await;
}

/// Posts `body(model)` as `tenant` (its name and key) for each `(model,
/// counted)` in turn: each is answered 200, no body was parsed on the
/// lane, and the tenant's counts on the lane so far are `counted`.
async fn counts_on_the_lane(
    gw: &Gateway,
    (tenant, key): (&str, &str),
    cases: &[(&str, u64)],
    body: impl Fn(&str) -> Value,
) {
    let client = client();
    for &(model, counted) in cases {
        let r = post_chat(&client, gw, Some(key), &body(model)).await;
        assert_eq!(r.status(), 200, "{model}");
        let jobs = (
            tenant_lane_jobs(gw, tenant, "parse").await,
            tenant_lane_jobs(gw, tenant, "count").await,
        );
        assert_eq!(jobs, (0, counted), "{model}");
    }
    gw.wait_idle().await;
}

/// The key of tenant `f`, whose prompts go to fallback chains below.
const KEY_F: &str = "sk-test-tenant-f-0006";

// proves: GW-17, GW-10 (a fallback chain whose models differ only in their
// `default_max_tokens` counts the prompt's text once: a prompt of 10 KiB,
// over the lane's size only if counted twice, is counted on the worker;
// a chain whose providers count input differently counts it twice, on
// the lane)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chain_differing_only_in_output_allowance_counts_once() {
    let sim = fast_sim().await;
    let base = sim.openai_base_url();
    let chains = format!(
        "[models.gpt-4o-long]\nprovider = \"sim\"\nupstream_model = \"sim-chat\"\n\
         default_max_tokens = 300\nfallbacks = [\"gpt-4o-short\"]\n\n\
         [models.gpt-4o-short]\nprovider = \"sim\"\nupstream_model = \"sim-chat\"\n\
         default_max_tokens = 100\n\n\
         [providers.sim-tokenizer]\nbase_url = \"{base}\"\naccounting = \"tokenizer\"\n\n\
         [models.gpt-4o-two-ways]\nprovider = \"sim\"\nupstream_model = \"sim-chat\"\n\
         fallbacks = [\"gpt-4o-by-tokenizer\"]\n\n\
         [models.gpt-4o-by-tokenizer]\nprovider = \"sim-tokenizer\"\nupstream_model = \"sim-chat\"\n"
    );
    let gw = Gateway::start(&format!("{}\n{chains}", config_with(&base, "f", KEY_F, ""))).await;
    let bytes = 10 * 1024;
    assert!(bytes < OFF_WORKER_BYTES && 2 * bytes >= OFF_WORKER_BYTES);
    let cases = [("gpt-4o-long", 0), ("gpt-4o-two-ways", 1)];
    counts_on_the_lane(&gw, ("f", KEY_F), &cases, |model| {
        let mut body = large_chat(model, bytes, 10);
        body.as_object_mut().unwrap().remove("max_tokens");
        body
    })
    .await;
}

// proves: GW-17 (a large prompt waiting for admission holds no place of
// the counting lane: with more of tenant c's large prompts waiting for
// its one concurrency permit than the lane has places, another tenant's
// large prompt is still parsed, counted and answered)
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_large_prompt_waiting_for_admission_holds_no_lane_place() {
    // Each completion token takes 20 ms: the holder's 3,000 take a minute.
    let sim = slow_sim(Duration::from_millis(20), 3_000).await;
    let gw = Gateway::start(&config_with(
        &sim.openai_base_url(),
        "c",
        KEY_C,
        "concurrency = 1",
    ))
    .await;
    let client = client();
    let send = |key: &'static str, body: Value| {
        let request = client
            .post(gw.url("/v1/chat/completions"))
            .bearer_auth(key)
            .header("x-request-timeout", "120")
            .json(&body);
        tokio::spawn(async move { request.send().await.map(|r| r.status()) })
    };
    let holder = send(
        KEY_C,
        json!({"model": "gpt-4o", "max_tokens": 3000,
        "messages": [{"role": "user", "content": "hold"}]}),
    );
    eventually("the holder holds tenant c's permit", || {
        gw.in_use("tenant:c") == 1
    })
    .await;
    let places = std::thread::available_parallelism().map_or(1, |n| (n.get() / 2).max(1));
    let waiting: Vec<_> = (0..=places)
        .map(|i| send(KEY_C, large_chat("gpt-4o", PARSE_OFF_WORKER_BYTES, 10 + i)))
        .collect();
    eventually("tenant c's large prompts wait for admission", || {
        gw.pool("tenant:c").waiting == places + 1
    })
    .await;
    let other = send(KEY_A, large_chat("gpt-4o", PARSE_OFF_WORKER_BYTES, 20));
    let status = bounded("the other tenant's large prompt", other)
        .await
        .expect("the request task")
        .expect("an answer");
    assert_eq!(status, 200);
    holder.abort();
    for call in waiting {
        call.abort();
    }
    gw.wait_idle().await;
}

// proves: GW-17 (slow uploads of large bodies hold no place of the
// counting lane: with more of them stalled halfway than the lane has
// places, another tenant's large prompt is parsed, counted and answered;
// then the stalled uploads finish and each is answered 200, nothing lost)
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn stalled_uploads_of_large_bodies_hold_no_lane_place() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let sim = fast_sim().await;
    let gw = Gateway::start(&config(&sim.openai_base_url(), "")).await;
    let places = std::thread::available_parallelism().map_or(1, |n| (n.get() / 2).max(1));
    let mut stalled = Vec::new();
    for i in 0..=places {
        let body =
            serde_json::to_vec(&large_chat("gpt-4o", PARSE_OFF_WORKER_BYTES, 30 + i)).unwrap();
        let mut tcp = tokio::net::TcpStream::connect(gw.addr())
            .await
            .expect("connect");
        let head = format!(
            "POST /v1/chat/completions HTTP/1.1\r\nhost: gateway\r\nauthorization: Bearer {KEY_B}\r\n\
             content-type: application/json\r\ncontent-length: {}\r\nx-request-timeout: 60\r\n\r\n",
            body.len()
        );
        tcp.write_all(head.as_bytes()).await.expect("head");
        let half = body.len() / 2;
        tcp.write_all(&body[..half])
            .await
            .expect("half of the body");
        stalled.push((tcp, body, half));
    }
    let r = post_chat(
        &client(),
        &gw,
        Some(KEY_A),
        &large_chat("gpt-4o", PARSE_OFF_WORKER_BYTES, 40),
    )
    .await;
    assert_eq!(r.status(), 200, "served beside the stalled uploads");
    for (mut tcp, body, half) in stalled {
        tcp.write_all(&body[half..])
            .await
            .expect("the rest of the body");
        let mut status = [0u8; 12];
        bounded("a stalled upload's answer", tcp.read_exact(&mut status))
            .await
            .expect("a status line");
        assert_eq!(
            &status,
            b"HTTP/1.1 200",
            "{}",
            String::from_utf8_lossy(&status)
        );
    }
    gw.wait_idle().await;
}

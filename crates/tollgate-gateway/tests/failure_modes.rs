//! Failure modes seen in other gateways, each pinned down by a test.

mod common;

use std::time::Duration;

use common::upstream::{End, Reply, Scripted, chunk};
use common::*;
use tollgate::quota::LimitSnapshot;

/// What a rejected request could have spent: every limit's availability
/// and the admission counters of a scope.
fn spendable(
    scope: &tollgate::admission::ScopeSnapshot,
) -> (Vec<(String, i64)>, u64, u64, usize, usize) {
    let limits = scope
        .limits
        .iter()
        .map(|l: &LimitSnapshot| (l.dimension.as_str().to_owned(), l.available))
        .collect();
    (
        limits,
        scope.counters.admitted,
        scope.counters.tokens_reserved,
        scope.queued,
        scope.pending,
    )
}

/// The available amount of a scope's token limit.
fn tokens_available(scope: &tollgate::admission::ScopeSnapshot) -> i64 {
    scope
        .limits
        .iter()
        .find(|l| l.dimension.as_str() == "tokens")
        .map(|l| l.available)
        .expect("a token limit")
}

fn config(base_url: &str, model: &str, a: &str, b: &str) -> String {
    format!(
        r#"
[providers.sim]
base_url = "{base_url}"

[scopes.main]
rpm = 100
tpm = 100000

[models.chat]
provider = "sim"
upstream_model = "sim-chat"
scope = "main"
{model}

{}
"#,
        tenants(a, b)
    )
}

// proves: GW-4, Q-9, POOL-3 (a request refused by the tenant pool spends nothing: no upstream RPM/TPM, no model permit, no tenant quota)
#[tokio::test]
async fn tenant_pool_rejection_spends_no_other_limit() {
    let sim = slow_sim(Duration::from_millis(50), 60).await;
    let gw = Gateway::start(&config(
        &sim.openai_base_url(),
        "concurrency = 4\nmax_waiting = 4",
        "concurrency = 1\nmax_waiting = 0\nrpm = 50\ntpm = 50000",
        "",
    ))
    .await;
    let held = hold_stream(&gw, KEY_A).await;
    let upstream = spendable(&gw.upstream_scope("main"));
    let tenant = spendable(&gw.tenant_scope("tenant:a"));
    let model_pool = gw.pool("model:chat");
    assert_eq!(upstream.1, 1, "the held stream was admitted upstream");

    for _ in 0..5 {
        let resp = post_chat(&client(), &gw, Some(KEY_A), &chat("chat", false)).await;
        let (status, _, error) = error_of(resp).await;
        assert_eq!((status, code(&error)), (429, "admission_rejected"));
    }
    assert_eq!(spendable(&gw.upstream_scope("main")), upstream);
    assert_eq!(spendable(&gw.tenant_scope("tenant:a")), tenant);
    assert_eq!(gw.pool("model:chat"), model_pool);
    assert_eq!(sim.stats().requests_total, 1);
    drop(held);
    gw.wait_idle().await;
}

// proves: GW-4, Q-9, ADM-2 (a request refused by the model pool spends no upstream RPM/TPM)
#[tokio::test]
async fn model_pool_rejection_spends_no_upstream_quota() {
    let sim = slow_sim(Duration::from_millis(50), 60).await;
    let gw = Gateway::start(&config(
        &sim.openai_base_url(),
        "concurrency = 1\nmax_waiting = 0",
        "",
        "rpm = 50\ntpm = 50000",
    ))
    .await;
    let held = hold_stream(&gw, KEY_A).await;
    let upstream = spendable(&gw.upstream_scope("main"));
    let tenant_tokens = tokens_available(&gw.tenant_scope("tenant:b"));

    for _ in 0..3 {
        let resp = post_chat(&client(), &gw, Some(KEY_B), &chat("chat", false)).await;
        let (status, _, error) = error_of(resp).await;
        assert_eq!((status, code(&error)), (429, "admission_rejected"));
    }
    assert_eq!(spendable(&gw.upstream_scope("main")), upstream);
    // Nothing was sent, so no tokens were used: tenant b's token budget
    // is whole again.
    assert_eq!(
        tokens_available(&gw.tenant_scope("tenant:b")),
        tenant_tokens
    );
    assert_eq!(sim.stats().requests_total, 1);
    drop(held);
    gw.wait_idle().await;
}

/// One model on the scripted upstream; retries with small base delays;
/// cooldowns capped at 100 ms so that they never hide the retry delay.
fn scripted_config(base_url: &str, retry_max_wait: &str) -> String {
    format!(
        r#"
[retry]
max_attempts = 5
base_delay = "10ms"
factor = 1.0
max_delay = "10ms"
jitter = 0.0
max_wait = "{retry_max_wait}"

[cooldown]
base = "50ms"
max = "100ms"

[providers.up]
base_url = "{base_url}"

[models.chat]
provider = "up"

{}
"#,
        tenants("", "")
    )
}

// proves: RT-3, RT-4 (the latest attempt's retry-after decides: a later, longer hint than max_wait ends the call at once with that hint, although the first hint was short)
#[tokio::test]
async fn latest_retry_after_decides_whether_to_wait() {
    let upstream = Scripted::start(vec![
        Reply::too_many("retry-after", "1"),
        Reply::too_many("retry-after", "5"),
        Reply::ok(),
    ])
    .await;
    let gw = Gateway::start(&scripted_config(&upstream.base_url, "1500ms")).await;
    let resp = post_chat(&client(), &gw, Some(KEY_A), &chat("chat", false)).await;
    let (status, retry_after, error) = error_of(resp).await;
    assert_eq!((status, code(&error)), (429, "upstream_rate_limited"));
    // Retried after the first hint (1 s ≤ max_wait), gave up on the second
    // (5 s > max_wait) without a third attempt, passing that hint on.
    assert_eq!(upstream.attempts(), 2);
    assert_eq!(retry_after.as_deref(), Some("5"));
    gw.wait_idle().await;
}

// proves: RT-3 (each delay is floored by the hint of the attempt just before it, not the first one)
#[tokio::test]
async fn latest_retry_after_sets_the_next_delay() {
    let upstream = Scripted::start(vec![
        Reply::too_many("retry-after-ms", "200"),
        Reply::too_many("retry-after-ms", "800"),
        Reply::ok(),
    ])
    .await;
    let gw = Gateway::start(&scripted_config(&upstream.base_url, "30s")).await;
    let resp = post_chat(&client(), &gw, Some(KEY_A), &chat("chat", false)).await;
    assert_eq!(resp.status(), 200);
    let seen = upstream.seen();
    assert_eq!(seen.len(), 3);
    // Lower bounds only: a sleep never ends early.
    let first_gap = seen[1].at - seen[0].at;
    let second_gap = seen[2].at - seen[1].at;
    assert!(first_gap >= Duration::from_millis(200), "{first_gap:?}");
    assert!(
        second_gap >= Duration::from_millis(800),
        "the second delay follows the second hint: {second_gap:?}"
    );
    gw.wait_idle().await;
}

// proves: LC-3 (a stream cut mid-answer reaches the client as an error event and an aborted body, never a normal completion, and is not replayed)
#[tokio::test]
async fn stream_cut_mid_answer_is_an_error_for_the_client() {
    let upstream = Scripted::start(vec![Reply::Stream {
        events: vec![chunk("Hello"), chunk(", wor")],
        end: End::Cut,
    }])
    .await;
    let gw = Gateway::start(&scripted_config(&upstream.base_url, "30s")).await;
    let resp = post_chat(&client(), &gw, Some(KEY_A), &chat("chat", true)).await;
    assert_eq!(resp.status(), 200);
    let read = read_sse(resp).await;
    assert_eq!(read.text(), "Hello, wor");
    assert!(read.end.is_err(), "the body must fail: {read:?}");
    assert!(!read.events.iter().any(|e| e == "[DONE]"));
    let errors = read.errors();
    assert_eq!(errors.len(), 1, "{read:?}");
    assert_eq!(errors[0]["error"]["code"], "upstream_error");
    assert_eq!(
        read.events.last(),
        read.events.get(2),
        "the error comes last"
    );
    assert_eq!(upstream.attempts(), 1);
    gw.wait_idle().await;
    assert_eq!(upstream.attempts(), 1, "never replayed");
}

// proves: LC-3, LC-4 (a 429 declared mid-stream is delivered once, ends the stream at once with an error, and is not retried)
#[tokio::test]
async fn rate_limit_error_mid_stream_neither_hangs_nor_retries() {
    let declared = r#"{"error":{"message":"Rate limit reached for requests","type":"rate_limit_error","param":null,"code":"rate_limit_exceeded"}}"#;
    let upstream = Scripted::start(vec![
        Reply::Stream {
            // After the error the upstream keeps the connection open.
            events: vec![chunk("partial"), declared.to_owned()],
            end: End::Hang,
        },
        Reply::ok(),
    ])
    .await;
    let gw = Gateway::start(&scripted_config(&upstream.base_url, "30s")).await;
    let resp = post_chat(&client(), &gw, Some(KEY_A), &chat("chat", true)).await;
    assert_eq!(resp.status(), 200);
    let read = read_sse(resp).await;
    assert_eq!(read.text(), "partial");
    assert!(read.end.is_err(), "the body must fail: {read:?}");
    let errors = read.errors();
    assert_eq!(errors.len(), 1, "the error is delivered once: {read:?}");
    assert_eq!(errors[0]["error"]["type"], "rate_limit_error");
    gw.wait_idle().await;
    assert_eq!(upstream.attempts(), 1, "not retried");
}

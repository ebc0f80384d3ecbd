//! Requests refused before any upstream work, in the OpenAI error format
//! (SPEC GW-1..GW-4, GW-7, POOL-2, POOL-3, ADM-5, Q-11).

mod common;

use std::time::Duration;

use common::*;
use serde_json::json;
use tollgate_sim::SimConfig;

/// Provider `sim`, model `chat` (optionally on scope `main` with `scope`
/// settings), tenants `a` and `b` with the given settings, and `extra`
/// top-level sections.
fn config(base_url: &str, model: &str, a: &str, b: &str, extra: &str) -> String {
    format!(
        r#"
{extra}

[providers.sim]
base_url = "{base_url}"

[models.chat]
provider = "sim"
upstream_model = "sim-chat"
{model}

{}
"#,
        tenants(a, b)
    )
}

// proves: GW-4 (pool overflow ⇒ 429 admission_rejected before any upstream call), POOL-3
#[tokio::test]
async fn full_tenant_pool_rejects_without_an_upstream_request() {
    let sim = slow_sim(Duration::from_millis(50), 60).await;
    let gw = Gateway::start(&config(
        &sim.openai_base_url(),
        "",
        "concurrency = 1\nmax_waiting = 0",
        "",
        "",
    ))
    .await;
    let held = hold_stream(&gw, KEY_A).await;
    let before = sim.stats().requests_total;
    assert_eq!(before, 1);
    for stream in [false, true] {
        let resp = post_chat(&client(), &gw, Some(KEY_A), &chat("chat", stream)).await;
        let (status, _, error) = error_of(resp).await;
        assert_eq!(status, 429);
        assert_eq!(error["type"], "rate_limit_error");
        assert_eq!(code(&error), "admission_rejected");
    }
    assert_eq!(
        sim.stats().requests_total,
        before,
        "nothing reached upstream"
    );
    drop(held);
    gw.wait_idle().await;
}

// proves: GW-4 (model pool overflow ⇒ 429 admission_rejected, no upstream request), POOL-3
#[tokio::test]
async fn full_model_pool_rejects_without_an_upstream_request() {
    let sim = slow_sim(Duration::from_millis(50), 60).await;
    let gw = Gateway::start(&config(
        &sim.openai_base_url(),
        "concurrency = 1\nmax_waiting = 0",
        "",
        "",
        "",
    ))
    .await;
    let held = hold_stream(&gw, KEY_A).await;
    let resp = post_chat(&client(), &gw, Some(KEY_B), &chat("chat", false)).await;
    let (status, _, error) = error_of(resp).await;
    assert_eq!((status, code(&error)), (429, "admission_rejected"));
    assert_eq!(sim.stats().requests_total, 1);
    drop(held);
    gw.wait_idle().await;
}

// proves: ADM-5 (bounded queue; overflow ⇒ 429 admission_rejected), GW-4
#[tokio::test]
async fn full_quota_queue_rejects() {
    let sim = fast_sim().await;
    let gw = Gateway::start(&config(
        &sim.openai_base_url(),
        "scope = \"main\"",
        "",
        "",
        "[scopes.main]\nrpm = 1\nqueue_capacity = 1\n",
    ))
    .await;
    let client = client();
    // The minute's only request.
    let resp = post_chat(&client, &gw, Some(KEY_A), &chat("chat", false)).await;
    assert_eq!(resp.status(), 200);
    // The next one can be admitted within its (long) deadline: it waits in
    // the queue and fills it.
    let waiting = {
        let (client, url) = (client.clone(), gw.url("/v1/chat/completions"));
        tokio::spawn(async move {
            client
                .post(url)
                .bearer_auth(KEY_A)
                .header("x-request-timeout", "120")
                .json(&chat("chat", false))
                .send()
                .await
        })
    };
    eventually("one call queued", || gw.upstream_scope("main").queued == 1).await;
    // The same tenant again: its flow holds the whole queue (another
    // tenant's first call would take the place instead, SPEC FAIR-10: see
    // tests/fairness.rs).
    let resp = client
        .post(gw.url("/v1/chat/completions"))
        .bearer_auth(KEY_A)
        .header("x-request-timeout", "120")
        .json(&chat("chat", false))
        .send()
        .await
        .unwrap();
    let (status, _, error) = error_of(resp).await;
    assert_eq!((status, code(&error)), (429, "admission_rejected"));
    assert_eq!(sim.stats().requests_total, 1);
    // The client of the queued call gives up: its place is freed.
    waiting.abort();
    gw.wait_idle().await;
    assert_eq!(gw.upstream_scope("main").queued, 0);
}

// proves: GW-3, GW-4 (the deadline of x-request-timeout runs out while waiting for a permit ⇒ 429 admission_wait_deadline_exceeded), POOL-3
#[tokio::test]
async fn expired_pool_wait_is_a_429() {
    let sim = slow_sim(Duration::from_millis(50), 60).await;
    let gw = Gateway::start(&config(
        &sim.openai_base_url(),
        "",
        "concurrency = 1\nmax_waiting = 4\nmax_wait = \"30s\"",
        "",
        "",
    ))
    .await;
    let held = hold_stream(&gw, KEY_A).await;
    let resp = client()
        .post(gw.url("/v1/chat/completions"))
        .bearer_auth(KEY_A)
        .header("x-request-timeout", "0.3")
        .json(&chat("chat", false))
        .send()
        .await
        .unwrap();
    let (status, _, error) = error_of(resp).await;
    assert_eq!(status, 429);
    assert_eq!(code(&error), "admission_wait_deadline_exceeded");
    assert_eq!(sim.stats().requests_total, 1);
    drop(held);
    gw.wait_idle().await;
}

// proves: Q-11, GW-4 (quota that cannot be had within the deadline ⇒ 429 admission_wait_deadline_exceeded at once, with retry-after)
#[tokio::test]
async fn quota_beyond_the_deadline_is_a_429_with_retry_after() {
    let sim = fast_sim().await;
    let gw = Gateway::start(&config(
        &sim.openai_base_url(),
        "scope = \"main\"",
        "",
        "",
        "[scopes.main]\nrpm = 1\n",
    ))
    .await;
    let client = client();
    let resp = post_chat(&client, &gw, Some(KEY_A), &chat("chat", false)).await;
    assert_eq!(resp.status(), 200);
    let resp = client
        .post(gw.url("/v1/chat/completions"))
        .bearer_auth(KEY_A)
        .header("x-request-timeout", "5")
        .json(&chat("chat", false))
        .send()
        .await
        .unwrap();
    let (status, retry_after, error) = error_of(resp).await;
    assert_eq!(status, 429);
    assert_eq!(code(&error), "admission_wait_deadline_exceeded");
    let secs: u64 = retry_after
        .expect("a 429 with a known reset carries retry-after")
        .parse()
        .unwrap();
    assert!((1..=60).contains(&secs), "retry-after {secs}");
    assert_eq!(sim.stats().requests_total, 1);
    gw.wait_idle().await;
}

// proves: POOL-2, GW-2 (tenant identity comes only from the API key; tenant-looking headers and body fields are ignored)
#[tokio::test]
async fn spoofed_tenant_headers_and_fields_are_ignored() {
    let sim = slow_sim(Duration::from_millis(50), 60).await;
    let gw = Gateway::start(&config(
        &sim.openai_base_url(),
        "",
        "concurrency = 1\nmax_waiting = 0",
        "concurrency = 1\nmax_waiting = 0",
        "",
    ))
    .await;
    let held = hold_stream(&gw, KEY_A).await;
    let spoof = |req: reqwest::RequestBuilder, as_tenant: &str, other_key: &str| {
        req.header("x-tenant", as_tenant)
            .header("x-tenant-id", as_tenant)
            .header("x-tollgate-tenant", as_tenant)
            .header("openai-organization", as_tenant)
            .header("x-api-key", other_key)
    };
    let mut body = json!({
        "model": "chat",
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 2,
        "tenant": "b",
        "user": "b",
        "metadata": {"tenant": "b"},
    });
    // a's key dressed up as b: still a, whose pool is full.
    let resp = spoof(
        client()
            .post(gw.url("/v1/chat/completions"))
            .bearer_auth(KEY_A),
        "b",
        KEY_B,
    )
    .json(&body)
    .send()
    .await
    .unwrap();
    let (status, _, error) = error_of(resp).await;
    assert_eq!((status, code(&error)), (429, "admission_rejected"));
    assert_eq!(gw.tenant_scope("tenant:a").counters.admitted, 1);

    // b's key dressed up as a: served as b.
    body["tenant"] = json!("a");
    body["user"] = json!("a");
    let resp = spoof(
        client()
            .post(gw.url("/v1/chat/completions"))
            .bearer_auth(KEY_B),
        "a",
        KEY_A,
    )
    .json(&body)
    .send()
    .await
    .unwrap();
    assert_eq!(resp.status(), 200);
    resp.bytes().await.unwrap();

    // No key at all: the headers do not make one.
    let resp = spoof(client().post(gw.url("/v1/chat/completions")), "a", KEY_A)
        .json(&body)
        .send()
        .await
        .unwrap();
    let (status, _, _) = error_of(resp).await;
    assert_eq!(status, 401);
    drop(held);
    gw.wait_idle().await;
}

// proves: GW-2 (bad or missing key ⇒ 401 in the OpenAI format, nothing sent upstream)
#[tokio::test]
async fn bad_keys_are_401() {
    let sim = fast_sim().await;
    let gw = Gateway::start(&config(&sim.openai_base_url(), "", "", "", "")).await;
    let client = client();
    let url = gw.url("/v1/chat/completions");
    let body = chat("chat", false);
    let hash = key_hash(KEY_A);
    let requests = [
        client.post(&url).json(&body),
        client.post(&url).bearer_auth("sk-wrong").json(&body),
        client.post(&url).bearer_auth(&hash).json(&body),
        client
            .post(&url)
            .header("authorization", format!("Basic {KEY_A}"))
            .json(&body),
        client.post(&url).header("authorization", KEY_A).json(&body),
    ];
    for req in requests {
        let (status, _, error) = error_of(req.send().await.unwrap()).await;
        assert_eq!(status, 401);
        assert_eq!(error["type"], "authentication_error");
        assert_eq!(code(&error), "invalid_api_key");
        assert!(!error.to_string().contains(KEY_A));
    }
    assert_eq!(sim.stats().requests_total, 0);
}

// proves: GW-7 (bounded request body ⇒ 413), GW-1 (bad JSON ⇒ 400, unknown model ⇒ 404, OpenAI error format)
#[tokio::test]
async fn oversized_malformed_and_unknown_model_requests() {
    let sim = fast_sim().await;
    let gw = Gateway::start(&config(
        &sim.openai_base_url(),
        "",
        "",
        "",
        "[server]\nmax_body_bytes = 4096\n",
    ))
    .await;
    let client = client();
    let url = gw.url("/v1/chat/completions");

    // Too large, announced by content-length ...
    let big = json!({
        "model": "chat",
        "messages": [{"role": "user", "content": "x".repeat(10_000)}],
    });
    let resp = client
        .post(&url)
        .bearer_auth(KEY_A)
        .json(&big)
        .send()
        .await
        .unwrap();
    let (status, _, error) = error_of(resp).await;
    assert_eq!((status, code(&error)), (413, "request_too_large"));
    // ... and sent chunked, without a length.
    let chunks: Vec<Result<Vec<u8>, std::io::Error>> =
        (0..20).map(|_| Ok(vec![b' '; 1024])).collect();
    let resp = client
        .post(&url)
        .bearer_auth(KEY_A)
        .header("content-type", "application/json")
        .body(reqwest::Body::wrap_stream(futures_util::stream::iter(
            chunks,
        )))
        .send()
        .await
        .unwrap();
    let (status, _, error) = error_of(resp).await;
    assert_eq!((status, code(&error)), (413, "request_too_large"));

    // Malformed JSON, and JSON that is not a chat request.
    for bad in [
        "{\"model\": \"chat\", \"messages\": [",
        "not json",
        "{\"model\": \"chat\"}",
        "{\"model\": 5, \"messages\": []}",
        "[]",
    ] {
        let resp = client
            .post(&url)
            .bearer_auth(KEY_A)
            .header("content-type", "application/json")
            .body(bad)
            .send()
            .await
            .unwrap();
        let (status, _, error) = error_of(resp).await;
        assert_eq!(status, 400, "{bad}");
        assert_eq!(error["type"], "invalid_request_error", "{bad}");
    }

    // A model that is not configured (even one the upstream knows).
    for model in ["gpt-unknown", "sim-chat"] {
        let resp = post_chat(&client, &gw, Some(KEY_A), &chat(model, false)).await;
        let (status, _, error) = error_of(resp).await;
        assert_eq!((status, code(&error)), (404, "model_not_found"));
        assert!(
            error["message"].as_str().unwrap().contains(model),
            "{error}"
        );
    }
    assert_eq!(sim.stats().requests_total, 0);
}

// proves: GW-3 (x-request-timeout lengthens or shortens the deadline, capped by max_timeout; the default applies without it), GW-4 (deadline exceeded upstream ⇒ 504)
#[tokio::test]
async fn request_timeout_header_is_capped() {
    // Every answer takes 1.5 s.
    let sim = sim(SimConfig {
        ttft: Duration::from_millis(1500),
        ..SimConfig::default()
    })
    .await;
    let admission =
        |max: &str| format!("[admission]\ndefault_timeout = \"300ms\"\nmax_timeout = \"{max}\"\n");
    let capped = Gateway::start(&config(
        &sim.openai_base_url(),
        "",
        "",
        "",
        &admission("600ms"),
    ))
    .await;
    let roomy = Gateway::start(&config(
        &sim.openai_base_url(),
        "",
        "",
        "",
        &admission("30s"),
    ))
    .await;
    let send = |gw: &Gateway, timeout: Option<&str>| {
        let mut req = client()
            .post(gw.url("/v1/chat/completions"))
            .bearer_auth(KEY_A)
            .json(&chat("chat", false));
        if let Some(t) = timeout {
            req = req.header("x-request-timeout", t);
        }
        req.send()
    };
    // Within the cap, the header lengthens the 300 ms default.
    let resp = send(&roomy, Some("20")).await.unwrap();
    assert_eq!(resp.status(), 200);
    // Without it, the default applies.
    let (status, _, error) = error_of(send(&roomy, None).await.unwrap()).await;
    assert_eq!(status, 504, "{error}");
    // Beyond the cap, the cap applies.
    let (status, _, error) = error_of(send(&capped, Some("20")).await.unwrap()).await;
    assert_eq!(status, 504, "{error}");
    assert_eq!(code(&error), "deadline_exceeded");
    // The abandoned upstream requests were cancelled.
    eventually("upstream requests cancelled", || {
        let s = sim.stats();
        s.active == 0 && s.client_disconnects == 2
    })
    .await;
    capped.wait_idle().await;
    roomy.wait_idle().await;
}

// proves: GW-7 (bounded request head: oversized headers are refused with 431 before any work)
#[tokio::test]
async fn oversized_headers_are_refused() {
    let sim = fast_sim().await;
    let gw = Gateway::start(&config(
        &sim.openai_base_url(),
        "",
        "",
        "",
        "[server]\nmax_header_bytes = 8192\n",
    ))
    .await;
    let resp = client()
        .post(gw.url("/v1/chat/completions"))
        .bearer_auth(KEY_A)
        .header("x-padding", "p".repeat(64 * 1024))
        .json(&chat("chat", false))
        .send()
        .await;
    match resp {
        Ok(resp) => assert_eq!(resp.status(), 431),
        // The server may close before the client finished sending.
        Err(e) => assert!(!e.is_timeout(), "{e:?}"),
    }
    assert_eq!(sim.stats().requests_total, 0);
    // Normal heads still pass.
    let resp = post_chat(&client(), &gw, Some(KEY_A), &chat("chat", false)).await;
    assert_eq!(resp.status(), 200);
}

// proves: GW-7 (a client that never finishes its request head is disconnected after header_read_timeout)
#[tokio::test]
async fn slow_request_heads_are_cut_off() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let sim = fast_sim().await;
    let gw = Gateway::start(&config(
        &sim.openai_base_url(),
        "",
        "",
        "",
        "[server]\nheader_read_timeout = \"300ms\"\n",
    ))
    .await;
    let mut tcp = tokio::net::TcpStream::connect(gw.addr()).await.unwrap();
    tcp.write_all(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\n")
        .await
        .unwrap();
    // The server closes the connection (possibly after a 408): the read
    // ends instead of waiting for ever.
    let mut rest = Vec::new();
    let _ = bounded(
        "the server closes the slow connection",
        tcp.read_to_end(&mut rest),
    )
    .await;
    assert_eq!(sim.stats().requests_total, 0);
}

// proves: GW-4, Q-3 (an estimate larger than a whole token limit ⇒ 400 estimate_exceeds_limit at once, before any upstream call)
#[tokio::test]
async fn estimate_larger_than_the_limit_is_a_400() {
    let sim = fast_sim().await;
    let gw = Gateway::start(&config(
        &sim.openai_base_url(),
        "scope = \"main\"",
        "",
        "",
        "[scopes.main]\ntpm = 1000\n",
    ))
    .await;
    let body = json!({
        "model": "chat",
        "messages": [{"role": "user", "content": "Write a long story."}],
        "max_tokens": 5000,
    });
    let resp = post_chat(&client(), &gw, Some(KEY_A), &body).await;
    let (status, _, error) = error_of(resp).await;
    assert_eq!((status, code(&error)), (400, "estimate_exceeds_limit"));
    assert_eq!(sim.stats().requests_total, 0);
    gw.wait_idle().await;
}

// proves: GW-4 (a token estimate too large ⇒ 400 before any upstream
// call: one past what a 64-bit count holds, or past the per-call bound on
// a scope without any token limit, is the client's error, never a 500,
// and moves no token counter). Found by a hostile-client review: the
// overflow was a 500 `admission_error`, and on a scope without a token
// limit two calls pinned the shared `tokens_reserved_total` at 2^64 - 1.
#[tokio::test]
async fn estimates_no_count_holds_are_a_400() {
    let sim = fast_sim().await;
    let gw = Gateway::start(&config(&sim.openai_base_url(), "", "", "", "")).await;
    let prompt = json!([{"role": "user", "content": "hi"}]);
    let asks = [
        (
            "/v1/chat/completions",
            json!({"model": "chat", "messages": prompt, "max_tokens": u64::MAX}),
        ),
        (
            "/v1/chat/completions",
            json!({"model": "chat", "messages": prompt, "max_tokens": 1u64 << 40, "n": 1u64 << 40}),
        ),
        (
            "/v1/chat/completions",
            json!({"model": "chat", "messages": prompt, "max_tokens": i64::MAX, "stream": true}),
        ),
        (
            "/v1/chat/completions",
            json!({"model": "chat", "messages": prompt, "max_completion_tokens": (1u64 << 32) + 1}),
        ),
        (
            "/v1/responses",
            json!({"model": "chat", "input": "hi", "max_output_tokens": u64::MAX}),
        ),
    ];
    for (path, body) in &asks {
        let resp = post_json(&gw, path, KEY_A, body).await;
        let (status, _, error) = error_of(resp).await;
        assert_eq!(
            (status, code(&error)),
            (400, "estimate_exceeds_limit"),
            "{path} {body}"
        );
        assert_eq!(error["type"], "invalid_request_error");
    }
    assert_eq!(sim.stats().requests_total, 0, "nothing reached upstream");
    let metrics = metrics_text(&gw).await;
    for line in metrics
        .lines()
        .filter(|l| l.starts_with("tollgate_tokens_reserved_total"))
    {
        let value: f64 = line
            .rsplit(' ')
            .next()
            .and_then(|v| v.parse().ok())
            .expect("a value");
        assert!(value <= 1e6, "a refused call moved a token counter: {line}");
    }
    // A call within the bound on the same scope still goes through, also
    // one just under it.
    let under = json!({"model": "chat", "messages": prompt, "max_tokens": 1u64 << 31});
    let ok = post_chat(&client(), &gw, Some(KEY_A), &under).await;
    assert_eq!(ok.status(), 200);
    let ok = post_chat(
        &client(),
        &gw,
        Some(KEY_A),
        &json!({"model": "chat", "messages": prompt, "max_tokens": 16}),
    )
    .await;
    assert_eq!(ok.status(), 200);
    gw.wait_idle().await;
}

// proves: GW-7 (an idle keep-alive connection is closed after server.idle_timeout)
#[tokio::test]
async fn idle_keep_alive_connections_are_closed() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let sim = fast_sim().await;
    // The head timeout is longer than this test's patience: only the idle
    // timeout can close the connection in time.
    let gw = Gateway::start(&config(
        &sim.openai_base_url(),
        "",
        "",
        "",
        "[server]\nidle_timeout = \"300ms\"\nheader_read_timeout = \"120s\"\n",
    ))
    .await;
    let mut tcp = tokio::net::TcpStream::connect(gw.addr()).await.unwrap();
    tcp.write_all(b"GET /healthz HTTP/1.1\r\nhost: x\r\n\r\n")
        .await
        .unwrap();
    let mut seen = Vec::new();
    let mut buf = [0u8; 1024];
    while !String::from_utf8_lossy(&seen).contains("\"ok\"}") {
        let n = bounded("the health answer", tcp.read(&mut buf))
            .await
            .unwrap();
        assert!(n > 0, "closed before answering");
        seen.extend_from_slice(&buf[..n]);
    }
    assert!(String::from_utf8_lossy(&seen).starts_with("HTTP/1.1 200"));
    // Kept alive, then idle: the server closes it.
    let mut rest = Vec::new();
    let _ = bounded(
        "the server closes the idle connection",
        tcp.read_to_end(&mut rest),
    )
    .await;
    assert!(rest.is_empty(), "{rest:?}");
}

//! The wider wire end to end (SPEC WIRE-1..WIRE-4, Q-12): the Responses
//! route, Anthropic's Messages route and the Azure and OpenAI-compatible
//! flavours, through real sockets against the strict simulator, which
//! refuses any request of the wrong shape (path, query, key header) and
//! counts every window itself.

mod common;

use std::time::Duration;

use common::upstream::{Reply, Scripted};
use common::*;
use serde_json::{Value, json};
use tollgate_sim::SimConfig;

/// The gateway's own upstream keys, read from these variables.
const AZURE_KEY_VAR: &str = "TOLLGATE_TEST_DIALECTS_AZURE_KEY";
const ANTHROPIC_KEY_VAR: &str = "TOLLGATE_TEST_DIALECTS_ANTHROPIC_KEY";
const COMPAT_KEY_VAR: &str = "TOLLGATE_TEST_DIALECTS_COMPAT_KEY";
const AZURE_KEY: &str = "az-upstream-secret";
const ANTHROPIC_KEY: &str = "ant-upstream-secret";
const COMPAT_KEY: &str = "compat-upstream-secret";

fn runtime() -> tokio::runtime::Runtime {
    runtime_with_env(&[
        (AZURE_KEY_VAR, AZURE_KEY),
        (ANTHROPIC_KEY_VAR, ANTHROPIC_KEY),
        (COMPAT_KEY_VAR, COMPAT_KEY),
    ])
}

fn responses_body(stream: bool) -> Value {
    json!({
        "model": "m",
        "instructions": "Be brief.",
        "input": [{"role": "user", "content": [{"type": "input_text", "text": "Say something."}]}],
        "max_output_tokens": 32,
        "stream": stream,
    })
}

/// The named events (`event:` lines) and data payloads of an SSE body.
async fn named_events(resp: reqwest::Response) -> (Vec<String>, Vec<Value>) {
    // A stream that failed ends with its error event, then an aborted
    // transfer: keep what arrived.
    let mut text = String::new();
    let mut body = resp.bytes_stream();
    bounded("the SSE body ends", async {
        while let Some(Ok(chunk)) = futures_util::StreamExt::next(&mut body).await {
            text.push_str(&String::from_utf8_lossy(&chunk));
        }
    })
    .await;
    let mut names = Vec::new();
    let mut data = Vec::new();
    for event in text.split("\n\n").filter(|e| !e.trim().is_empty()) {
        for line in event.lines() {
            if let Some(name) = line.strip_prefix("event:") {
                names.push(name.trim().to_owned());
            } else if let Some(d) = line.strip_prefix("data:") {
                data.push(serde_json::from_str(d.trim()).expect("event data is JSON"));
            }
        }
    }
    (names, data)
}

// proves: WIRE-1 (Responses one-shot and stream through the gateway, usage
// settled from `usage` / `response.completed`), Q-5
#[test]
fn responses_route_one_shot_and_stream_settle() {
    runtime().block_on(async {
        let sim = sim(SimConfig {
            rpm: Some(600),
            tpm: Some(100_000),
            completion_tokens: 8,
            ..SimConfig::default()
        })
        .await;
        let gw = Gateway::start(&one_model_config(
            &format!("base_url = \"{}\"", sim.openai_base_url()),
            "rpm = 600\ntpm = 100000",
            "upstream_model = \"sim-chat\"",
        ))
        .await;

        let resp = post_json(&gw, "/v1/responses", KEY_A, &responses_body(false)).await;
        assert_eq!(resp.status(), 200);
        let body: Value = resp.json().await.expect("json");
        assert_eq!(body["object"], "response");
        let one_shot = body["usage"]["total_tokens"].as_u64().expect("usage");

        let resp = post_json(&gw, "/v1/responses", KEY_A, &responses_body(true)).await;
        assert_eq!(resp.status(), 200);
        let (names, data) = named_events(resp).await;
        assert_eq!(names.first().map(String::as_str), Some("response.created"));
        assert_eq!(
            names.last().map(String::as_str),
            Some("response.completed"),
            "{names:?}"
        );
        let streamed = data
            .last()
            .and_then(|d| d.pointer("/response/usage/total_tokens"))
            .and_then(Value::as_u64)
            .expect("usage in response.completed");

        gw.wait_idle().await;
        let stats = sim.stats();
        assert_eq!(stats.routes.responses, 2);
        assert_eq!(stats.rejected_429.total(), 0);
        let main = gw.upstream_scope("main");
        assert_eq!(main.counters.tokens_reported, one_shot + streamed);
        assert_eq!(stats.tokens_charged, one_shot + streamed);
    });
}

// proves: WIRE-4 (a model serves only the routes its flavour offers: an
// OpenAI-compatible model is unknown on /v1/responses unless it lists it)
#[test]
fn routes_a_model_does_not_serve_are_unknown_there() {
    runtime().block_on(async {
        let sim = fast_sim().await;
        let gw = Gateway::start(&one_model_config(
            &format!(
                "flavor = \"openai_compatible\"\nbase_url = \"{}\"",
                sim.openai_base_url()
            ),
            "rpm = 600",
            "",
        ))
        .await;
        let resp = post_json(&gw, "/v1/responses", KEY_A, &responses_body(false)).await;
        let (status, _, error) = error_of(resp).await;
        assert_eq!(status, 404);
        assert_eq!(code(&error), "model_not_found");
        let resp = post_chat(&client(), &gw, Some(KEY_A), &chat("m", false)).await;
        assert_eq!(resp.status(), 200);
        let resp = post_json(&gw, "/v1/messages", KEY_A, &messages_body(false, 16)).await;
        assert_eq!(resp.status(), 404);
        let body: Value = resp.json().await.expect("json");
        assert_eq!(body["type"], "error", "Anthropic's format: {body}");
        assert_eq!(body["error"]["type"], "not_found_error");
        assert_eq!(sim.stats().routes.responses, 0);
    });
}

// proves: WIRE-2 (azure: deployment path, api-version query, api-key
// header and no Authorization; the client's key never goes upstream)
#[test]
fn azure_requests_have_azure_shape() {
    runtime().block_on(async {
        let sim = sim(SimConfig {
            azure_key: Some(AZURE_KEY.to_owned()),
            require_key: Some("only-for-openai-routes".to_owned()),
            ..SimConfig::default()
        })
        .await;
        let base = sim.openai_base_url();
        let root = base.trim_end_matches("/v1");
        let gw = Gateway::start(&one_model_config(
            &format!(
                "flavor = \"azure\"\nbase_url = \"{root}\"\napi_version = \"2024-10-21\"\n\
                 api_key_env = \"{AZURE_KEY_VAR}\""
            ),
            "rpm = 600",
            "upstream_model = \"gpt-4o-prod\"",
        ))
        .await;
        let resp = post_chat(&client(), &gw, Some(KEY_A), &chat("m", false)).await;
        assert_eq!(resp.status(), 200);
        let body: Value = resp.json().await.expect("json");
        assert_eq!(body["model"], "gpt-4o-prod", "the deployment answered");
        let resp = post_chat(&client(), &gw, Some(KEY_A), &chat("m", true)).await;
        assert_eq!(resp.status(), 200);
        assert!(read_sse(resp).await.completed());
        gw.wait_idle().await;
        let stats = sim.stats();
        assert_eq!(stats.routes.azure_chat_completions, 2, "{stats:?}");
        assert_eq!(stats.unauthorized, 0, "key in api-key, no Authorization");
        assert_eq!(stats.routes.not_found, 0, "api-version was sent");
        assert_eq!(stats.routes.chat_completions, 0);
    });
}

// proves: WIRE-2 (openai_compatible: the key in the configured header after
// the configured prefix, static headers and query parameters, never the
// client's key)
#[test]
fn openai_compatible_sends_its_key_where_configured() {
    runtime().block_on(async {
        let upstream = Scripted::start(vec![Reply::ok()]).await;
        let gw = Gateway::start(&one_model_config(
            &format!(
                "flavor = \"openai_compatible\"\nbase_url = \"{}\"\n\
                 api_key_env = \"{COMPAT_KEY_VAR}\"\nauth_header = \"X-Api-Token\"\n\
                 auth_prefix = \"Token \"\nheaders = {{ \"X-Team\" = \"search\" }}\n\
                 query = {{ tenant = \"a b\" }}",
                upstream.base_url
            ),
            "rpm = 600",
            "",
        ))
        .await;
        let resp = post_chat(&client(), &gw, Some(KEY_A), &chat("m", false)).await;
        assert_eq!(resp.status(), 200);
        let seen = upstream.seen();
        assert_eq!(seen.len(), 1);
        let h = &seen[0].headers;
        assert_eq!(h["x-api-token"], format!("Token {COMPAT_KEY}").as_str());
        assert_eq!(h["x-team"], "search");
        assert!(h.get("authorization").is_none(), "no bearer key: {h:?}");
        assert_eq!(seen[0].uri, "/v1/chat/completions?tenant=a+b");
        assert!(
            !format!("{h:?}").contains(KEY_A),
            "the client's key never goes upstream"
        );
    });
}

fn messages_body(stream: bool, max_tokens: u64) -> Value {
    json!({
        "model": "m",
        "system": "Be brief.",
        "messages": [{"role": "user", "content": "Say something in a few words."}],
        "max_tokens": max_tokens,
        "stream": stream,
    })
}

fn anthropic_provider(sim: &tollgate_sim::SimServer) -> String {
    format!(
        "flavor = \"anthropic\"\nbase_url = \"{}\"\napi_key_env = \"{ANTHROPIC_KEY_VAR}\"",
        sim.openai_base_url()
    )
}

async fn post_messages(gw: &Gateway, key: &str, body: &Value) -> reqwest::Response {
    bounded(
        "messages answered",
        client()
            .post(gw.url("/v1/messages"))
            .header("x-api-key", key)
            .header("anthropic-version", "2023-06-01")
            .json(body)
            .send(),
    )
    .await
    .expect("the gateway answers")
}

// proves: WIRE-3 (Messages one-shot and stream passed through with the
// gateway's own key, settled from usage; Anthropic-format errors; a client
// key in x-api-key identifies the tenant)
#[test]
fn messages_route_one_shot_stream_and_errors() {
    runtime().block_on(async {
        let sim = sim(SimConfig {
            anthropic_key: Some(ANTHROPIC_KEY.to_owned()),
            anthropic_rpm: Some(600),
            itpm: Some(100_000),
            otpm: Some(20_000),
            completion_tokens: 8,
            ..SimConfig::default()
        })
        .await;
        let gw = Gateway::start(&one_model_config(
            &anthropic_provider(&sim),
            "algorithm = \"token_bucket\"\nrpm = 600\nitpm = 100000\notpm = 20000",
            "upstream_model = \"sim-claude\"",
        ))
        .await;

        let resp = post_messages(&gw, KEY_A, &messages_body(false, 64)).await;
        assert_eq!(resp.status(), 200);
        let body: Value = resp.json().await.expect("json");
        assert_eq!(body["type"], "message");
        assert_eq!(body["model"], "sim-claude");
        let input = body["usage"]["input_tokens"].as_u64().expect("input");
        let output = body["usage"]["output_tokens"].as_u64().expect("output");

        let resp = post_messages(&gw, KEY_A, &messages_body(true, 64)).await;
        assert_eq!(resp.status(), 200);
        let (names, _) = named_events(resp).await;
        assert_eq!(names.first().map(String::as_str), Some("message_start"));
        assert_eq!(names.last().map(String::as_str), Some("message_stop"));

        // Errors in Anthropic's format: an unknown key, an unknown model.
        let resp = post_messages(&gw, "sk-wrong", &messages_body(false, 64)).await;
        assert_eq!(resp.status(), 401);
        let body: Value = resp.json().await.expect("json");
        assert_eq!(body["error"]["type"], "authentication_error", "{body}");
        let mut unknown = messages_body(false, 64);
        unknown["model"] = json!("nope");
        let resp = post_messages(&gw, KEY_A, &unknown).await;
        assert_eq!(resp.status(), 404);
        let body: Value = resp.json().await.expect("json");
        assert_eq!(body["error"]["type"], "not_found_error", "{body}");

        gw.wait_idle().await;
        let stats = sim.stats();
        assert_eq!(stats.routes.messages, 2, "{stats:?}");
        assert_eq!(stats.unauthorized, 0, "the gateway's key went upstream");
        assert_eq!(stats.rejected_429.total(), 0);
        let main = gw.upstream_scope("main");
        // Both calls settled with the simulator's own counts (Q-5, Q-12).
        assert_eq!(main.counters.tokens_reported, 2 * (input + output));
        assert_eq!(stats.input_tokens_charged, 2 * input);
        assert_eq!(stats.output_tokens_charged, 2 * output);
    });
}

/// Asserts that some access-log line says the call waited for `dimension`
/// and that none names another limit.
async fn assert_limited_by(lines: &parking_lot::Mutex<Vec<String>>, n: usize, dimension: &str) {
    eventually("every access line", || lines.lock().len() >= n).await;
    let lines = lines.lock().clone();
    let named: Vec<&str> = lines
        .iter()
        .filter_map(|l| l.split("limited_by=").nth(1))
        .filter_map(|rest| rest.split_whitespace().next())
        .collect();
    assert!(named.contains(&dimension), "{named:?}");
    assert!(
        named.iter().all(|n| *n == "none" || *n == dimension),
        "{named:?}"
    );
}

/// Runs `n` Messages calls with `concurrency` at a time; each must
/// succeed.
async fn messages_load(gw: &Gateway, n: usize, concurrency: usize, body: Value) {
    let gate = std::sync::Arc::new(tokio::sync::Semaphore::new(concurrency));
    let mut tasks = Vec::new();
    for _ in 0..n {
        let permit = gate.clone().acquire_owned().await.expect("gate");
        let (url, body) = (gw.url("/v1/messages"), body.clone());
        tasks.push(tokio::spawn(async move {
            let resp = client()
                .post(url)
                .header("x-api-key", KEY_A)
                .header("anthropic-version", "2023-06-01")
                .json(&body)
                .send()
                .await
                .expect("answered");
            drop(permit);
            let status = resp.status().as_u16();
            let text = resp.text().await.unwrap_or_default();
            (status, text)
        }));
    }
    for t in tasks {
        let (status, text) = t.await.expect("task");
        assert_eq!(status, 200, "{text}");
    }
}

/// `n` Messages calls of `body`, 8 at a time, under Anthropic-style
/// limits of `itpm` input and `otpm` output tokens per 2 s window (the
/// simulator's and the scope's alike): no provider 429, and the access log
/// says `dimension` is what calls waited for.
async fn split_limit_load(itpm: u64, otpm: u64, n: usize, body: Value, dimension: &str) {
    let window = Duration::from_secs(2);
    let sim = sim(SimConfig {
        anthropic_key: Some(ANTHROPIC_KEY.to_owned()),
        window,
        itpm: Some(itpm),
        otpm: Some(otpm),
        completion_tokens: 8,
        ..SimConfig::default()
    })
    .await;
    let gw = Gateway::start(&one_model_config(
        &anthropic_provider(&sim),
        &format!(
            "algorithm = \"token_bucket\"\nlimits = [{{ input_tokens = {itpm}, per = \"2s\" }}, \
             {{ output_tokens = {otpm}, per = \"2s\" }}]"
        ),
        "upstream_model = \"sim-claude\"",
    ))
    .await;
    let lines = gw.app.access_log.capture();
    messages_load(&gw, n, 8, body).await;
    gw.wait_idle().await;
    let stats = sim.stats();
    assert_eq!(stats.rejected_429.total(), 0, "{stats:?}");
    assert_eq!(stats.routes.messages, n as u64);
    assert_limited_by(&lines, n, dimension).await;
}

// proves: Q-12 (the input-token limit binds a load of long prompts: the
// simulator never refuses and the access log names input_tokens as what
// calls waited for), WIRE-3
#[test]
fn itpm_binds_long_prompts_without_provider_429s() {
    // About 400 characters: the gateway reserves ~140 input tokens, the
    // simulator counts ~106; 30 calls need about two windows of input.
    let body = json!({
        "model": "m",
        "messages": [{"role": "user", "content": "word ".repeat(80)}],
        "max_tokens": 4,
    });
    runtime().block_on(split_limit_load(2_000, 100_000, 30, body, "input_tokens"));
}

// proves: Q-12 (the output allowance binds: max_tokens is reserved on the
// output-token limit and the unused part given back), WIRE-3
#[test]
fn otpm_binds_large_max_tokens_without_provider_429s() {
    runtime().block_on(split_limit_load(
        100_000,
        2_000,
        16,
        messages_body(false, 500),
        "output_tokens",
    ));
}

/// A Responses or Messages stream request on `path`.
async fn stream_on(gw: &Gateway, path: &str) -> reqwest::Response {
    let body = if path == "/v1/messages" {
        let mut body = messages_body(true, 16);
        body["model"] = json!("c");
        body
    } else {
        responses_body(true)
    };
    bounded(
        "stream answered",
        client()
            .post(gw.url(path))
            .bearer_auth(KEY_A)
            .header("anthropic-version", "2023-06-01")
            .json(&body)
            .send(),
    )
    .await
    .expect("the gateway answers")
}

/// A gateway in front of `sim` serving model `m` on both dialects' routes
/// (two models: `m` on OpenAI's routes, `c` on Anthropic's).
async fn both_dialects(sim: &tollgate_sim::SimServer, scope: &str) -> Gateway {
    Gateway::start(&format!(
        r#"
[retry]
base_delay = "10ms"
max_delay = "50ms"
max_attempts = 6

[providers.up]
base_url = "{base}"
[providers.ant]
flavor = "anthropic"
base_url = "{base}"
api_key_env = "{ANTHROPIC_KEY_VAR}"

[scopes.main]
{scope}

[models.m]
provider = "up"
scope = "main"
upstream_model = "sim-chat"
[models.c]
provider = "ant"
upstream_model = "sim-claude"

{}
"#,
        tenants("", ""),
        base = sim.openai_base_url(),
    ))
    .await
}

// proves: WIRE-1, WIRE-3 (same retry rules as chat: a stream refused before
// its first event is retried; one broken after it is not replayed and ends
// with an error event in the route's dialect), LC-3
#[test]
fn streams_retry_before_the_first_event_and_never_replay_after() {
    runtime().block_on(async {
        // Every request fails with a 5xx on a seeded share of attempts.
        let flaky = sim(SimConfig {
            anthropic_key: Some(ANTHROPIC_KEY.to_owned()),
            error_rate: 0.4,
            seed: 7,
            completion_tokens: 4,
            ..SimConfig::default()
        })
        .await;
        let gw = both_dialects(&flaky, "rpm = 600").await;
        for path in ["/v1/responses", "/v1/messages"] {
            for _ in 0..6 {
                let resp = stream_on(&gw, path).await;
                assert_eq!(resp.status(), 200, "{path}");
                let (names, _) = named_events(resp).await;
                let last = names.last().map(String::as_str);
                assert!(
                    matches!(last, Some("response.completed" | "message_stop")),
                    "{path}: {names:?}"
                );
            }
        }
        gw.wait_idle().await;
        let stats = flaky.stats();
        assert!(stats.faults.server_error > 0, "retried 5xx: {stats:?}");
        assert_eq!(stats.ok, 12);

        // Every stream is cut after its first events.
        let cut = sim(SimConfig {
            anthropic_key: Some(ANTHROPIC_KEY.to_owned()),
            disconnect_rate: 1.0,
            completion_tokens: 8,
            ..SimConfig::default()
        })
        .await;
        let gw = both_dialects(&cut, "rpm = 600").await;
        let resp = stream_on(&gw, "/v1/responses").await;
        assert_eq!(resp.status(), 200);
        let (names, data) = named_events(resp).await;
        assert_eq!(names.last().map(String::as_str), Some("error"), "{names:?}");
        let error = data.last().expect("error event");
        assert_eq!(error["type"], "error");
        assert!(error["message"].is_string(), "{error}");
        let resp = stream_on(&gw, "/v1/messages").await;
        assert_eq!(resp.status(), 200);
        let (names, data) = named_events(resp).await;
        assert_eq!(names.last().map(String::as_str), Some("error"), "{names:?}");
        let error = data.last().expect("error event");
        assert_eq!(error["type"], "error");
        assert!(
            error["error"]["type"].is_string(),
            "Anthropic's shape: {error}"
        );
        gw.wait_idle().await;
        let stats = cut.stats();
        assert_eq!(stats.requests_total, 2, "never replayed: {stats:?}");
        assert_eq!(stats.faults.disconnect, 2);
    });
}

// proves: WIRE-1 (a Responses load needing several windows draws no
// provider 429: admission is exact on this route too), Q-7, Q-15
//
// The simulator runs on its own runtime ([`RemoteSim`]): "no provider 429"
// holds while requests reach it within the arrival bound of being sent
// (Q-15), which a simulator queued behind the gateway's burst on the same
// runtime does not guarantee on a loaded machine.
#[test]
fn responses_load_over_several_windows_draws_no_provider_429() {
    runtime().block_on(async {
        let sim = RemoteSim::start(SimConfig {
            rpm: Some(10),
            window: Duration::from_secs(1),
            completion_tokens: 4,
            ..SimConfig::default()
        })
        .await;
        let gw = both_dialects(&sim, "limits = [{ requests = 10, per = \"1s\" }]").await;
        let mut tasks = Vec::new();
        for i in 0..30 {
            let (url, stream) = (gw.url("/v1/responses"), i % 2 == 0);
            tasks.push(tokio::spawn(async move {
                let resp = client()
                    .post(url)
                    .bearer_auth(KEY_A)
                    .json(&responses_body(stream))
                    .send()
                    .await
                    .expect("answered");
                let status = resp.status().as_u16();
                let body = resp.text().await.unwrap_or_default();
                (status, body)
            }));
        }
        for t in tasks {
            let (status, body) = t.await.expect("task");
            assert_eq!(status, 200, "{body}");
            assert!(
                body.contains("response.completed") || body.contains("\"object\":\"response\""),
                "{body}"
            );
        }
        gw.wait_idle().await;
        let stats = sim.stats();
        assert_eq!(stats.routes.responses, 30);
        assert_eq!(stats.rejected_429.total(), 0, "{stats:?}");
        assert!(stats.max_requests_in_window <= 10, "{stats:?}");
    });
}

// proves: WIRE-3, CD-1 (an Anthropic 429, with its retry-after and
// anthropic-ratelimit-* headers, starts the scope's cooldown; calls retried
// after it all succeed and the client sees no error)
#[test]
fn anthropic_429s_start_a_cooldown_from_their_hint() {
    runtime().block_on(async {
        let sim = sim(SimConfig {
            anthropic_key: Some(ANTHROPIC_KEY.to_owned()),
            window: Duration::from_secs(1),
            itpm: Some(300),
            completion_tokens: 4,
            ..SimConfig::default()
        })
        .await;
        // No limits configured: the gateway learns of the provider's only
        // through its 429s.
        let gw = Gateway::start(&format!(
            r#"
[retry]
base_delay = "10ms"
max_delay = "50ms"
max_attempts = 8
max_wait = "10s"

[providers.ant]
flavor = "anthropic"
base_url = "{}"
api_key_env = "{ANTHROPIC_KEY_VAR}"

[models.c]
provider = "ant"
upstream_model = "sim-claude"

{}
"#,
            sim.openai_base_url(),
            tenants("", "")
        ))
        .await;
        let prompt = "word ".repeat(80);
        let body = json!({
            "model": "c",
            "messages": [{"role": "user", "content": prompt}],
            "max_tokens": 4,
        });
        messages_load(&gw, 8, 8, body).await;
        gw.wait_idle().await;
        let stats = sim.stats();
        assert!(stats.rejected_429.itpm > 0, "the load drew 429s: {stats:?}");
        assert_eq!(stats.routes.messages - stats.rejected_429.total(), 8);
        let scope = gw.upstream_scope("model:c");
        assert!(
            scope.counters.cooldowns > 0,
            "a 429 started the scope's cooldown: {scope:?}"
        );
    });
}

// proves: WIRE-2, CD-1 (Azure's 429s, with Azure's body and its
// retry-after / retry-after-ms / x-ratelimit-* headers, are understood: the
// scope cools down, the calls are retried and all succeed)
#[test]
fn azure_429s_are_retried_after_their_hint() {
    runtime().block_on(async {
        let sim = sim(SimConfig {
            azure_key: Some(AZURE_KEY.to_owned()),
            window: Duration::from_secs(1),
            rpm: Some(3),
            ..SimConfig::default()
        })
        .await;
        let base = sim.openai_base_url();
        // No limits configured: the gateway learns of Azure's only through
        // its 429s.
        let gw = Gateway::start(&format!(
            r#"
[retry]
base_delay = "10ms"
max_delay = "50ms"
max_attempts = 8
max_wait = "10s"

[providers.az]
flavor = "azure"
base_url = "{}"
api_version = "2024-10-21"
api_key_env = "{AZURE_KEY_VAR}"

[models.m]
provider = "az"
upstream_model = "gpt-4o-prod"

{}
"#,
            base.trim_end_matches("/v1"),
            tenants("", "")
        ))
        .await;
        let mut calls = Vec::new();
        for _ in 0..6 {
            let (url, body) = (gw.url("/v1/chat/completions"), chat("m", false));
            calls.push(tokio::spawn(async move {
                client()
                    .post(url)
                    .bearer_auth(KEY_A)
                    .json(&body)
                    .send()
                    .await
                    .expect("answered")
                    .status()
                    .as_u16()
            }));
        }
        for call in calls {
            assert_eq!(call.await.expect("task"), 200);
        }
        gw.wait_idle().await;
        let stats = sim.stats();
        assert!(stats.rejected_429.rpm > 0, "the load drew 429s: {stats:?}");
        assert_eq!(stats.ok, 6);
        let scope = gw.upstream_scope("model:m");
        assert!(scope.counters.cooldowns > 0, "{scope:?}");
    });
}

// proves: DL-1, GW-17, WIRE-3 (a tiny deadline on /v1/messages: a one-shot
// call past it is a 504 in Anthropic's format, a stream past it ends with
// Anthropic's error event; nothing is held afterwards)
#[test]
fn messages_calls_past_a_tiny_deadline_end_in_anthropics_format() {
    runtime().block_on(async {
        let sim = sim(SimConfig {
            anthropic_key: Some(ANTHROPIC_KEY.to_owned()),
            per_token: Duration::from_millis(50),
            completion_tokens: 60,
            ..SimConfig::default()
        })
        .await;
        let gw = Gateway::start(&one_model_config(
            &anthropic_provider(&sim),
            "rpm = 600",
            "upstream_model = \"sim-claude\"",
        ))
        .await;
        let call = |stream: bool| {
            client()
                .post(gw.url("/v1/messages"))
                .header("x-api-key", KEY_A)
                .header("x-request-timeout", "1")
                .json(&messages_body(stream, 60))
                .send()
        };
        let resp = bounded("one-shot answered", call(false))
            .await
            .expect("answered");
        assert_eq!(resp.status(), 504);
        let body: Value = resp.json().await.expect("json");
        assert_eq!(body["type"], "error", "{body}");
        assert_eq!(body["error"]["type"], "timeout_error", "{body}");

        let resp = bounded("stream answered", call(true))
            .await
            .expect("answered");
        assert_eq!(resp.status(), 200);
        let (names, data) = named_events(resp).await;
        assert_eq!(names.last().map(String::as_str), Some("error"), "{names:?}");
        assert_eq!(data.last().expect("error event")["type"], "error");
        gw.wait_idle().await;
        assert!(gw.is_idle());
    });
}

// proves: GW-1 (every answer of the API listener is an error in the
// route's format, also for a path no route serves and for a method the
// model list does not serve; `GET /v1/models/{model}`, the SDKs'
// `models.retrieve`, answers a configured model and 404 `model_not_found`
// otherwise). Found by a hostile-client review: those paths answered an
// empty 404 or 405 that an SDK cannot read.
#[test]
fn unknown_paths_and_the_model_list_answer_in_the_openai_format() {
    runtime().block_on(async {
        let sim = fast_sim().await;
        let slashed = "\n[models.\"org/m\"]\nprovider = \"sim\"\nupstream_model = \"sim-chat\"\n";
        let config = two_models(&sim.openai_base_url(), "", "") + slashed;
        let gw = Gateway::start(&config).await;
        let c = client();
        let send = |r: reqwest::RequestBuilder, what: String| async move {
            bounded("answered", r.send())
                .await
                .unwrap_or_else(|e| panic!("{what}: {e}"))
        };
        for path in [
            "/v1/completions",
            "/v1/chat/completions/",
            "//v1/chat/completions",
            "/nothing",
        ] {
            let r = send(
                c.post(gw.url(path)).bearer_auth(KEY_A).body("{}"),
                path.into(),
            )
            .await;
            assert_eq!(r.status(), 404, "{path}");
            assert!(header(&r, "x-request-id").is_some(), "{path}");
            let v: Value = r.json().await.expect("a JSON body");
            assert_eq!(v["error"]["code"], "unknown_url", "{path}: {v}");
            assert_eq!(v["error"]["type"], "invalid_request_error", "{path}: {v}");
        }
        let r = send(
            c.post(gw.url("/v1/messages/")).header("x-api-key", KEY_A),
            "messages/".into(),
        )
        .await;
        assert_eq!(r.status(), 404);
        let v: Value = r.json().await.expect("a JSON body");
        assert_eq!(v["type"], "error", "Anthropic's shape: {v}");
        for path in ["/v1/models", "/v1/models/chat"] {
            let r = send(c.post(gw.url(path)).bearer_auth(KEY_A), path.into()).await;
            assert_eq!(r.status(), 405, "{path}");
            assert_eq!(header(&r, "allow").as_deref(), Some("GET, HEAD"), "{path}");
            let v: Value = r.json().await.expect("a JSON body");
            assert_eq!(v["error"]["code"], "method_not_allowed", "{path}: {v}");
        }
        let r = send(
            c.get(gw.url("/v1/models/chat")).bearer_auth(KEY_A),
            "retrieve".into(),
        )
        .await;
        assert_eq!(r.status(), 200);
        assert!(header(&r, "x-request-id").is_some());
        let v: Value = r.json().await.expect("a model");
        assert_eq!(
            (v["id"].as_str(), v["object"].as_str()),
            (Some("chat"), Some("model")),
            "{v}"
        );
        // A name with a slash, as sent by an SDK that does not encode it.
        let r = send(
            c.get(gw.url("/v1/models/org/m")).bearer_auth(KEY_A),
            "slashed".into(),
        )
        .await;
        assert_eq!(r.status(), 200);
        let v: Value = r.json().await.expect("a model");
        assert_eq!(v["id"], "org/m", "{v}");
        // A name that is not UTF-8 once decoded names no model.
        let r = send(
            c.get(gw.url("/v1/models/%FF")).bearer_auth(KEY_A),
            "not UTF-8".into(),
        )
        .await;
        let (status, _, error) = error_of(r).await;
        assert_eq!((status, code(&error)), (404, "model_not_found"));
        let r = send(
            c.get(gw.url("/v1/models/sim-chat")).bearer_auth(KEY_A),
            "upstream name".into(),
        )
        .await;
        let (status, _, error) = error_of(r).await;
        assert_eq!((status, code(&error)), (404, "model_not_found"));
        let r = send(c.get(gw.url("/v1/models/chat")), "no key".into()).await;
        assert_eq!(r.status(), 401);
        assert_eq!(sim.stats().requests_total, 0);
    });
}

// proves: GW-1, WIRE-3, WIRE-4 (a GET or HEAD on a model route, which
// serves POST only, answers 405 with `allow: POST` and an error in the
// route's dialect: OpenAI's shape on the OpenAI routes, Anthropic's on
// /v1/messages). Found in review: the router answered an empty 405.
#[test]
fn other_methods_on_post_routes_answer_in_the_routes_dialect() {
    runtime().block_on(async {
        let sim = fast_sim().await;
        let gw = Gateway::start(&two_models(&sim.openai_base_url(), "", "")).await;
        let c = client();
        for path in ["/v1/chat/completions", "/v1/embeddings", "/v1/responses"] {
            let r = bounded(path, c.get(gw.url(path)).bearer_auth(KEY_A).send())
                .await
                .expect("answered");
            assert_eq!(r.status(), 405, "{path}");
            assert_eq!(header(&r, "allow").as_deref(), Some("POST"), "{path}");
            let v: Value = r.json().await.expect("a JSON body");
            assert_eq!(v["error"]["code"], "method_not_allowed", "{path}: {v}");
            assert!(v["error"]["message"].is_string(), "{path}: {v}");
        }
        let r = bounded(
            "GET messages",
            c.get(gw.url("/v1/messages"))
                .header("x-api-key", KEY_A)
                .send(),
        )
        .await
        .expect("answered");
        assert_eq!(r.status(), 405);
        assert_eq!(header(&r, "allow").as_deref(), Some("POST"));
        let v: Value = r.json().await.expect("a JSON body");
        assert_eq!(v["type"], "error", "{v}");
        assert_eq!(v["error"]["type"], "invalid_request_error", "{v}");
        assert!(v["error"]["message"].is_string(), "{v}");
        let r = bounded(
            "HEAD chat",
            c.head(gw.url("/v1/chat/completions"))
                .bearer_auth(KEY_A)
                .send(),
        )
        .await
        .expect("answered");
        assert_eq!(r.status(), 405);
        assert_eq!(header(&r, "allow").as_deref(), Some("POST"));
    });
}

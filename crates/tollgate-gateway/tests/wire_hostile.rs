//! The wider wire end to end, adversarially (SPEC WIRE-1..4, Q-5, Q-12, GW-2,
//! GW-4, GW-12, GW-15): a hostile client and odd upstreams against a real
//! gateway. The upstream (`common::Scripted`) answers any path with
//! scripted raw bytes and records what it received.

mod common;

use common::upstream::{Reply, Scripted};
use common::*;
use futures_util::StreamExt;
use serde_json::{Value, json};
use tollgate::quota::Dimension;
use tollgate_gateway::config::GatewayConfig;

const ANT_KEY_VAR: &str = "TOLLGATE_TEST_REVIEW_ANT_KEY";
const ANT_KEY: &str = "ant-review-upstream-secret";
const COMPAT_KEY_VAR: &str = "TOLLGATE_TEST_REVIEW_COMPAT_KEY";
const COMPAT_KEY: &str = "compat-review-upstream-secret";
const AZURE_KEY_VAR: &str = "TOLLGATE_TEST_REVIEW_AZURE_KEY";
const AZURE_KEY: &str = "azure-review-upstream-secret";
/// The admin key (cargo sets this variable for the test process).
const ADMIN: &str = env!("CARGO_PKG_NAME");

fn runtime() -> tokio::runtime::Runtime {
    runtime_with_env(&[
        (ANT_KEY_VAR, ANT_KEY),
        (COMPAT_KEY_VAR, COMPAT_KEY),
        (AZURE_KEY_VAR, AZURE_KEY),
    ])
}

// ---------------------------------------------------------------------------
// Raw scripted replies (the upstream is `common::Scripted`).

fn raw_json(status: u16, body: Value) -> Reply {
    Reply::Raw {
        status,
        headers: vec![("content-type", "application/json".to_owned())],
        chunks: vec![body.to_string()],
        cut: false,
    }
}

fn raw_sse(chunks: Vec<String>, cut: bool) -> Reply {
    Reply::Raw {
        status: 200,
        headers: vec![("content-type", "text/event-stream".to_owned())],
        chunks,
        cut,
    }
}

// ---------------------------------------------------------------------------
// Helpers.

fn event(name: &str, data: &Value) -> String {
    format!("event: {name}\ndata: {data}\n\n")
}

/// Anthropic stream events: `message_start` (input 25, the documented
/// placeholder output 1), `deltas` text deltas, then `tail`.
fn anthropic_events(deltas: usize, tail: &[(&str, Value)]) -> Vec<String> {
    let mut out = vec![event(
        "message_start",
        &json!({"type": "message_start", "message": {
            "id": "msg_1", "type": "message", "role": "assistant", "model": "claude-x",
            "content": [], "stop_reason": null, "stop_sequence": null,
            "usage": {"input_tokens": 25, "output_tokens": 1}
        }}),
    )];
    out.push(event(
        "content_block_start",
        &json!({"type": "content_block_start", "index": 0,
                "content_block": {"type": "text", "text": ""}}),
    ));
    for i in 0..deltas {
        out.push(event(
            "content_block_delta",
            &json!({"type": "content_block_delta", "index": 0,
                    "delta": {"type": "text_delta", "text": format!("word{i} ")}}),
        ));
    }
    for (name, data) in tail {
        out.push(event(name, data));
    }
    out
}

/// A gateway with an `anthropic` provider at `upstream`, scope `main`
/// (`scope` lines), model `c` (`upstream_model = "claude-x"`), tenants a
/// and b (`b_extra` lines for b), `extra` TOML appended.
fn anthropic_config(upstream: &Scripted, scope: &str, b_extra: &str, extra: &str) -> String {
    anthropic_config_a(upstream, scope, "", b_extra, extra)
}

/// [`anthropic_config`] with `a_extra` lines for tenant a.
fn anthropic_config_a(
    upstream: &Scripted,
    scope: &str,
    a_extra: &str,
    b_extra: &str,
    extra: &str,
) -> String {
    format!(
        r#"
[server]
admin_key_env = "CARGO_PKG_NAME"

[retry]
max_attempts = 1
base_delay = "10ms"
max_delay = "50ms"

[providers.ant]
flavor = "anthropic"
base_url = "{}"
api_key_env = "{ANT_KEY_VAR}"

[scopes.main]
{scope}

[models.c]
provider = "ant"
scope = "main"
upstream_model = "claude-x"

{extra}

{}
"#,
        upstream.base_url,
        tenants(a_extra, b_extra)
    )
}

fn messages_body(stream: bool, max_tokens: u64) -> Value {
    json!({
        "model": "c",
        "messages": [{"role": "user", "content": "Say something."}],
        "max_tokens": max_tokens,
        "stream": stream,
    })
}

async fn send(req: reqwest::RequestBuilder) -> reqwest::Response {
    bounded("request answered", req.send())
        .await
        .expect("the gateway answers")
}

async fn read_all(resp: reqwest::Response) -> String {
    let mut text = String::new();
    let mut body = resp.bytes_stream();
    bounded("body ends", async {
        while let Some(Ok(chunk)) = body.next().await {
            text.push_str(&String::from_utf8_lossy(&chunk));
        }
    })
    .await;
    text
}

/// Output tokens taken from `scope`'s output-token limit (limit minus
/// available).
fn output_used(gw: &Gateway, scope: &str) -> i64 {
    let s = gw.upstream_scope(scope);
    let l = s
        .limits
        .iter()
        .find(|l| l.dimension == Dimension::OutputTokens)
        .expect("an output-token limit");
    i64::try_from(l.limit).expect("limit") - l.available
}

/// Streams one Messages call (`max_tokens` 500) through a gateway in front
/// of an upstream answering `reply`; the body the client read, and the
/// output tokens the scope's output limit keeps once everything is idle.
async fn stream_and_output_used(reply: Reply) -> (String, i64) {
    let up = Scripted::start(vec![reply]).await;
    let gw = Gateway::start(&anthropic_config(
        &up,
        "otpm = 100000\nitpm = 100000",
        "",
        "",
    ))
    .await;
    let resp = send(
        client()
            .post(gw.url("/v1/messages"))
            .header("x-api-key", KEY_A)
            .json(&messages_body(true, 500)),
    )
    .await;
    assert_eq!(resp.status(), 200);
    let text = read_all(resp).await;
    gw.wait_idle().await;
    (text, output_used(&gw, "main"))
}

/// Asserts an Anthropic-format error body.
fn assert_anthropic_error(body: &Value, kind: &str) {
    assert_eq!(body["type"], "error", "Anthropic's format: {body}");
    assert_eq!(body["error"]["type"], kind, "{body}");
    assert!(body["error"]["message"].is_string(), "{body}");
}

// proves: Q-5, Q-12, WIRE-3: a Messages stream whose `message_delta`
// carries no `usage` keeps its output allowance charged on the scope's
// output-token limit (message_start's output count is a placeholder, never
// a settlement).
#[test]
fn messages_stream_without_delta_usage_keeps_output_charged() {
    runtime().block_on(async {
        let (text, used) = stream_and_output_used(raw_sse(
            anthropic_events(
                40,
                &[
                    (
                        "content_block_stop",
                        json!({"type": "content_block_stop", "index": 0}),
                    ),
                    (
                        "message_delta",
                        json!({"type": "message_delta",
                               "delta": {"stop_reason": "end_turn", "stop_sequence": null}}),
                    ),
                    ("message_stop", json!({"type": "message_stop"})),
                ],
            ),
            false,
        ))
        .await;
        assert!(text.contains("message_stop"), "{text}");
        assert!(
            used >= 40,
            "40 output deltas streamed, but the scope's output-token limit keeps only \
             {used} token(s) of the 500 reserved"
        );
    });
}

// proves: Q-5, Q-12, LC-3: a Messages stream cut after 40 deltas keeps
// its output estimate (the engine settles a failed stream only from a
// `Usage` event, never from the usage the stream's error carries, which for
// Messages is message_start's placeholder).
#[test]
fn messages_stream_cut_mid_answer_keeps_output_charged() {
    runtime().block_on(async {
        let (text, used) = stream_and_output_used(raw_sse(anthropic_events(40, &[]), true)).await;
        assert!(text.contains("event: error"), "{text}");
        assert!(
            used >= 40,
            "40 output deltas streamed before the cut, but the scope's output-token limit \
             keeps only {used} token(s) of the 500 reserved"
        );
    });
}

// proves: WIRE-2, GW-2, CFG-3: `auth_header` cannot name a header the
// gateway sets itself (`x-request-id` would carry the client's value where
// the key belongs; `content-type`, `host`, `content-length` cannot work).
#[test]
fn auth_header_cannot_be_a_header_the_gateway_sets() {
    runtime().block_on(async {
        let toml = |header: &str, base: &str| {
            format!(
                r#"
[providers.up]
flavor = "openai_compatible"
base_url = "{base}"
api_key_env = "{COMPAT_KEY_VAR}"
auth_header = "{header}"

[models.m]
provider = "up"

{}
"#,
                tenants("", "")
            )
        };
        let mut accepted = Vec::new();
        for header in ["X-Request-Id", "Content-Type", "Host", "Content-Length"] {
            if GatewayConfig::from_toml(&toml(header, "http://127.0.0.1:9/v1"), "t.toml").is_ok() {
                accepted.push(header);
            }
        }
        let up = Scripted::start(vec![raw_json(
            200,
            json!({"id": "x", "object": "chat.completion", "choices": [],
                   "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}),
        )])
        .await;
        if GatewayConfig::from_toml(&toml("X-Request-Id", &up.base_url), "t.toml").is_ok() {
            let gw = Gateway::start(&toml("X-Request-Id", &up.base_url)).await;
            let resp = send(
                client()
                    .post(gw.url("/v1/chat/completions"))
                    .bearer_auth(KEY_A)
                    .header("x-request-id", "client-chosen-credential")
                    .json(&chat("m", false)),
            )
            .await;
            assert_eq!(resp.status(), 200);
            let seen = up.seen();
            let h = &seen[0].headers;
            assert!(
                format!("{h:?}").contains(COMPAT_KEY),
                "the gateway's key never reached the upstream; its auth header carried \
                 {:?} (the client's x-request-id). Accepted auth_header values: {accepted:?}",
                h.get("x-request-id")
            );
        }
        assert!(
            accepted.is_empty(),
            "auth_header accepted for headers the gateway sets: {accepted:?}"
        );
    });
}

// proves: GW-4, GW-7: `max_tokens` near u64::MAX on a tenant without token
// limits is served or refused, never a panic that leaks the tenant's
// permit (the engine's token counters saturate).
#[test]
fn huge_max_tokens_does_not_break_the_tenant() {
    runtime().block_on(async {
        let ok = raw_json(
            200,
            json!({"id": "msg_1", "type": "message", "content": [],
                   "usage": {"input_tokens": 5, "output_tokens": 3}}),
        );
        let up = Scripted::start(vec![ok]).await;
        let gw = Gateway::start(&anthropic_config_a(
            &up,
            "rpm = 1000",
            "concurrency = 1",
            "",
            "",
        ))
        .await;
        let normal = || {
            client()
                .post(gw.url("/v1/messages"))
                .header("x-api-key", KEY_A)
                .header("x-request-timeout", "3")
                .json(&messages_body(false, 16))
        };
        assert_eq!(send(normal()).await.status(), 200);
        let hostile = bounded(
            "hostile request answered",
            client()
                .post(gw.url("/v1/messages"))
                .header("x-api-key", KEY_A)
                .json(&messages_body(false, u64::MAX))
                .send(),
        )
        .await;
        let after = send(normal()).await;
        assert!(
            hostile.is_ok(),
            "max_tokens = u64::MAX got no HTTP answer (the handler panicked): {hostile:?}; \
             the tenant's next call then answered {}",
            after.status()
        );
        assert_eq!(after.status(), 200, "the tenant keeps working");
    });
}

// ---------------------------------------------------------------------------
// Checks expected to hold.

// proves: WIRE-3, GW-2: only the gateway's key goes upstream (x-api-key),
// never the client's key in either header; the client's anthropic-version
// and anthropic-beta go upstream; both headers present ⇒ judged by
// Authorization; a non-UTF-8 or unknown x-api-key is a 401 in Anthropic's
// format.
#[test]
fn messages_keys_and_forwarded_headers() {
    runtime().block_on(async {
        let ok = raw_json(
            200,
            json!({"id": "msg_1", "type": "message", "role": "assistant", "content": [],
                   "model": "claude-x", "stop_reason": "end_turn",
                   "usage": {"input_tokens": 5, "output_tokens": 3}}),
        );
        let up = Scripted::start(vec![ok]).await;
        let gw = Gateway::start(&anthropic_config(&up, "rpm = 100", "", "")).await;
        let resp = send(
            client()
                .post(gw.url("/v1/messages"))
                .header("x-api-key", KEY_A)
                .header("anthropic-version", "2099-01-01")
                .header("anthropic-beta", "some-beta-2025")
                .json(&messages_body(false, 16)),
        )
        .await;
        assert_eq!(resp.status(), 200);
        let seen = up.seen();
        let h = &seen[0].headers;
        assert_eq!(h["x-api-key"], ANT_KEY);
        assert!(h.get("authorization").is_none(), "{h:?}");
        assert_eq!(h["anthropic-version"], "2099-01-01");
        assert_eq!(h["anthropic-beta"], "some-beta-2025");
        assert!(!format!("{h:?}").contains(KEY_A));
        assert_eq!(seen[0].uri, "/v1/messages");

        // Both headers: Authorization decides (a bad bearer is a 401 even
        // with a good x-api-key).
        let resp = send(
            client()
                .post(gw.url("/v1/messages"))
                .bearer_auth("sk-nope")
                .header("x-api-key", KEY_A)
                .json(&messages_body(false, 16)),
        )
        .await;
        assert_eq!(resp.status(), 401);
        let body: Value = resp.json().await.expect("json");
        assert_anthropic_error(&body, "authentication_error");
        // Non-UTF-8 x-api-key.
        let resp = send(
            client()
                .post(gw.url("/v1/messages"))
                .header(
                    "x-api-key",
                    http::HeaderValue::from_bytes(b"sk-\xff\xfe").expect("header"),
                )
                .json(&messages_body(false, 16)),
        )
        .await;
        assert_eq!(resp.status(), 401);
        let body: Value = resp.json().await.expect("json");
        assert_anthropic_error(&body, "authentication_error");
        // x-api-key is not a key on the OpenAI routes.
        let resp = send(
            client()
                .post(gw.url("/v1/responses"))
                .header("x-api-key", KEY_A)
                .json(&json!({"model": "c", "input": "hi"})),
        )
        .await;
        assert_eq!(resp.status(), 401);
        assert_eq!(up.seen().len(), 1, "nothing else reached the upstream");
    });
}

// proves: WIRE-3, GW-4, GW-13: an upstream 429 on /v1/messages is a 429
// in Anthropic's format with retry-after; malformed bodies are 400s in
// Anthropic's format and never reach the upstream; a huge max_tokens is
// refused before any upstream call.
#[test]
fn messages_errors_are_anthropic_shaped() {
    runtime().block_on(async {
        let limited = Reply::Raw {
            status: 429,
            headers: vec![
                ("content-type", "application/json".to_owned()),
                ("retry-after", "3".to_owned()),
            ],
            chunks: vec![
                json!({"type": "error", "error": {"type": "rate_limit_error",
                                 "message": "slow down"}})
                .to_string(),
            ],
            cut: false,
        };
        let up = Scripted::start(vec![limited]).await;
        let gw = Gateway::start(&anthropic_config(&up, "otpm = 100000", "", "")).await;
        let resp = send(
            client()
                .post(gw.url("/v1/messages"))
                .header("x-api-key", KEY_A)
                .json(&messages_body(false, 16)),
        )
        .await;
        assert_eq!(resp.status(), 429);
        assert!(resp.headers().get("retry-after").is_some());
        let body: Value = resp.json().await.expect("json");
        assert_anthropic_error(&body, "rate_limit_error");
        let before = up.seen().len();
        for bad in [
            json!([]),
            json!({"model": "c", "messages": "hi"}),
            json!({"model": "c", "messages": [], "max_tokens": -1}),
            json!({"model": "c", "messages": [], "stream": "yes"}),
            json!({"model": "c", "messages": [{"role": "user"}]}),
            json!({"model": ["c"], "messages": []}),
        ] {
            let resp = send(
                client()
                    .post(gw.url("/v1/messages"))
                    .header("x-api-key", KEY_A)
                    .json(&bad),
            )
            .await;
            assert_eq!(resp.status(), 400, "{bad}");
            let body: Value = resp.json().await.expect("json");
            assert_anthropic_error(&body, "invalid_request_error");
        }
        assert_eq!(
            up.seen().len(),
            before,
            "no upstream call for refused bodies"
        );
    });
}

// proves: GW-12, WIRE-4: a tenant that may not call `c` gets the same 404
// as for an unknown model, in Anthropic's format; a model of another
// dialect is unknown on /v1/messages.
#[test]
fn messages_tenant_policy_does_not_leak_models() {
    runtime().block_on(async {
        let up = Scripted::start(vec![raw_json(200, json!({}))]).await;
        let extra = format!(
            "[providers.oa]\nbase_url = \"{}\"\n[models.g]\nprovider = \"oa\"\n",
            up.base_url
        );
        let gw = Gateway::start(&anthropic_config(
            &up,
            "rpm = 100",
            "models = [\"g\"]",
            &extra,
        ))
        .await;
        let ask = |key: &'static str, model: &'static str| {
            let mut body = messages_body(false, 16);
            body["model"] = json!(model);
            send(
                client()
                    .post(gw.url("/v1/messages"))
                    .header("x-api-key", key)
                    .json(&body),
            )
        };
        let mut bodies = Vec::new();
        for (key, model) in [(KEY_B, "c"), (KEY_B, "nope"), (KEY_A, "g")] {
            let resp = ask(key, model).await;
            assert_eq!(resp.status(), 404, "{key} {model}");
            let body: Value = resp.json().await.expect("json");
            assert_anthropic_error(&body, "not_found_error");
            bodies.push(
                body["error"]["message"]
                    .as_str()
                    .unwrap_or("")
                    .replace(model, "M"),
            );
        }
        assert!(bodies.windows(2).all(|w| w[0] == w[1]), "{bodies:?}");
        assert!(up.seen().is_empty());
    });
}

// proves: WIRE-2: Azure's URL: deployment path, api-version and static
// query parameters encoded; key in api-key only.
#[test]
fn azure_url_and_query_encoding() {
    runtime().block_on(async {
        let up = Scripted::start(vec![raw_json(
            200,
            json!({"id": "x", "object": "chat.completion", "choices": [],
                   "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}),
        )])
        .await;
        let gw = Gateway::start(&format!(
            r#"
[providers.az]
flavor = "azure"
base_url = "{}/"
api_version = "2024-10-01-preview"
api_key_env = "{AZURE_KEY_VAR}"
query = {{ "a&b" = "c=d e", "x" = "é" }}

[models.m]
provider = "az"
upstream_model = "gpt-4o.prod_1"

{}
"#,
            up.root(),
            tenants("", "")
        ))
        .await;
        let resp = send(
            client()
                .post(gw.url("/v1/chat/completions"))
                .bearer_auth(KEY_A)
                .json(&chat("m", false)),
        )
        .await;
        assert_eq!(resp.status(), 200);
        let seen = up.seen();
        assert_eq!(
            seen[0].uri,
            "/openai/deployments/gpt-4o.prod_1/chat/completions?\
             api-version=2024-10-01-preview&a%26b=c%3Dd+e&x=%C3%A9"
        );
        assert_eq!(seen[0].headers["api-key"], AZURE_KEY);
        assert!(seen[0].headers.get("authorization").is_none());
        let body = &seen[0].body;
        assert_eq!(body["model"], "gpt-4o.prod_1");
    });
}

// proves: GW-15, WIRE-2, WIRE-4: a reload that changes a provider's
// flavour from openai to anthropic moves its model to /v1/messages, with
// Anthropic's key header and URL.
#[test]
fn reload_changes_the_flavour() {
    runtime().block_on(async {
        let ok_chat = raw_json(
            200,
            json!({"id": "x", "object": "chat.completion", "choices": [],
                   "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}),
        );
        let up = Scripted::start(vec![
            ok_chat,
            raw_json(
                200,
                json!({"id": "msg_1", "type": "message", "content": [],
                       "usage": {"input_tokens": 5, "output_tokens": 3}}),
            ),
        ])
        .await;
        let file = |flavor: &str| {
            format!(
                r#"
[server]
admin_key_env = "CARGO_PKG_NAME"

[providers.p]
flavor = "{flavor}"
base_url = "{}"
api_key_env = "{ANT_KEY_VAR}"

[models.m]
provider = "p"
upstream_model = "claude-x"

{}
"#,
                up.base_url,
                tenants("", "")
            )
        };
        let (gw, path) = Gateway::start_file(&file("openai")).await;
        let resp = send(
            client()
                .post(gw.url("/v1/chat/completions"))
                .bearer_auth(KEY_A)
                .json(&chat("m", false)),
        )
        .await;
        assert_eq!(resp.status(), 200);
        std::fs::write(&path, file("anthropic")).expect("rewrite");
        let r = send(client().post(gw.url("/admin/reload")).bearer_auth(ADMIN)).await;
        assert_eq!(r.status(), 200, "{}", r.text().await.unwrap_or_default());
        let resp = send(
            client()
                .post(gw.url("/v1/chat/completions"))
                .bearer_auth(KEY_A)
                .json(&chat("m", false)),
        )
        .await;
        assert_eq!(resp.status(), 404);
        let mut body = messages_body(false, 16);
        body["model"] = json!("m");
        let resp = send(
            client()
                .post(gw.url("/v1/messages"))
                .header("x-api-key", KEY_A)
                .json(&body),
        )
        .await;
        assert_eq!(resp.status(), 200);
        let seen = up.seen();
        assert_eq!(seen.len(), 2);
        assert_eq!(seen[1].uri, "/v1/messages");
        assert_eq!(seen[1].headers["x-api-key"], ANT_KEY);
        assert!(seen[1].headers.get("authorization").is_none());
        assert_eq!(seen[1].headers["anthropic-version"], "2023-06-01");
        let _ = std::fs::remove_file(&path);
    });
}

// proves: WIRE-1, Q-5: hostile Responses bodies never panic the gateway;
// a response.failed stream is delivered once and settles with its usage.
#[test]
fn responses_hostile_bodies_and_failed_stream() {
    runtime().block_on(async {
        let failed = raw_sse(
            vec![
                event(
                    "response.created",
                    &json!({"type": "response.created", "response": {"usage": null}}),
                ),
                event(
                    "response.failed",
                    &json!({"type": "response.failed", "response": {
                        "usage": {"input_tokens": 7, "output_tokens": 2, "total_tokens": 9},
                        "error": {"code": "server_error", "message": "boom"}}}),
                ),
            ],
            false,
        );
        let up = Scripted::start(vec![failed]).await;
        let gw = Gateway::start(&format!(
            r#"
[providers.oa]
base_url = "{}"
[scopes.main]
tpm = 100000
[models.g]
provider = "oa"
scope = "main"
upstream_model = "gpt-4o"

{}
"#,
            up.base_url,
            tenants("", "")
        ))
        .await;
        for bad in [
            json!({"model": "g", "input": 5}),
            json!({"model": "g", "input": {"role": "user", "content": {"deep": [1, 2]}}}),
            json!({"model": "g", "input": [null, 1, "x", [[]], {"type": "function_call_output",
                   "output": {"a": 1}}], "max_output_tokens": 1}),
            json!({"model": "g", "tools": [1, "x", null], "input": "x", "max_output_tokens": 1}),
            json!({"model": "g", "text": {"format": {"type": "json_schema"}}, "input": "x",
                   "max_output_tokens": 1}),
        ] {
            let resp = send(
                client()
                    .post(gw.url("/v1/responses"))
                    .bearer_auth(KEY_A)
                    .json(&bad),
            )
            .await;
            // Forwarded (the upstream judges) or refused: never a crash.
            assert!(
                resp.status().as_u16() < 500 || resp.status() == 502,
                "{bad}"
            );
        }
        let n = up.seen().len();
        let resp = send(
            client()
                .post(gw.url("/v1/responses"))
                .bearer_auth(KEY_A)
                .json(&json!({"model": "g", "input": "x", "stream": true,
                              "max_output_tokens": 100})),
        )
        .await;
        assert_eq!(resp.status(), 200);
        let text = read_all(resp).await;
        assert_eq!(text.matches("response.failed").count(), 2, "{text}");
        assert!(
            !text.contains("event: error"),
            "one error event only: {text}"
        );
        gw.wait_idle().await;
        assert_eq!(up.seen().len(), n + 1);
    });
}

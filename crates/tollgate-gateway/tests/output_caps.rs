//! The output cap a request without one is sent with (SPEC Q-7, BUD-2),
//! in the field each provider takes (WIRE-1, WIRE-2), against a scripted
//! upstream that records what it received.

mod common;

use common::upstream::{Reply, Scripted};
use common::*;
use serde_json::{Value, json};

const AZURE_KEY_VAR: &str = "TOLLGATE_TEST_OUTPUT_CAPS_AZURE_KEY";

fn runtime() -> tokio::runtime::Runtime {
    runtime_with_env(&[(AZURE_KEY_VAR, "az-upstream-secret")])
}

/// The body upstream received for one chat request `body` through a
/// provider configured by `provider` (`{root}` and `{base}` stand for the
/// scripted upstream's root and OpenAI base URLs).
async fn sent(provider: &str, model: &str, path: &str, body: Value) -> Value {
    let up = Scripted::start(vec![Reply::ok()]).await;
    let provider = provider
        .replace("{root}", up.root())
        .replace("{base}", &up.base_url);
    let gw = Gateway::start(&one_model_config(&provider, "rpm = 600", model)).await;
    let resp = post_json(&gw, path, KEY_A, &body).await;
    assert_eq!(resp.status(), 200, "{provider}");
    let seen = up.seen();
    assert_eq!(seen.len(), 1);
    seen[0].body.clone()
}

fn chat() -> Value {
    json!({"model": "m", "messages": [{"role": "user", "content": "hi"}]})
}

// proves: Q-7, BUD-2, WIRE-2 (a chat request without a cap goes with the
// reserved allowance: max_completion_tokens to OpenAI and to Azure from
// api-version 2024-09-01 on, max_tokens to an older Azure version, which
// refuses the other, and to an OpenAI-compatible server; a request with a
// cap of its own keeps it, and nothing is added)
#[test]
fn a_chat_request_without_a_cap_gets_the_providers_field() {
    runtime().block_on(async {
        let azure = |version: &str| {
            format!(
                "flavor = \"azure\"\nbase_url = \"{{root}}\"\napi_version = \"{version}\"\n\
                 api_key_env = \"{AZURE_KEY_VAR}\""
            )
        };
        let cases = [
            ("base_url = \"{base}\"".to_owned(), "max_completion_tokens"),
            (azure("2024-10-21"), "max_completion_tokens"),
            (azure("2025-01-01-preview"), "max_completion_tokens"),
            (azure("2024-06-01"), "max_tokens"),
            (
                "flavor = \"openai_compatible\"\nbase_url = \"{base}\"".to_owned(),
                "max_tokens",
            ),
        ];
        for (provider, field) in cases {
            let body = sent(
                &provider,
                "default_max_tokens = 300",
                "/v1/chat/completions",
                chat(),
            )
            .await;
            assert_eq!(body[field], 300, "{provider}: {body}");
            let other = if field == "max_tokens" {
                "max_completion_tokens"
            } else {
                "max_tokens"
            };
            assert!(body.get(other).is_none(), "{provider}: {body}");
        }
        let mut own = chat();
        own["max_tokens"] = json!(12);
        let body = sent("base_url = \"{base}\"", "", "/v1/chat/completions", own).await;
        assert_eq!(body["max_tokens"], 12);
        assert!(body.get("max_completion_tokens").is_none(), "{body}");
    });
}

// proves: Q-7, BUD-2, WIRE-1 (a Responses request without a cap goes with
// the reserved allowance, never below the API's minimum of 16, which the
// reservation counts too)
#[test]
fn a_responses_request_without_a_cap_gets_at_least_16() {
    runtime().block_on(async {
        let input = json!({"model": "m", "input": "Classify: spam or ham?"});
        for (default, cap) in [(8, 16), (300, 300)] {
            let model = format!("default_max_tokens = {default}");
            let body = sent(
                "base_url = \"{base}\"",
                &model,
                "/v1/responses",
                input.clone(),
            )
            .await;
            assert_eq!(body["max_output_tokens"], cap, "{body}");
        }
    });
}

// proves: Q-7, WIRE-2 (a request that sets only max_completion_tokens is
// sent to a provider written max_tokens (an OpenAI-compatible server, an
// older Azure version, which may not know the newer field) with max_tokens
// set to the same value, so the provider cannot write past what was
// reserved; to OpenAI it goes as it came)
#[test]
fn a_cap_in_the_newer_field_reaches_a_max_tokens_provider() {
    runtime().block_on(async {
        let mut own = chat();
        own["max_completion_tokens"] = json!(21);
        let compatible = "flavor = \"openai_compatible\"\nbase_url = \"{base}\"";
        let body = sent(compatible, "", "/v1/chat/completions", own.clone()).await;
        assert_eq!(
            (&body["max_completion_tokens"], &body["max_tokens"]),
            (&json!(21), &json!(21)),
            "{body}"
        );
        let body = sent("base_url = \"{base}\"", "", "/v1/chat/completions", own).await;
        assert_eq!(body["max_completion_tokens"], 21);
        assert!(body.get("max_tokens").is_none(), "{body}");
    });
}

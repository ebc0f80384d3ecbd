//! Tenant policies and what clients are told about their budget (SPEC
//! GW-12, GW-13): allowed models, tenant limits of any window (also per
//! model), `x-ratelimit-*` on every response and exact retry hints on 429s.

mod common;

use std::time::Instant;

use common::*;
use serde_json::Value;

// proves: GW-12 (a tenant may call only its models; another model answers
// 404 exactly as an unknown one, is not listed, and nothing goes upstream)
#[tokio::test]
async fn a_model_the_tenant_may_not_call_is_unknown_to_it() {
    let sim = fast_sim().await;
    let gw = Gateway::start(&two_models(
        &sim.openai_base_url(),
        "models = [\"chat\"]",
        "",
    ))
    .await;
    let client = client();
    let forbidden = post_chat(&client, &gw, Some(KEY_A), &chat("other", false)).await;
    let unknown = post_chat(&client, &gw, Some(KEY_A), &chat("nope", false)).await;
    let (s1, _, e1) = error_of(forbidden).await;
    let (s2, _, e2) = error_of(unknown).await;
    assert_eq!((s1, code(&e1)), (404, "model_not_found"));
    assert_eq!((s2, code(&e2)), (404, "model_not_found"));
    assert_eq!(
        e1["message"].as_str().unwrap().replace("other", "X"),
        e2["message"].as_str().unwrap().replace("nope", "X"),
        "the refusal does not tell a forbidden model from an unknown one"
    );
    assert_eq!(sim.stats().requests_total, 0);
    let ok = post_chat(&client, &gw, Some(KEY_A), &chat("chat", false)).await;
    assert_eq!(ok.status(), 200);
    // b may call both.
    let ok = post_chat(&client, &gw, Some(KEY_B), &chat("other", false)).await;
    assert_eq!(ok.status(), 200);
    let list: Value = client
        .get(gw.url("/v1/models"))
        .bearer_auth(KEY_A)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let ids: Vec<&str> = list["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["chat"]);
}

// proves: GW-12 (a tenant day limit), GW-13 (a spent limit answers 429 with
// `retry-after` and `retry-after-ms` from the instant the engine computed:
// one day after the first admission), Q-11 (at once, not after a wait)
#[tokio::test]
async fn a_spent_day_limit_answers_429_with_the_exact_retry_hint() {
    let sim = fast_sim().await;
    let gw = Gateway::start(&two_models(
        &sim.openai_base_url(),
        "limits = [{ requests = 2, per = \"1d\" }]",
        "",
    ))
    .await;
    let client = client();
    let first_sent = Instant::now();
    for _ in 0..2 {
        let r = post_chat(&client, &gw, Some(KEY_A), &chat("chat", false)).await;
        assert_eq!(r.status(), 200);
    }
    let refused = post_chat(&client, &gw, Some(KEY_A), &chat("chat", false)).await;
    let span = first_sent.elapsed();
    assert_eq!(refused.status(), 429);
    let ms = number(&refused, "retry-after-ms");
    let secs = number(&refused, "retry-after");
    let day = 86_400_000u64;
    let span_ms = u64::try_from(span.as_millis()).unwrap() + 1;
    assert!(
        ms <= day && ms >= day - span_ms,
        "retry-after-ms {ms} is one day after the first admission"
    );
    assert_eq!(secs, ms.div_ceil(1_000));
    assert_eq!(number(&refused, "x-ratelimit-remaining-requests"), 0);
    let (_, _, error) = error_of(refused).await;
    assert_eq!(code(&error), "admission_wait_deadline_exceeded");
    assert_eq!(sim.stats().requests_total, 2, "the refusal sent nothing");
    // b has no limit.
    let r = post_chat(&client, &gw, Some(KEY_B), &chat("chat", false)).await;
    assert_eq!(r.status(), 200);
    assert_eq!(header(&r, "x-ratelimit-limit-requests"), None);
}

// proves: GW-12 (a tenant's limit on one model leaves its other models
// alone)
#[tokio::test]
async fn a_per_model_limit_binds_only_that_model() {
    let sim = fast_sim().await;
    let gw = Gateway::start(&two_models(
        &sim.openai_base_url(),
        "[tenants.a.per_model.chat]\nlimits = [{ requests = 1, per = \"1h\" }]",
        "",
    ))
    .await;
    let client = client();
    let r = post_chat(&client, &gw, Some(KEY_A), &chat("chat", false)).await;
    assert_eq!(r.status(), 200);
    assert_eq!(number(&r, "x-ratelimit-remaining-requests"), 0);
    let r = post_chat(&client, &gw, Some(KEY_A), &chat("chat", false)).await;
    assert_eq!(r.status(), 429);
    assert!(number(&r, "retry-after-ms") > 3_500_000);
    let r = post_chat(&client, &gw, Some(KEY_A), &chat("other", false)).await;
    assert_eq!(r.status(), 200);
    gw.wait_idle().await;
}

// proves: GW-13 (every response carries the tenant's tightest limits; the
// remaining values go down by exactly what was reserved and settled)
#[tokio::test]
async fn remaining_goes_down_by_what_was_reserved_and_settled() {
    let sim = fast_sim().await;
    let gw = Gateway::start(&two_models(
        &sim.openai_base_url(),
        "rpm = 100\ntpm = 100000\nlimits = [{ requests = 1000, per = \"1d\" }]",
        "",
    ))
    .await;
    let client = client();
    let mut tokens_left = 100_000u64;
    for n in 1..=3u64 {
        let r = post_chat(&client, &gw, Some(KEY_A), &chat("chat", false)).await;
        assert_eq!(r.status(), 200);
        // The per-minute limit is the tightest.
        assert_eq!(number(&r, "x-ratelimit-limit-requests"), 100);
        assert_eq!(number(&r, "x-ratelimit-remaining-requests"), 100 - n);
        assert_eq!(
            header(&r, "x-ratelimit-reset-requests").as_deref(),
            Some("0s")
        );
        assert_eq!(number(&r, "x-ratelimit-limit-tokens"), 100_000);
        let remaining = number(&r, "x-ratelimit-remaining-tokens");
        let body: Value = r.json().await.unwrap();
        let used = body["usage"]["total_tokens"].as_u64().unwrap();
        tokens_left -= used;
        assert_eq!(remaining, tokens_left, "settled to the reported usage");
    }
    // A stream's headers leave before it is settled: its reservation shows.
    let r = post_chat(&client, &gw, Some(KEY_A), &chat("chat", true)).await;
    assert_eq!(number(&r, "x-ratelimit-remaining-requests"), 96);
    assert!(number(&r, "x-ratelimit-remaining-tokens") < tokens_left);
    assert!(read_sse(r).await.completed());
    // Errors after authentication carry them too.
    let r = post_chat(&client, &gw, Some(KEY_A), &chat("nope", false)).await;
    assert_eq!(r.status(), 404);
    assert_eq!(number(&r, "x-ratelimit-remaining-requests"), 96);
    gw.wait_idle().await;
}

// proves: Q-12, GW-13 (a tenant's itpm/otpm limits take the request's
// input estimate and output allowance, are settled from the reported
// prompt and completion tokens, and are told in headers of their own; a
// tenant without a tokens limit gets no `-tokens` headers)
#[tokio::test]
async fn input_and_output_limits_settle_from_the_reported_split() {
    let sim = fast_sim().await;
    let gw = Gateway::start(&two_models(
        &sim.openai_base_url(),
        "itpm = 100000\notpm = 50000",
        "",
    ))
    .await;
    let client = client();
    let (mut input_left, mut output_left) = (100_000u64, 50_000u64);
    for _ in 0..2 {
        let r = post_chat(&client, &gw, Some(KEY_A), &chat("chat", false)).await;
        assert_eq!(r.status(), 200);
        assert_eq!(header(&r, "x-ratelimit-limit-tokens"), None);
        assert_eq!(number(&r, "x-ratelimit-limit-input-tokens"), 100_000);
        assert_eq!(number(&r, "x-ratelimit-limit-output-tokens"), 50_000);
        assert_eq!(
            header(&r, "x-ratelimit-reset-output-tokens").as_deref(),
            Some("0s")
        );
        let input = number(&r, "x-ratelimit-remaining-input-tokens");
        let output = number(&r, "x-ratelimit-remaining-output-tokens");
        let body: Value = r.json().await.unwrap();
        input_left -= body["usage"]["prompt_tokens"].as_u64().unwrap();
        output_left -= body["usage"]["completion_tokens"].as_u64().unwrap();
        assert_eq!(
            (input, output),
            (input_left, output_left),
            "settled to the reported split"
        );
    }
    gw.wait_idle().await;
}

// proves: GW-13 (a tenant without a limit of a dimension is told the
// account's: the remaining budget of the quota scope its call spent, as
// the provider itself would tell it; a limit of its own wins for its
// dimension)
#[tokio::test]
async fn a_tenant_without_limits_is_told_the_accounts_budget() {
    let sim = fast_sim().await;
    let config = format!(
        r#"
[providers.sim]
base_url = "{}"

[scopes.account]
rpm = 50
tpm = 20000

[models.chat]
provider = "sim"
upstream_model = "sim-chat"
scope = "account"

{}
"#,
        sim.openai_base_url(),
        tenants("rpm = 10", "")
    );
    let gw = Gateway::start(&config).await;
    let client = client();
    let mut tokens_left = 20_000u64;
    // b has no limits: the account's, settled to the reported usage.
    let r = post_chat(&client, &gw, Some(KEY_B), &chat("chat", false)).await;
    assert_eq!(r.status(), 200);
    assert_eq!(number(&r, "x-ratelimit-limit-requests"), 50);
    assert_eq!(number(&r, "x-ratelimit-remaining-requests"), 49);
    assert_eq!(
        header(&r, "x-ratelimit-reset-requests").as_deref(),
        Some("0s")
    );
    assert_eq!(number(&r, "x-ratelimit-limit-tokens"), 20_000);
    let remaining = number(&r, "x-ratelimit-remaining-tokens");
    let body: Value = r.json().await.unwrap();
    tokens_left -= body["usage"]["total_tokens"].as_u64().unwrap();
    assert_eq!(remaining, tokens_left);
    // a has a request limit of its own, and the account's for tokens.
    let r = post_chat(&client, &gw, Some(KEY_A), &chat("chat", false)).await;
    assert_eq!(r.status(), 200);
    assert_eq!(number(&r, "x-ratelimit-limit-requests"), 10);
    assert_eq!(number(&r, "x-ratelimit-remaining-requests"), 9);
    assert_eq!(number(&r, "x-ratelimit-limit-tokens"), 20_000);
    let remaining = number(&r, "x-ratelimit-remaining-tokens");
    let body: Value = r.json().await.unwrap();
    tokens_left -= body["usage"]["total_tokens"].as_u64().unwrap();
    assert_eq!(remaining, tokens_left, "a's call spent the account too");
    // b again: the account spent a's call as well.
    let r = post_chat(&client, &gw, Some(KEY_B), &chat("chat", false)).await;
    assert_eq!(number(&r, "x-ratelimit-remaining-requests"), 47);
    // An unknown model names no account: no headers.
    let r = post_chat(&client, &gw, Some(KEY_B), &chat("nope", false)).await;
    assert_eq!(r.status(), 404);
    assert_eq!(header(&r, "x-ratelimit-limit-requests"), None);
    gw.wait_idle().await;
}

//! Azure OpenAI's shape (the upstream side of WIRE-2) over real sockets:
//! deployment paths, `api-version`, the `api-key` header, Azure's 401, 404
//! and 429 bodies, and the same limits and stats as the OpenAI routes.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::*;
use reqwest::StatusCode;
use serde_json::{Value, json};
use tollgate_sim::{ManualClock, REJECT_CAUSE_HEADER, SimConfig};

const CHAT: &str = "/openai/deployments/gpt-4o-prod/chat/completions?api-version=2024-10-21";
const EMBED: &str = "/openai/deployments/embed-small/embeddings?api-version=2024-10-21";
const KEY: (&str, &str) = ("api-key", "az-secret");

fn config() -> SimConfig {
    SimConfig {
        completion_tokens: 4,
        azure_key: Some("az-secret".into()),
        ..SimConfig::default()
    }
}

/// An Azure chat body: no `model` (the deployment names it).
fn chat_body(stream: bool) -> String {
    json!({"messages": [{"role": "user", "content": "hi"}], "stream": stream}).to_string()
}

// proves: SIM-1 (Azure deployment routes: the deployment is the model, one-shot, stream and embeddings; WIRE-2)
#[tokio::test]
async fn deployment_routes_answer_in_openai_shape_with_the_deployment_as_model() {
    let server = start(config()).await;
    let r = post_with(&server, CHAT, &[KEY], &chat_body(false)).await;
    assert_eq!(r.status(), StatusCode::OK);
    let json: Value = r.json().await.expect("json");
    assert_eq!(json["object"], "chat.completion");
    assert_eq!(json["model"], "gpt-4o-prod");
    // "hi": 3 + 3 + 1 = 7 prompt tokens.
    assert_eq!(
        json["usage"],
        json!({"prompt_tokens": 7, "completion_tokens": 4, "total_tokens": 11})
    );

    // A body `model` is ignored: the deployment wins.
    let body = json!({"model": "other", "messages": [{"role": "user", "content": "hi"}],
        "stream": true, "stream_options": {"include_usage": true}});
    let r = post_with(&server, CHAT, &[KEY], &body.to_string()).await;
    assert_eq!(r.status(), StatusCode::OK);
    let sse = read_sse(r).await;
    assert!(!sse.truncated);
    assert_eq!(sse.events.last().map(String::as_str), Some("[DONE]"));
    let first: Value = serde_json::from_str(&sse.events[0]).expect("chunk");
    assert_eq!(first["model"], "gpt-4o-prod");
    let usage: Value = serde_json::from_str(&sse.events[sse.events.len() - 2]).expect("chunk");
    assert_eq!(usage["usage"]["total_tokens"], 11);

    let r = post_with(&server, EMBED, &[KEY], r#"{"input":["abcd","abcdefgh"]}"#).await;
    assert_eq!(r.status(), StatusCode::OK);
    let json: Value = r.json().await.expect("json");
    assert_eq!(json["model"], "embed-small");
    assert_eq!(json["data"].as_array().map(Vec::len), Some(2));
    assert_eq!(json["usage"]["prompt_tokens"], 3);

    wait_for_stats(&server, |s| s.active == 0).await;
    let stats = server.stats();
    assert_eq!(stats.routes.azure_chat_completions, 2);
    assert_eq!(stats.routes.azure_embeddings, 1);
    assert_eq!(stats.routes.chat_completions, 0);
    assert_eq!((stats.ok, stats.requests_total), (3, 3));
    assert_eq!(stats.tokens_charged, 11 + 11 + 3);
}

// proves: SIM-1 (Azure auth: only the right `api-key` and no `Authorization` is admitted; Azure's 401 body; WIRE-2)
#[tokio::test]
async fn the_api_key_is_required_and_a_bearer_key_is_refused() {
    let server = start(SimConfig {
        require_key: Some("sk-openai".into()),
        ..config()
    })
    .await;
    let bearer = ("authorization", "Bearer az-secret");
    let openai_bearer = ("authorization", "Bearer sk-openai");
    for headers in [
        &[][..],
        &[("api-key", "wrong")],
        &[bearer],
        &[openai_bearer],
        &[KEY, openai_bearer],
    ] {
        let r = post_with(&server, CHAT, headers, &chat_body(false)).await;
        assert_eq!(r.status(), StatusCode::UNAUTHORIZED, "{headers:?}");
        let error: Value = r.json().await.expect("json");
        assert_eq!(error["error"]["code"], "401");
        let message = error["error"]["message"].as_str().expect("message");
        assert!(
            message.starts_with("Access denied due to invalid subscription key"),
            "{message}"
        );
    }
    let r = post_with(&server, EMBED, &[bearer], r#"{"input":"hi"}"#).await;
    assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
    // The Azure key alone is enough: the OpenAI bearer key is not asked for.
    let r = post_with(&server, CHAT, &[KEY], &chat_body(false)).await;
    assert_eq!(r.status(), StatusCode::OK);
    let stats = server.stats();
    assert_eq!(stats.unauthorized, 6);
    assert_eq!((stats.ok, stats.requests_charged), (1, 1));
}

// proves: SIM-1 (Azure: a missing `api-version` is Azure's 404, never served; malformed JSON a 400; WIRE-2)
#[tokio::test]
async fn a_missing_api_version_is_404_and_bad_json_400() {
    let server = start(config()).await;
    for path in [
        "/openai/deployments/gpt-4o-prod/chat/completions",
        "/openai/deployments/gpt-4o-prod/chat/completions?api-version=",
        "/openai/deployments/embed-small/embeddings?version=2024-10-21",
    ] {
        let r = post_with(&server, path, &[KEY], &chat_body(false)).await;
        assert_eq!(r.status(), StatusCode::NOT_FOUND, "{path}");
        let error: Value = r.json().await.expect("json");
        assert_eq!(
            error,
            json!({"error": {"code": "404", "message": "Resource not found"}})
        );
    }
    let r = post_with(&server, CHAT, &[KEY], "{oops").await;
    assert_eq!(r.status(), StatusCode::BAD_REQUEST);
    let error: Value = r.json().await.expect("json");
    assert_eq!(error["error"]["type"], "invalid_request_error");
    let stats = server.stats();
    assert_eq!(stats.routes.not_found, 3);
    assert_eq!(stats.routes.azure_chat_completions, 1);
    assert_eq!(
        (stats.requests_total, stats.bad_request, stats.ok),
        (1, 1, 0)
    );
}

// proves: SIM-2 (Azure 429: Azure's body with "retry after N seconds", retry-after, retry-after-ms and x-ratelimit-remaining-*; WIRE-2)
#[tokio::test]
async fn over_the_limit_azure_answers_its_own_429() {
    let clock = ManualClock::new();
    let server = start_with_clock(
        SimConfig {
            rpm: Some(2),
            tpm: Some(20),
            window: Duration::from_secs(60),
            ..config()
        },
        Arc::new(clock.clone()),
    )
    .await;
    let r = post_with(&server, CHAT, &[KEY], &chat_body(false)).await;
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(header(&r, "x-ratelimit-remaining-requests"), Some("1"));
    assert_eq!(header(&r, "x-ratelimit-remaining-tokens"), Some("9"));
    clock.advance(Duration::from_millis(2_500));
    // 11 + 11 > 20: the token limit binds; the entry leaves in 57.5 s.
    let r = post_with(&server, CHAT, &[KEY], &chat_body(true)).await;
    assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(header(&r, REJECT_CAUSE_HEADER), Some("tpm"));
    assert_eq!(header(&r, "retry-after"), Some("58"));
    assert_eq!(header(&r, "retry-after-ms"), Some("57500"));
    assert_eq!(header(&r, "x-ratelimit-remaining-requests"), Some("1"));
    assert_eq!(header(&r, "x-ratelimit-remaining-tokens"), Some("9"));
    let error: Value = r.json().await.expect("json");
    assert_eq!(error["error"]["code"], "429");
    let message = error["error"]["message"].as_str().expect("message");
    assert!(
        message.starts_with(
            "Requests to the ChatCompletions_Create Operation under Azure OpenAI API version \
             2024-10-21 have exceeded token rate limit"
        ),
        "{message}"
    );
    assert!(
        message.contains("Please retry after 58 seconds."),
        "{message}"
    );

    // Embeddings: 2 tokens fit the tokens, then the request limit binds.
    let r = post_with(&server, EMBED, &[KEY], r#"{"input":"abcdefgh"}"#).await;
    assert_eq!(r.status(), StatusCode::OK);
    let r = post_with(&server, EMBED, &[KEY], r#"{"input":"abcdefgh"}"#).await;
    assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(header(&r, REJECT_CAUSE_HEADER), Some("rpm"));
    assert_eq!(header(&r, "x-ratelimit-remaining-requests"), Some("0"));
    let error: Value = r.json().await.expect("json");
    let message = error["error"]["message"].as_str().expect("message");
    assert!(message.contains("Embeddings_Create Operation"), "{message}");
    assert!(message.contains("call rate limit"), "{message}");

    let stats = server.stats();
    assert_eq!((stats.rejected_429.tpm, stats.rejected_429.rpm), (1, 1));
    assert_eq!(stats.max_requests_in_window, 2);
    assert!(stats.max_tokens_in_window <= 20);
}

// proves: SIM-2 (an Azure load paced under RPM/TPM over several windows gets zero 429s)
#[tokio::test]
async fn a_load_under_the_limits_gets_no_429() {
    let clock = ManualClock::new();
    let server = start_with_clock(
        SimConfig {
            rpm: Some(4),
            tpm: Some(44),
            window: Duration::from_secs(60),
            ..config()
        },
        Arc::new(clock.clone()),
    )
    .await;
    for i in 0..12 {
        let r = post_with(&server, CHAT, &[KEY], &chat_body(i % 2 == 1)).await;
        assert_eq!(r.status(), StatusCode::OK, "request {i}");
        if i % 2 == 1 {
            assert!(!read_sse(r).await.truncated);
        }
        clock.advance(Duration::from_secs(15));
    }
    wait_for_stats(&server, |s| s.active == 0).await;
    let stats = server.stats();
    assert_eq!(stats.rejected_429.total(), 0);
    assert_eq!(
        (stats.max_requests_in_window, stats.max_tokens_in_window),
        (4, 44)
    );
}

//! The access log and request ids (SPEC GW-14): one structured line per
//! request, never a key, a prompt or a completion.

mod common;

use common::upstream::{Reply, Scripted};
use common::*;
use serde_json::{Value, json};

/// Marks every secret a line must not contain.
const SENTINEL: &str = "SENTINEL-7f3a9c";

fn config(base_url: &str, format: &str) -> String {
    format!(
        r#"
[server]
log_format = "{format}"

[providers.up]
base_url = "{base_url}"

[models.chat]
provider = "up"

{}
"#,
        tenants("", "")
    )
}

/// A chat body whose prompt carries the sentinel.
fn secret_chat(stream: bool) -> Value {
    json!({
        "model": "chat",
        "messages": [{"role": "user", "content": format!("my password is {SENTINEL}")}],
        "max_tokens": 16,
        "stream": stream,
    })
}

// proves: GW-14 (one JSON line per request with the request id, tenant,
// model, deployment, status, error code, attempts, times and tokens; no
// key, prompt or completion, checked with a sentinel)
#[tokio::test]
async fn json_lines_carry_the_exchange_and_no_secret() {
    let sim = fast_sim().await;
    let gw = Gateway::start(&config(&sim.openai_base_url(), "json")).await;
    let lines = gw.app.access_log.capture();
    let client = client();
    let r = client
        .post(gw.url("/v1/chat/completions"))
        .bearer_auth(KEY_A)
        .header("x-request-id", "client-id-1")
        .json(&secret_chat(false))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["x-request-id"], "client-id-1", "echoed");
    let completion: Value = r.json().await.unwrap();
    let reply = completion["choices"][0]["message"]["content"]
        .as_str()
        .unwrap()
        .to_owned();
    let s = post_chat(&client, &gw, Some(KEY_A), &secret_chat(true)).await;
    let generated = s.headers()["x-request-id"].to_str().unwrap().to_owned();
    assert_eq!(generated.len(), 32, "generated when absent");
    assert!(read_sse(s).await.completed());
    let bad = post_chat(
        &client,
        &gw,
        Some(&format!("sk-{SENTINEL}")),
        &secret_chat(false),
    )
    .await;
    assert_eq!(bad.status(), 401);
    gw.wait_idle().await;
    eventually("three access lines", || lines.lock().len() == 3).await;
    let lines = lines.lock().clone();
    for line in &lines {
        assert!(!line.contains(SENTINEL), "a secret leaked: {line}");
        assert!(!line.contains(KEY_A), "a key leaked: {line}");
        assert!(!line.contains(&reply), "the completion leaked: {line}");
        assert!(!line.contains('\n'));
    }
    let parsed: Vec<Value> = lines
        .iter()
        .map(|l| serde_json::from_str(l).expect("a line is one JSON object"))
        .collect();
    let one_shot = &parsed[0];
    assert_eq!(one_shot["request_id"], "client-id-1");
    assert_eq!(one_shot["tenant"], "a");
    assert_eq!(one_shot["model"], "chat");
    assert_eq!(one_shot["deployment"], "chat");
    assert_eq!(one_shot["status"], 200);
    assert_eq!(one_shot["error"], Value::Null);
    assert_eq!(one_shot["attempts"], 1);
    assert_eq!(one_shot["stream"], false);
    assert_eq!(
        one_shot["tokens_reported"],
        completion["usage"]["total_tokens"]
    );
    assert!(one_shot["tokens_estimated"].as_u64().unwrap() > 0);
    for field in ["queue", "upstream", "total"] {
        assert!(one_shot[field].as_f64().unwrap() >= 0.0, "{field}");
    }
    assert!(one_shot["time"].as_str().unwrap().ends_with('Z'));
    let stream = &parsed[1];
    assert_eq!(stream["request_id"], generated.as_str());
    assert_eq!(stream["stream"], true);
    assert!(stream["tokens_reported"].as_u64().unwrap() > 0);
    let refused = &parsed[2];
    assert_eq!(refused["status"], 401);
    assert_eq!(refused["error"], "invalid_api_key");
    assert_eq!(refused["tenant"], Value::Null);
}

// proves: GW-14 (the request id goes upstream with every attempt; a
// client id that is not a plain token is replaced)
#[tokio::test]
async fn the_request_id_is_sent_upstream() {
    let up = Scripted::start(vec![Reply::ok()]).await;
    let gw = Gateway::start(&config(&up.base_url, "text")).await;
    let lines = gw.app.access_log.capture();
    let client = client();
    let r = client
        .post(gw.url("/v1/chat/completions"))
        .bearer_auth(KEY_B)
        .header("x-request-id", "trace-42")
        .json(&chat("chat", false))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let r2 = client
        .post(gw.url("/v1/chat/completions"))
        .bearer_auth(KEY_B)
        .header("x-request-id", "not plain; injected=1")
        .json(&chat("chat", false))
        .send()
        .await
        .unwrap();
    let replaced = r2.headers()["x-request-id"].to_str().unwrap().to_owned();
    assert_ne!(replaced, "not plain; injected=1");
    let seen = up.seen();
    assert_eq!(seen[0].request_id.as_deref(), Some("trace-42"));
    assert_eq!(seen[1].request_id.as_deref(), Some(replaced.as_str()));
    eventually("two access lines", || lines.lock().len() == 2).await;
    let first = lines.lock()[0].clone();
    assert!(
        first.contains("request_id=trace-42 route=chat tenant=b model=chat"),
        "{first}"
    );
    assert!(first.contains("status=200"), "{first}");
}

// proves: GW-14 (a request whose client goes away before the answer still
// gets its one line: status 499, client_disconnected), GW-6
#[tokio::test]
async fn a_client_that_goes_away_still_gets_a_line() {
    let sim = slow_sim(std::time::Duration::from_millis(50), 100).await;
    let gw = Gateway::start(&config(&sim.openai_base_url(), "json")).await;
    let lines = gw.app.access_log.capture();
    let call = spawn_chat(&gw, KEY_A, chat("chat", false));
    eventually("the call reached the simulator", || sim.stats().active == 1).await;
    call.abort();
    eventually("one access line", || lines.lock().len() == 1).await;
    let line: Value = serde_json::from_str(&lines.lock()[0]).unwrap();
    assert_eq!(line["status"], 499);
    assert_eq!(line["error"], "client_disconnected");
    assert_eq!(line["tenant"], "a");
    gw.wait_idle().await;
}

// proves: GW-14 (the access line's error code is the code the client
// received, for a body the gateway cannot parse too, in both formats)
#[tokio::test]
async fn a_malformed_body_is_logged_with_the_code_the_client_received() {
    let sim = fast_sim().await;
    for format in ["json", "text"] {
        let gw = Gateway::start(&config(&sim.openai_base_url(), format)).await;
        let lines = gw.app.access_log.capture();
        let client = client();
        let mut codes = Vec::new();
        for body in [r#"{"model": "chat", "messages": "#, r#"{"model": "chat"}"#] {
            let r = client
                .post(gw.url("/v1/chat/completions"))
                .bearer_auth(KEY_A)
                .header("content-type", "application/json")
                .body(body)
                .send()
                .await
                .unwrap();
            let (status, _, error) = error_of(r).await;
            assert_eq!(status, 400);
            let sent = error["code"]
                .as_str()
                .unwrap_or_else(|| panic!("the client gets a machine-readable code: {error}"));
            codes.push(sent.to_owned());
        }
        eventually("two access lines", || lines.lock().len() == 2).await;
        let lines = lines.lock().clone();
        for (line, sent) in lines.iter().zip(&codes) {
            if format == "json" {
                let v: Value = serde_json::from_str(line).unwrap();
                assert_eq!(v["error"], sent.as_str(), "{line}");
            } else {
                assert!(line.contains(&format!(" error={sent} ")), "{line}");
            }
        }
        assert_eq!(sim.stats().requests_total, 0);
    }
}

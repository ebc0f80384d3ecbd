//! The batch runner's traces (SPEC OBS-5), end to end: a real run against
//! the simulator over 127.0.0.1 exporting over OTLP/HTTP to the collector
//! the gateway's trace tests use (`tollgate_telemetry::testing`).

mod common;

use std::collections::HashMap;
use std::time::Duration;

use serde_json::Value;
use tokio::net::TcpListener;
use tollgate_batch::{BatchConfig, Outcome};
use tollgate_sim::SimServer;
use tollgate_telemetry::testing::*;

use common::{Dir, chat_line, never, write_lines};

/// The simulator allowing `rpm` requests per 1 s window.
async fn sim(rpm: u64) -> SimServer {
    common::sim_per_second(Some(rpm), None).await
}

/// A run of `n` chat items, one at a time, exporting to `endpoint`.
fn traced(dir: &Dir, server: &SimServer, n: usize, endpoint: &str) -> BatchConfig {
    let lines: Vec<Value> = (0..n)
        .map(|i| chat_line(&format!("item-{i}"), "Tell me a secret.", 4))
        .collect();
    write_lines(&dir.path("in.jsonl"), &lines);
    let mut c = common::http_config(dir, server);
    c.concurrency = 1;
    c.item_timeout = Some(Duration::from_secs(30));
    c.telemetry.endpoint = Some(endpoint.to_owned());
    c.telemetry.service_name = Some("batch-under-test".into());
    c.telemetry.schedule_delay = Duration::from_millis(20);
    c
}

/// `custom_id` → the `tollgate.attempts` of its output line.
fn attempts_recorded(dir: &Dir) -> HashMap<String, i64> {
    let data = std::fs::read_to_string(dir.path("out.jsonl")).expect("output");
    data.lines()
        .map(|l| {
            let v: Value = serde_json::from_str(l).expect("JSON line");
            let id = v["custom_id"].as_str().expect("custom_id").to_owned();
            (id, v["tollgate"]["attempts"].as_i64().expect("attempts"))
        })
        .collect()
}

// proves: OBS-5 (the batch runner: one span per item carrying its custom_id, a child span per attempt, the gateway's GenAI and tollgate attributes, a retried item has two attempt spans, no prompt or completion exported)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batch_run_exports_a_span_per_item_and_one_per_attempt() {
    let collector = Collector::start().await;
    let dir = Dir::new("traces");
    // One request per window: the items after the first draw a 429 and
    // are retried once the window turns.
    let server = sim(1).await;
    let n = 3;
    let report = tollgate_batch::run(traced(&dir, &server, n, &collector.endpoint), never())
        .await
        .expect("run");
    assert_eq!(report.outcome, Outcome::Complete);
    let recorded = attempts_recorded(&dir);
    assert_eq!(recorded.len(), n);

    // The run flushed its spans before it returned.
    let all = collector.spans();
    assert!(all.iter().all(|(svc, _)| svc == "batch-under-test"));
    let spans: Vec<Span> = all.into_iter().map(|(_, s)| s).collect();
    let items: Vec<&Span> = spans
        .iter()
        .filter(|s| kind(s) == SpanKind::Internal)
        .collect();
    assert_eq!(items.len(), n, "one span per item: {spans:#?}");
    let mut retried = 0;
    for item in &items {
        let id = string(item, "tollgate.custom_id").expect("custom_id");
        assert_eq!(item.name, "chat sim-chat");
        assert!(item.parent_span_id.is_empty(), "an item is a trace's root");
        assert_eq!(
            string(item, "gen_ai.operation.name").as_deref(),
            Some("chat")
        );
        assert_eq!(
            string(item, "gen_ai.request.model").as_deref(),
            Some("sim-chat")
        );
        assert_eq!(string(item, "tollgate.route").as_deref(), Some("chat"));
        assert_eq!(string(item, "tollgate.class").as_deref(), Some("batch"));
        assert_eq!(int(item, "http.response.status_code"), Some(200));
        assert_eq!(
            int(item, "tollgate.tokens_estimated").map(|t| t > 0),
            Some(true)
        );
        assert!(string(item, "tollgate.limited_by").is_some(), "{item:#?}");
        assert!(double(item, "tollgate.quota_wait_ms").is_some_and(|w| w >= 0.0));
        assert!(
            int(item, "gen_ai.usage.output_tokens").is_some(),
            "{item:#?}"
        );
        assert!(!is_error(item));
        let attempts = attempts_of(&spans, item);
        assert_eq!(int(item, "tollgate.attempt"), Some(recorded[&id]));
        assert_eq!(attempts.len() as i64, recorded[&id], "{id}: {spans:#?}");
        for (i, a) in attempts.iter().enumerate() {
            assert_eq!(a.trace_id, item.trace_id);
            assert_eq!(a.name, "chat sim-chat");
            assert_eq!(int(a, "tollgate.attempt"), Some(i as i64 + 1));
            assert_eq!(string(a, "gen_ai.provider.name").as_deref(), Some("openai"));
            assert_eq!(
                string(a, "gen_ai.request.model").as_deref(),
                Some("sim-chat")
            );
            assert_eq!(string(a, "server.address").as_deref(), Some("127.0.0.1"));
            assert!(double(a, "tollgate.deadline_left_ms").is_some_and(|l| l > 0.0));
            assert!(a.start_time_unix_nano >= item.start_time_unix_nano);
            assert!(a.end_time_unix_nano <= item.end_time_unix_nano);
        }
        if attempts.len() == 2 {
            retried += 1;
            let (first, second) = (attempts[0], attempts[1]);
            assert_eq!(string(first, "error.type").as_deref(), Some("rate_limited"));
            assert_eq!(int(first, "http.response.status_code"), Some(429));
            assert!(is_error(first));
            assert_eq!(
                string(second, "tollgate.retry_cause").as_deref(),
                Some("rate_limited")
            );
            assert!(!is_error(second));
            assert!(int(second, "gen_ai.usage.output_tokens").is_some());
        }
    }
    assert!(retried >= 1, "an item was retried: {recorded:?}");
    let mut ids: Vec<_> = items.iter().map(|s| s.trace_id.clone()).collect();
    ids.sort();
    ids.dedup();
    assert_eq!(ids.len(), n, "each item its own trace");
    let raw = collector.raw();
    let text = String::from_utf8_lossy(&raw);
    assert!(!text.contains("Tell me a secret"), "prompt exported");
}

// proves: OBS-5 (an unreachable collector fails and stops no item of a batch run)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreachable_collector_fails_no_item() {
    let closed = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let endpoint = format!("http://{}", closed.local_addr().expect("addr"));
    drop(closed);
    let dir = Dir::new("traces-closed");
    let server = sim(10_000).await;
    let mut config = traced(&dir, &server, 20, &endpoint);
    config.concurrency = 8;
    config.telemetry.queue_size = 2;
    config.telemetry.batch_size = 1;
    let report = tollgate_batch::run(config, never()).await.expect("run");
    assert_eq!(report.outcome, Outcome::Complete);
    assert_eq!(report.summary.failed, 0, "{:?}", report.summary);
    assert_eq!(attempts_recorded(&dir).len(), 20);
}

/// An upstream that answers every chat completion and keeps each
/// request's `traceparent`.
async fn recording_upstream() -> (String, std::sync::Arc<std::sync::Mutex<Vec<String>>>) {
    use axum::http::HeaderMap;
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let kept = std::sync::Arc::clone(&seen);
    let app = axum::Router::new().route(
        "/v1/chat/completions",
        axum::routing::post(move |headers: HeaderMap| {
            let kept = std::sync::Arc::clone(&kept);
            async move {
                let tp = headers
                    .get("traceparent")
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or("none")
                    .to_owned();
                kept.lock().expect("lock").push(tp);
                (
                    [("content-type", "application/json")],
                    r#"{"id":"c","object":"chat.completion","created":0,"model":"sim-chat","choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}],"usage":{"prompt_tokens":5,"completion_tokens":1,"total_tokens":6}}"#,
                )
            }
        }),
    );
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    (format!("http://{addr}/v1"), seen)
}

// proves: OBS-5 (the batch runner: each attempt's upstream request carries the traceparent naming that attempt's span)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_attempt_sends_its_own_traceparent_upstream() {
    let collector = Collector::start().await;
    let dir = Dir::new("traces-upstream");
    let (base_url, seen) = recording_upstream().await;
    let n = 3;
    let lines: Vec<Value> = (0..n)
        .map(|i| chat_line(&format!("item-{i}"), "Tell me a secret.", 4))
        .collect();
    write_lines(&dir.path("in.jsonl"), &lines);
    let mut c = BatchConfig::new(
        dir.path("in.jsonl"),
        Some(dir.path("out.jsonl")),
        tollgate_batch::Target::Http {
            base_url,
            api_key: None,
        },
    );
    c.concurrency = 1;
    c.telemetry.endpoint = Some(collector.endpoint.clone());
    c.telemetry.schedule_delay = Duration::from_millis(20);
    let report = tollgate_batch::run(c, never()).await.expect("run");
    assert_eq!(report.outcome, Outcome::Complete);

    let mut sent = seen.lock().expect("lock").clone();
    let mut named: Vec<String> = collector
        .spans()
        .into_iter()
        .map(|(_, s)| s)
        .filter(|s| kind(s) == SpanKind::Client)
        .map(|s| format!("00-{}-{}-01", hex(&s.trace_id), hex(&s.span_id)))
        .collect();
    sent.sort();
    named.sort();
    assert_eq!(sent.len(), n);
    assert_eq!(sent, named, "one traceparent per attempt, naming its span");
}

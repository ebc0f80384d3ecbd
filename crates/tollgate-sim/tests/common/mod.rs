//! Helpers shared by the HTTP-level tests: a simulator on 127.0.0.1:0 and a
//! small SSE reader.
#![allow(dead_code)] // each test binary uses a subset

use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use serde_json::{Value, json};
use tollgate_sim::{Clock, REJECT_CAUSE_HEADER, SimConfig, SimServer, Simulator};

pub async fn start(config: SimConfig) -> SimServer {
    Simulator::spawn(config, "127.0.0.1:0")
        .await
        .expect("simulator starts")
}

pub async fn start_with_clock(config: SimConfig, clock: Arc<dyn Clock>) -> SimServer {
    Simulator::with_clock(config, clock)
        .expect("valid config")
        .bind("127.0.0.1:0")
        .await
        .expect("simulator starts")
}

/// A client without idle pooling: no background timers that could make
/// tokio's paused clock auto-advance.
pub fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .pool_max_idle_per_host(0)
        .build()
        .expect("client builds")
}

pub fn chat(content: &str, max_tokens: Option<u64>) -> Value {
    let mut body = json!({
        "model": "sim-chat",
        "messages": [{"role": "user", "content": content}],
    });
    if let Some(m) = max_tokens {
        body["max_tokens"] = json!(m);
    }
    body
}

pub fn chat_stream(content: &str, max_tokens: Option<u64>, include_usage: bool) -> Value {
    let mut body = chat(content, max_tokens);
    body["stream"] = json!(true);
    if include_usage {
        body["stream_options"] = json!({"include_usage": true});
    }
    body
}

pub async fn post(server: &SimServer, path: &str, body: &Value) -> reqwest::Response {
    client()
        .post(server.url(path))
        .json(body)
        .send()
        .await
        .expect("request sent")
}

pub fn header<'a>(response: &'a reqwest::Response, name: &str) -> Option<&'a str> {
    response.headers().get(name).and_then(|v| v.to_str().ok())
}

/// Asserts that `response` is a 429 of `cause` (`x-sim-reject-cause`) with
/// `retry-after` `retry_after`.
#[track_caller]
pub fn assert_refused(response: &reqwest::Response, cause: &str, retry_after: Option<&str>) {
    assert_eq!(response.status(), reqwest::StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(header(response, REJECT_CAUSE_HEADER), Some(cause));
    assert_eq!(header(response, "retry-after"), retry_after);
}

/// A stream's `data:` payloads, and the transfer error if the body was cut.
#[derive(Debug, PartialEq)]
pub struct Sse {
    pub events: Vec<String>,
    pub truncated: bool,
}

/// The body as text up to its end or its cut, and whether it was cut.
async fn read_body(response: reqwest::Response) -> (String, bool) {
    let mut raw = Vec::new();
    let mut truncated = false;
    let mut body = response.bytes_stream();
    while let Some(chunk) = body.next().await {
        match chunk {
            Ok(bytes) => raw.extend_from_slice(&bytes),
            Err(_) => {
                truncated = true;
                break;
            }
        }
    }
    let text = String::from_utf8(raw).expect("utf-8 body");
    (text, truncated)
}

pub async fn read_sse(response: reqwest::Response) -> Sse {
    let (text, truncated) = read_body(response).await;
    let events = text
        .split("\n\n")
        .filter(|e| !e.is_empty())
        .map(|e| e.strip_prefix("data: ").expect("data: prefix").to_owned())
        .collect();
    Sse { events, truncated }
}

/// Polls the stats until `pred` holds (bounded: panics after 5 s).
pub async fn wait_for_stats(server: &SimServer, pred: impl Fn(&tollgate_sim::SimStats) -> bool) {
    for _ in 0..500 {
        if pred(&server.stats()) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("stats never matched: {:?}", server.stats());
}

/// A typed SSE stream (`event:` + `data:` per event): the event names,
/// their JSON payloads, and whether the transfer was cut.
#[derive(Debug)]
pub struct TypedSse {
    pub names: Vec<String>,
    pub data: Vec<Value>,
    pub truncated: bool,
}

pub async fn read_typed_sse(response: reqwest::Response) -> TypedSse {
    let (text, truncated) = read_body(response).await;
    let (mut names, mut data) = (Vec::new(), Vec::new());
    for event in text.split("\n\n").filter(|e| !e.is_empty()) {
        let (name, payload) = event.split_once('\n').expect("two lines");
        names.push(
            name.strip_prefix("event: ")
                .expect("event: line")
                .to_owned(),
        );
        let payload = payload.strip_prefix("data: ").expect("data: line");
        data.push(serde_json::from_str(payload).expect("data is JSON"));
    }
    TypedSse {
        names,
        data,
        truncated,
    }
}

/// Seconds since the Unix epoch of an RFC 3339 UTC timestamp of the form
/// `YYYY-MM-DDTHH:MM:SSZ`.
pub fn parse_rfc3339(s: &str) -> u64 {
    assert_eq!(s.len(), 20, "{s}");
    assert!(s.ends_with('Z') && &s[10..11] == "T", "{s}");
    let n = |range: std::ops::Range<usize>| -> i64 { s[range].parse().expect("digits") };
    let (y, m, d) = (n(0..4), n(5..7), n(8..10));
    // Howard Hinnant's days_from_civil.
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    u64::try_from(days * 86_400 + n(11..13) * 3600 + n(14..16) * 60 + n(17..19))
        .expect("after 1970")
}

pub async fn post_with(
    server: &SimServer,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> reqwest::Response {
    let mut request = client().post(server.url(path)).body(body.to_owned());
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    request
        .header("content-type", "application/json")
        .send()
        .await
        .expect("request sent")
}

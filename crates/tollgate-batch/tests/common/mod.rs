//! What the batch runner's integration tests share: a temporary directory
//! removed at the end, input lines, and writing them.
#![allow(dead_code)]

use std::path::{Path, PathBuf};

use serde_json::{Value, json};

/// A temporary directory, removed when dropped.
pub struct Dir(PathBuf);

impl Dir {
    /// A fresh directory named after `name`, the process and the time.
    pub fn new(name: &str) -> Dir {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        let p = std::env::temp_dir().join(format!(
            "tollgate-batch-{name}-{}-{nanos}",
            std::process::id()
        ));
        std::fs::create_dir_all(&p).expect("temp dir");
        Dir(p)
    }

    /// `f` inside it.
    pub fn path(&self, f: &str) -> PathBuf {
        self.0.join(f)
    }
}

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A chat completions input line.
pub fn chat_line(id: &str, text: &str, max_tokens: u64) -> Value {
    json!({"custom_id": id, "method": "POST", "url": "/v1/chat/completions",
           "body": {"model": "sim-chat", "messages": [{"role": "user", "content": text}],
                    "max_tokens": max_tokens}})
}

/// Writes `lines` as JSONL.
pub fn write_lines(path: &Path, lines: &[Value]) {
    let mut s = String::new();
    for l in lines {
        s.push_str(&l.to_string());
        s.push('\n');
    }
    std::fs::write(path, s).expect("write input");
}

/// An interrupt that never comes.
pub fn never() -> std::future::Pending<()> {
    std::future::pending()
}

/// The strict simulator behind a layer that rewrites the limits it
/// advertises: answer `n` (from 1) says `x-ratelimit-limit-tokens:
/// tokens(n)` and 10,000 requests per window, whatever the simulator
/// enforces. A provider whose advertised limit changes (SPEC Q-14).
pub struct Advertising {
    /// `http://127.0.0.1:PORT/v1`.
    pub base_url: String,
    /// Answers so far.
    pub answers: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl Advertising {
    /// Serves `config`'s simulator with the advertised token limits of
    /// `tokens`.
    pub async fn start(config: tollgate_sim::SimConfig, tokens: fn(usize) -> u64) -> Advertising {
        use axum::http::HeaderValue;
        use std::sync::atomic::{AtomicUsize, Ordering};
        let answers = std::sync::Arc::new(AtomicUsize::new(0));
        let counter = std::sync::Arc::clone(&answers);
        let rewrite = move |mut response: axum::response::Response| {
            let n = counter.fetch_add(1, Ordering::SeqCst) + 1;
            let headers = response.headers_mut();
            headers.insert("x-ratelimit-limit-requests", HeaderValue::from(10_000u64));
            headers.insert("x-ratelimit-limit-tokens", HeaderValue::from(tokens(n)));
            async move { response }
        };
        let sim = tollgate_sim::Simulator::new(config).expect("simulator configuration");
        let router = sim.router().layer(axum::middleware::map_response(rewrite));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let base_url = format!("http://{}/v1", listener.local_addr().expect("addr"));
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, router).await;
        });
        Advertising {
            base_url,
            answers,
            task,
        }
    }
}

impl Drop for Advertising {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// How many lines of the output at `path` each `custom_id` has (a missing
/// file has none); fails the test on a torn last line or a line that is
/// not JSON.
pub fn counts(path: &Path) -> std::collections::HashMap<String, usize> {
    let data = std::fs::read_to_string(path).unwrap_or_default();
    assert!(data.is_empty() || data.ends_with('\n'), "torn last line");
    let mut seen = std::collections::HashMap::new();
    for l in data.lines() {
        let v: Value = serde_json::from_str(l).expect("every output line is JSON");
        *seen
            .entry(v["custom_id"].as_str().expect("id").to_owned())
            .or_insert(0) += 1;
    }
    seen
}

/// A run of `dir`/in.jsonl into `dir`/out.jsonl against `server`'s OpenAI
/// routes, with the defaults.
pub fn http_config(dir: &Dir, server: &tollgate_sim::SimServer) -> tollgate_batch::BatchConfig {
    tollgate_batch::BatchConfig::new(
        dir.path("in.jsonl"),
        Some(dir.path("out.jsonl")),
        tollgate_batch::Target::Http {
            base_url: server.openai_base_url(),
            api_key: None,
        },
    )
}

/// The strict simulator on 127.0.0.1 with 1-second windows of `rpm`
/// requests and `tpm` tokens.
pub async fn sim_per_second(rpm: Option<u64>, tpm: Option<u64>) -> tollgate_sim::SimServer {
    tollgate_sim::Simulator::spawn(
        tollgate_sim::SimConfig {
            rpm,
            tpm,
            window: std::time::Duration::from_secs(1),
            ..tollgate_sim::SimConfig::default()
        },
        "127.0.0.1:0",
    )
    .await
    .expect("simulator")
}

//! The end-to-end harness: a real gateway (built from a TOML string with
//! `build`, served by `server::serve` on 127.0.0.1:0) in front of real
//! upstreams (the simulator, or the scripted upstream of [`upstream`]),
//! driven over real sockets with reqwest.
//!
//! The clock is tokio's normal one: tests never assert on wall-clock
//! durations (except lower bounds that a sleep guarantees) and wait for
//! conditions with bounded polling ([`eventually`]) instead of fixed
//! sleeps.
#![allow(dead_code)]

pub mod upstream;

use std::future::Future;
use std::io;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use futures_util::StreamExt;
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tollgate::Snapshot;
use tollgate::admission::{PoolSnapshot, ScopeSnapshot};
use tollgate_gateway::auth::{hash_key, to_hex};
use tollgate_gateway::build::build;
use tollgate_gateway::config::GatewayConfig;
use tollgate_gateway::live::Live;
use tollgate_gateway::metrics::Metrics;
use tollgate_gateway::server::{ServeOptions, serve, serve_live};
use tollgate_gateway::state::AppState;
use tollgate_sim::{SimConfig, SimServer, Simulator};

/// Tenant `a`'s API key.
pub const KEY_A: &str = "sk-test-tenant-a-0001";
/// Tenant `b`'s API key.
pub const KEY_B: &str = "sk-test-tenant-b-0002";

/// How long any wait for a condition may take before the test fails.
pub const PATIENCE: Duration = Duration::from_secs(20);

/// The hex SHA-256 of `key`, as `keys_sha256` wants it.
pub fn key_hash(key: &str) -> String {
    to_hex(&hash_key(key))
}

/// `[tenants.a]` and `[tenants.b]` with the given extra settings (TOML
/// lines, may be empty).
/// Models `chat` and `other` on one simulator at `base_url`; tenants `a`
/// and `b` with the settings given.
pub fn two_models(base_url: &str, a: &str, b: &str) -> String {
    format!(
        r#"
[providers.sim]
base_url = "{base_url}"

[models.chat]
provider = "sim"
upstream_model = "sim-chat"

[models.other]
provider = "sim"
upstream_model = "sim-chat"

{}
"#,
        tenants(a, b)
    )
}

pub fn tenants(a_extra: &str, b_extra: &str) -> String {
    format!(
        "[tenants.a]\nkeys_sha256 = [\"{}\"]\n{a_extra}\n\n[tenants.b]\nkeys_sha256 = [\"{}\"]\n{b_extra}\n",
        key_hash(KEY_A),
        key_hash(KEY_B)
    )
}

/// Model `model` with deployments `east` and `west` (SPEC GW-11) on
/// providers of those names at base URLs `east` and `west`, short retry
/// delays, tenants `a` and `b`; `east_extra` / `west_extra` are extra
/// deployment settings and `scopes` any scope tables.
pub fn two_deployments(
    model: &str,
    east: &str,
    west: &str,
    scopes: &str,
    east_extra: &str,
    west_extra: &str,
) -> String {
    format!(
        r#"
[providers.east]
base_url = "{east}"
[providers.west]
base_url = "{west}"

[retry]
base_delay = "50ms"
max_delay = "200ms"

{scopes}

[models.{model}.deployments.east]
provider = "east"
upstream_model = "sim-chat"
{east_extra}
[models.{model}.deployments.west]
provider = "west"
upstream_model = "sim-chat"
{west_extra}

{}
"#,
        tenants("", "")
    )
}

/// A two-worker runtime, after setting the environment variables `vars`
/// (upstream keys the configuration names in `api_key_env`) once for the
/// whole test binary. Every test of a binary that uses it must call it
/// first, with the same `vars`, before any other work: `Once` makes them
/// wait until the variables are set, so no thread reads the environment
/// while it is written.
pub fn runtime_with_env(vars: &'static [(&'static str, &'static str)]) -> tokio::runtime::Runtime {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        for (name, value) in vars {
            // SAFETY: see above; nothing else runs in this binary yet.
            unsafe { std::env::set_var(name, value) };
        }
    });
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime")
}

/// A simulator on 127.0.0.1:0.
pub async fn sim(config: SimConfig) -> SimServer {
    Simulator::spawn(config, "127.0.0.1:0")
        .await
        .expect("simulator starts")
}

/// A simulator served by a runtime of its own (one worker thread), as a
/// provider runs on another host: it counts a request when the request
/// reaches it, not when the test's runtime, busy with the gateway and the
/// clients, gets round to its task. Tests that assert "no provider 429"
/// on a real clock with short windows use it: SPEC Q-15 promises that only
/// for arrival delays within the provider's arrival bound (500 ms unless a
/// slower refusal taught more), and a simulator queued on the gateway's own
/// runtime behind a burst was measured counting 700 ms after the gateway
/// sent (docs/tokens.md, "Where: arrival").
pub struct RemoteSim {
    server: Option<SimServer>,
    runtime: Option<tokio::runtime::Runtime>,
}

impl RemoteSim {
    /// Starts a simulator with `config` on 127.0.0.1:0 on its own runtime.
    pub async fn start(config: SimConfig) -> RemoteSim {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("remote-sim")
            .enable_all()
            .build()
            .expect("simulator runtime");
        let server = runtime
            .spawn(sim(config))
            .await
            .expect("the simulator's runtime runs");
        RemoteSim {
            server: Some(server),
            runtime: Some(runtime),
        }
    }
}

impl std::ops::Deref for RemoteSim {
    type Target = SimServer;

    fn deref(&self) -> &SimServer {
        self.server.as_ref().expect("present until dropped")
    }
}

impl Drop for RemoteSim {
    fn drop(&mut self) {
        // Stops serving first, then lets the runtime go without blocking
        // (a test drops it inside its own runtime).
        drop(self.server.take());
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

/// A simulator with no latency and no limits.
pub async fn fast_sim() -> SimServer {
    sim(SimConfig::default()).await
}

/// A simulator whose streams take a while: the first chunk after `ttft`,
/// then `tokens` content chunks `per_token` apart.
pub async fn slow_sim(per_token: Duration, tokens: u32) -> SimServer {
    sim(SimConfig {
        per_token,
        completion_tokens: tokens,
        ..SimConfig::default()
    })
    .await
}

/// A running gateway.
pub struct Gateway {
    /// The shared state, for in-process inspection (the state it started
    /// with; after a reload see [`Gateway::live`]).
    pub app: Arc<AppState>,
    /// The reloadable state, for gateways started from a file.
    pub live: Option<Arc<Live>>,
    /// `http://127.0.0.1:PORT`.
    pub base: String,
    shutdown: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<io::Result<()>>>,
    /// The configuration file [`Gateway::start_file`] wrote, removed on drop.
    file: Option<PathBuf>,
}

impl Gateway {
    /// Parses `toml`, builds the state and serves it with the
    /// configuration's own server bounds.
    pub async fn start(toml: &str) -> Gateway {
        let config = GatewayConfig::from_toml(toml, "test.toml")
            .unwrap_or_else(|e| panic!("test configuration is invalid: {e}"));
        let options = ServeOptions::from_config(&config.server);
        Self::start_config(&config, options).await
    }

    /// Serves `config` with `options`.
    pub async fn start_config(config: &GatewayConfig, options: ServeOptions) -> Gateway {
        let app = build(config, Metrics::install())
            .unwrap_or_else(|e| panic!("gateway does not build: {e}"));
        // Access lines go to a buffer (`app.access_log.capture()`), not
        // into the test output.
        let _ = app.access_log.capture();
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let base = format!("http://{}", listener.local_addr().expect("local addr"));
        let (tx, rx) = oneshot::channel::<()>();
        let task = tokio::spawn(serve(listener, Arc::clone(&app), options, async move {
            let _ = rx.await;
        }));
        Gateway {
            app,
            live: None,
            base,
            shutdown: Some(tx),
            task: Some(task),
            file: None,
        }
    }

    /// Writes `toml` to a file of its own and serves it reloadably (SPEC
    /// GW-15); returns the gateway and the file's path.
    pub async fn start_file(toml: &str) -> (Gateway, PathBuf) {
        static FILES: AtomicUsize = AtomicUsize::new(0);
        let path = std::env::temp_dir().join(format!(
            "tollgate-test-{}-{}.toml",
            std::process::id(),
            FILES.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::write(&path, toml).expect("write the configuration");
        let config = GatewayConfig::load(&path)
            .unwrap_or_else(|e| panic!("test configuration is invalid: {e}"));
        let options = ServeOptions::from_config(&config.server);
        let metrics = Metrics::install();
        let app = build(&config, metrics.clone())
            .unwrap_or_else(|e| panic!("gateway does not build: {e}"));
        let _ = app.access_log.capture();
        let live = Arc::new(Live::new(Arc::clone(&app), Some(path.clone()), metrics));
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let base = format!("http://{}", listener.local_addr().expect("local addr"));
        let (tx, rx) = oneshot::channel::<()>();
        let task = tokio::spawn(serve_live(
            listener,
            None,
            Arc::clone(&live),
            options,
            async move {
                let _ = rx.await;
            },
        ));
        let gw = Gateway {
            app,
            live: Some(live),
            base,
            shutdown: Some(tx),
            task: Some(task),
            file: Some(path.clone()),
        };
        (gw, path)
    }

    /// The state serving new requests now.
    pub fn current(&self) -> Arc<AppState> {
        self.live
            .as_ref()
            .map_or_else(|| Arc::clone(&self.app), |l| l.current())
    }

    /// `host:port` of the gateway, for raw TCP clients.
    pub fn addr(&self) -> &str {
        self.base.trim_start_matches("http://")
    }

    /// The URL of `path` (starting with `/`).
    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    /// Signals the graceful shutdown (like SIGTERM would).
    pub fn begin_shutdown(&mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
    }

    /// Waits (bounded) for `serve` to return and returns its result.
    pub async fn stopped(&mut self) -> io::Result<()> {
        let task = self.task.take().expect("gateway task already awaited");
        tokio::time::timeout(PATIENCE, task)
            .await
            .expect("serve returns after shutdown")
            .expect("serve task does not panic")
    }

    /// The upstream side (quota scopes, deployment pools).
    pub fn upstream(&self) -> Snapshot {
        self.current().upstream_snapshot()
    }

    /// The tenant side (every tenant's scopes and pool).
    pub fn tenants(&self) -> Snapshot {
        self.current().tenant_snapshot()
    }

    /// The pool called `name` (`model:<m>` or `tenant:<t>`).
    pub fn pool(&self, name: &str) -> PoolSnapshot {
        self.upstream()
            .pools
            .into_iter()
            .chain(self.tenants().pools)
            .find(|p| p.name == name)
            .unwrap_or_else(|| panic!("no pool {name}"))
    }

    /// Permits of pool `name` in use.
    pub fn in_use(&self, name: &str) -> usize {
        let p = self.pool(name);
        p.limit - p.available
    }

    /// The upstream quota scope called `name`.
    pub fn upstream_scope(&self, name: &str) -> ScopeSnapshot {
        scope_of(&self.upstream(), name)
    }

    /// The tenant-side quota scope called `name`.
    pub fn tenant_scope(&self, name: &str) -> ScopeSnapshot {
        scope_of(&self.tenants(), name)
    }

    /// Whether every permit is back and every queue empty, on both sides.
    pub fn is_idle(&self) -> bool {
        self.upstream().is_idle() && self.tenants().is_idle()
    }

    /// Waits (bounded) until [`is_idle`](Self::is_idle).
    pub async fn wait_idle(&self) {
        eventually("gateway returns to idle", || self.is_idle()).await;
    }
}

impl Drop for Gateway {
    fn drop(&mut self) {
        if let Some(task) = &self.task {
            task.abort();
        }
        if let Some(file) = &self.file {
            let _ = std::fs::remove_file(file);
        }
    }
}

fn scope_of(s: &Snapshot, name: &str) -> ScopeSnapshot {
    s.scopes
        .iter()
        .find(|sc| sc.name == name)
        .cloned()
        .unwrap_or_else(|| panic!("no scope {name}"))
}

/// The admin key of configurations that say `admin_key_env =
/// "CARGO_PKG_NAME"`: cargo sets it for the test process, so the tests need
/// not change their environment.
pub const ADMIN: &str = env!("CARGO_PKG_NAME");

/// `POST /admin/reload` with [`ADMIN`]: its status and body.
pub async fn reload(gw: &Gateway) -> (u16, String) {
    let r = client()
        .post(gw.url("/admin/reload"))
        .bearer_auth(ADMIN)
        .send()
        .await
        .expect("reload answered");
    (r.status().as_u16(), r.text().await.unwrap_or_default())
}

/// Replaces the configuration file at `path` (reloaded by [`reload`]).
pub fn rewrite(path: &std::path::Path, toml: &str) {
    std::fs::write(path, toml).expect("rewrite the configuration");
}

/// Polls `cond` every few milliseconds until it holds; fails the test after
/// [`PATIENCE`].
pub async fn eventually(what: &str, mut cond: impl FnMut() -> bool) {
    let give_up = tokio::time::Instant::now() + PATIENCE;
    loop {
        if cond() {
            return;
        }
        assert!(
            tokio::time::Instant::now() < give_up,
            "timed out waiting until {what}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// `fut`, failing the test if it takes longer than [`PATIENCE`].
pub async fn bounded<F: Future>(what: &str, fut: F) -> F::Output {
    tokio::time::timeout(PATIENCE, fut)
        .await
        .unwrap_or_else(|_| panic!("timed out: {what}"))
}

/// A client that talks to 127.0.0.1 directly.
pub fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .no_proxy()
        .timeout(Duration::from_secs(60))
        .build()
        .expect("client")
}

/// The gateway's `/metrics` text.
pub async fn metrics_text(gw: &Gateway) -> String {
    client()
        .get(gw.url("/metrics"))
        .send()
        .await
        .expect("metrics")
        .text()
        .await
        .expect("metrics body")
}

/// A chat request body for `model`.
pub fn chat(model: &str, stream: bool) -> Value {
    json!({
        "model": model,
        "messages": [{"role": "user", "content": "Say something."}],
        "max_tokens": 64,
        "stream": stream,
    })
}

/// `POST /v1/chat/completions` with `key` (if any) and `body`.
pub async fn post_chat(
    client: &reqwest::Client,
    gw: &Gateway,
    key: Option<&str>,
    body: &Value,
) -> reqwest::Response {
    let mut req = client.post(gw.url("/v1/chat/completions")).json(body);
    if let Some(key) = key {
        req = req.bearer_auth(key);
    }
    bounded("chat request answered", req.send())
        .await
        .expect("chat request reaches the gateway")
}

/// Sends one more call for `key` that may wait up to 10 s in the gateway
/// (`x-request-timeout`) and asserts that it is served and that the
/// simulator behind refused nothing: what a reload that keeps the quota
/// state promises (SPEC GW-15).
pub async fn one_more_call_draws_no_429(gw: &Gateway, sim: &SimServer, key: &str, body: &Value) {
    let req = client()
        .post(gw.url("/v1/chat/completions"))
        .bearer_auth(key)
        .header("x-request-timeout", "10")
        .json(body);
    let r = bounded("the call answered", req.send())
        .await
        .expect("the call reaches the gateway");
    assert_eq!(r.status(), 200);
    assert_eq!(
        sim.stats().rejected_429.total(),
        0,
        "the provider refused nothing"
    );
}

/// `POST /v1/chat/completions` with `key` and `body` on a task of its own,
/// for a call that will wait (or be abandoned with `abort`, like a client
/// that disconnects). Resolves to the response, or the transport error.
pub fn spawn_chat(
    gw: &Gateway,
    key: &'static str,
    body: Value,
) -> JoinHandle<reqwest::Result<reqwest::Response>> {
    let (client, url) = (client(), gw.url("/v1/chat/completions"));
    tokio::spawn(async move { client.post(url).bearer_auth(key).json(&body).send().await })
}

/// Opens a stream of model `chat` for `key` and reads its first chunk: the
/// stream then holds its permits until the response is dropped or read to
/// the end.
pub async fn hold_stream(gw: &Gateway, key: &str) -> reqwest::Response {
    let mut resp = post_chat(&client(), gw, Some(key), &chat("chat", true)).await;
    assert_eq!(resp.status(), 200);
    bounded("first chunk", resp.chunk())
        .await
        .expect("first chunk read")
        .expect("the stream has a first chunk");
    resp
}

/// An error response: its status, `retry-after` and OpenAI error object
/// (`{"message", "type", "code", ...}`); panics if the body is not in the
/// OpenAI error format.
pub async fn error_of(resp: reqwest::Response) -> (u16, Option<String>, Value) {
    let status = resp.status().as_u16();
    let retry_after = resp
        .headers()
        .get("retry-after")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let body: Value = resp.json().await.expect("error body is JSON");
    let error = body
        .get("error")
        .cloned()
        .unwrap_or_else(|| panic!("not an OpenAI error body: {body}"));
    assert!(
        error.get("message").and_then(Value::as_str).is_some(),
        "{body}"
    );
    assert!(
        error.get("type").and_then(Value::as_str).is_some(),
        "{body}"
    );
    (status, retry_after, error)
}

/// The value of header `name` of `resp`, if it is text.
pub fn header(resp: &reqwest::Response, name: &str) -> Option<String> {
    resp.headers()
        .get(name)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
}

/// The number header `name` of `resp` holds; fails the test without one.
pub fn number(resp: &reqwest::Response, name: &str) -> u64 {
    header(resp, name)
        .unwrap_or_else(|| panic!("no {name}"))
        .parse()
        .unwrap_or_else(|_| panic!("{name} is not a number"))
}

/// The `code` of an OpenAI error object.
pub fn code(error: &Value) -> &str {
    error.get("code").and_then(Value::as_str).unwrap_or("")
}

/// What a client read from an SSE body.
#[derive(Debug)]
pub struct SseRead {
    /// The `data:` payloads in order (`[DONE]` included).
    pub events: Vec<String>,
    /// `Err` when reading the body failed (an aborted transfer).
    pub end: Result<(), String>,
}

impl SseRead {
    /// Whether the stream ended with `data: [DONE]` and a clean end.
    pub fn completed(&self) -> bool {
        self.end.is_ok() && self.events.last().map(String::as_str) == Some("[DONE]")
    }

    /// The events carrying an `error` member.
    pub fn errors(&self) -> Vec<Value> {
        self.events
            .iter()
            .filter_map(|e| serde_json::from_str::<Value>(e).ok())
            .filter(|v| v.get("error").is_some())
            .collect()
    }

    /// The concatenated `delta.content` of the chunks.
    pub fn text(&self) -> String {
        self.events
            .iter()
            .filter_map(|e| serde_json::from_str::<Value>(e).ok())
            .filter_map(|v| {
                v.pointer("/choices/0/delta/content")
                    .and_then(Value::as_str)
                    .map(str::to_owned)
            })
            .collect()
    }
}

/// Splits complete SSE events off `buf` into `out`.
fn drain_events(buf: &mut String, out: &mut Vec<String>) {
    while let Some(end) = buf.find("\n\n") {
        let event: String = buf.drain(..end + 2).collect();
        let data: Vec<&str> = event
            .lines()
            .filter_map(|l| l.strip_prefix("data:"))
            .map(str::trim_start)
            .collect();
        if !data.is_empty() {
            out.push(data.join("\n"));
        }
    }
}

/// Reads an SSE body to its end (bounded).
pub async fn read_sse(resp: reqwest::Response) -> SseRead {
    read_sse_from(resp.bytes_stream(), String::new()).await
}

/// Reads the rest of an SSE body whose start (`already`) was read.
pub async fn read_sse_from(
    mut body: impl futures_core::Stream<Item = reqwest::Result<bytes::Bytes>> + Unpin,
    already: String,
) -> SseRead {
    let mut read = SseRead {
        events: Vec::new(),
        end: Ok(()),
    };
    let mut buf = already;
    drain_events(&mut buf, &mut read.events);
    bounded("the SSE body ends", async {
        while let Some(chunk) = body.next().await {
            match chunk {
                Ok(bytes) => {
                    buf.push_str(&String::from_utf8_lossy(&bytes));
                    drain_events(&mut buf, &mut read.events);
                }
                Err(e) => {
                    read.end = Err(format!("{e:?}"));
                    return;
                }
            }
        }
    })
    .await;
    if !buf.trim().is_empty() && read.end.is_ok() {
        read.end = Err(format!("body ended inside an event: {buf:?}"));
    }
    read
}

/// Log output captured in memory (a `tracing_subscriber` writer).
#[derive(Clone, Default)]
pub struct Logs(Arc<std::sync::Mutex<Vec<u8>>>);

impl Logs {
    /// Captures this thread's log output until the guard is dropped (on
    /// a single-threaded test runtime the server's tasks log here too).
    pub fn capture() -> (Logs, tracing::subscriber::DefaultGuard) {
        let logs = Logs::default();
        let guard = tracing::subscriber::set_default(
            tracing_subscriber::fmt()
                .with_writer(logs.clone())
                .with_ansi(false)
                .finish(),
        );
        (logs, guard)
    }

    /// Everything written so far.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }
}

impl std::io::Write for Logs {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for Logs {
    type Writer = Logs;

    fn make_writer(&'a self) -> Logs {
        self.clone()
    }
}

/// A gateway config with one provider table `provider` (TOML lines), one
/// scope `main` (`scope` lines) and model `m` (`model` lines).
pub fn one_model_config(provider: &str, scope: &str, model: &str) -> String {
    format!(
        r#"
[retry]
base_delay = "20ms"
max_delay = "100ms"

[providers.up]
{provider}

[scopes.main]
{scope}

[models.m]
provider = "up"
scope = "main"
{model}

{}
"#,
        tenants("", "")
    )
}

/// Posts `body` to `path` with `key`, bounded.
pub async fn post_json(gw: &Gateway, path: &str, key: &str, body: &Value) -> reqwest::Response {
    bounded(
        "request answered",
        client()
            .post(gw.url(path))
            .bearer_auth(key)
            .json(body)
            .send(),
    )
    .await
    .expect("the gateway answers")
}

/// One model `chat` (the simulator's `sim-chat`) on a generous scope,
/// the two tenants of [`tenants`] (`a` added to tenant a), with `server`
/// and `model` lines in their tables and `extra` at the end: the hostile
/// client tests' gateway.
pub fn hostile_config(base_url: &str, server: &str, model: &str, a: &str, extra: &str) -> String {
    format!(
        r#"
[server]
{server}

[providers.up]
base_url = "{base_url}"

[scopes.main]
rpm = 100
tpm = 100000

[models.chat]
provider = "up"
upstream_model = "sim-chat"
scope = "main"
{model}

{}

{extra}
"#,
        tenants(a, "")
    )
}

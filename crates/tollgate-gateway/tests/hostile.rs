//! Slow, stalled and malformed clients (SPEC GW-17, DL-1, GW-2, GW-7,
//! GW-8, GW-16): none of them can hold capacity, hang shutdown or slip past
//! authentication. Every client here is a real socket; the misbehaving
//! ones are raw TCP, so that they can stop reading or stop sending.

mod common;

use std::time::Duration;

use common::upstream::{End, Reply, Scripted, chunk};
use common::*;
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};
use tokio::time::Instant;

/// Generous slack for bounds on 2 busy CI cores.
const SLACK: Duration = Duration::from_secs(5);

/// A small chat request body as JSON text.
fn chat_body(stream: bool) -> String {
    chat("chat", stream).to_string()
}

/// A connection whose receive buffer is small, so that a client that does
/// not read fills it (and the gateway's send side) quickly.
async fn stingy_connection(gw: &Gateway) -> TcpStream {
    let socket = TcpSocket::new_v4().expect("socket");
    socket.set_recv_buffer_size(4096).expect("SO_RCVBUF");
    socket
        .connect(gw.addr().parse().expect("socket address"))
        .await
        .expect("connect")
}

/// Writes a request head (`head` lines without the final blank line) and
/// then `body`.
async fn send(tcp: &mut TcpStream, head: &[u8], body: &[u8]) {
    tcp.write_all(head).await.expect("write head");
    tcp.write_all(b"\r\n").await.expect("write head end");
    tcp.write_all(body).await.expect("write body");
}

/// A request head for `POST /v1/chat/completions` with the extra header
/// lines `extra` (each ending in CRLF) and a `content-length`.
fn head(extra: &str, content_length: usize) -> Vec<u8> {
    format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: gateway\r\ncontent-type: application/json\r\ncontent-length: {content_length}\r\n{extra}"
    )
    .into_bytes()
}

/// Reads one response with a `content-length`: its status, head and body.
async fn read_response(tcp: &mut TcpStream) -> (u16, String, String) {
    let mut seen = Vec::new();
    let mut buf = [0u8; 4096];
    let head_end = loop {
        if let Some(i) = seen.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
        let n = tcp.read(&mut buf).await.expect("read response");
        assert!(n > 0, "closed before a response head");
        seen.extend_from_slice(&buf[..n]);
    };
    let head = String::from_utf8_lossy(&seen[..head_end]).into_owned();
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no status line: {head:?}"));
    let length: usize = head
        .lines()
        .find_map(|l| {
            let (name, value) = l.split_once(':')?;
            name.eq_ignore_ascii_case("content-length")
                .then(|| value.trim().parse().ok())?
        })
        .unwrap_or_else(|| panic!("no content-length: {head:?}"));
    while seen.len() < head_end + length {
        let n = tcp.read(&mut buf).await.expect("read body");
        assert!(n > 0, "closed inside the body");
        seen.extend_from_slice(&buf[..n]);
    }
    let body = String::from_utf8_lossy(&seen[head_end..head_end + length]).into_owned();
    (status, head, body)
}

/// The `error` object of an OpenAI error body (panics otherwise).
fn openai_error(body: &str) -> Value {
    let v: Value = serde_json::from_str(body).unwrap_or_else(|_| panic!("not JSON: {body}"));
    let e = v["error"].clone();
    assert!(e["message"].is_string() && e["type"].is_string(), "{body}");
    e
}

/// Reads until the server closes the connection (an end or a reset).
async fn closed_by_server(tcp: &mut TcpStream) {
    let mut sink = vec![0u8; 64 * 1024];
    bounded("the server closes the connection", async {
        loop {
            match tcp.read(&mut sink).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    })
    .await;
}

/// A stream far larger than the socket buffers between the gateway and a
/// client that does not read (18 MB: Linux lets a send buffer grow to
/// 4 MB), that then never ends. Its events are large (900 kB, under the
/// 1 MiB event limit) so that the write hyper has buffered when the
/// client stalls is far larger than what the kernel later finds room for:
/// a wake-up at the deadline then cannot make hyper poll the body again.
fn endless_big_stream() -> Reply {
    let text = "x".repeat(900_000);
    Reply::Stream {
        events: (0..20).map(|_| chunk(&text)).collect(),
        end: End::Hang,
    }
}

/// Every limit of `scope` has all of its capacity available.
fn untouched(scope: &tollgate::admission::ScopeSnapshot) -> bool {
    scope.counters.admitted == 0 && scope.limits.iter().all(|l| l.available == l.limit as i64)
}

/// The value of the `tollgate_calls_total` counter of `model` and
/// `terminal`, from `/metrics`.
async fn calls_total(gw: &Gateway, model: &str, terminal: &str) -> u64 {
    let text = reqwest::get(gw.url("/metrics"))
        .await
        .expect("metrics")
        .text()
        .await
        .expect("metrics text");
    let (m, t) = (
        format!("model=\"{model}\""),
        format!("terminal=\"{terminal}\""),
    );
    text.lines()
        .filter(|l| l.starts_with("tollgate_calls_total{") && l.contains(&m) && l.contains(&t))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .map(|v| v as u64)
        .sum()
}

// proves: GW-17, DL-6, POOL-4 (a client that stops reading a stream does not keep its permits past its deadline: they come back whether or not the body is polled, the call ends Aborted, the next caller is served, and the connection is closed)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stalled_stream_reader_releases_its_permits_at_the_deadline() {
    stalled_stream_reader("", "stalled").await;
}

// proves: GW-17, DL-6, POOL-4 (the same on connection threads of their own:
// `server.connection_threads`)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stalled_stream_reader_on_connection_threads() {
    stalled_stream_reader("connection_threads = 2", "stalled_threads").await;
}

/// A client that stops reading a stream of `model` (a name of its own per
/// test: the metrics recorder is shared by the tests of this file), with
/// `server` settings: its permits come back at its deadline.
async fn stalled_stream_reader(server: &str, model: &'static str) {
    let up = Scripted::start(vec![endless_big_stream(), Reply::ok()]).await;
    let gw = Gateway::start(
        &hostile_config(
            &up.base_url,
            server,
            "concurrency = 1\nmax_waiting = 4",
            "concurrency = 4",
            "",
        )
        .replace("[models.chat]", &format!("[models.{model}]")),
    )
    .await;
    let pool = format!("model:{model}");
    let mut stalled = stingy_connection(&gw).await;
    let body = chat(model, true).to_string();
    send(
        &mut stalled,
        &head(
            &format!("authorization: Bearer {KEY_A}\r\nx-request-timeout: 3\r\n"),
            body.len(),
        ),
        body.as_bytes(),
    )
    .await;
    eventually("the stream holds the model permit", || {
        gw.in_use(&pool) == 1
    })
    .await;
    let started = Instant::now();

    // The next caller waits for that permit, with a budget that outlasts
    // the stalled stream's deadline by far.
    let next = tokio::spawn({
        let (client, url) = (client(), gw.url("/v1/chat/completions"));
        async move {
            client
                .post(url)
                .bearer_auth(KEY_A)
                .header("x-request-timeout", "12")
                .json(&chat(model, false))
                .send()
                .await
        }
    });
    let answer = bounded("the next caller is answered", next)
        .await
        .expect("task")
        .expect("response");
    assert_eq!(answer.status(), 200, "the permit came back at the deadline");
    answer.bytes().await.expect("body");
    assert!(
        started.elapsed() < Duration::from_secs(3) + SLACK,
        "served once the stalled stream's deadline passed, not after its own"
    );

    gw.wait_idle().await;
    assert_eq!(calls_total(&gw, model, "aborted").await, 1);
    assert_eq!(calls_total(&gw, model, "completed").await, 1);
    closed_by_server(&mut stalled).await;
    assert_eq!(up.attempts(), 2);
}

// proves: GW-17, GW-2 (no key ⇒ 401 at once, without waiting for the announced body)
#[tokio::test]
async fn missing_key_is_refused_before_the_body() {
    let sim = fast_sim().await;
    let gw = Gateway::start(&hostile_config(&sim.openai_base_url(), "", "", "", "")).await;
    let mut tcp = TcpStream::connect(gw.addr()).await.expect("connect");
    send(&mut tcp, &head("", 100_000), b"{\"model\":").await;
    let (status, _, body) = tokio::time::timeout(SLACK, read_response(&mut tcp))
        .await
        .expect("answered without the rest of the body");
    assert_eq!(status, 401);
    openai_error(&body);
    // A wrong key too.
    let mut tcp = TcpStream::connect(gw.addr()).await.expect("connect");
    send(
        &mut tcp,
        &head("authorization: Bearer sk-nobody\r\n", 100_000),
        b"{\"model\":",
    )
    .await;
    let (status, _, _) = tokio::time::timeout(SLACK, read_response(&mut tcp))
        .await
        .expect("answered without the rest of the body");
    assert_eq!(status, 401);
    assert_eq!(sim.stats().requests_total, 0);
    assert!(gw.is_idle());
}

// proves: GW-17, DL-1 (a stalled upload is cut at the request's deadline, which started when the head was read: 408 request_timeout, and no quota or permit was taken)
#[tokio::test]
async fn stalled_upload_is_cut_at_its_deadline() {
    stalled_upload("").await;
}

// proves: GW-17, DL-1 (the same on connection threads of their own)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stalled_upload_on_connection_threads() {
    stalled_upload("connection_threads = 2").await;
}

/// A stalled upload with `server` settings (besides a long body read
/// timeout): cut at the request's deadline, nothing taken.
async fn stalled_upload(server: &str) {
    let sim = fast_sim().await;
    let gw = Gateway::start(&hostile_config(
        &sim.openai_base_url(),
        &format!("body_read_timeout = \"60s\"\n{server}"),
        "concurrency = 2",
        "concurrency = 2\nrpm = 10\ntpm = 10000",
        "",
    ))
    .await;
    let mut tcp = TcpStream::connect(gw.addr()).await.expect("connect");
    let sent = Instant::now();
    send(
        &mut tcp,
        &head(
            &format!("authorization: Bearer {KEY_A}\r\nx-request-timeout: 1\r\n"),
            100_000,
        ),
        b"{\"model\":",
    )
    .await;
    let (status, head, body) = tokio::time::timeout(Duration::from_secs(1) + SLACK, async {
        read_response(&mut tcp).await
    })
    .await
    .expect("answered at the deadline");
    assert!(
        sent.elapsed() >= Duration::from_millis(900),
        "not before it"
    );
    assert_eq!(status, 408, "{head}{body}");
    let error = openai_error(&body);
    assert_eq!(error["code"], "request_timeout");
    assert!(
        head.to_ascii_lowercase().contains("connection: close"),
        "{head}"
    );
    closed_by_server(&mut tcp).await;

    assert!(untouched(&gw.tenant_scope("tenant:a")), "no tenant quota");
    assert!(untouched(&gw.upstream_scope("main")), "no upstream quota");
    assert!(gw.is_idle());
    assert_eq!(gw.pool("tenant:a").available, 2);
    assert_eq!(gw.pool("model:chat").available, 2);
    assert_eq!(sim.stats().requests_total, 0);
}

// proves: GW-17, GW-7 (the body read timeout bounds an upload even when the request's deadline is long)
#[tokio::test]
async fn body_read_timeout_bounds_a_slow_upload() {
    let sim = fast_sim().await;
    let gw = Gateway::start(&hostile_config(
        &sim.openai_base_url(),
        "body_read_timeout = \"300ms\"",
        "",
        "rpm = 10",
        "",
    ))
    .await;
    let mut tcp = TcpStream::connect(gw.addr()).await.expect("connect");
    send(
        &mut tcp,
        &head(
            &format!("authorization: Bearer {KEY_A}\r\nx-request-timeout: 120\r\n"),
            100_000,
        ),
        b"{\"model\":",
    )
    .await;
    let (status, _, body) = tokio::time::timeout(SLACK, read_response(&mut tcp))
        .await
        .expect("answered at the body read timeout");
    assert_eq!(status, 408);
    assert_eq!(openai_error(&body)["code"], "request_timeout");
    assert!(untouched(&gw.tenant_scope("tenant:a")));
    assert_eq!(sim.stats().requests_total, 0);
    // A body that does arrive in time is served as usual.
    let resp = post_chat(&client(), &gw, Some(KEY_A), &chat("chat", false)).await;
    assert_eq!(resp.status(), 200);
}

// proves: GW-2 (an Authorization header that is not ASCII is a malformed key, 401, never anonymous access)
#[tokio::test]
async fn non_ascii_authorization_is_401_even_with_anonymous_access() {
    let sim = fast_sim().await;
    let gw = Gateway::start(&hostile_config(
        &sim.openai_base_url(),
        "",
        "",
        "",
        "[anonymous]\nenabled = true\nconcurrency = 2",
    ))
    .await;
    let body = chat_body(false);
    for value in [&b"Bearer \xff\xfe"[..], "Bearer clé".as_bytes(), b"\xff"] {
        let mut tcp = TcpStream::connect(gw.addr()).await.expect("connect");
        let mut h = head("", body.len());
        h.extend_from_slice(b"authorization: ");
        h.extend_from_slice(value);
        h.extend_from_slice(b"\r\n");
        send(&mut tcp, &h, body.as_bytes()).await;
        let (status, _, text) = bounded("answered", read_response(&mut tcp)).await;
        assert_eq!(status, 401, "{value:?}: {text}");
        openai_error(&text);
    }
    assert_eq!(sim.stats().requests_total, 0);
    assert!(gw.tenants().scopes.iter().all(untouched));
    assert_eq!(gw.pool("tenant:anonymous").available, 2);
    // Without the header, anonymous access still works.
    let resp = post_chat(&client(), &gw, None, &chat("chat", false)).await;
    assert_eq!(resp.status(), 200);
}

// proves: GW-8, LC-7, GW-17 (a shutdown with a streaming client that stopped reading finishes within the grace period plus a bounded cleanup: the stream is ended, every permit is back, the connection is dropped)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_with_a_stalled_reader_is_bounded() {
    let up = Scripted::start(vec![endless_big_stream()]).await;
    let mut gw = Gateway::start(&hostile_config(
        &up.base_url,
        "shutdown_grace = \"300ms\"",
        "concurrency = 2",
        "concurrency = 2",
        "",
    ))
    .await;
    let mut stalled = stingy_connection(&gw).await;
    let body = chat_body(true);
    send(
        &mut stalled,
        &head(&format!("authorization: Bearer {KEY_A}\r\n"), body.len()),
        body.as_bytes(),
    )
    .await;
    eventually("the stream holds its permits", || {
        gw.in_use("model:chat") == 1 && gw.in_use("tenant:a") == 1
    })
    .await;
    // Let the gateway fill the socket buffers and stop polling the body.
    tokio::time::sleep(Duration::from_millis(300)).await;

    let signalled = Instant::now();
    gw.begin_shutdown();
    gw.stopped().await.expect("serve ends");
    let took = signalled.elapsed();
    assert!(
        took < Duration::from_millis(300) + tollgate_gateway::server::CLEANUP_BUDGET + SLACK,
        "shutdown took {took:?}"
    );
    assert!(gw.is_idle(), "every permit is back");
    closed_by_server(&mut stalled).await;
}

// proves: GW-16, CB-2 (deadlines the client chose never open the provider's circuit: after many 504s from tiny x-request-timeout values an ordinary call is served)
#[tokio::test]
async fn client_deadlines_leave_the_circuit_closed() {
    let sim = sim(tollgate_sim::SimConfig {
        ttft: Duration::from_millis(300),
        ..tollgate_sim::SimConfig::default()
    })
    .await;
    let gw = Gateway::start(&hostile_config(&sim.openai_base_url(), "", "", "", "")).await;
    let client = client();
    // Six 0.1 s budgets run out upstream (504, a transport-phase deadline:
    // the simulator answers after 300 ms), more than the default failure
    // threshold of 5; the 0.001 s ones may run out earlier still.
    let budgets = [
        "0.1", "0.001", "0.1", "0.1", "0.001", "0.1", "0.1", "0.001", "0.1",
    ];
    let mut upstream_timeouts = 0;
    for timeout in budgets {
        let resp = client
            .post(gw.url("/v1/chat/completions"))
            .bearer_auth(KEY_A)
            .header("x-request-timeout", timeout)
            .json(&chat("chat", false))
            .send()
            .await
            .expect("answered");
        let (status, _, error) = error_of(resp).await;
        assert_ne!(code(&error), "circuit_open", "after {timeout}");
        assert!(matches!(status, 504 | 429 | 408), "{status} {error}");
        upstream_timeouts += usize::from(status == 504);
    }
    assert!(
        upstream_timeouts >= 5,
        "the threshold was reached: {upstream_timeouts}"
    );
    let resp = post_chat(&client, &gw, Some(KEY_A), &chat("chat", false)).await;
    let status = resp.status();
    let text = resp.text().await.unwrap_or_default();
    assert_eq!(status, 200, "{text}");
    assert!(
        gw.app
            .breakers
            .iter()
            .all(|(_, b)| b.state().as_str() == "closed")
    );
}

// proves: GW-7, GW-17 (connections are capped: past max_connections a new connection waits for a slot instead of being served)
#[tokio::test]
async fn connections_past_the_cap_wait_for_a_slot() {
    let sim = fast_sim().await;
    let gw = Gateway::start(&hostile_config(
        &sim.openai_base_url(),
        "max_connections = 1\nheader_read_timeout = \"60s\"",
        "",
        "",
        "",
    ))
    .await;
    let first = TcpStream::connect(gw.addr()).await.expect("connect");
    // Give the accept loop time to take the one slot for it.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let mut second = TcpStream::connect(gw.addr()).await.expect("connect");
    second
        .write_all(b"GET /healthz HTTP/1.1\r\nhost: gateway\r\n\r\n")
        .await
        .expect("write");
    let early = tokio::time::timeout(Duration::from_millis(500), read_response(&mut second)).await;
    assert!(early.is_err(), "served past the cap");
    drop(first);
    let (status, _, _) = bounded("served once a slot is free", read_response(&mut second)).await;
    assert_eq!(status, 200);
}

//! `server.max_connections_per_client` (SPEC GW-17, GW-7) where the
//! flooding test of hostile_listeners.rs does not reach: on the connection
//! threads, on a dual-stack `[::]` listener, after connections that end in
//! an error, and under a flood of refused connections that never close.
//! Real sockets throughout; flooders and clients bound to addresses of
//! their own in 127/8. No metrics are read here (the recorder is the
//! process's), so these tests do not disturb hostile_listeners.rs.

mod common;

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use common::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tollgate_gateway::build::build;
use tollgate_gateway::config::GatewayConfig;
use tollgate_gateway::live::Live;
use tollgate_gateway::metrics::Metrics;
use tollgate_gateway::server::{ServeOptions, serve_live};
use tollgate_sim::SimServer;

/// A gateway serving on `listener`: (its port, stop, task).
async fn start_on(
    toml: &str,
    listener: TcpListener,
) -> (
    u16,
    tokio::sync::oneshot::Sender<()>,
    tokio::task::JoinHandle<std::io::Result<()>>,
) {
    let config = GatewayConfig::from_toml(toml, "test.toml").expect("valid");
    let metrics = Metrics::install();
    let app = build(&config, metrics.clone()).expect("builds");
    let _ = app.access_log.capture();
    let live = Arc::new(Live::new(app, None, metrics));
    let port = listener.local_addr().expect("addr").port();
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(serve_live(
        listener,
        None,
        live,
        ServeOptions::from_config(&config.server),
        async move {
            let _ = rx.await;
        },
    ));
    (port, tx, task)
}

async fn stop(
    stop: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<std::io::Result<()>>,
) {
    let _ = stop.send(());
    bounded("serve returns", task)
        .await
        .expect("join")
        .expect("serve");
}

/// A TCP connection from `from` (an address of this host) to `to`.
async fn connect_from(from: &str, to: SocketAddr) -> TcpStream {
    let from: IpAddr = from.parse().expect("source");
    let socket = match from {
        IpAddr::V4(_) => TcpSocket::new_v4(),
        IpAddr::V6(_) => TcpSocket::new_v6(),
    }
    .expect("socket");
    socket
        .bind(SocketAddr::new(from, 0))
        .expect("bind the source");
    socket.connect(to).await.expect("connect")
}

/// Everything the server sends on `tcp` until it closes it, or `None`
/// when it resets it (within [`PATIENCE`]).
async fn answer(tcp: &mut TcpStream) -> Option<String> {
    let mut seen = Vec::new();
    let read = bounded(
        "the server closes the connection",
        tcp.read_to_end(&mut seen),
    )
    .await;
    read.ok()
        .map(|_| String::from_utf8_lossy(&seen).into_owned())
}

/// A connection from `from` that sent `payload` and was not refused by
/// the per-client cap (a refused one is retried for [`PATIENCE`]: the
/// server may see a connection end a moment after its client does; a
/// count that is never given back fails here). With what it answered
/// within 300 ms.
async fn admitted(from: &str, to: SocketAddr, payload: &[u8]) -> (TcpStream, String) {
    let give_up = tokio::time::Instant::now() + PATIENCE;
    loop {
        let mut tcp = connect_from(from, to).await;
        tcp.write_all(payload).await.expect("write");
        let mut seen = vec![0u8; 4096];
        let n = tokio::time::timeout(Duration::from_millis(300), tcp.read(&mut seen))
            .await
            .map_or(0, |r| r.unwrap_or(0));
        let seen = String::from_utf8_lossy(&seen[..n]).into_owned();
        if !seen.contains("too_many_connections") {
            return (tcp, seen);
        }
        assert!(
            tokio::time::Instant::now() < give_up,
            "{from} is still refused: its connections were not given back"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A connection from `from` that the server counts and keeps: a request
/// whose body it is still sending, a byte every 100 ms (within the body
/// read timeout, 10 s, for as long as a test needs it).
async fn hold(from: &'static str, to: SocketAddr) -> tokio::task::JoinHandle<()> {
    let head = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: gateway\r\n\
         authorization: Bearer {KEY_A}\r\ncontent-type: application/json\r\n\
         content-length: 100000\r\n\r\n"
    );
    let (mut tcp, _) = admitted(from, to, head.as_bytes()).await;
    tokio::spawn(async move {
        loop {
            if tcp.write_all(b" ").await.is_err() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
}

/// Asserts that one more connection from `from` is refused with the
/// fixed 429.
async fn refused(from: &str, to: SocketAddr) {
    let mut tcp = connect_from(from, to).await;
    tcp.write_all(b"GET /v1/models HTTP/1.1\r\nhost: gateway\r\n\r\n")
        .await
        .expect("write");
    let text = answer(&mut tcp).await;
    let text = text.unwrap_or_else(|| panic!("a connection from {from} past its cap was reset"));
    assert!(
        text.starts_with("HTTP/1.1 429 ") && text.contains("too_many_connections"),
        "a connection from {from} past its cap: {text:?}"
    );
}

/// A client whose connections come from `from`, one per request.
fn client_from(from: &str) -> reqwest::Client {
    reqwest::Client::builder()
        .no_proxy()
        .pool_max_idle_per_host(0)
        .timeout(Duration::from_secs(60))
        .local_address(from.parse::<IpAddr>().expect("address"))
        .build()
        .expect("client")
}

/// A chat completion from `from` to `url` answers 200, once the
/// connections it held before are given back (a 429 from the
/// per-client cap is retried for [`PATIENCE`]: the server may see a
/// connection end a moment after its client does; a count that is never
/// given back fails here).
async fn served(from: &str, url: &str) {
    let client = client_from(from);
    let give_up = tokio::time::Instant::now() + PATIENCE;
    loop {
        let r = bounded(
            "a chat completion",
            client
                .post(format!("{url}/v1/chat/completions"))
                .bearer_auth(KEY_A)
                .json(&chat("chat", false))
                .send(),
        )
        .await
        .expect("response");
        if r.status() == 200 {
            return;
        }
        assert_eq!(r.status(), 429, "from {from}");
        assert!(
            tokio::time::Instant::now() < give_up,
            "{from} is still refused: its connections were not given back"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The per-client cap on the listener in the given serving mode: a held
/// connection counts, one more is refused, other addresses are served,
/// and every way a connection ends gives its count back — a finished
/// request, a head that is not HTTP, a head that never ends (the header
/// read timeout), a client that goes away mid-head.
async fn cap_is_given_back_on_every_end(threads: &str) {
    let sim = fast_sim().await;
    let toml = hostile_config(
        &sim.openai_base_url(),
        &format!(
            "max_connections = 8\nmax_connections_per_client = 1\n\
             header_read_timeout = \"1s\"\nidle_timeout = \"60s\"\n{threads}"
        ),
        "",
        "",
        "",
    );
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let (port, tx, task) = start_on(&toml, listener).await;
    let to = SocketAddr::from(([127, 0, 0, 1], port));
    let url = format!("http://{to}");
    let flooder = "127.0.0.2";
    let held = hold(flooder, to).await;
    refused(flooder, to).await;
    served("127.0.0.3", &url).await;
    held.abort();
    let _ = held.await;
    for round in 0..5 {
        // A request served to its end.
        served(flooder, &url).await;
        // A head that is not HTTP: hyper answers 400 and closes.
        let (mut tcp, _) = admitted(flooder, to, b"\x16\x03\x01 not http\r\n\r\n").await;
        let _ = answer(&mut tcp).await;
        served(flooder, &url).await;
        // A head that never ends: closed at the header read timeout.
        let (mut tcp, _) = admitted(flooder, to, b"POST /v1/chat/completions HTTP/1.1\r\n").await;
        let _ = answer(&mut tcp).await;
        served(flooder, &url).await;
        // A client that goes away mid-head.
        let (tcp, _) = admitted(
            flooder,
            to,
            b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\n",
        )
        .await;
        drop(tcp);
        served(flooder, &url).await;
        // Still capped: no count was given back twice.
        let held = hold(flooder, to).await;
        refused(flooder, to).await;
        held.abort();
        let _ = held.await;
        let _ = round;
    }
    stop(tx, task).await;
}

// proves: GW-17, GW-7 (on the work-stealing runtime, every way a
// connection ends gives its client's count back exactly once: the address
// is served again, and still capped)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn per_client_count_is_given_back_on_every_end() {
    cap_is_given_back_on_every_end("").await;
}

// proves: GW-17, GW-7 (with server.connection_threads the per-client cap
// holds and every way a connection ends on a connection thread gives its
// client's count back exactly once)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn per_client_count_is_given_back_on_connection_threads() {
    cap_is_given_back_on_every_end("connection_threads = 2").await;
}

// proves: GW-17 (on a dual-stack [::] listener an IPv4 client arriving
// IPv4-mapped is capped as its IPv4 address, apart from other IPv4
// addresses, and an IPv6 client by its /64)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dual_stack_listener_caps_mapped_ipv4_and_ipv6_clients() {
    let sim = fast_sim().await;
    let toml = hostile_config(
        &sim.openai_base_url(),
        "max_connections = 8\nmax_connections_per_client = 1\n\
         header_read_timeout = \"60s\"\nidle_timeout = \"60s\"",
        "",
        "",
        "",
    );
    let listener = TcpListener::bind("[::]:0").await.expect("bind [::]");
    let (port, tx, task) = start_on(&toml, listener).await;
    let v4 = SocketAddr::from(([127, 0, 0, 1], port));
    let v6: SocketAddr = format!("[::1]:{port}").parse().expect("address");
    let held = hold("127.0.0.2", v4).await;
    refused("127.0.0.2", v4).await;
    served("127.0.0.3", &format!("http://{v4}")).await;
    let held6 = hold("::1", v6).await;
    refused("::1", v6).await;
    held.abort();
    held6.abort();
    let _ = (held.await, held6.await);
    served("127.0.0.2", &format!("http://{v4}")).await;
    served("::1", &format!("http://{v6}")).await;
    stop(tx, task).await;
}

/// A gateway on 127.0.0.1 of 8 connections, one per client, with long
/// header and idle timeouts: (its upstream, its address, stop, task).
async fn one_connection_per_client() -> (
    SimServer,
    SocketAddr,
    tokio::sync::oneshot::Sender<()>,
    tokio::task::JoinHandle<std::io::Result<()>>,
) {
    let sim = fast_sim().await;
    let toml = hostile_config(
        &sim.openai_base_url(),
        "max_connections = 8\nmax_connections_per_client = 1\n\
         header_read_timeout = \"60s\"\nidle_timeout = \"60s\"",
        "",
        "",
        "",
    );
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let (port, tx, task) = start_on(&toml, listener).await;
    (sim, SocketAddr::from(([127, 0, 0, 1], port)), tx, task)
}

// proves: GW-17 (a flooder's refused connections that never close cost
// only their sender: while one address keeps far more refused
// connections open than refusals may run at once, a connection of another
// address past its own cap is still answered with the 429)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_refusals_leaves_other_clients_their_answer() {
    let (_sim, to, tx, task) = one_connection_per_client().await;
    let flooder = hold("127.0.0.2", to).await;
    let other = hold("127.0.0.3", to).await;
    // 100 connections past the flooder's cap, opened at once and never
    // closed: each refusal waits (up to its bound) for the close.
    let mut flood = Vec::new();
    for _ in 0..100 {
        flood.push(connect_from("127.0.0.2", to).await);
    }
    // The other client's connections past its cap get their answer.
    for _ in 0..3 {
        refused("127.0.0.3", to).await;
    }
    drop(flood);
    flooder.abort();
    other.abort();
    let _ = (flooder.await, other.await);
    stop(tx, task).await;
}

// proves: GW-17, GW-13 (a connection past its client's cap is answered
// after its request starts arriving, never before: an HTTP/1.1 client
// takes an answer to a request it has not sent for a broken connection;
// so a client such as reqwest sees the 429 with its retry-after)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refusal_answers_the_request_it_refuses() {
    let (_sim, to, tx, task) = one_connection_per_client().await;
    let held = hold("127.0.0.2", to).await;
    // A connection opened ahead of its request (as a client's pool
    // does): nothing arrives before the request is sent.
    let mut tcp = connect_from("127.0.0.2", to).await;
    let mut early = [0u8; 512];
    let early = tokio::time::timeout(Duration::from_millis(300), tcp.read(&mut early)).await;
    assert!(
        early.is_err(),
        "an answer arrived before the request was sent: {early:?}"
    );
    refused("127.0.0.2", to).await;
    let client = client_from("127.0.0.2");
    for _ in 0..10 {
        let r = bounded(
            "a refused request",
            client
                .post(format!("http://{to}/v1/chat/completions"))
                .bearer_auth(KEY_A)
                .json(&chat("chat", false))
                .send(),
        )
        .await
        .expect("a response, not a broken connection");
        assert_eq!(r.status(), 429);
        assert_eq!(r.headers()["retry-after"], "1");
        let body: serde_json::Value = r.json().await.expect("json");
        assert_eq!(body["error"]["code"], "too_many_connections");
    }
    drop(tcp);
    held.abort();
    let _ = held.await;
    stop(tx, task).await;
}

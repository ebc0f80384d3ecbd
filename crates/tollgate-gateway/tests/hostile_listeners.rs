//! Hostile clients that hold connections (SPEC GW-7, GW-17, DL-3): on the
//! side listener (`server.metrics_listen`), a slow reader of a large
//! one-shot answer, and one address flooding the API listener under
//! `server.max_connections_per_client`. Real sockets throughout.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::upstream::{Reply, Scripted};
use common::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tollgate_gateway::build::build;
use tollgate_gateway::config::GatewayConfig;
use tollgate_gateway::live::Live;
use tollgate_gateway::metrics::Metrics;
use tollgate_gateway::server::{ServeOptions, serve_live};

/// Generous slack for bounds on 2 busy CI cores.
const SLACK: Duration = Duration::from_secs(5);

fn config(base_url: &str, server: &str) -> String {
    hostile_config(base_url, server, "", "", "")
}

/// A gateway with a side listener: (API address, side address, stop, task).
async fn start_with_side(
    toml: &str,
) -> (
    String,
    String,
    tokio::sync::oneshot::Sender<()>,
    tokio::task::JoinHandle<std::io::Result<()>>,
) {
    let config = GatewayConfig::from_toml(toml, "test.toml").expect("valid");
    let metrics = Metrics::install();
    let app = build(&config, metrics.clone()).expect("builds");
    let _ = app.access_log.capture();
    let live = Arc::new(Live::new(app, None, metrics));
    let api = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let side = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let (api_addr, side_addr) = (
        api.local_addr().expect("addr").to_string(),
        side.local_addr().expect("addr").to_string(),
    );
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(serve_live(
        api,
        Some(side),
        live,
        ServeOptions::from_config(&config.server),
        async move {
            let _ = rx.await;
        },
    ));
    (api_addr, side_addr, tx, task)
}

/// Whether the server closes `tcp` within `within`.
async fn closed_within(tcp: &mut TcpStream, within: Duration) -> bool {
    let mut sink = vec![0u8; 16 * 1024];
    tokio::time::timeout(within, async {
        loop {
            match tcp.read(&mut sink).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    })
    .await
    .is_ok()
}

// proves: GW-17, GW-7 (a client of the side listener that never finishes
// its request head is disconnected at the header read timeout, as on the
// API's listener)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn side_listener_drops_a_slowloris_head() {
    let sim = fast_sim().await;
    let toml = config(
        &sim.openai_base_url(),
        "header_read_timeout = \"1s\"\nidle_timeout = \"1s\"",
    );
    let (_api, side, stop, task) = start_with_side(&toml).await;
    let mut tcp = TcpStream::connect(&side).await.expect("connect");
    tcp.write_all(b"GET /metrics HTTP/1.1\r\nhost: x\r\n")
        .await
        .expect("write");
    assert!(
        closed_within(&mut tcp, Duration::from_secs(1) + SLACK).await,
        "a head that never ends keeps its connection on the side listener"
    );
    let _ = stop.send(());
    bounded("serve returns", task)
        .await
        .expect("join")
        .expect("serve");
}

/// Reads one response's status line from `tcp`.
async fn status_of(tcp: &mut TcpStream) -> u16 {
    let mut seen = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        if let Some(line) = seen.windows(2).position(|w| w == b"\r\n") {
            let line = String::from_utf8_lossy(&seen[..line]).into_owned();
            return line
                .split(' ')
                .nth(1)
                .and_then(|s| s.parse().ok())
                .unwrap_or_else(|| panic!("no status line: {line:?}"));
        }
        let n = tcp.read(&mut buf).await.expect("read");
        assert!(n > 0, "closed before a response");
        seen.extend_from_slice(&buf[..n]);
    }
}

// proves: GW-7, GW-17 (the side listener's connections are capped like the
// API's, with slots of their own: past the cap a side connection waits,
// while the API still serves)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn side_listener_connections_are_capped_apart_from_the_api() {
    let sim = fast_sim().await;
    let toml = config(
        &sim.openai_base_url(),
        "max_connections = 1\nheader_read_timeout = \"60s\"",
    );
    let (api, side, stop, task) = start_with_side(&toml).await;
    let first = TcpStream::connect(&side).await.expect("connect");
    // Give the side accept loop time to take its one slot for it.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let mut second = TcpStream::connect(&side).await.expect("connect");
    second
        .write_all(b"GET /metrics HTTP/1.1\r\nhost: x\r\n\r\n")
        .await
        .expect("write");
    let early = tokio::time::timeout(Duration::from_millis(500), status_of(&mut second)).await;
    assert!(early.is_err(), "served past the cap");
    // The API's one slot is its own.
    let mut on_api = TcpStream::connect(&api).await.expect("connect");
    on_api
        .write_all(b"GET /healthz HTTP/1.1\r\nhost: x\r\n\r\n")
        .await
        .expect("write");
    assert_eq!(bounded("the API serves", status_of(&mut on_api)).await, 200);
    drop(first);
    assert_eq!(
        bounded("served once a slot is free", status_of(&mut second)).await,
        200
    );
    drop((second, on_api));
    let _ = stop.send(());
    bounded("serve returns", task)
        .await
        .expect("join")
        .expect("serve");
}

/// A one-shot chat completion of about 32 MB: far more than the socket
/// buffers between the gateway and its client hold.
fn huge_completion() -> Reply {
    let body = serde_json::json!({
        "id": "chatcmpl-huge",
        "object": "chat.completion",
        "created": 0,
        "model": "scripted",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "x".repeat(32_000_000)}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 5, "completion_tokens": 1, "total_tokens": 6}
    })
    .to_string();
    Reply::Status {
        status: 200,
        headers: Vec::new(),
        body,
    }
}

// proves: GW-17, DL-3, GW-7 (a client that reads a large one-shot answer
// slowly but steadily, never stalling long enough for the send timeout,
// loses its connection at its deadline: it cannot keep a connection slot,
// and the answer's memory, beyond it; another tenant waiting for that
// slot is served)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_reader_of_a_one_shot_answer_is_cut_at_its_deadline() {
    let up = Scripted::start(vec![huge_completion(), Reply::ok()]).await;
    let gw = Gateway::start(&config(
        &up.base_url,
        "max_connections = 1\nidle_timeout = \"10s\"\nheader_read_timeout = \"10s\"",
    ))
    .await;
    let mut slow = TcpStream::connect(gw.addr()).await.expect("connect");
    let body = chat("chat", false).to_string();
    slow.write_all(
        format!(
            "POST /v1/chat/completions HTTP/1.1\r\nhost: gateway\r\ncontent-type: application/json\r\n\
             authorization: Bearer {KEY_A}\r\nx-request-timeout: 3\r\ncontent-length: {}\r\n\r\n{body}",
            body.len()
        )
        .as_bytes(),
    )
    .await
    .expect("write");
    // Reads at most 64 kB every quarter of a second: the 32 MB answer
    // would take minutes, and the socket always makes progress within the
    // send timeout.
    let reader = tokio::spawn(async move {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            match slow.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    });
    eventually("the answer is on its way", || up.attempts() == 1).await;
    // Tenant b's call needs the one connection slot.
    let other = client()
        .post(gw.url("/v1/chat/completions"))
        .bearer_auth(KEY_B)
        .header("x-request-timeout", "15")
        .json(&chat("chat", false))
        .send();
    let answer = bounded("the other tenant is served", other)
        .await
        .expect("response");
    assert_eq!(answer.status(), 200);
    assert_eq!(up.attempts(), 2);
    reader.abort();
}

/// A connection to `addr` from the source address `from` (all of 127/8
/// reaches loopback on Linux).
async fn connect_from(from: &str, addr: &str) -> TcpStream {
    let socket = tokio::net::TcpSocket::new_v4().expect("socket");
    socket
        .bind(format!("{from}:0").parse().expect("source"))
        .expect("bind the source address");
    socket
        .connect(addr.parse().expect("address"))
        .await
        .expect("connect")
}

/// Everything the server sends on `tcp` until it closes it (within
/// [`PATIENCE`]).
async fn until_closed(tcp: &mut TcpStream) -> String {
    let mut seen = Vec::new();
    bounded(
        "the server closes the connection",
        tcp.read_to_end(&mut seen),
    )
    .await
    .expect("read");
    String::from_utf8_lossy(&seen).into_owned()
}

/// The value of the unlabelled series `name` in the exposition `text`.
fn series(text: &str, name: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
}

// proves: GW-17, GW-7 (with server.max_connections_per_client, one client
// address that opens more connections than its cap and trickles request
// heads holds only its cap: each further connection is answered 429
// too_many_connections and closed without its request read, so another
// client still gets its chat completion; once the flooder closes, nothing
// of it stays counted and its address is served again)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flooding_address_holds_only_its_connection_cap() {
    let sim = fast_sim().await;
    // Without the per-client cap the flooder's first four connections
    // would take every slot until the header read timeout (60 s), and the
    // other client's connection would wait in the backlog past PATIENCE.
    let toml = config(
        &sim.openai_base_url(),
        "max_connections = 4\nmax_connections_per_client = 2\n\
         header_read_timeout = \"60s\"\nidle_timeout = \"60s\"",
    );
    let (api, side, stop, task) = start_with_side(&toml).await;
    let head = "POST /v1/chat/completions HTTP/1.1\r\nhost: gateway\r\n";
    // The flooder: six connections (more than every slot), each sending
    // its head a line at a time, slowly, never finishing it.
    let mut flood = Vec::new();
    for _ in 0..6 {
        let mut tcp = connect_from("127.0.0.2", &api).await;
        let _ = tcp.write_all(head.as_bytes()).await;
        flood.push(tcp);
    }
    let mut held = Vec::new();
    let mut refused = Vec::new();
    for (i, tcp) in flood.into_iter().enumerate() {
        if i < 2 {
            // Accepted first (the backlog is first in, first out): kept
            // busy with a header line every 100 ms.
            held.push(tokio::spawn(async move {
                let mut tcp = tcp;
                loop {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    if tcp.write_all(b"x-slow: 1\r\n").await.is_err() {
                        return;
                    }
                }
            }));
        } else {
            refused.push(tcp);
        }
    }
    // A well-behaved client elsewhere is served.
    let good = client()
        .post(format!("http://{api}/v1/chat/completions"))
        .bearer_auth(KEY_A)
        .json(&chat("chat", false))
        .send();
    let good = bounded("the other client is served", good)
        .await
        .expect("response");
    assert_eq!(good.status(), 200);
    drop(good);
    // The flooder's connections past its cap got the 429 and were closed.
    for tcp in &mut refused {
        let answer = until_closed(tcp).await;
        assert!(answer.starts_with("HTTP/1.1 429 "), "{answer}");
        let lower = answer.to_ascii_lowercase();
        assert!(lower.contains("\r\nconnection: close\r\n"), "{answer}");
        assert!(lower.contains("\r\nretry-after: 1\r\n"), "{answer}");
        assert!(lower.contains("\r\nretry-after-ms: 1000\r\n"), "{answer}");
        let body = answer.split("\r\n\r\n").nth(1).unwrap_or_default();
        let body: serde_json::Value = serde_json::from_str(body).expect("a JSON body");
        assert_eq!(body["error"]["code"], "too_many_connections", "{answer}");
        assert_eq!(body["error"]["type"], "rate_limit_error", "{answer}");
    }
    // The two it holds are still open.
    for task in &held {
        assert!(
            !task.is_finished(),
            "a connection within the cap was closed"
        );
    }
    let scrape = || async {
        client()
            .get(format!("http://{side}/metrics"))
            .send()
            .await
            .expect("scrape")
            .text()
            .await
            .expect("text")
    };
    let text = scrape().await;
    assert_eq!(
        series(&text, "tollgate_connections_refused_total"),
        Some(4.0),
        "{text}"
    );
    // The flooder goes away: its count goes with it, and its address is
    // served again.
    for task in held {
        task.abort();
        let _ = task.await;
    }
    drop(refused);
    let give_up = tokio::time::Instant::now() + PATIENCE;
    loop {
        let text = scrape().await;
        if series(&text, "tollgate_connection_clients") == Some(0.0) {
            break;
        }
        assert!(
            tokio::time::Instant::now() < give_up,
            "clients still counted after every connection closed: {text}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let again = reqwest::Client::builder()
        .no_proxy()
        .local_address("127.0.0.2".parse::<std::net::IpAddr>().expect("address"))
        .build()
        .expect("client")
        .post(format!("http://{api}/v1/chat/completions"))
        .bearer_auth(KEY_A)
        .json(&chat("chat", false))
        .send();
    let again = bounded("the flooder's address is served again", again)
        .await
        .expect("response");
    assert_eq!(again.status(), 200);
    let _ = stop.send(());
    bounded("serve returns", task)
        .await
        .expect("join")
        .expect("serve");
}

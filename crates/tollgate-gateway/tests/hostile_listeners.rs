//! Hostile clients on the gateway's side listener (`server.metrics_listen`)
//! and on the status page (SPEC GW-7, GW-17, OBS-6): real sockets.

mod common;

use std::sync::Arc;
use std::time::Duration;

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

{}
"#,
        tenants("", "")
    )
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

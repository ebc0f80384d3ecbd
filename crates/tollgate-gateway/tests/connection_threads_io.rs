//! `server.connection_threads` where it differs from the work-stealing
//! runtime: each thread's upstream connections (stream and one-shot) are
//! its own, and a reload that changes the setting says it applies only
//! after a restart.

mod common;

use std::time::Duration;

use common::*;
use tollgate_gateway::config::GatewayConfig;
use tollgate_gateway::server::ServeOptions;

fn config(base_url: &str, server: &str) -> String {
    format!(
        r#"
[server]
{server}

[providers.sim]
base_url = "{base_url}"

[scopes.main]
rpm = 100000

[models.chat]
provider = "sim"
upstream_model = "sim-chat"
scope = "main"
concurrency = 64

{}
"#,
        tenants("concurrency = 64", "")
    )
}

async fn start(toml: &str, threads: Option<usize>) -> Gateway {
    let config = GatewayConfig::from_toml(toml, "test.toml").expect("valid");
    let mut options = ServeOptions::from_config(&config.server);
    options.connection_threads = threads;
    Gateway::start_config(&config, options).await
}

/// The socket inode behind file descriptor `fd` of this process.
fn socket_inode(fd: u32) -> Option<u64> {
    let link = std::fs::read_link(format!("/proc/self/fd/{fd}")).ok()?;
    let link = link.to_string_lossy();
    link.strip_prefix("socket:[")?
        .strip_suffix(']')?
        .parse()
        .ok()
}

/// Every epoll instance of this process (a tokio runtime's reactor each)
/// with the inodes of the sockets registered in it.
fn reactors() -> Vec<(u32, Vec<u64>)> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir("/proc/self/fd")
        .expect("fd list")
        .flatten()
    {
        let Ok(fd) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(link) = std::fs::read_link(entry.path()) else {
            continue;
        };
        if link.to_string_lossy() != "anon_inode:[eventpoll]" {
            continue;
        }
        let Ok(info) = std::fs::read_to_string(format!("/proc/self/fdinfo/{fd}")) else {
            continue;
        };
        let inodes = info
            .lines()
            .filter_map(|l| l.strip_prefix("tfd:"))
            .filter_map(|l| l.split_whitespace().next()?.parse::<u32>().ok())
            .filter_map(socket_inode)
            .collect();
        out.push((fd, inodes));
    }
    out
}

/// `(local port, remote port, inode)` of every established IPv4 TCP
/// socket.
fn tcp_sockets() -> Vec<(u16, u16, u64)> {
    let table = std::fs::read_to_string("/proc/net/tcp").expect("/proc/net/tcp");
    let port = |addr: &str| u16::from_str_radix(addr.rsplit(':').next()?, 16).ok();
    table
        .lines()
        .skip(1)
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            if f.get(3) != Some(&"01") {
                return None;
            }
            Some((port(f.get(1)?)?, port(f.get(2)?)?, f.get(9)?.parse().ok()?))
        })
        .collect()
}

/// The epoll instance `inode` is registered in.
fn reactor_of(inode: u64) -> Option<u32> {
    reactors()
        .into_iter()
        .find(|(_, inodes)| inodes.contains(&inode))
        .map(|(fd, _)| fd)
}

// proves: GW-1 (with connection threads, a stream's upstream connection is
// registered with the reactor of the thread serving the stream: each
// thread keeps its own upstream connections, so no upstream read is a
// cross-thread wake-up; read from the kernel's epoll registrations, no
// timing involved)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_does_its_upstream_io_on_its_own_connection_thread() {
    use tokio::io::AsyncReadExt;

    let sim = slow_sim(Duration::from_millis(20), 200).await;
    let sim_port = port_of(&sim.openai_base_url());
    let gw = start(&config(&sim.openai_base_url(), ""), Some(2)).await;
    let gw_port: u16 = gw.addr().rsplit(':').next().unwrap().parse().unwrap();

    // Connection 1 (thread 0): a short stream; its upstream connection goes
    // back to the stream pool.
    {
        let c1 = client();
        let body = serde_json::json!({
            "model": "chat",
            "messages": [{"role": "user", "content": "x"}],
            "max_tokens": 1,
            "stream": true,
        });
        let resp = post_chat(&c1, &gw, Some(KEY_A), &body).await;
        assert!(read_sse(resp).await.completed());
    }
    gw.wait_idle().await;

    // Connection 2 (thread 1): a long stream, which takes the pooled
    // upstream connection.
    let mut c2 = tokio::net::TcpStream::connect(gw.addr())
        .await
        .expect("connect");
    let c2_port = c2.local_addr().unwrap().port();
    write_chat(&mut c2, &gw, true).await;
    let mut seen = Vec::new();
    bounded("first event", async {
        let mut buf = [0u8; 4096];
        while !String::from_utf8_lossy(&seen).contains("data:") {
            let n = c2.read(&mut buf).await.expect("read");
            assert!(n > 0, "closed early");
            seen.extend_from_slice(&buf[..n]);
        }
    })
    .await;

    let sockets = tcp_sockets();
    let client_side = sockets
        .iter()
        .find(|(l, r, _)| *l == gw_port && *r == c2_port)
        .map(|s| s.2)
        .expect("the gateway's socket of connection 2");
    let upstream: Vec<u64> = sockets
        .iter()
        .filter(|(l, r, _)| *r == sim_port && *l != sim_port)
        .map(|s| s.2)
        .collect();
    // Connection 1's upstream connection stays in thread 0's share of the
    // pool; connection 2 (thread 1) opened one of its own. Not an exact
    // count: under load a third upstream connection was seen once in 17
    // runs (a pool opens a new connection when its idle one is not back
    // yet), which breaks no rule. The rule is the reactor check below.
    assert!(
        upstream.len() >= 2,
        "one upstream connection per thread at least: {upstream:?}"
    );
    let here = reactor_of(client_side).expect("connection 2 is registered");
    let reactors: Vec<_> = upstream.iter().filter_map(|s| reactor_of(*s)).collect();
    assert!(
        reactors.contains(&here),
        "connection 2's stream reads its upstream socket through its own \
         thread's reactor (epoll fd {here}; upstream sockets on {reactors:?})"
    );
}

/// The port of an upstream's base URL.
fn port_of(base_url: &str) -> u16 {
    base_url
        .rsplit(':')
        .next()
        .and_then(|p| p.split('/').next())
        .and_then(|p| p.parse().ok())
        .expect("a port")
}

/// Writes one chat request (tenant A's key) on `conn`.
async fn write_chat(conn: &mut tokio::net::TcpStream, gw: &Gateway, stream: bool) {
    use tokio::io::AsyncWriteExt;
    let body = chat("chat", stream).to_string();
    let head = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: {}\r\nauthorization: Bearer {KEY_A}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
        gw.addr(),
        body.len()
    );
    conn.write_all(head.as_bytes()).await.unwrap();
    conn.write_all(body.as_bytes()).await.unwrap();
}

/// Sends one one-shot chat request on `conn` (kept open) and reads its
/// whole answer; returns the status line.
async fn one_shot_on(conn: &mut tokio::net::TcpStream, gw: &Gateway) -> String {
    use tokio::io::AsyncReadExt;
    write_chat(conn, gw, false).await;
    let mut seen = Vec::new();
    bounded("the whole answer", async {
        let mut buf = [0u8; 4096];
        loop {
            let text = String::from_utf8_lossy(&seen);
            if let Some(end) = text.find("\r\n\r\n") {
                let length = text[..end]
                    .lines()
                    .find_map(|l| {
                        let (name, value) = l.split_once(':')?;
                        name.eq_ignore_ascii_case("content-length")
                            .then(|| value.trim().parse::<usize>().ok())?
                    })
                    .expect("a content-length");
                if seen.len() >= end + 4 + length {
                    break;
                }
            }
            let n = conn.read(&mut buf).await.expect("read");
            assert!(n > 0, "closed early");
            seen.extend_from_slice(&buf[..n]);
        }
    })
    .await;
    String::from_utf8_lossy(&seen)
        .lines()
        .next()
        .unwrap_or_default()
        .to_owned()
}

// proves: GW-1 (with connection threads, a one-shot call's upstream
// connection is registered with the reactor of the thread serving the
// call: a thread does not reuse a pooled upstream connection that another
// thread opened, whose socket and connection task are that thread's; read
// from the kernel's epoll registrations, no timing involved)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_one_shot_call_does_its_upstream_io_on_its_own_connection_thread() {
    let sim = fast_sim().await;
    let sim_port = port_of(&sim.openai_base_url());
    let gw = start(&config(&sim.openai_base_url(), ""), Some(2)).await;
    let gw_port: u16 = gw.addr().rsplit(':').next().unwrap().parse().unwrap();

    // Connection 1 (thread 0), then connection 2 (thread 1), one call
    // each, one after the other: the first call's upstream connection is
    // idle in the pool when the second call starts.
    let mut conns = Vec::new();
    for _ in 0..2 {
        let mut conn = tokio::net::TcpStream::connect(gw.addr())
            .await
            .expect("connect");
        let status = one_shot_on(&mut conn, &gw).await;
        assert!(status.contains(" 200 "), "{status}");
        gw.wait_idle().await;
        conns.push(conn);
    }

    let sockets = tcp_sockets();
    let upstream: Vec<u64> = sockets
        .iter()
        .filter(|(l, r, _)| *r == sim_port && *l != sim_port)
        .map(|s| s.2)
        .collect();
    let reactors: Vec<_> = upstream.iter().filter_map(|s| reactor_of(*s)).collect();
    for (i, conn) in conns.iter().enumerate() {
        let port = conn.local_addr().unwrap().port();
        let client_side = sockets
            .iter()
            .find(|(l, r, _)| *l == gw_port && *r == port)
            .map(|s| s.2)
            .expect("the gateway's socket of the connection");
        let here = reactor_of(client_side).expect("the connection is registered");
        assert!(
            reactors.contains(&here),
            "connection {}'s call used an upstream connection of its own \
             thread's reactor (epoll fd {here}; upstream sockets {upstream:?} \
             on {reactors:?})",
            i + 1
        );
    }
}

/// The global log capture (connection threads log through the global
/// subscriber, not a test thread's default).
fn global_logs() -> Logs {
    static LOGS: std::sync::OnceLock<Logs> = std::sync::OnceLock::new();
    LOGS.get_or_init(|| {
        let logs = Logs::default();
        tracing::subscriber::set_global_default(
            tracing_subscriber::fmt()
                .with_writer(logs.clone())
                .with_ansi(false)
                .finish(),
        )
        .expect("no other global subscriber in this test binary");
        logs
    })
    .clone()
}

// proves: GW-15 (a reload that changes `server.connection_threads` or
// `server.max_connections_per_client` is accepted with a warning naming
// them, as for the listener's other settings that apply only at start)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_that_changes_connection_threads_warns() {
    let logs = global_logs();
    let sim = fast_sim().await;
    let file = |threads: usize, max: usize, per_client: usize| {
        config(
            &sim.openai_base_url(),
            &format!(
                "admin_key_env = \"CARGO_PKG_NAME\"\nconnection_threads = {threads}\nmax_connections = {max}\n\
                 max_connections_per_client = {per_client}"
            ),
        )
    };
    let (gw, path) = Gateway::start_file(&file(2, 100, 10)).await;
    std::fs::write(&path, file(3, 101, 11)).expect("rewrite");
    let r = client()
        .post(gw.url("/admin/reload"))
        .bearer_auth(env!("CARGO_PKG_NAME"))
        .send()
        .await
        .expect("reload answered");
    assert_eq!(r.status(), 200);
    let text = logs.text();
    let warning = text
        .lines()
        .find(|l| l.contains("apply only after a restart"))
        .unwrap_or_else(|| panic!("no restart warning at all: {text}"));
    assert!(warning.contains("server.max_connections,"), "{warning}");
    assert!(
        warning.contains("server.max_connections_per_client"),
        "the changed max_connections_per_client is not named: {warning}"
    );
    assert!(
        warning.contains("server.connection_threads"),
        "the changed connection_threads is not named: {warning}"
    );
}

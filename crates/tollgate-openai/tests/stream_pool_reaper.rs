//! The stream pool's reaper (`provider/h1/pool.rs`), through the
//! public API only: an `HttpProvider` against a raw HTTP/1.1 upstream on
//! loopback that counts the connections it accepted and those the client
//! closed.
//!
//! Real clocks; every wait is bounded generously and only invariants are
//! asserted ("the idle connection is eventually closed"), never durations.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use futures_util::StreamExt;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tollgate::Deadline;
use tollgate::lifecycle::{AttemptContext, Provider, StreamEvent};
use tollgate_openai::provider::Endpoint;
use tollgate_openai::{HttpProvider, UpstreamRequest};

const IDLE: Duration = Duration::from_millis(100);
/// Far longer than the idle timeout plus the reaper's period (1.5 × IDLE).
const PATIENCE: Duration = Duration::from_secs(10);

const STREAM: &str = "data: {\"id\":\"c1\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"hi\"}}],\"usage\":null}\n\ndata: {\"id\":\"c1\",\"choices\":[],\"usage\":{\"prompt_tokens\":9,\"completion_tokens\":3,\"total_tokens\":12}}\n\ndata: [DONE]\n\n";

/// The upstream: runs on a runtime of its own (a thread), so that it
/// outlives the runtimes the client side is tested on.
struct Upstream {
    base: String,
    accepted: Arc<AtomicUsize>,
    closed: Arc<AtomicUsize>,
}

impl Upstream {
    fn start() -> Upstream {
        let accepted = Arc::new(AtomicUsize::new(0));
        let closed = Arc::new(AtomicUsize::new(0));
        let (a, c) = (Arc::clone(&accepted), Arc::clone(&closed));
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(1)
                .enable_all()
                .build()
                .expect("upstream runtime");
            rt.block_on(async move {
                let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
                tx.send(listener.local_addr().expect("addr")).expect("send");
                while let Ok((sock, _)) = listener.accept().await {
                    a.fetch_add(1, Ordering::SeqCst);
                    tokio::spawn(serve(sock, Arc::clone(&c)));
                }
            });
        });
        let addr = rx.recv().expect("upstream address");
        Upstream {
            base: format!("http://{addr}/v1"),
            accepted,
            closed,
        }
    }

    fn accepted(&self) -> usize {
        self.accepted.load(Ordering::SeqCst)
    }

    fn closed(&self) -> usize {
        self.closed.load(Ordering::SeqCst)
    }
}

/// Reads one request (head and `content-length` body); `false` at EOF.
async fn read_request(sock: &mut TcpStream) -> bool {
    let mut seen = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        if let Some(end) = seen.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&seen[..end]).to_ascii_lowercase();
            let len: usize = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length:"))
                .and_then(|v| v.trim().parse().ok())
                .unwrap_or(0);
            while seen.len() < end + 4 + len {
                match sock.read(&mut buf).await {
                    Ok(0) | Err(_) => return false,
                    Ok(n) => seen.extend_from_slice(&buf[..n]),
                }
            }
            return true;
        }
        match sock.read(&mut buf).await {
            Ok(0) | Err(_) => return false,
            Ok(n) => seen.extend_from_slice(&buf[..n]),
        }
    }
}

/// Answers every request of the connection with a whole chunked stream,
/// keeps the connection open, counts it as closed at the client's EOF.
async fn serve(mut sock: TcpStream, closed: Arc<AtomicUsize>) {
    while read_request(&mut sock).await {
        let mut out = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n".to_vec();
        out.extend_from_slice(format!("{:x}\r\n", STREAM.len()).as_bytes());
        out.extend_from_slice(STREAM.as_bytes());
        out.extend_from_slice(b"\r\n0\r\n\r\n");
        if sock.write_all(&out).await.is_err() {
            break;
        }
    }
    closed.fetch_add(1, Ordering::SeqCst);
}

fn provider(base: &str) -> HttpProvider {
    HttpProvider::builder(base)
        .connect_timeout(Duration::from_secs(5))
        .pool_idle_timeout(Some(IDLE))
        .build()
        .expect("provider")
}

fn request() -> UpstreamRequest {
    let body = Bytes::from_static(
        b"{\"model\":\"m\",\"stream\":true,\"stream_options\":{\"include_usage\":true}}",
    );
    UpstreamRequest::new(Endpoint::ChatCompletions, body, true, false)
}

fn attempt() -> AttemptContext {
    AttemptContext {
        call_id: None,
        attempt: 1,
        deadline: Deadline::NONE,
        timeout: Some(Duration::from_secs(10)),
    }
}

/// One whole stream; panics unless it ended with `[DONE]` and no error.
async fn one_stream(provider: &HttpProvider) {
    let stream = tokio::time::timeout(PATIENCE, provider.stream(&request(), attempt()))
        .await
        .expect("stream opens in time")
        .expect("stream opens");
    let items: Vec<_> = tokio::time::timeout(PATIENCE, stream.collect::<Vec<_>>())
        .await
        .expect("stream ends in time");
    assert!(items.iter().all(Result::is_ok), "{items:?}");
    assert!(
        items
            .iter()
            .any(|i| matches!(i, Ok(StreamEvent::Chunk(b)) if &b[..] == b"data: [DONE]\n\n")),
        "{items:?}"
    );
}

/// Waits (bounded) until the upstream saw `n` connections closed.
async fn until_closed(up: &Upstream, n: usize) -> bool {
    let give_up = tokio::time::Instant::now() + PATIENCE;
    while up.closed() < n {
        if tokio::time::Instant::now() >= give_up {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    true
}

// proves: LC-5, GW-7 (a reaper lost with its runtime is started again: an
// upstream no longer called keeps no idle connection past the pool's idle
// timeout, even after the runtime that ran the first reaper ended)
#[test]
fn a_reaper_lost_with_its_runtime_is_started_again() {
    let up = Upstream::start();
    let provider = provider(&up.base);

    // A short-lived runtime: one stream, its connection given back to the
    // pool (the reaper starts on this runtime), then the runtime ends.
    let first = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    first.block_on(one_stream(&provider));
    drop(first);

    // A long-lived runtime from now on.
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        one_stream(&provider).await;
        let accepted = up.accepted();
        // Whatever happened to the first connection, every connection the
        // provider opened must be closed once it sat idle past the timeout,
        // without the host being used again.
        assert!(
            until_closed(&up, accepted).await,
            "idle connections still open {PATIENCE:?} after their last use \
             (idle timeout {IDLE:?}): accepted {accepted}, closed {}",
            up.closed()
        );
    });
}

// proves: LC-5, GW-7 (on one long-lived runtime the reaper closes idle
// connections, and many concurrent streams racing with it (tiny idle
// timeout, so reaps, puts and takes interleave) all complete)
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn reaper_races_with_put_and_take() {
    let up = Upstream::start();
    let provider = HttpProvider::builder(&up.base)
        .pool_idle_timeout(Some(Duration::from_millis(2)))
        .build()
        .expect("provider");
    let provider = Arc::new(provider);
    for round in 0..30 {
        let mut tasks = Vec::new();
        for _ in 0..8 {
            let p = Arc::clone(&provider);
            tasks.push(tokio::spawn(async move { one_stream(&p).await }));
        }
        for t in tasks {
            t.await.expect("stream task");
        }
        if round % 5 == 0 {
            tokio::time::sleep(Duration::from_millis(3)).await;
        }
    }
    let accepted = up.accepted();
    assert!(
        until_closed(&up, accepted).await,
        "accepted {accepted}, closed {}",
        up.closed()
    );
}

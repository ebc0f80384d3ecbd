//! The driven path against a raw HTTP/1.1 upstream: connection reuse,
//! early drops, connections the server closed while idle, and bodies split
//! at every byte.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use futures_util::StreamExt;
use http::{HeaderMap, Uri};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tollgate::Deadline;
use tollgate::lifecycle::{AttemptContext, ErrorKind, Provider, StreamEvent};

use crate::provider::{ChunkItem, Endpoint, HttpProvider, UpstreamRequest};

pub(super) const ROLE: &str = "data: {\"id\":\"c1\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}],\"usage\":null}\n\n";
pub(super) const HELLO: &str = "data: {\"id\":\"c1\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"H\u{e9}llo\"}}],\"usage\":null}\n\n";
pub(super) const USAGE: &str = "data: {\"id\":\"c1\",\"choices\":[],\"usage\":{\"prompt_tokens\":9,\"completion_tokens\":3,\"total_tokens\":12}}\n\n";
pub(super) const DONE: &str = "data: [DONE]\n\n";

/// What the upstream does with each request of a connection.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Answer {
    /// The whole stream, each piece its own HTTP chunk, flushed one by one.
    Stream { piece: usize },
    /// The whole stream in one chunk, then, when the test says so
    /// ([`Upstream::hang_up`]), the connection is closed without announcing
    /// it.
    StreamThenClose,
    /// The head and `ROLE`, then nothing (the connection stays open until
    /// the client closes it).
    Stall,
    /// The head and the first `cut` bytes of the body, then a close.
    Cut { cut: usize },
}

struct Upstream {
    base: String,
    accepted: Arc<AtomicUsize>,
    /// Connections the client closed.
    closed: Arc<AtomicUsize>,
    signals: Arc<Signals>,
}

#[derive(Default)]
struct Signals {
    /// Tells a [`Answer::StreamThenClose`] connection to close.
    hang_up: tokio::sync::Notify,
    /// Connections the server closed on [`Signals::hang_up`].
    hung_up: AtomicUsize,
}

impl Upstream {
    /// Closes the connection waiting in [`Answer::StreamThenClose`], and
    /// returns once it is closed (its FIN is on the client's socket: over
    /// loopback it is queued there by the server's close).
    async fn hang_up(&self) {
        let before = self.signals.hung_up.load(Ordering::SeqCst);
        self.signals.hang_up.notify_one();
        while self.signals.hung_up.load(Ordering::SeqCst) == before {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }
}

async fn upstream(answer: Answer) -> Upstream {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let accepted = Arc::new(AtomicUsize::new(0));
    let closed = Arc::new(AtomicUsize::new(0));
    let signals = Arc::new(Signals::default());
    let (a, c, s) = (
        Arc::clone(&accepted),
        Arc::clone(&closed),
        Arc::clone(&signals),
    );
    tokio::spawn(async move {
        while let Ok((sock, _)) = listener.accept().await {
            a.fetch_add(1, Ordering::SeqCst);
            tokio::spawn(serve(sock, answer, Arc::clone(&c), Arc::clone(&s)));
        }
    });
    Upstream {
        base: format!("http://{addr}/v1"),
        accepted,
        closed,
        signals,
    }
}

/// Reads one request (head and `content-length` body); `false` at EOF.
pub(super) async fn read_request<S: AsyncRead + Unpin + ?Sized>(sock: &mut S) -> bool {
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

const HEAD: &[u8] =
    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n";

pub(super) fn chunk(data: &[u8]) -> Vec<u8> {
    let mut out = format!("{:x}\r\n", data.len()).into_bytes();
    out.extend_from_slice(data);
    out.extend_from_slice(b"\r\n");
    out
}

pub(super) fn whole() -> String {
    [ROLE, HELLO, USAGE, DONE].concat()
}

async fn serve(
    mut sock: TcpStream,
    answer: Answer,
    closed: Arc<AtomicUsize>,
    signals: Arc<Signals>,
) {
    loop {
        if !read_request(&mut sock).await {
            closed.fetch_add(1, Ordering::SeqCst);
            return;
        }
        let body = whole();
        let _ = sock.write_all(HEAD).await;
        match answer {
            Answer::Stream { piece } => {
                for part in body.as_bytes().chunks(piece) {
                    let _ = sock.write_all(&chunk(part)).await;
                    let _ = sock.flush().await;
                    tokio::task::yield_now().await;
                }
                let _ = sock.write_all(b"0\r\n\r\n").await;
            }
            Answer::StreamThenClose => {
                let _ = sock.write_all(&chunk(body.as_bytes())).await;
                let _ = sock.write_all(b"0\r\n\r\n").await;
                signals.hang_up.notified().await;
                drop(sock);
                signals.hung_up.fetch_add(1, Ordering::SeqCst);
                return;
            }
            Answer::Stall => {
                let _ = sock.write_all(&chunk(ROLE.as_bytes())).await;
                let mut buf = [0u8; 64];
                // Until the client closes.
                while matches!(sock.read(&mut buf).await, Ok(n) if n > 0) {}
                closed.fetch_add(1, Ordering::SeqCst);
                return;
            }
            Answer::Cut { cut } => {
                let _ = sock.write_all(&chunk(&body.as_bytes()[..cut])).await;
                return;
            }
        }
    }
}

pub(super) fn provider(base: &str) -> HttpProvider {
    HttpProvider::builder(base)
        .connect_timeout(Duration::from_secs(5))
        .build()
        .expect("provider")
}

pub(in crate::provider) fn request() -> UpstreamRequest {
    let body = Bytes::from_static(
        b"{\"model\":\"m\",\"stream\":true,\"stream_options\":{\"include_usage\":true}}",
    );
    UpstreamRequest::new(Endpoint::ChatCompletions, body, true, false)
}

pub(in crate::provider) fn attempt() -> AttemptContext {
    AttemptContext {
        call_id: None,
        attempt: 1,
        deadline: Deadline::NONE,
        timeout: Some(Duration::from_secs(10)),
    }
}

async fn items(provider: &HttpProvider) -> Vec<ChunkItem> {
    let stream = provider
        .stream(&request(), attempt())
        .await
        .expect("stream");
    tokio::time::timeout(Duration::from_secs(10), stream.collect::<Vec<_>>())
        .await
        .expect("stream ends")
}

/// The chunks' bytes joined, and the usage reports.
pub(in crate::provider) fn relayed(
    items: &[ChunkItem],
) -> (Vec<u8>, Vec<tollgate::Usage>, Option<ErrorKind>) {
    let mut bytes = Vec::new();
    let mut usage = Vec::new();
    let mut error = None;
    for item in items {
        match item {
            Ok(StreamEvent::Chunk(c)) => bytes.extend_from_slice(c),
            Ok(StreamEvent::Usage(u)) => usage.push(*u),
            Ok(StreamEvent::Error(c, e)) => {
                bytes.extend_from_slice(c);
                error = Some(e.kind);
            }
            Err(e) => error = Some(e.kind),
        }
    }
    (bytes, usage, error)
}

fn chat_url(base: &str) -> Uri {
    format!("{base}/chat/completions").parse().expect("uri")
}

// proves: GW-5, LC-3 (an upstream body split at every byte boundary, one
// HTTP chunk per byte, relays the same bytes and settles the same usage as
// the body in one piece; [DONE] is its normal end)
#[tokio::test]
async fn a_stream_split_at_every_byte_relays_identically() {
    let whole_up = upstream(Answer::Stream { piece: usize::MAX }).await;
    let split_up = upstream(Answer::Stream { piece: 1 }).await;
    let one = relayed(&items(&provider(&whole_up.base)).await);
    let split = relayed(&items(&provider(&split_up.base)).await);
    let expected = [ROLE, HELLO, DONE].concat();
    assert_eq!(String::from_utf8_lossy(&one.0), expected);
    assert_eq!(one.1.len(), 1);
    assert_eq!(one.1[0].total(), Some(12));
    assert_eq!(one.2, None);
    assert_eq!(split, one);
}

// Completed bodies give their connection back: sequential streams to one
// host share one connection.
#[tokio::test]
async fn completed_streams_reuse_their_connection() {
    let up = upstream(Answer::Stream { piece: 64 }).await;
    let provider = provider(&up.base);
    for _ in 0..3 {
        let (bytes, usage, error) = relayed(&items(&provider).await);
        assert_eq!(error, None);
        assert_eq!(usage.len(), 1);
        assert!(bytes.ends_with(DONE.as_bytes()));
    }
    assert_eq!(up.accepted.load(Ordering::SeqCst), 1);
    assert_eq!(provider.client().driven_idle(&chat_url(&up.base)), 1);
}

// proves: RT-1, RT-5 (a pooled connection the server closed while it sat
// idle costs no attempt and no error: the request, never written to it,
// goes on a new connection)
#[tokio::test]
async fn connections_closed_while_idle_are_replaced() {
    let up = upstream(Answer::StreamThenClose).await;
    let provider = provider(&up.base);
    let url = chat_url(&up.base);
    for round in 1..=3 {
        let (_, usage, error) = relayed(&items(&provider).await);
        assert_eq!((error, usage.len()), (None, 1), "round {round}");
        // The connection went back to the pool open; the server closes it
        // while it sits there.
        assert_eq!(provider.client().driven_idle(&url), 1, "round {round}");
        up.hang_up().await;
    }
    assert_eq!(up.accepted.load(Ordering::SeqCst), 3);
}

// proves: LC-5, GW-6 (a stream dropped before its end closes its upstream
// connection at once; it never goes back to the pool)
#[tokio::test]
async fn a_stream_dropped_early_closes_its_connection() {
    let up = upstream(Answer::Stall).await;
    let provider = provider(&up.base);
    let mut stream = provider
        .stream(&request(), attempt())
        .await
        .expect("stream");
    let first = tokio::time::timeout(Duration::from_secs(5), stream.next())
        .await
        .expect("first event");
    assert!(
        matches!(first, Some(Ok(StreamEvent::Chunk(_)))),
        "{first:?}"
    );
    drop(stream);
    tokio::time::timeout(Duration::from_secs(5), async {
        while up.closed.load(Ordering::SeqCst) == 0 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
    .expect("the upstream sees the close");
    assert_eq!(provider.client().driven_idle(&chat_url(&up.base)), 0);
}

// proves: LC-3 (a body cut before its first complete event fails before
// any chunk, so the attempt may be retried; cut after it, the chunk comes
// first and then a broken stream, never a normal end)
#[tokio::test]
async fn streams_cut_before_and_after_the_first_event() {
    let before = upstream(Answer::Cut {
        cut: ROLE.len() - 3,
    })
    .await;
    let got = items(&provider(&before.base)).await;
    assert_eq!(got.len(), 1, "{got:?}");
    assert!(
        matches!(&got[0], Err(e) if e.kind == ErrorKind::StreamBroken),
        "{got:?}"
    );

    let after = upstream(Answer::Cut {
        cut: ROLE.len() + 5,
    })
    .await;
    let got = items(&provider(&after.base)).await;
    assert_eq!(got.len(), 2, "{got:?}");
    assert_eq!(
        got[0],
        Ok(StreamEvent::Chunk(Bytes::from_static(ROLE.as_bytes())))
    );
    assert!(
        matches!(&got[1], Err(e) if e.kind == ErrorKind::StreamBroken),
        "{got:?}"
    );
    // Neither connection is kept.
    assert_eq!(
        provider(&after.base)
            .client()
            .driven_idle(&chat_url(&after.base)),
        0
    );
}

#[tokio::test]
async fn requests_carry_host_and_origin_form() {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let seen = tokio::spawn(async move {
        let (mut sock, _) = listener.accept().await.expect("accept");
        let mut head = Vec::new();
        let mut buf = [0u8; 1024];
        while !head.windows(4).any(|w| w == b"\r\n\r\n") {
            let n = sock.read(&mut buf).await.expect("read");
            if n == 0 {
                break;
            }
            head.extend_from_slice(&buf[..n]);
        }
        String::from_utf8_lossy(&head).into_owned()
    });
    let provider = provider(&format!("http://{addr}/v1?api-version=1"));
    let client = provider.client().clone();
    let send = client.post_stream(
        &format!("http://{addr}/v1/chat/completions?api-version=1")
            .parse()
            .expect("uri"),
        &HeaderMap::new(),
        [&[], &[]],
        Bytes::from_static(b"{}"),
    );
    let _pending = tokio::spawn(send);
    let head = tokio::time::timeout(Duration::from_secs(5), seen)
        .await
        .expect("head")
        .expect("task");
    assert!(
        head.starts_with("POST /v1/chat/completions?api-version=1 HTTP/1.1\r\n"),
        "{head}"
    );
    assert!(
        head.to_ascii_lowercase()
            .contains(&format!("host: {addr}\r\n")),
        "{head}"
    );
}

// The pool keeps at most `pool_max_idle_per_host` connections per host,
// and none past `pool_idle_timeout`.
#[tokio::test]
async fn the_pool_is_capped_and_expires() {
    let up = upstream(Answer::Stream { piece: 64 }).await;
    let capped = HttpProvider::builder(&up.base)
        .pool_max_idle_per_host(1)
        .build()
        .expect("provider");
    let a = capped
        .stream(&request(), attempt())
        .await
        .expect("stream a");
    let b = capped
        .stream(&request(), attempt())
        .await
        .expect("stream b");
    let (a, b) = tokio::join!(a.collect::<Vec<_>>(), b.collect::<Vec<_>>());
    assert_eq!(relayed(&a).2, None);
    assert_eq!(relayed(&b).2, None);
    assert_eq!(up.accepted.load(Ordering::SeqCst), 2);
    assert_eq!(capped.client().driven_idle(&chat_url(&up.base)), 1);

    let up = upstream(Answer::Stream { piece: 64 }).await;
    let brief = HttpProvider::builder(&up.base)
        .pool_idle_timeout(Some(Duration::from_millis(30)))
        .build()
        .expect("provider");
    assert_eq!(relayed(&items(&brief).await).2, None);
    tokio::time::sleep(Duration::from_millis(60)).await;
    assert_eq!(relayed(&items(&brief).await).2, None);
    assert_eq!(up.accepted.load(Ordering::SeqCst), 2);
}

// An upstream no longer called keeps no idle connection past the pool's
// idle timeout: the reaper closes it without the host being used again.
#[tokio::test]
async fn idle_connections_are_reaped_without_further_use() {
    let up = upstream(Answer::Stream { piece: 64 }).await;
    let brief = HttpProvider::builder(&up.base)
        .pool_idle_timeout(Some(Duration::from_millis(40)))
        .build()
        .expect("provider");
    assert_eq!(relayed(&items(&brief).await).2, None);
    let url = chat_url(&up.base);
    assert_eq!(brief.client().driven_idle(&url), 1);
    let reaped = async {
        while brief.client().driven_idle(&url) > 0 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(10), reaped)
        .await
        .expect("the idle connection is reaped");
    // The pool still works afterwards, on a new connection.
    assert_eq!(relayed(&items(&brief).await).2, None);
    assert_eq!(up.accepted.load(Ordering::SeqCst), 2);
}

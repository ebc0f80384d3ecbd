//! A request the upstream may have received is never sent again by the
//! HTTP client itself, on either path (SPEC RT-1: every attempt is counted
//! by the engine; RT-5: a non-idempotent call is never retried behind its
//! back). Only a request that was never written (a pooled connection the
//! server had closed while idle) may go out on another connection.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use futures_util::StreamExt;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tollgate::Deadline;
use tollgate::lifecycle::{AttemptContext, Provider, StreamEvent};
use tollgate_openai::provider::ChunkItem;
use tollgate_openai::{Endpoint, HttpProvider, UpstreamRequest};

const ROLE: &str =
    "data: {\"id\":\"c1\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\"}}]}\n\n";
const DONE: &str = "data: [DONE]\n\n";
const HEAD: &[u8] =
    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n";

fn chunk(data: &[u8]) -> Vec<u8> {
    let mut out = format!("{:x}\r\n", data.len()).into_bytes();
    out.extend_from_slice(data);
    out.extend_from_slice(b"\r\n");
    out
}

fn full_stream(events: &str) -> Vec<u8> {
    let mut out = HEAD.to_vec();
    out.extend(chunk(events.as_bytes()));
    out.extend_from_slice(b"0\r\n\r\n");
    out
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

fn request() -> UpstreamRequest {
    let body = Bytes::from_static(b"{\"model\":\"m\",\"stream\":true}");
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

fn bytes_of(items: &[ChunkItem]) -> String {
    let mut out = Vec::new();
    for item in items {
        match item {
            Ok(StreamEvent::Chunk(c)) | Ok(StreamEvent::Error(c, _)) => out.extend_from_slice(c),
            _ => {}
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

async fn collect(provider: &HttpProvider) -> Result<Vec<ChunkItem>, String> {
    let stream = tokio::time::timeout(
        Duration::from_secs(10),
        provider.stream(&request(), attempt()),
    )
    .await
    .expect("bounded")
    .map_err(|e| format!("{e:?}"))?;
    Ok(
        tokio::time::timeout(Duration::from_secs(10), stream.collect::<Vec<_>>())
            .await
            .expect("bounded"),
    )
}

// proves: RT-1, RT-5 (the stream path: a request written in full on a
// reused connection whose connection then dies in the middle of the
// response head may have run upstream; it fails to the engine instead of
// going out a second time)
#[tokio::test]
async fn a_request_the_upstream_received_is_not_sent_twice() {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let requests = Arc::new(AtomicUsize::new(0));
    let seen = Arc::clone(&requests);
    tokio::spawn(async move {
        let mut conn_no = 0;
        while let Ok((mut sock, _)) = listener.accept().await {
            conn_no += 1;
            let seen = Arc::clone(&seen);
            let first_conn = conn_no == 1;
            tokio::spawn(async move {
                let mut on_conn = 0;
                while read_request(&mut sock).await {
                    seen.fetch_add(1, Ordering::SeqCst);
                    on_conn += 1;
                    if first_conn && on_conn == 2 {
                        // Got (and "executed") the request; dies mid-head.
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        let _ = sock.write_all(b"HTTP/1.1 200 OK\r\ncontent-ty").await;
                        return;
                    }
                    let _ = sock.write_all(&full_stream(&[ROLE, DONE].concat())).await;
                }
            });
        }
    });
    let provider = HttpProvider::builder(format!("http://{addr}/v1"))
        .build()
        .expect("provider");
    let first = collect(&provider).await.expect("first stream");
    assert!(bytes_of(&first).ends_with(DONE));
    let second = collect(&provider).await;
    let n = requests.load(Ordering::SeqCst);
    assert_eq!(
        n,
        2,
        "the upstream received {n} requests for 2 calls (second call: {:?})",
        second.as_ref().map(|i| bytes_of(i))
    );
}

// proves: RT-1, RT-5 (the same on the one-shot path, hyper's pooling
// client)
#[tokio::test]
async fn one_shot_path_does_not_resend_a_written_request() {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let requests = Arc::new(AtomicUsize::new(0));
    let seen = Arc::clone(&requests);
    tokio::spawn(async move {
        let mut conn_no = 0;
        while let Ok((mut sock, _)) = listener.accept().await {
            conn_no += 1;
            let seen = Arc::clone(&seen);
            let first_conn = conn_no == 1;
            tokio::spawn(async move {
                let mut on_conn = 0;
                while read_request(&mut sock).await {
                    seen.fetch_add(1, Ordering::SeqCst);
                    on_conn += 1;
                    if first_conn && on_conn == 2 {
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        let _ = sock.write_all(b"HTTP/1.1 200 OK\r\ncontent-ty").await;
                        return;
                    }
                    let body = "{\"id\":\"x\",\"choices\":[],\"usage\":{\"prompt_tokens\":1,\"completion_tokens\":1,\"total_tokens\":2}}";
                    let head = format!(
                        "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
                        body.len()
                    );
                    let _ = sock.write_all(head.as_bytes()).await;
                    let _ = sock.write_all(body.as_bytes()).await;
                }
            });
        }
    });
    let provider = HttpProvider::builder(format!("http://{addr}/v1"))
        .build()
        .expect("provider");
    let one = || {
        UpstreamRequest::new(
            Endpoint::ChatCompletions,
            Bytes::from_static(b"{}"),
            false,
            false,
        )
    };
    provider.call(&one(), attempt()).await.expect("first");
    let second = provider.call(&one(), attempt()).await;
    assert!(second.is_err());
    assert_eq!(requests.load(Ordering::SeqCst), 2);
}

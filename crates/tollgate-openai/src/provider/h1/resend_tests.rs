//! A request the upstream may have received is never sent again by the HTTP
//! client itself, on either path (SPEC RT-1: the engine counts every
//! attempt; RT-5: a non-idempotent call is never retried behind its back).
//! Only a request that was never written (a pooled connection the server
//! had closed while idle) may go out on another connection.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;
use tollgate::lifecycle::Provider;

use super::tests::{DONE, ROLE, attempt, chunk, provider, read_request, relayed, request};
use crate::provider::{Endpoint, HttpProvider, UpstreamRequest};

/// What the upstream reads and writes through: TCP, or TLS over it.
trait Io: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Io for T {}

/// An upstream that answers each request with `answer`, except the second
/// request of its first connection: read in full (so it may have run), then
/// the connection dies in the middle of the response head. Speaks TLS
/// through `tls` if given. Returns its base URL and the count of requests
/// it read.
pub(in crate::provider) async fn dies_mid_head(
    answer: Vec<u8>,
    tls: Option<TlsAcceptor>,
) -> (String, Arc<AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let requests = Arc::new(AtomicUsize::new(0));
    let seen = Arc::clone(&requests);
    let scheme = if tls.is_some() { "https" } else { "http" };
    tokio::spawn(async move {
        let mut connections = 0;
        while let Ok((tcp, _)) = listener.accept().await {
            connections += 1;
            let first = connections == 1;
            let (seen, answer, tls) = (Arc::clone(&seen), answer.clone(), tls.clone());
            tokio::spawn(async move {
                let mut sock: Box<dyn Io> = match tls {
                    None => Box::new(tcp),
                    Some(tls) => match tls.accept(tcp).await {
                        Ok(sock) => Box::new(sock),
                        Err(_) => return,
                    },
                };
                let mut on_connection = 0;
                while read_request(&mut sock).await {
                    seen.fetch_add(1, Ordering::SeqCst);
                    on_connection += 1;
                    if first && on_connection == 2 {
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        let _ = sock.write_all(b"HTTP/1.1 200 OK\r\ncontent-ty").await;
                        let _ = sock.flush().await;
                        return;
                    }
                    let _ = sock.write_all(&answer).await;
                    let _ = sock.flush().await;
                }
            });
        }
    });
    (format!("{scheme}://{addr}/v1"), requests)
}

/// A one-shot answer of `usage` total 2, as a whole HTTP/1.1 response.
pub(in crate::provider) fn one_shot_answer() -> Vec<u8> {
    let body = "{\"id\":\"x\",\"choices\":[],\"usage\":{\"prompt_tokens\":1,\
        \"completion_tokens\":1,\"total_tokens\":2}}";
    format!(
        "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// A one-shot (not streamed) chat request.
pub(in crate::provider) fn one_shot() -> UpstreamRequest {
    UpstreamRequest::new(
        Endpoint::ChatCompletions,
        Bytes::from_static(b"{\"model\":\"m\"}"),
        false,
        false,
    )
}

/// Two one-shot calls to `p` (through `dies_mid_head`): the first
/// succeeds; the second fails to the engine as possibly sent, and the
/// upstream read exactly one request per attempt.
pub(in crate::provider) async fn second_call_is_not_sent_twice(
    p: &HttpProvider,
    requests: &AtomicUsize,
) {
    p.call(&one_shot(), attempt()).await.expect("first");
    let second = tokio::time::timeout(Duration::from_secs(10), p.call(&one_shot(), attempt()))
        .await
        .expect("bounded");
    let err = second.expect_err("fails to the engine");
    assert!(!err.unsent, "it may have run upstream: {err:?}");
    assert_eq!(
        requests.load(Ordering::SeqCst),
        2,
        "one request per attempt"
    );
}

// proves: RT-1, RT-5 (the driven path: a request written in full on a
// reused connection whose connection then dies in the middle of the
// response head may have run upstream; it fails to the engine instead of
// going out a second time)
#[tokio::test]
async fn a_streamed_request_the_upstream_received_is_not_sent_twice() {
    let mut stream = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n\
        transfer-encoding: chunked\r\n\r\n"
        .to_vec();
    stream.extend(chunk([ROLE, DONE].concat().as_bytes()));
    stream.extend_from_slice(b"0\r\n\r\n");
    let (base, requests) = dies_mid_head(stream, None).await;
    let p = provider(&base);
    let first = p.stream(&request(), attempt()).await.expect("first stream");
    let first: Vec<_> = futures_util::StreamExt::collect(first).await;
    assert!(relayed(&first).0.ends_with(DONE.as_bytes()));
    let second = tokio::time::timeout(Duration::from_secs(10), p.stream(&request(), attempt()))
        .await
        .expect("bounded");
    assert!(second.is_err(), "the second attempt fails to the engine");
    assert_eq!(
        requests.load(Ordering::SeqCst),
        2,
        "one request per attempt"
    );
}

// proves: RT-1, RT-5 (the same on the one-shot path, hyper's pooling
// client; `tls_tests` proves it over TLS)
#[tokio::test]
async fn a_one_shot_request_the_upstream_received_is_not_sent_twice() {
    let (base, requests) = dies_mid_head(one_shot_answer(), None).await;
    second_call_is_not_sent_twice(&provider(&base), &requests).await;
}

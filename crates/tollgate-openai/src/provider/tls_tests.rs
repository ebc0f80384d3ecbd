//! Both paths of the HTTP client against a real TLS upstream (rustls, a
//! certificate of a test authority in `tests/fixtures/tls`) that offers
//! HTTP/2 and HTTP/1.1 through ALPN: one-shot calls go through hyper's
//! pooling client and speak HTTP/2 when offered, streams take the driven
//! HTTP/1.1 path (every other test of the client runs over plain TCP).

use std::convert::Infallible;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use bytes::Bytes;
use futures_util::StreamExt;
use http::{Request, Response, Version};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;
use tollgate::lifecycle::{ErrorKind, Provider};

use super::HttpProvider;
use super::h1::resend_tests::{
    dies_mid_head, one_shot, one_shot_answer, second_call_is_not_sent_twice,
};
use super::h1::tests::{attempt, relayed, request};
use super::transport::HttpClient;

const CA: &[u8] = include_bytes!("../../tests/fixtures/tls/ca.pem");
const CERT: &[u8] = include_bytes!("../../tests/fixtures/tls/server.pem");
const KEY: &[u8] = include_bytes!("../../tests/fixtures/tls/server.key");

const REPLY: &str = r#"{"id":"c1","object":"chat.completion","created":1,"model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"hi"},"finish_reason":"stop"}],"usage":{"prompt_tokens":9,"completion_tokens":3,"total_tokens":12}}"#;
const EVENTS: &str = concat!(
    "data: {\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"hi\"},\"finish_reason\":\"stop\"}],\"usage\":null}\n\n",
    "data: {\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"m\",\"choices\":[],\"usage\":{\"prompt_tokens\":9,\"completion_tokens\":3,\"total_tokens\":12}}\n\n",
    "data: [DONE]\n\n",
);

/// What the upstream saw of each request: the number of its connection
/// (in order of arrival), the protocol ALPN chose for it (none when the
/// client offered none), the request's HTTP version, and whether it asked
/// for a stream.
type Seen = Arc<Mutex<Vec<(usize, Option<Vec<u8>>, Version, bool)>>>;

/// The TLS side of a test upstream, offering `alpn` (in order of
/// preference).
fn acceptor(alpn: &[&[u8]]) -> TlsAcceptor {
    let certs = CertificateDer::pem_slice_iter(CERT)
        .collect::<Result<Vec<_>, _>>()
        .expect("certificate");
    let key = PrivateKeyDer::from_pem_slice(KEY).expect("key");
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("versions")
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .expect("server config");
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    TlsAcceptor::from(Arc::new(config))
}

/// A TLS upstream on a free port of 127.0.0.1 offering HTTP/2 and
/// HTTP/1.1: its base URL and what it saw.
async fn tls_upstream() -> (String, Seen) {
    let acceptor = acceptor(&[b"h2", b"http/1.1"]);
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let seen = Seen::default();
    let log = Arc::clone(&seen);
    tokio::spawn(async move {
        let mut connections = 0;
        while let Ok((tcp, _)) = listener.accept().await {
            let connection = connections;
            connections += 1;
            let acceptor = acceptor.clone();
            let log = Arc::clone(&log);
            tokio::spawn(async move {
                let Ok(tls) = acceptor.accept(tcp).await else {
                    return;
                };
                let alpn = tls.get_ref().1.alpn_protocol().map(<[u8]>::to_vec);
                let h2 = alpn.as_deref() == Some(b"h2");
                let service = service_fn(move |req: Request<Incoming>| {
                    let log = Arc::clone(&log);
                    let alpn = alpn.clone();
                    async move {
                        let version = req.version();
                        let body = req.into_body().collect().await.map(|b| b.to_bytes());
                        let stream = body
                            .as_ref()
                            .is_ok_and(|b| b.windows(13).any(|w| w == b"\"stream\":true"));
                        log.lock()
                            .unwrap_or_else(PoisonError::into_inner)
                            .push((connection, alpn, version, stream));
                        let (kind, text) = if stream {
                            ("text/event-stream", EVENTS)
                        } else {
                            ("application/json", REPLY)
                        };
                        let response = Response::builder()
                            .header("content-type", kind)
                            .body(Full::new(Bytes::from_static(text.as_bytes())))
                            .expect("response");
                        Ok::<_, Infallible>(response)
                    }
                });
                let io = TokioIo::new(tls);
                let _ = if h2 {
                    hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                        .serve_connection(io, service)
                        .await
                } else {
                    hyper::server::conn::http1::Builder::new()
                        .serve_connection(io, service)
                        .await
                };
            });
        }
    });
    (format!("https://127.0.0.1:{}/v1", addr.port()), seen)
}

/// A provider for `base` trusting only the test authority.
fn provider(base: &str) -> HttpProvider {
    let mut roots = rustls::RootCertStore::empty();
    roots
        .add(CertificateDer::from_pem_slice(CA).expect("CA certificate"))
        .expect("root");
    let builder = HttpProvider::builder(base)
        .connect_timeout(Duration::from_secs(5))
        .https_proxy(None);
    let client = HttpClient::with_roots(&builder.client_settings(), roots);
    builder.client(client).build().expect("provider")
}

// proves: GW-5, Q-6 (over TLS: one-shot calls speak HTTP/2 when the
// upstream offers it, as docs/operations.md says, and report their usage;
// streams speak HTTP/1.1 on the driven path and relay every event and the
// usage; both verify the upstream's certificate against the roots given)
#[tokio::test]
async fn https_upstreams_get_http2_for_one_shot_calls_and_http1_for_streams() {
    let (base, seen) = tls_upstream().await;
    let provider = provider(&base);

    for _ in 0..3 {
        let reply = provider
            .call(&one_shot(), attempt())
            .await
            .expect("one-shot over TLS");
        assert_eq!(reply.body, Bytes::from_static(REPLY.as_bytes()));
        assert_eq!(reply.usage.total(), Some(12));
    }
    let stream = provider
        .stream(&request(), attempt())
        .await
        .expect("stream over TLS");
    let items = tokio::time::timeout(Duration::from_secs(10), stream.collect::<Vec<_>>())
        .await
        .expect("stream ends");
    let (bytes, usage, error) = relayed(&items);
    assert_eq!(error, None);
    assert!(bytes.ends_with(b"data: [DONE]\n\n"), "{bytes:?}");
    assert_eq!(usage.first().and_then(|u| u.total()), Some(12));

    let seen = seen.lock().unwrap_or_else(PoisonError::into_inner).clone();
    let h2 = Some(b"h2".to_vec());
    // The driven path offers no ALPN (see `h1`): the server's default.
    let h1 = None;
    // One HTTP/2 connection carried the three one-shot calls.
    assert_eq!(
        seen,
        vec![
            (0, h2.clone(), Version::HTTP_2, false),
            (0, h2.clone(), Version::HTTP_2, false),
            (0, h2, Version::HTTP_2, false),
            (1, h1, Version::HTTP_11, true),
        ]
    );
}

// proves: RT-1, RT-5 (hyper's pooling client, which carries one-shot
// calls, over TLS: a request written in full on a reused connection
// that then dies in the middle of the response head may have run
// upstream; it fails to the engine as possibly sent instead of going out a
// second time; over HTTP/1.1, the protocol such an upstream chose)
#[tokio::test]
async fn a_one_shot_request_an_https_upstream_received_is_not_sent_twice() {
    let tls = acceptor(&[b"http/1.1"]);
    let (base, requests) = dies_mid_head(one_shot_answer(), Some(tls)).await;
    second_call_is_not_sent_twice(&provider(&base), &requests).await;
}

// proves: Q-9 (a certificate the client's roots do not vouch for fails
// the attempt on both paths before any byte of the request left: a
// connection error marked never sent, so the attempt costs nothing)
#[tokio::test]
async fn an_untrusted_certificate_fails_before_the_request_leaves() {
    let (base, seen) = tls_upstream().await;
    let builder = HttpProvider::builder(&base)
        .connect_timeout(Duration::from_secs(5))
        .https_proxy(None);
    let client = HttpClient::with_roots(&builder.client_settings(), rustls::RootCertStore::empty());
    let provider = builder.client(client).build().expect("provider");
    let one_shot = provider
        .call(&one_shot(), attempt())
        .await
        .expect_err("one-shot must fail");
    let Err(stream) = provider.stream(&request(), attempt()).await else {
        panic!("stream must fail");
    };
    for err in [one_shot, stream] {
        assert_eq!(err.kind, ErrorKind::Connect, "{err:?}");
        assert!(err.unsent, "{err:?}");
    }
    assert!(
        seen.lock()
            .unwrap_or_else(PoisonError::into_inner)
            .is_empty()
    );
}

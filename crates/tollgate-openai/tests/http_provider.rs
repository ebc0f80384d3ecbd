//! The HTTP provider against real sockets on loopback: the simulator as the
//! upstream, and a tiny fixture server for exact bytes and odd answers.
//!
//! These run on tokio's real clock (paused time would auto-advance while
//! tasks wait on sockets) with zero simulated latency where possible; they
//! never assert on wall-clock durations, and every wait is bounded.

use std::future::Future;
use std::time::Duration;

use bytes::Bytes;
use futures_util::StreamExt;
use http::StatusCode;
use serde_json::{Value, json};
use tollgate::Deadline;
use tollgate::lifecycle::{AttemptContext, ErrorKind, Provider, ProviderError, StreamEvent};
use tollgate_openai::provider::{ChunkItem, ChunkStream};
use tollgate_openai::wire::{
    ChatCompletionChunk, ChatCompletionRequest, ChatCompletionResponse, ChatMessage,
    EmbeddingInput, EmbeddingsRequest, EmbeddingsResponse,
};
use tollgate_openai::{HttpProvider, UpstreamRequest};
use tollgate_sim::{SimConfig, SimServer, Simulator};

/// Upper bound on any single test step: generous, never asserted on.
const STEP: Duration = Duration::from_secs(30);

async fn bounded<T>(work: impl Future<Output = T>) -> T {
    tokio::time::timeout(STEP, work)
        .await
        .expect("test step took far too long")
}

async fn sim(config: SimConfig) -> SimServer {
    Simulator::spawn(config, "127.0.0.1:0")
        .await
        .expect("simulator")
}

fn provider_for(base_url: &str) -> HttpProvider {
    HttpProvider::builder(base_url)
        .connect_timeout(Duration::from_secs(5))
        .build()
        .expect("provider")
}

/// A provider for `base_url` whose client gives up after 200 ms of silence.
fn impatient(base_url: &str) -> HttpProvider {
    HttpProvider::builder(base_url)
        .read_timeout(Duration::from_millis(200))
        .build()
        .expect("provider")
}

fn attempt(timeout: Option<Duration>) -> AttemptContext {
    AttemptContext {
        call_id: None,
        attempt: 1,
        deadline: Deadline::NONE,
        timeout,
    }
}

/// The attempt timeout of tests that do not test timeouts.
fn roomy() -> AttemptContext {
    attempt(Some(STEP))
}

fn chat(stream: bool, client_wants_usage: bool) -> ChatCompletionRequest {
    let mut request = ChatCompletionRequest::new("client-alias", vec![ChatMessage::user("hello")]);
    if stream {
        request.stream = Some(true);
        if client_wants_usage {
            request.request_stream_usage();
        }
    }
    request
}

fn upstream(stream: bool, client_wants_usage: bool) -> UpstreamRequest {
    UpstreamRequest::chat(&chat(stream, client_wants_usage), "sim-chat").expect("upstream")
}

async fn drain(stream: ChunkStream) -> Vec<ChunkItem> {
    bounded(stream.collect::<Vec<_>>()).await
}

fn chunks(items: &[ChunkItem]) -> Vec<Bytes> {
    items
        .iter()
        .filter_map(|i| match i {
            Ok(StreamEvent::Chunk(b)) => Some(b.clone()),
            _ => None,
        })
        .collect()
}

fn usages(items: &[ChunkItem]) -> Vec<tollgate::Usage> {
    items
        .iter()
        .filter_map(|i| match i {
            Ok(StreamEvent::Usage(u)) => Some(*u),
            _ => None,
        })
        .collect()
}

fn parse_chunk(frame: &Bytes) -> ChatCompletionChunk {
    let text = std::str::from_utf8(frame).expect("utf-8");
    let json = text
        .strip_prefix("data: ")
        .and_then(|t| t.strip_suffix("\n\n"))
        .expect("a data frame");
    serde_json::from_str(json).expect("chunk json")
}

async fn open_err(
    provider: &HttpProvider,
    request: &UpstreamRequest,
    ctx: AttemptContext,
) -> ProviderError {
    match bounded(provider.stream(request, ctx)).await {
        Ok(_) => panic!("the stream opened"),
        Err(err) => err,
    }
}

// ---------------------------------------------------------------- success

// proves: Q-6 (usage of a one-shot body, extracted by the engine's rules)
#[tokio::test]
async fn one_shot_chat_returns_the_body_and_its_usage() {
    let server = sim(SimConfig::default()).await;
    let provider = provider_for(&server.openai_base_url());
    let reply = bounded(provider.call(&upstream(false, false), roomy()))
        .await
        .expect("reply");
    let parsed: ChatCompletionResponse = serde_json::from_slice(&reply.body).expect("response");
    assert_eq!(parsed.model, "sim-chat", "the upstream model was sent");
    let reported = parsed.usage.expect("usage").known_total();
    assert!(reported.is_some_and(|t| t > 0));
    assert_eq!(reply.usage.total(), reported);
    assert_eq!(
        reply
            .usage
            .input()
            .zip(reply.usage.output())
            .map(|(i, o)| i + o),
        reported
    );
    assert_eq!(server.stats().ok, 1);
}

// proves: Q-6
#[tokio::test]
async fn one_shot_embeddings_report_prompt_tokens() {
    let server = sim(SimConfig::default()).await;
    let provider = provider_for(&server.openai_base_url());
    let request = EmbeddingsRequest::new(
        "alias",
        EmbeddingInput::Texts(vec!["a b".into(), "c".into()]),
    );
    let upstream = UpstreamRequest::embeddings(&request, "sim-embedding").expect("upstream");
    let reply = bounded(provider.call(&upstream, roomy()))
        .await
        .expect("reply");
    let parsed: EmbeddingsResponse = serde_json::from_slice(&reply.body).expect("response");
    assert_eq!(parsed.data.len(), 2);
    let prompt = parsed.usage.as_ref().and_then(|u| u.prompt().value());
    assert!(prompt.is_some_and(|p| p > 0));
    assert_eq!(reply.usage.total(), prompt);
}

// proves: GW-5 (usage always reported to the engine; the usage chunk is
// stripped when the client did not ask for it), LC-3 ([DONE] ends it)
#[tokio::test]
async fn stream_without_client_usage_strips_the_usage_chunk() {
    let server = sim(SimConfig {
        completion_tokens: 5,
        ..SimConfig::default()
    })
    .await;
    let provider = provider_for(&server.openai_base_url());
    let stream = bounded(provider.stream(&upstream(true, false), roomy()))
        .await
        .expect("stream");
    let items = drain(stream).await;
    assert!(items.iter().all(Result::is_ok), "{items:?}");
    let frames = chunks(&items);
    // Role, five content chunks, finish, [DONE]: in order, no usage chunk.
    assert_eq!(frames.len(), 8, "{frames:?}");
    assert_eq!(
        frames.last().map(|b| &b[..]),
        Some(&b"data: [DONE]\n\n"[..])
    );
    let parsed: Vec<ChatCompletionChunk> = frames[..7].iter().map(parse_chunk).collect();
    assert_eq!(
        parsed[0].choices[0].delta.role.as_deref(),
        Some("assistant")
    );
    let text: String = parsed[1..6]
        .iter()
        .filter_map(|c| c.choices[0].delta.content.clone())
        .collect();
    assert_eq!(text, "the gate lets each token");
    assert_eq!(parsed[6].choices[0].finish_reason.as_deref(), Some("stop"));
    assert!(parsed.iter().all(|c| !c.is_usage_only()));
    // The engine still gets the usage, once, before [DONE].
    let usage = usages(&items);
    assert_eq!(usage.len(), 1);
    assert_eq!(usage[0].output(), Some(5));
    assert!(matches!(items[items.len() - 2], Ok(StreamEvent::Usage(_))));
    assert!(usage[0].total().is_some_and(|t| t > 5));
}

// proves: GW-5 (the usage chunk is kept when the client asked for it)
#[tokio::test]
async fn stream_with_client_usage_keeps_the_usage_chunk() {
    let server = sim(SimConfig {
        completion_tokens: 3,
        ..SimConfig::default()
    })
    .await;
    let provider = provider_for(&server.openai_base_url());
    let stream = bounded(provider.stream(&upstream(true, true), roomy()))
        .await
        .expect("stream");
    let items = drain(stream).await;
    let frames = chunks(&items);
    // Role, three content chunks, finish, usage chunk, [DONE].
    assert_eq!(frames.len(), 7, "{frames:?}");
    let usage_chunk = parse_chunk(&frames[5]);
    assert!(usage_chunk.is_usage_only());
    let usage = usages(&items);
    assert_eq!(usage.len(), 1);
    assert_eq!(
        usage[0].total(),
        usage_chunk.usage.as_ref().and_then(|u| u.known_total())
    );
    assert_eq!(&frames[6][..], b"data: [DONE]\n\n");
}

// ---------------------------------------------------------------- failures

// proves: RT-2 (429 is RateLimited), RT-3 (the server's hint is the floor)
#[tokio::test]
async fn rate_limited_answers_carry_the_retry_floor() {
    let server = sim(SimConfig {
        rpm: Some(1),
        ..SimConfig::default()
    })
    .await;
    let provider = provider_for(&server.openai_base_url());
    bounded(provider.call(&upstream(false, false), roomy()))
        .await
        .expect("first call fits");
    let err = bounded(provider.call(&upstream(false, false), roomy()))
        .await
        .expect_err("second call is refused");
    assert_eq!(err.kind, ErrorKind::RateLimited);
    assert_eq!(err.status, Some(429));
    assert!(err.is_retryable());
    assert!(
        err.retry_after.is_some_and(|d| d > Duration::ZERO),
        "{err:?}"
    );
    assert!(err.message.contains("Rate limit"), "{}", err.message);

    // The same for a stream that is refused at its start.
    let err = open_err(&provider, &upstream(true, false), roomy()).await;
    assert_eq!(err.kind, ErrorKind::RateLimited);
    assert!(err.retry_after.is_some());
    assert_eq!(server.stats().rejected_429.rpm, 2);
}

// proves: Q-14 (answers, refusals and streams carry the provider's
// advertised limits and remaining budget for the engine)
#[tokio::test]
async fn responses_report_the_providers_budget() {
    let server = sim(SimConfig {
        rpm: Some(3),
        tpm: Some(100_000),
        ..SimConfig::default()
    })
    .await;
    let provider = provider_for(&server.openai_base_url());
    let reply = bounded(provider.call(&upstream(false, false), roomy()))
        .await
        .expect("reply");
    assert!(
        reply.request_id.is_some(),
        "the provider's x-request-id is kept"
    );
    let requests = reply.budget.requests.expect("request budget");
    assert_eq!(requests.limit, Some(3));
    assert_eq!(requests.remaining, Some(2));
    assert!(requests.reset.is_some());
    let tokens = reply.budget.tokens.expect("token budget");
    assert_eq!(tokens.limit, Some(100_000));
    assert!(tokens.remaining.is_some_and(|r| r < 100_000));

    let stream = bounded(provider.stream(&upstream(true, false), roomy()))
        .await
        .expect("stream");
    assert_eq!(
        provider
            .stream_budget(&stream)
            .requests
            .and_then(|r| r.remaining),
        Some(1)
    );
    drop(drain(stream).await);
    bounded(provider.call(&upstream(false, false), roomy()))
        .await
        .expect("third fits");
    let refused = bounded(provider.call(&upstream(false, false), roomy()))
        .await
        .expect_err("fourth is refused");
    let budget = refused.budget.expect("a refusal reports the budget too");
    assert_eq!(budget.requests.and_then(|r| r.remaining), Some(0));
}

// proves: RT-2 (5xx is Server, retryable)
#[tokio::test]
async fn server_errors_are_retryable_server_failures() {
    let server = sim(SimConfig {
        error_rate: 1.0,
        ..SimConfig::default()
    })
    .await;
    let provider = provider_for(&server.openai_base_url());
    let err = bounded(provider.call(&upstream(false, false), roomy()))
        .await
        .expect_err("5xx");
    assert_eq!(err.kind, ErrorKind::Server);
    assert!(matches!(err.status, Some(500 | 503)), "{err:?}");
    assert!(err.is_retryable());
    let err = open_err(&provider, &upstream(true, false), roomy()).await;
    assert_eq!(err.kind, ErrorKind::Server);
}

// proves: DL-4 (the attempt's timeout bounds the wait for headers), RT-2
#[tokio::test]
async fn slow_headers_hit_the_attempt_timeout() {
    let server = sim(SimConfig {
        slow_headers_rate: 1.0,
        slow_headers_delay: Duration::from_secs(600),
        ..SimConfig::default()
    })
    .await;
    let provider = provider_for(&server.openai_base_url());
    let short = attempt(Some(Duration::from_millis(200)));
    let err = bounded(provider.call(&upstream(false, false), short))
        .await
        .expect_err("timeout");
    assert_eq!(err.kind, ErrorKind::Timeout);
    assert!(err.is_retryable());
    let err = open_err(&provider, &upstream(true, false), short).await;
    assert_eq!(err.kind, ErrorKind::Timeout);
}

// proves: RT-2 (a silent upstream is a retryable timeout), DL-4 (the read
// timeout bounds the wait for headers even without an attempt timeout)
#[tokio::test]
async fn the_read_timeout_bounds_the_wait_for_headers() {
    let server = sim(SimConfig {
        slow_headers_rate: 1.0,
        slow_headers_delay: Duration::from_secs(600),
        ..SimConfig::default()
    })
    .await;
    let provider = impatient(&server.openai_base_url());
    let err = bounded(provider.call(&upstream(false, false), attempt(None)))
        .await
        .expect_err("timeout");
    assert_eq!(err.kind, ErrorKind::Timeout, "{err:?}");
    assert!(err.message.contains("read timeout"), "{}", err.message);
    let err = open_err(&provider, &upstream(true, false), attempt(None)).await;
    assert_eq!(err.kind, ErrorKind::Timeout, "{err:?}");
}

// proves: LC-3 (a stream that stalls past the read timeout ends with
// StreamBroken, its permits freed instead of held to the deadline)
#[tokio::test]
async fn a_stalled_stream_breaks_at_the_read_timeout() {
    let server = sim(SimConfig {
        completion_tokens: 4,
        per_token: Duration::from_secs(600),
        ..SimConfig::default()
    })
    .await;
    let provider = impatient(&server.openai_base_url());
    let stream = bounded(provider.stream(&upstream(true, false), attempt(None)))
        .await
        .expect("stream opens");
    let items = drain(stream).await;
    match items.last() {
        Some(Err(err)) => {
            assert_eq!(err.kind, ErrorKind::StreamBroken, "{err:?}");
            assert!(err.message.contains("read timeout"), "{}", err.message);
        }
        other => panic!("stream ended with {other:?}"),
    }
}

// proves: GW-7 (a one-shot upstream body is bounded: past the limit the
// attempt fails as a protocol error instead of buffering without end)
#[tokio::test]
async fn one_shot_bodies_past_the_limit_fail() {
    let server = sim(SimConfig::default()).await;
    let provider = HttpProvider::builder(server.openai_base_url())
        .max_response_body(64)
        .build()
        .expect("provider");
    let err = bounded(provider.call(&upstream(false, false), roomy()))
        .await
        .expect_err("too large");
    assert_eq!(err.kind, ErrorKind::Protocol, "{err:?}");
    assert!(!err.is_retryable());
    assert!(err.message.contains("max_response_body"), "{}", err.message);
    // The same body fits under the default limit.
    let provider = provider_for(&server.openai_base_url());
    bounded(provider.call(&upstream(false, false), roomy()))
        .await
        .expect("fits");
}

// proves: RT-2 (a proxy that refuses the tunnel is a Connect failure); an
// https upstream behind a proxy is reached through an HTTP CONNECT tunnel
// carrying the proxy's credentials, which never reach a message
#[tokio::test]
async fn https_upstreams_tunnel_through_the_proxy() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let proxy = tokio::spawn(async move {
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
        sock.write_all(b"HTTP/1.1 403 Forbidden\r\ncontent-length: 0\r\n\r\n")
            .await
            .expect("write");
        String::from_utf8_lossy(&head).into_owned()
    });
    let provider = HttpProvider::builder("https://api.example.invalid/v1")
        .https_proxy(Some(format!("http://user:secret@{addr}")))
        .build()
        .expect("provider");
    let err = bounded(provider.call(&upstream(false, false), roomy()))
        .await
        .expect_err("the proxy refuses");
    assert_eq!(err.kind, ErrorKind::Connect, "{err:?}");
    assert!(err.is_retryable());
    assert!(!err.message.contains("secret"), "{}", err.message);
    let head = bounded(proxy).await.expect("proxy task");
    assert!(
        head.starts_with("CONNECT api.example.invalid:443 HTTP/1.1\r\n"),
        "{head}"
    );
    assert!(
        head.to_ascii_lowercase()
            .contains("proxy-authorization: basic dxnlcjpzzwnyzxq="),
        "{head}"
    );
}

// proves: CFG-3 (a proxy that cannot be used fails at build time, without
// its credentials in the message)
#[tokio::test]
async fn unusable_proxies_fail_at_build() {
    let err = HttpProvider::builder("https://api.example.invalid/v1")
        .https_proxy(Some("socks5://user:secret@127.0.0.1:1080".to_owned()))
        .build()
        .expect_err("socks is not supported");
    let text = err.to_string();
    assert!(text.contains("only http:// proxies"), "{text}");
    assert!(!text.contains("secret"), "{text}");
    // Plain-http upstreams never use the proxy.
    HttpProvider::builder("http://127.0.0.1:9/v1")
        .https_proxy(Some("socks5://127.0.0.1:1080".to_owned()))
        .build()
        .expect("http upstreams connect directly");
}

// proves: RT-2 (connection failures are Connect, retryable)
#[tokio::test]
async fn refused_connections_are_connect_failures() {
    // A port that was free a moment ago and has no listener now.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    drop(listener);
    let provider = provider_for(&format!("http://{addr}/v1"));
    let err = bounded(provider.call(&upstream(false, false), roomy()))
        .await
        .expect_err("refused");
    assert_eq!(err.kind, ErrorKind::Connect, "{err:?}");
    assert!(err.is_retryable());
    let err = open_err(&provider, &upstream(true, false), roomy()).await;
    assert_eq!(err.kind, ErrorKind::Connect);
}

// proves: GW-2 (the provider's own key is sent), RT-2 (401 is Auth, not
// retryable)
#[tokio::test]
async fn the_api_key_is_sent_as_a_bearer_token() {
    let server = sim(SimConfig {
        require_key: Some("sk-upstream-key".into()),
        ..SimConfig::default()
    })
    .await;
    let good = HttpProvider::builder(server.openai_base_url())
        .api_key("sk-upstream-key")
        .build()
        .expect("provider");
    bounded(good.call(&upstream(false, false), roomy()))
        .await
        .expect("authorised");
    let bad = HttpProvider::builder(server.openai_base_url())
        .api_key("sk-wrong-key")
        .build()
        .expect("provider");
    let err = bounded(bad.call(&upstream(false, false), roomy()))
        .await
        .expect_err("unauthorised");
    assert_eq!(err.kind, ErrorKind::Auth);
    assert!(!err.is_retryable());
    assert!(!err.message.contains("sk-wrong-key"));
}

// proves: LC-3 (a stream cut mid-way ends with StreamBroken, never a normal
// end)
#[tokio::test]
async fn mid_stream_disconnects_are_broken_streams() {
    let server = sim(SimConfig {
        disconnect_rate: 1.0,
        completion_tokens: 8,
        ..SimConfig::default()
    })
    .await;
    let provider = provider_for(&server.openai_base_url());
    for _ in 0..5 {
        let stream = bounded(provider.stream(&upstream(true, false), roomy()))
            .await
            .expect("stream opens");
        let items = drain(stream).await;
        let (last, before) = items.split_last().expect("at least the error");
        match last {
            Err(err) => assert_eq!(err.kind, ErrorKind::StreamBroken, "{err:?}"),
            Ok(other) => panic!("stream ended normally with {other:?}"),
        }
        assert!(!before.is_empty(), "the chunks sent before the cut arrive");
        assert!(before.iter().all(Result::is_ok));
        assert!(
            chunks(before).iter().all(|b| &b[..] != b"data: [DONE]\n\n"),
            "no [DONE] in a cut stream"
        );
    }
    assert_eq!(server.stats().faults.disconnect, 5);
}

// proves: LC-5, GW-6 (dropping the stream closes the upstream connection)
#[tokio::test]
async fn dropping_the_stream_closes_the_upstream_request() {
    let server = sim(SimConfig {
        completion_tokens: 10_000,
        per_token: Duration::from_millis(5),
        ..SimConfig::default()
    })
    .await;
    let provider = provider_for(&server.openai_base_url());
    let mut stream = bounded(provider.stream(&upstream(true, false), roomy()))
        .await
        .expect("stream");
    let first = bounded(stream.next()).await;
    assert!(
        matches!(first, Some(Ok(StreamEvent::Chunk(_)))),
        "{first:?}"
    );
    assert_eq!(server.stats().client_disconnects, 0);
    assert_eq!(server.stats().active, 1);
    drop(stream);
    // The simulator notices the closed connection at its next write.
    bounded(async {
        while server.stats().client_disconnects == 0 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
    let stats = server.stats();
    assert_eq!(stats.client_disconnects, 1);
    assert_eq!(stats.active, 0);
}

// ------------------------------------------------- fixture upstream (axum)

/// A one-route upstream answering every POST with `status`, `content_type`
/// and `body`, verbatim.
async fn fixture(status: StatusCode, content_type: &'static str, body: &'static str) -> String {
    use axum::routing::post;
    let app = axum::Router::new().route(
        "/v1/chat/completions",
        post(move || async move { (status, [(http::header::CONTENT_TYPE, content_type)], body) }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    format!("http://{addr}/v1")
}

// proves: Q-6 (byte-for-byte body; odd spacing and unknown fields kept)
#[tokio::test]
async fn one_shot_bodies_are_returned_byte_for_byte() {
    const BODY: &str = "{ \"id\": \"x\",\n  \"choices\": [],\n  \"usage\": {\"prompt_tokens\": 4, \"completion_tokens\": \"2\"},\n  \"vendor\": 1.0e-7 }\n";
    let base = fixture(StatusCode::OK, "application/json", BODY).await;
    let reply = bounded(provider_for(&base).call(&upstream(false, false), roomy()))
        .await
        .expect("reply");
    assert_eq!(&reply.body[..], BODY.as_bytes());
    assert_eq!(reply.usage.total(), Some(6));
}

// proves: RT-2 (a 2xx body that is not JSON is a Protocol error, not
// retried)
#[tokio::test]
async fn unreadable_bodies_are_protocol_errors() {
    let base = fixture(StatusCode::OK, "application/json", "<html>oops</html>").await;
    let err = bounded(provider_for(&base).call(&upstream(false, false), roomy()))
        .await
        .expect_err("protocol");
    assert_eq!(err.kind, ErrorKind::Protocol);
    assert!(!err.is_retryable());

    // A stream request answered with JSON instead of an event stream.
    let base = fixture(StatusCode::OK, "application/json", "{}").await;
    let err = open_err(&provider_for(&base), &upstream(true, false), roomy()).await;
    assert_eq!(err.kind, ErrorKind::Protocol);
}

// proves: LC-4 (a declared error chunk reaches the consumer once and ends
// the stream with a typed error), GW-5 (frames forwarded byte for byte)
#[tokio::test]
async fn declared_error_chunks_end_the_stream() {
    const STREAM: &str = concat!(
        "data: {\"id\":\"c\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hi\"}}]}\n\n",
        ": ping\n\n",
        "data: {\"error\":{\"message\":\"overloaded\",\"type\":\"server_error\"}}\n\n",
        "data: [DONE]\n\n",
    );
    let base = fixture(StatusCode::OK, "text/event-stream", STREAM).await;
    let stream = bounded(provider_for(&base).stream(&upstream(true, false), roomy()))
        .await
        .expect("stream");
    let items = drain(stream).await;
    assert_eq!(items.len(), 2, "{items:?}");
    assert_eq!(
        items[0],
        Ok(StreamEvent::Chunk(Bytes::from_static(
            b"data: {\"id\":\"c\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hi\"}}]}\n\n"
        )))
    );
    match &items[1] {
        Ok(StreamEvent::Error(frame, err)) => {
            let v: Value = serde_json::from_slice(
                frame
                    .strip_prefix(b"data: ")
                    .and_then(|f| f.strip_suffix(b"\n\n"))
                    .expect("frame"),
            )
            .expect("json");
            assert_eq!(
                v,
                json!({"error": {"message": "overloaded", "type": "server_error"}})
            );
            assert_eq!(err.kind, ErrorKind::Declared);
            assert_eq!(err.message, "overloaded");
        }
        other => panic!("expected the declared error, got {other:?}"),
    }
}

// proves: RT-7 (the upstream key never appears in an error message)
#[tokio::test]
async fn upstream_messages_are_redacted() {
    const BODY: &str = "{\"error\":{\"message\":\"Incorrect API key provided: sk-fixture-secret-123. Find yours at https://example\",\"type\":\"invalid_request_error\",\"code\":\"invalid_api_key\"}}";
    let base = fixture(StatusCode::UNAUTHORIZED, "application/json", BODY).await;
    let provider = HttpProvider::builder(base)
        .api_key("sk-fixture-secret-123")
        .build()
        .expect("provider");
    let err = bounded(provider.call(&upstream(false, false), roomy()))
        .await
        .expect_err("401");
    assert_eq!(err.kind, ErrorKind::Auth);
    assert!(
        err.message.starts_with("Incorrect API key provided"),
        "{}",
        err.message
    );
    assert!(!err.message.contains("secret-123"), "{}", err.message);
    assert!(!format!("{provider:?}").contains("secret-123"));
}

// proves: LC-5 (only a stream dropped early aborts its request: a completed
// stream gives its connection back to the pool, three streams in a row use
// one connection)
#[tokio::test]
async fn completed_streams_reuse_their_connection() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use axum::routing::post;
    use axum::serve::ListenerExt;

    // A chunked body (no content length), like a real event stream.
    let app = axum::Router::new().route(
        "/v1/chat/completions",
        post(|| async {
            let frames: Vec<Result<Bytes, std::io::Error>> = vec![
                Ok(Bytes::from_static(b"data: {\"choices\":[]}\n\n")),
                Ok(Bytes::from_static(b"data: [DONE]\n\n")),
            ];
            (
                [(http::header::CONTENT_TYPE, "text/event-stream")],
                axum::body::Body::from_stream(futures_util::stream::iter(frames)),
            )
        }),
    );
    let accepted = Arc::new(AtomicUsize::new(0));
    let counter = Arc::clone(&accepted);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let listener = listener.tap_io(move |_| {
        counter.fetch_add(1, Ordering::SeqCst);
    });
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    let provider = provider_for(&format!("http://{addr}/v1"));
    for _ in 0..3 {
        let stream = bounded(provider.stream(&upstream(true, false), roomy()))
            .await
            .expect("stream");
        let items = drain(stream).await;
        assert_eq!(chunks(&items).len(), 2, "{items:?}");
    }
    assert_eq!(accepted.load(Ordering::SeqCst), 1);
}

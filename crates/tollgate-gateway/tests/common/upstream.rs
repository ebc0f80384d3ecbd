//! A tiny scripted OpenAI-style upstream for failure modes the simulator
//! does not produce: 429s with chosen `retry-after` hints, a stream that
//! sends a chunk and then an error event, a stream cut mid-answer.
//!
//! Attempt `n` (from 1) gets reply `n` of the script; attempts past its end
//! get the last reply again. Every attempt is recorded with its arrival
//! instant and body, and an optional hook runs as it arrives.

use std::io;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use futures_util::StreamExt;
use futures_util::stream;
use http::HeaderMap;
use parking_lot::Mutex;
use serde_json::Value;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio::time::Instant;

/// How a scripted stream ends after its events.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum End {
    /// `data: [DONE]` and a clean end.
    Done,
    /// The connection is aborted (no terminating chunk).
    Cut,
    /// Nothing more is sent; the connection stays open.
    Hang,
}

/// One scripted reply.
#[derive(Debug, Clone)]
pub enum Reply {
    /// A plain response.
    Status {
        /// HTTP status.
        status: u16,
        /// Extra headers.
        headers: Vec<(&'static str, String)>,
        /// JSON body.
        body: String,
    },
    /// An SSE stream of `events` (each the JSON after `data: `), ended as
    /// `end` says.
    Stream {
        /// Event payloads.
        events: Vec<String>,
        /// How the stream ends.
        end: End,
    },
    /// Raw bytes: `status`, `headers` and the body `chunks` as given; with
    /// `cut` the connection is aborted after them.
    Raw {
        /// HTTP status.
        status: u16,
        /// Every header (no content type is added).
        headers: Vec<(&'static str, String)>,
        /// Body chunks, each written as it is.
        chunks: Vec<String>,
        /// Abort the connection after the chunks.
        cut: bool,
    },
    /// `reply`, answered `delay` after the attempt arrived.
    Delayed {
        /// How long the answer takes.
        delay: Duration,
        /// The answer.
        reply: Box<Reply>,
    },
}

impl Reply {
    /// A 429 with `retry-after: <secs>`.
    pub fn too_many(header: &'static str, value: &str) -> Reply {
        Reply::Status {
            status: 429,
            headers: vec![(header, value.to_owned())],
            body: r#"{"error":{"message":"Rate limit reached","type":"requests","param":null,"code":"rate_limit_exceeded"}}"#
                .to_owned(),
        }
    }

    /// A successful one-shot chat completion.
    pub fn ok() -> Reply {
        Reply::Status {
            status: 200,
            headers: Vec::new(),
            body: completion(),
        }
    }
}

/// A one-shot chat completion body.
pub fn completion() -> String {
    serde_json::json!({
        "id": "chatcmpl-scripted",
        "object": "chat.completion",
        "created": 0,
        "model": "scripted",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "hello"}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 5, "completion_tokens": 1, "total_tokens": 6}
    })
    .to_string()
}

/// A content chunk of a streamed completion.
pub fn chunk(text: &str) -> String {
    serde_json::json!({
        "id": "chatcmpl-scripted",
        "object": "chat.completion.chunk",
        "created": 0,
        "model": "scripted",
        "choices": [{"index": 0, "delta": {"content": text}, "finish_reason": null}]
    })
    .to_string()
}

/// One attempt as the upstream saw it.
#[derive(Debug, Clone)]
pub struct Seen {
    /// When it arrived.
    pub at: Instant,
    /// Its JSON body.
    pub body: Value,
    /// Its `Authorization` header, if any.
    pub authorization: Option<String>,
    /// Its `x-request-id` header, if any.
    pub request_id: Option<String>,
    /// Its path and query.
    pub uri: String,
    /// All its headers.
    pub headers: HeaderMap,
}

type Hook = Arc<dyn Fn(u32) + Send + Sync>;

struct Shared {
    script: Vec<Reply>,
    seen: Mutex<Vec<Seen>>,
    hook: Option<Hook>,
}

/// A running scripted upstream.
pub struct Scripted {
    shared: Arc<Shared>,
    /// `http://127.0.0.1:PORT/v1`.
    pub base_url: String,
    task: JoinHandle<()>,
}

impl Scripted {
    /// Serves `script` on 127.0.0.1:0.
    pub async fn start(script: Vec<Reply>) -> Scripted {
        Self::start_with_hook(script, None).await
    }

    /// Serves `script`; `hook(n)` runs when attempt `n` arrives, before it
    /// is answered.
    pub async fn start_with_hook(script: Vec<Reply>, hook: Option<Hook>) -> Scripted {
        assert!(!script.is_empty());
        let shared = Arc::new(Shared {
            script,
            seen: Mutex::new(Vec::new()),
            hook,
        });
        // Any path: tests of other routes and of provider flavours read
        // the path from `Seen::uri`.
        let router = Router::new()
            .fallback(answer)
            .with_state(Arc::clone(&shared));
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let base_url = format!("http://{}/v1", listener.local_addr().expect("addr"));
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, router).await;
        });
        Scripted {
            shared,
            base_url,
            task,
        }
    }

    /// The attempts seen so far.
    pub fn seen(&self) -> Vec<Seen> {
        self.shared.seen.lock().clone()
    }

    /// `http://127.0.0.1:PORT`, without the `/v1` of `base_url`.
    pub fn root(&self) -> &str {
        self.base_url.trim_end_matches("/v1")
    }

    /// How many attempts arrived.
    pub fn attempts(&self) -> usize {
        self.shared.seen.lock().len()
    }
}

impl Drop for Scripted {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn answer(
    State(shared): State<Arc<Shared>>,
    uri: http::Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let n = {
        let mut seen = shared.seen.lock();
        seen.push(Seen {
            at: Instant::now(),
            body: serde_json::from_slice(&body).unwrap_or(Value::Null),
            authorization: headers
                .get("authorization")
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned),
            request_id: headers
                .get("x-request-id")
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned),
            uri: uri.to_string(),
            headers,
        });
        seen.len()
    };
    if let Some(hook) = &shared.hook {
        hook(u32::try_from(n).unwrap_or(u32::MAX));
    }
    let mut reply = shared
        .script
        .get(n - 1)
        .or_else(|| shared.script.last())
        .cloned()
        .expect("script is not empty");
    while let Reply::Delayed {
        delay,
        reply: inner,
    } = reply
    {
        tokio::time::sleep(delay).await;
        reply = *inner;
    }
    match reply {
        Reply::Delayed { .. } => unreachable!("unwrapped above"),
        Reply::Status {
            status,
            headers,
            body,
        } => {
            let mut response = Response::builder()
                .status(status)
                .header("content-type", "application/json");
            for (name, value) in headers {
                response = response.header(name, value);
            }
            response
                .body(Body::from(body))
                .expect("valid scripted response")
        }
        Reply::Stream { events, end } => {
            let frames = stream::iter(
                events
                    .into_iter()
                    .map(|e| Ok::<_, io::Error>(Bytes::from(format!("data: {e}\n\n")))),
            );
            let body = match end {
                End::Done => frames
                    .chain(stream::once(async {
                        Ok(Bytes::from_static(b"data: [DONE]\n\n"))
                    }))
                    .boxed(),
                End::Cut => frames.chain(stream::once(scripted_cut())).boxed(),
                End::Hang => frames.chain(stream::pending()).boxed(),
            };
            (
                [("content-type", "text/event-stream")],
                Body::from_stream(body),
            )
                .into_response()
        }
        Reply::Raw {
            status,
            headers,
            chunks,
            cut,
        } => {
            let frames = stream::iter(
                chunks
                    .into_iter()
                    .map(|c| Ok::<_, io::Error>(Bytes::from(c))),
            );
            let body = if cut {
                frames.chain(stream::once(scripted_cut())).boxed()
            } else {
                frames.boxed()
            };
            let mut response = Response::builder().status(status);
            for (name, value) in headers {
                response = response.header(name, value);
            }
            response
                .body(Body::from_stream(body))
                .expect("valid scripted response")
        }
    }
}

/// Ends a scripted body with an error, which aborts the connection. It
/// waits first so that hyper flushes what came before: an abort may discard
/// what is still buffered.
async fn scripted_cut() -> Result<Bytes, io::Error> {
    tokio::time::sleep(Duration::from_millis(50)).await;
    Err(io::Error::other("scripted cut"))
}

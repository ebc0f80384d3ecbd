//! One keep-alive HTTP/1.1 connection per worker, on hyper's low-level
//! client.
//!
//! Why not a pooled client (reqwest, hyper-util's `Client`): each worker owns
//! its connection, so there is no pool lock, no per-request pool checkout and
//! no redirect/decompression layers on the hot path, and the number of
//! connections is exactly `--concurrency`. The load generator shares two
//! cores with the server it measures; every cycle it saves is the server's.

use std::time::Duration;

use anyhow::{Context, anyhow, bail};
use bytes::Bytes;
use http::{HeaderValue, Method, Request, StatusCode, Uri, header};
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1::{self, SendRequest};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;
use tokio::time::Instant;

/// Where and what to send.
#[derive(Debug, Clone)]
pub struct Target {
    /// `host:port` to connect to.
    pub addr: String,
    /// `Host` header value.
    pub host: HeaderValue,
    /// Path and query.
    pub path: String,
    /// `Authorization` header value, if any.
    pub auth: Option<HeaderValue>,
    /// Request body.
    pub body: Bytes,
}

impl Target {
    /// Parses an `http://` URL.
    pub fn new(url: &str, api_key: Option<&str>, body: Bytes) -> anyhow::Result<Self> {
        let uri: Uri = url
            .parse()
            .with_context(|| format!("invalid --url {url}"))?;
        if uri.scheme_str() != Some("http") {
            bail!("--url must start with http:// (the load generator speaks plain HTTP/1.1)");
        }
        let authority = uri
            .authority()
            .ok_or_else(|| anyhow!("--url has no host"))?;
        let port = authority.port_u16().unwrap_or(80);
        let addr = format!("{}:{port}", authority.host());
        let path = uri
            .path_and_query()
            .map_or_else(|| "/".to_owned(), |p| p.as_str().to_owned());
        let auth = api_key
            .map(|k| HeaderValue::try_from(format!("Bearer {k}")))
            .transpose()
            .context("the API key is not a valid header value")?;
        Ok(Self {
            host: HeaderValue::try_from(authority.as_str())?,
            addr,
            path,
            auth,
            body,
        })
    }

    fn request(&self) -> anyhow::Result<Request<Full<Bytes>>> {
        let mut builder = Request::builder()
            .method(Method::POST)
            .uri(self.path.as_str())
            .header(header::HOST, self.host.clone())
            .header(header::CONTENT_TYPE, "application/json");
        if let Some(auth) = &self.auth {
            builder = builder.header(header::AUTHORIZATION, auth.clone());
        }
        Ok(builder.body(Full::new(self.body.clone()))?)
    }
}

/// What one request gave.
#[derive(Debug, Clone, Copy)]
pub struct Reply {
    /// Response status.
    pub status: StatusCode,
    /// When the first body bytes arrived.
    pub first_chunk: Option<Instant>,
}

/// A worker's connection, reopened after any error.
pub struct Connection {
    target: std::sync::Arc<Target>,
    sender: Option<SendRequest<Full<Bytes>>>,
}

impl Connection {
    /// A connection to `target`, opened lazily.
    pub fn new(target: std::sync::Arc<Target>) -> Self {
        Self {
            target,
            sender: None,
        }
    }

    async fn open(&self) -> anyhow::Result<SendRequest<Full<Bytes>>> {
        let stream = TcpStream::connect(&self.target.addr)
            .await
            .with_context(|| format!("connecting to {}", self.target.addr))?;
        stream.set_nodelay(true)?;
        let (sender, connection) = http1::handshake(TokioIo::new(stream)).await?;
        tokio::spawn(async move {
            // Ends when the sender is dropped or the peer closes.
            let _ = connection.await;
        });
        Ok(sender)
    }

    /// Sends one request and reads its whole body, within `timeout`.
    /// On any error the connection is dropped and reopened next time.
    pub async fn send(&mut self, timeout: Duration) -> anyhow::Result<Reply> {
        match tokio::time::timeout(timeout, self.send_inner()).await {
            Ok(Ok(reply)) => Ok(reply),
            Ok(Err(e)) => {
                self.sender = None;
                Err(e)
            }
            Err(_) => {
                self.sender = None;
                Err(anyhow!(
                    "timeout after {}",
                    humantime::format_duration(timeout)
                ))
            }
        }
    }

    async fn send_inner(&mut self) -> anyhow::Result<Reply> {
        let mut sender = match self.sender.take() {
            Some(s) if !s.is_closed() => s,
            _ => self.open().await?,
        };
        if sender.ready().await.is_err() {
            // The server closed the idle keep-alive connection: reopen once.
            sender = self.open().await?;
            sender.ready().await?;
        }
        let response = sender.send_request(self.target.request()?).await?;
        let status = response.status();
        let mut body = response.into_body();
        let mut first_chunk = None;
        while let Some(frame) = body.frame().await {
            let frame = frame.context("reading the body")?;
            if first_chunk.is_none() && frame.data_ref().is_some_and(|d| !d.is_empty()) {
                first_chunk = Some(Instant::now());
            }
        }
        self.sender = Some(sender);
        Ok(Reply {
            status,
            first_chunk,
        })
    }
}

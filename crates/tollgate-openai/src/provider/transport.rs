//! The HTTP client under [`HttpProvider`](super::HttpProvider): hyper's
//! pooling client over TCP or rustls for one-shot calls, the driven
//! HTTP/1.1 path of its own for streams (see `h1`), and the body types
//! they yield.
//!
//! A provider sends one `POST` per attempt and nothing else: no redirects,
//! no proxies, no cookies, no decompression. Using hyper directly keeps the
//! per-request work to building one request from pre-built parts (a shared
//! `Uri`, a cloned header map, the body's `Bytes`), which is most of what an
//! idle gateway spends per call.

use std::error::Error as StdError;
use std::fmt;
use std::pin::Pin;
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use futures_core::Stream;
use http::{HeaderMap, HeaderName, HeaderValue, Method, Request, Response, Uri};
use http_body_util::{BodyDataStream, Full};
use hyper::body::Incoming;
use hyper_rustls::{HttpsConnector, HttpsConnectorBuilder};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::connect::proxy::Tunnel;
use hyper_util::client::proxy::matcher::{Intercept, Matcher};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tokio::net::TcpStream;
use tokio::time::Sleep;

use super::h1::{DrivenBody, DrivenClient};
use super::shard::{self, MAX_SHARDS};

/// Settings of an [`HttpClient`].
#[derive(Debug, Clone)]
pub(super) struct ClientSettings {
    pub(super) connect_timeout: Duration,
    pub(super) read_timeout: Option<Duration>,
    pub(super) pool_idle_timeout: Option<Duration>,
    pub(super) pool_max_idle_per_host: usize,
    pub(super) proxy: ProxySetting,
}

/// How `https` upstreams are reached.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(super) enum ProxySetting {
    /// Through the proxy named by `HTTPS_PROXY`/`https_proxy` (or
    /// `ALL_PROXY`), unless `NO_PROXY` lists the host; directly when none
    /// is set.
    #[default]
    FromEnv,
    /// Directly.
    Direct,
    /// Through this proxy.
    Url(String),
}

/// The proxy rules of a client, shared by its connector.
#[derive(Clone)]
struct Proxies(Arc<Matcher>);

impl Proxies {
    fn new(setting: &ProxySetting) -> Self {
        Proxies(Arc::new(match setting {
            ProxySetting::FromEnv => Matcher::from_env(),
            ProxySetting::Direct => Matcher::builder().build(),
            ProxySetting::Url(url) => Matcher::builder().https(url.as_str()).build(),
        }))
    }

    /// The proxy to reach `dst` through. Plain-http upstreams (a local
    /// simulator or model server) are always reached directly.
    fn for_upstream(&self, dst: &Uri) -> Option<Intercept> {
        match dst.scheme_str() {
            Some("https") => self.0.intercept(dst),
            _ => None,
        }
    }
}

type BoxError = Box<dyn StdError + Send + Sync>;

/// Opens TCP connections: to the upstream itself, or for an `https`
/// upstream behind a proxy, to the proxy, asking it with `CONNECT` for a
/// tunnel (TLS then runs through the tunnel, end to end).
#[derive(Clone)]
pub(super) struct Connector {
    tcp: HttpConnector,
    proxies: Proxies,
}

impl tower_service::Service<Uri> for Connector {
    type Response = TokioIo<TcpStream>;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, BoxError>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.tcp.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, dst: Uri) -> Self::Future {
        let proxy = self.proxies.for_upstream(&dst);
        let mut tcp = self.tcp.clone();
        match proxy {
            None => Box::pin(async move { tcp.call(dst).await.map_err(Into::into) }),
            Some(proxy) => {
                let mut tunnel = Tunnel::new(proxy.uri().clone(), tcp);
                if let Some(auth) = proxy.basic_auth() {
                    tunnel = tunnel.with_auth(auth.clone());
                }
                Box::pin(async move { tunnel.call(dst).await.map_err(Into::into) })
            }
        }
    }
}

/// A pooling HTTP/1.1 and HTTP/2 client (TLS by rustls with the platform's
/// certificate verifier; HTTP/2 when the server offers it through ALPN).
/// Stream requests take a path of their own: HTTP/1.1 connections, pooled
/// apart from the others, each driven by the task that reads its body (see
/// the `h1` module), so that a stream's events reach their reader without
/// a hand-over between tasks. The pool settings apply to each of the two
/// pools.
///
/// A thread pinned to a shard ([`pin_to_thread`](super::pin_to_thread))
/// uses connections of its own on both paths, so the pool settings then
/// apply per shard.
///
/// Clones share the connection pools: give one client to several
/// [`HttpProvider`](super::HttpProvider)s of the same host through
/// [`HttpProviderBuilder::client`](super::HttpProviderBuilder::client).
#[derive(Clone)]
pub struct HttpClient {
    /// One-shot requests: hyper's pooling client, one per thread shard.
    pooled: Arc<Pooled>,
    /// Stream requests: HTTP/1.1 connections driven by their reader.
    driven: DrivenClient,
    proxies: Proxies,
    read_timeout: Option<Duration>,
    /// Why no certificate can be verified (e.g. the system has no CA
    /// roots), if so: `https` upstreams are then refused when a provider is
    /// built, while plain `http` ones (a local simulator or model server)
    /// still work.
    tls_error: Option<rustls::Error>,
}

impl fmt::Debug for HttpClient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HttpClient")
            .field("read_timeout", &self.read_timeout)
            .finish_non_exhaustive()
    }
}

/// The TLS configuration could not be created (e.g. the platform's
/// certificate store is unusable).
#[derive(Debug, thiserror::Error)]
#[error(transparent)]
pub struct ClientError(#[from] rustls::Error);

/// rustls with the platform's certificate verifier; without usable roots,
/// a configuration that verifies nothing (so no `https` connection can
/// succeed) and the reason.
fn tls_config() -> Result<(rustls::ClientConfig, Option<rustls::Error>), rustls::Error> {
    use rustls_platform_verifier::BuilderVerifierExt;
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let builder = || {
        rustls::ClientConfig::builder_with_provider(Arc::clone(&provider))
            .with_safe_default_protocol_versions()
    };
    match builder()?.with_platform_verifier() {
        Ok(verified) => Ok((verified.with_no_client_auth(), None)),
        Err(err) => {
            let none = builder()?
                .with_root_certificates(rustls::RootCertStore::empty())
                .with_no_client_auth();
            Ok((none, Some(err)))
        }
    }
}

impl HttpClient {
    pub(super) fn new(settings: &ClientSettings) -> Result<Self, ClientError> {
        let (tls, tls_error) = tls_config()?;
        Ok(Self::with_tls(settings, tls, tls_error))
    }

    fn with_tls(
        settings: &ClientSettings,
        tls: rustls::ClientConfig,
        tls_error: Option<rustls::Error>,
    ) -> Self {
        let mut tcp = HttpConnector::new();
        tcp.enforce_http(false);
        tcp.set_nodelay(true);
        tcp.set_connect_timeout(Some(settings.connect_timeout));
        let proxies = Proxies::new(&settings.proxy);
        let connector = Connector {
            tcp,
            proxies: proxies.clone(),
        };
        let driven = DrivenClient::new(
            HttpsConnectorBuilder::new()
                .with_tls_config(tls.clone())
                .https_or_http()
                .enable_http1()
                .wrap_connector(connector.clone()),
            settings.pool_max_idle_per_host,
            settings.pool_idle_timeout,
        );
        let connector = HttpsConnectorBuilder::new()
            .with_tls_config(tls)
            .https_or_http()
            .enable_all_versions()
            .wrap_connector(connector);
        HttpClient {
            pooled: Arc::new(Pooled::new(connector, settings)),
            driven,
            proxies,
            read_timeout: settings.read_timeout,
            tls_error,
        }
    }

    /// A client as if the system had no CA roots (for tests of that case).
    #[cfg(test)]
    pub(super) fn without_roots(settings: &ClientSettings) -> Self {
        let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
        let tls = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .expect("default versions")
            .with_root_certificates(rustls::RootCertStore::empty())
            .with_no_client_auth();
        Self::with_tls(
            settings,
            tls,
            Some(rustls::Error::General("no CA certificates".to_owned())),
        )
    }

    /// A client trusting only `roots` (for tests against a server of a
    /// test certificate authority).
    #[cfg(test)]
    pub(super) fn with_roots(settings: &ClientSettings, roots: rustls::RootCertStore) -> Self {
        let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
        let tls = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .expect("default versions")
            .with_root_certificates(roots)
            .with_no_client_auth();
        Self::with_tls(settings, tls, None)
    }

    /// The proxy an `https` upstream at `uri` is reached through, if any.
    pub(super) fn proxy_for(&self, uri: &Uri) -> Option<Uri> {
        self.proxies.for_upstream(uri).map(|p| p.uri().clone())
    }

    /// Fails when this client cannot verify any `https` server.
    pub(super) fn check_https(&self) -> Result<(), ClientError> {
        match &self.tls_error {
            None => Ok(()),
            Some(err) => Err(ClientError(err.clone())),
        }
    }

    /// The longest silence allowed between two reads of a response.
    pub(super) fn read_timeout(&self) -> Option<Duration> {
        self.read_timeout
    }

    /// Starts a `POST` of `body` to `uri`; resolves with the response head.
    pub(super) fn post(
        &self,
        uri: &Uri,
        headers: &HeaderMap,
        extra: [&[(HeaderName, HeaderValue)]; 2],
        body: Bytes,
    ) -> impl Future<Output = Result<Response<Incoming>, SendError>> + Send + 'static {
        let sent = self.pooled.get().request(post(uri, headers, extra, body));
        async move { sent.await.map_err(|e| SendError(SendFailure::Pooled(e))) }
    }

    /// Idle connections of the driven path to the host of `uri`.
    #[cfg(test)]
    pub(super) fn driven_idle(&self, uri: &Uri) -> usize {
        self.driven.idle(uri)
    }

    /// Starts a `POST` of `body` to `uri` whose response body is a stream,
    /// over HTTP/1.1 on a connection that the body's reader drives (see
    /// `h1`); resolves with the response head.
    pub(super) fn post_stream(
        &self,
        uri: &Uri,
        headers: &HeaderMap,
        extra: [&[(HeaderName, HeaderValue)]; 2],
        body: Bytes,
    ) -> impl Future<Output = Result<Response<DrivenBody>, SendError>> + Send + 'static {
        self.driven.send(post(uri, headers, extra, body))
    }
}

/// hyper's pooling client per thread shard (see `shard`): the client of
/// shard 0, and those of the pinned shards, each made on its first use.
/// The client runs each of its connections in a task spawned on the
/// runtime of the request that opened it, so a pinned thread's one-shot
/// exchanges never involve another thread.
struct Pooled {
    base: PooledClient,
    /// Shard `n` (1..=MAX_SHARDS) at `n - 1`.
    pinned: Box<[OnceLock<Box<PooledClient>>]>,
    builder: hyper_util::client::legacy::Builder,
    connector: HttpsConnector<Connector>,
}

type PooledClient = Client<HttpsConnector<Connector>, Full<Bytes>>;

impl Pooled {
    fn new(connector: HttpsConnector<Connector>, settings: &ClientSettings) -> Self {
        let mut builder = Client::builder(TokioExecutor::new());
        builder
            .pool_timer(TokioTimer::new())
            .timer(TokioTimer::new())
            .pool_idle_timeout(settings.pool_idle_timeout)
            .pool_max_idle_per_host(settings.pool_max_idle_per_host);
        Pooled {
            base: builder.build(connector.clone()),
            pinned: (0..MAX_SHARDS).map(|_| OnceLock::new()).collect(),
            builder,
            connector,
        }
    }

    /// The client of the calling thread's shard.
    fn get(&self) -> &PooledClient {
        match shard::current()
            .checked_sub(1)
            .and_then(|i| self.pinned.get(i))
        {
            Some(slot) => slot.get_or_init(|| Box::new(self.builder.build(self.connector.clone()))),
            None => &self.base,
        }
    }
}

/// A `POST` of `body` to `uri` with `headers`, then `extra` (the
/// request's own: its id, forwarded headers; then the attempt's: its
/// `traceparent`), each replacing a header of its name.
fn post(
    uri: &Uri,
    headers: &HeaderMap,
    extra: [&[(HeaderName, HeaderValue)]; 2],
    body: Bytes,
) -> Request<Full<Bytes>> {
    let mut request = Request::new(Full::new(body));
    *request.method_mut() = Method::POST;
    *request.uri_mut() = uri.clone();
    *request.headers_mut() = headers.clone();
    for (name, value) in extra.into_iter().flatten() {
        request.headers_mut().insert(name.clone(), value.clone());
    }
    request
}

/// A request that got no response (connecting failed, or the connection
/// broke before the response head).
#[derive(Debug)]
pub struct SendError(SendFailure);

#[derive(Debug)]
enum SendFailure {
    /// From the pooling client (one-shot calls).
    Pooled(hyper_util::client::legacy::Error),
    /// Opening a connection of the driven path failed.
    Connect(BoxError),
    /// A connection of the driven path failed before the response head.
    Http(hyper::Error),
    /// A connection of the driven path ended before the response head
    /// without saying whether the request was written: it may have been.
    Lost(BoxError),
}

impl SendError {
    pub(super) fn connect(e: BoxError) -> Self {
        SendError(SendFailure::Connect(e))
    }

    pub(super) fn http(e: hyper::Error) -> Self {
        SendError(SendFailure::Http(e))
    }

    pub(super) fn lost(e: BoxError) -> Self {
        SendError(SendFailure::Lost(e))
    }
}

impl SendError {
    /// Whether the connection could not be made (refused, unreachable,
    /// timed out, or its TLS handshake failed): no byte of the request was
    /// sent.
    pub fn is_connect(&self) -> bool {
        match &self.0 {
            SendFailure::Pooled(e) => e.is_connect(),
            SendFailure::Connect(_) => true,
            SendFailure::Http(_) | SendFailure::Lost(_) => false,
        }
    }
}

impl fmt::Display for SendError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_connect() {
            f.write_str("cannot connect to the upstream")
        } else {
            f.write_str("the upstream connection failed before a response")
        }
    }
}

impl StdError for SendError {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        match &self.0 {
            // The client's own error only says "client error (…)": its
            // source is the part worth showing.
            SendFailure::Pooled(e) => e.source(),
            SendFailure::Connect(e) => Some(&**e),
            SendFailure::Http(e) => Some(e),
            SendFailure::Lost(e) => Some(&**e),
        }
    }
}

/// A failure while reading a response body.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BodyError {
    /// The connection failed or the body was malformed.
    #[error("reading the upstream body failed")]
    Http(#[source] hyper::Error),
    /// Nothing arrived for longer than the client's read timeout.
    #[error("no data from the upstream for {0:?} (read timeout)")]
    ReadTimeout(Duration),
    /// The upstream connection ended without ending the body.
    #[error("the upstream connection closed before the body ended")]
    Closed,
    /// A one-shot body grew past the provider's `max_response_body`.
    #[error("the upstream response body exceeds the limit of {limit} bytes (max_response_body)")]
    TooLarge {
        /// The limit, in bytes.
        limit: usize,
    },
}

impl BodyError {
    /// Whether the read timed out.
    pub fn is_timeout(&self) -> bool {
        matches!(self, BodyError::ReadTimeout(_))
    }
}

/// The data of a response body as a stream of chunks, failing with
/// [`BodyError::ReadTimeout`] when a gap between chunks exceeds the read
/// timeout.
pub struct BodyChunks {
    body: Source,
    read_timeout: Option<Duration>,
    /// One timer per body, re-armed (not re-created) for each read.
    timer: Option<Pin<Box<Sleep>>>,
    armed: bool,
    done: bool,
}

/// Where a body's chunks come from.
enum Source {
    /// hyper's body, its connection run by the pooling client.
    Pooled(BodyDataStream<Incoming>),
    /// A stream body whose connection its reader drives.
    Driven(DrivenBody),
}

impl BodyChunks {
    pub(super) fn new(body: Incoming, read_timeout: Option<Duration>) -> Self {
        Self::with_source(Source::Pooled(BodyDataStream::new(body)), read_timeout)
    }

    pub(super) fn driven(body: DrivenBody, read_timeout: Option<Duration>) -> Self {
        Self::with_source(Source::Driven(body), read_timeout)
    }

    fn with_source(body: Source, read_timeout: Option<Duration>) -> Self {
        BodyChunks {
            body,
            read_timeout,
            timer: None,
            armed: false,
            done: false,
        }
    }
}

impl fmt::Debug for BodyChunks {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BodyChunks")
            .field("read_timeout", &self.read_timeout)
            .field("done", &self.done)
            .finish_non_exhaustive()
    }
}

impl Stream for BodyChunks {
    type Item = Result<Bytes, BodyError>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        if this.done {
            return Poll::Ready(None);
        }
        let polled = match &mut this.body {
            Source::Pooled(body) => Pin::new(body)
                .poll_next(cx)
                .map(|item| item.map(|r| r.map_err(BodyError::Http))),
            Source::Driven(body) => Pin::new(body).poll_next(cx),
        };
        if let Poll::Ready(item) = polled {
            this.armed = false;
            if !matches!(item, Some(Ok(_))) {
                this.done = true;
            }
            return Poll::Ready(item);
        }
        let Some(limit) = this.read_timeout else {
            return Poll::Pending;
        };
        if !this.armed {
            let at = tokio::time::Instant::now() + limit;
            match this.timer.as_mut() {
                Some(timer) => timer.as_mut().reset(at),
                None => this.timer = Some(Box::pin(tokio::time::sleep_until(at))),
            }
            this.armed = true;
        }
        let Some(timer) = this.timer.as_mut() else {
            return Poll::Pending;
        };
        match timer.as_mut().poll(cx) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(()) => {
                this.done = true;
                Poll::Ready(Some(Err(BodyError::ReadTimeout(limit))))
            }
        }
    }
}

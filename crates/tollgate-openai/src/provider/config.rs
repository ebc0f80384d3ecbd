//! Building an [`HttpProvider`](super::HttpProvider): base URL, key, client
//! settings, and the typed errors of a bad configuration (SPEC CFG-3).

use std::fmt;
use std::time::Duration;

use http::HeaderMap;

use super::stream::DEFAULT_END_GRACE;
use super::transport::{ClientError, ClientSettings, HttpClient, ProxySetting};
use crate::sse::DEFAULT_MAX_EVENT_SIZE;

/// Default time allowed to establish a connection.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Default time an idle pooled connection is kept.
pub const DEFAULT_POOL_IDLE_TIMEOUT: Duration = Duration::from_secs(90);
/// Default number of idle connections kept per upstream host.
pub const DEFAULT_POOL_MAX_IDLE_PER_HOST: usize = 64;
/// Default number of bytes of a non-2xx body read to find its message.
pub const DEFAULT_MAX_ERROR_BODY: usize = 64 * 1024;
/// Default largest one-shot response body accepted from the upstream
/// (room for a batch of 2,048 embeddings of 1,536 floats as JSON text).
pub const DEFAULT_MAX_RESPONSE_BODY: usize = 64 * 1024 * 1024;

/// An upstream API key. Its `Debug` output is redacted, so a key never
/// reaches a log line through a configuration dump.
#[derive(Clone, PartialEq, Eq)]
pub struct ApiKey(String);

impl ApiKey {
    /// Wraps a key.
    pub fn new(key: impl Into<String>) -> Self {
        ApiKey(key.into())
    }

    /// The key itself.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for ApiKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ApiKey([redacted])")
    }
}

impl From<String> for ApiKey {
    fn from(key: String) -> Self {
        ApiKey(key)
    }
}

impl From<&str> for ApiKey {
    fn from(key: &str) -> Self {
        ApiKey(key.to_owned())
    }
}

/// A provider configuration that cannot work, reported before any request
/// is sent (SPEC CFG-3).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BuildError {
    /// The base URL is not an absolute `http`/`https` URL.
    #[error("upstream base_url `{url}` is invalid: {reason}")]
    BaseUrl {
        /// The URL as configured.
        url: String,
        /// Why it was refused.
        reason: String,
    },
    /// The API key cannot be sent in an HTTP header (control characters,
    /// non-ASCII) or is empty.
    #[error("upstream api_key is not a valid bearer token (empty or not printable ASCII)")]
    ApiKey,
    /// A zero duration or size where a positive one is required.
    #[error("upstream `{field}` must be greater than zero")]
    MustBePositive {
        /// The offending field.
        field: &'static str,
    },
    /// The HTTP client could not be created (e.g. no TLS roots).
    #[error("cannot create the upstream HTTP client: {0}")]
    Client(#[source] ClientError),
    /// The proxy an `https` upstream would go through cannot be used.
    #[error("upstream proxy `{proxy}` cannot be used: {reason}")]
    Proxy {
        /// The proxy's scheme, host and port (never its credentials).
        proxy: String,
        /// Why.
        reason: &'static str,
    },
}

/// Settings of an [`HttpProvider`](super::HttpProvider); created by
/// [`HttpProvider::builder`](super::HttpProvider::builder).
#[derive(Clone)]
#[must_use = "a builder does nothing until `build` is called"]
pub struct HttpProviderBuilder {
    pub(super) base_url: String,
    pub(super) api_key: Option<ApiKey>,
    pub(super) key_header: Option<(http::HeaderName, String)>,
    pub(super) connect_timeout: Duration,
    pub(super) read_timeout: Option<Duration>,
    pub(super) pool_idle_timeout: Option<Duration>,
    pub(super) pool_max_idle_per_host: usize,
    pub(super) max_event_size: usize,
    pub(super) max_error_body: usize,
    pub(super) max_response_body: usize,
    pub(super) stream_end_grace: Duration,
    pub(super) headers: HeaderMap,
    pub(super) proxy: ProxySetting,
    pub(super) client: Option<HttpClient>,
}

impl fmt::Debug for HttpProviderBuilder {
    /// Header values and the key are not shown (they may be credentials).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HttpProviderBuilder")
            .field("base_url", &self.base_url)
            .field("api_key", &self.api_key)
            .field(
                "key_header",
                &self
                    .key_header
                    .as_ref()
                    .map_or("authorization", |(n, _)| n.as_str()),
            )
            .field("connect_timeout", &self.connect_timeout)
            .field("read_timeout", &self.read_timeout)
            .field("pool_idle_timeout", &self.pool_idle_timeout)
            .field("pool_max_idle_per_host", &self.pool_max_idle_per_host)
            .field("max_event_size", &self.max_event_size)
            .field("max_error_body", &self.max_error_body)
            .field("max_response_body", &self.max_response_body)
            .field("stream_end_grace", &self.stream_end_grace)
            .field("headers", &self.headers.keys().collect::<Vec<_>>())
            .field(
                "proxy",
                &match &self.proxy {
                    ProxySetting::FromEnv => "from environment",
                    ProxySetting::Direct => "none",
                    ProxySetting::Url(_) => "[configured]",
                },
            )
            .field("shared_client", &self.client.is_some())
            .finish()
    }
}

impl HttpProviderBuilder {
    pub(super) fn new(base_url: impl Into<String>) -> Self {
        HttpProviderBuilder {
            base_url: base_url.into(),
            api_key: None,
            key_header: None,
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            read_timeout: None,
            pool_idle_timeout: Some(DEFAULT_POOL_IDLE_TIMEOUT),
            pool_max_idle_per_host: DEFAULT_POOL_MAX_IDLE_PER_HOST,
            max_event_size: DEFAULT_MAX_EVENT_SIZE,
            max_error_body: DEFAULT_MAX_ERROR_BODY,
            max_response_body: DEFAULT_MAX_RESPONSE_BODY,
            stream_end_grace: DEFAULT_END_GRACE,
            headers: HeaderMap::new(),
            proxy: ProxySetting::default(),
            client: None,
        }
    }

    /// The key sent as `Authorization: Bearer <key>` (the gateway's own
    /// upstream key, never a client's: SPEC GW-2). Without one, no
    /// `Authorization` header is sent.
    pub fn api_key(mut self, key: impl Into<ApiKey>) -> Self {
        self.api_key = Some(key.into());
        self
    }

    /// Sends the API key as `name: <prefix><key>` instead of
    /// `Authorization: Bearer <key>` (SPEC WIRE-2): Azure OpenAI takes
    /// `api-key: <key>`, Anthropic `x-api-key: <key>`, some
    /// OpenAI-compatible servers their own header. No `Authorization` header
    /// is then sent unless [`headers`](Self::headers) sets one.
    pub fn key_header(mut self, name: http::HeaderName, prefix: impl Into<String>) -> Self {
        self.key_header = Some((name, prefix.into()));
        self
    }

    /// Time allowed to establish a connection (TCP and TLS); default
    /// [`DEFAULT_CONNECT_TIMEOUT`]. The attempt's own timeout still bounds
    /// the whole attempt.
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// Longest silence allowed between two reads of a response, streams
    /// included: a stalled upstream fails (as a timeout before the response,
    /// a broken stream after it) instead of holding its permits until the
    /// call's deadline. Default: none.
    pub fn read_timeout(mut self, timeout: Duration) -> Self {
        self.read_timeout = Some(timeout);
        self
    }

    /// How long an idle pooled connection is kept (`None`: forever);
    /// default [`DEFAULT_POOL_IDLE_TIMEOUT`].
    pub fn pool_idle_timeout(mut self, timeout: Option<Duration>) -> Self {
        self.pool_idle_timeout = timeout;
        self
    }

    /// Idle connections kept per upstream host; default
    /// [`DEFAULT_POOL_MAX_IDLE_PER_HOST`]. Zero disables reuse.
    pub fn pool_max_idle_per_host(mut self, max: usize) -> Self {
        self.pool_max_idle_per_host = max;
        self
    }

    /// Largest server-sent event accepted from the upstream, in bytes;
    /// default [`DEFAULT_MAX_EVENT_SIZE`]. A larger event fails the stream
    /// as a protocol error (memory stays bounded: SPEC GW-7).
    pub fn max_event_size(mut self, bytes: usize) -> Self {
        self.max_event_size = bytes;
        self
    }

    /// Bytes of a non-2xx body read to find the provider's message; default
    /// [`DEFAULT_MAX_ERROR_BODY`]. The rest is discarded.
    pub fn max_error_body(mut self, bytes: usize) -> Self {
        self.max_error_body = bytes;
        self
    }

    /// Largest one-shot (non-streaming) response body accepted, in bytes;
    /// default [`DEFAULT_MAX_RESPONSE_BODY`]. A one-shot body is held in
    /// memory whole (its usage is read before it is returned), so a larger
    /// one fails the attempt as a protocol error instead of growing without
    /// bound. Streams are bounded per event instead
    /// ([`max_event_size`](Self::max_event_size)).
    pub fn max_response_body(mut self, bytes: usize) -> Self {
        self.max_response_body = bytes;
        self
    }

    /// How long a stream waits, after `[DONE]`, for the upstream body to
    /// end so that its connection goes back to the pool; default
    /// [`DEFAULT_END_GRACE`]. The `[DONE]` frame itself is never delayed,
    /// only the stream's end (and the release of what it holds). Zero
    /// closes the connection unless the body had already ended.
    pub fn stream_end_grace(mut self, grace: Duration) -> Self {
        self.stream_end_grace = grace;
        self
    }

    /// The proxy of `https` upstreams: `Some("http://[user:pass@]host:port")`
    /// tunnels every connection through it with `CONNECT` (TLS runs end to
    /// end through the tunnel); `None` connects directly. Default: the
    /// `HTTPS_PROXY`/`https_proxy` (or `ALL_PROXY`) environment variable,
    /// unless `NO_PROXY` lists the host. Plain-`http` upstreams are always
    /// reached directly. Not applied to a shared [`client`](Self::client).
    pub fn https_proxy(mut self, proxy: Option<String>) -> Self {
        self.proxy = match proxy {
            Some(url) => ProxySetting::Url(url),
            None => ProxySetting::Direct,
        };
        self
    }

    /// Extra headers sent with every request (e.g. `OpenAI-Organization`,
    /// or Azure's `api-key`). Their values are treated as sensitive (never
    /// shown in debug output). An `Authorization` header here is replaced
    /// by the API key, if one is set.
    pub fn headers(mut self, headers: HeaderMap) -> Self {
        self.headers = headers;
        self
    }

    /// Uses `client` (e.g. shared by several upstreams, so they share one
    /// connection pool) instead of building one. The connect timeout, read
    /// timeout and pool settings of this builder are then not applied; they
    /// are the client's.
    pub fn client(mut self, client: HttpClient) -> Self {
        self.client = Some(client);
        self
    }

    /// The [`HttpClient`] these settings describe (one per process and
    /// host is enough: it pools connections).
    ///
    /// # Errors
    /// [`BuildError::MustBePositive`] for a zero connect or read timeout;
    /// [`BuildError::Client`] when the TLS configuration cannot be created.
    pub fn build_client(&self) -> Result<HttpClient, BuildError> {
        if self.connect_timeout.is_zero() {
            return Err(BuildError::MustBePositive {
                field: "connect_timeout",
            });
        }
        if self.read_timeout.is_some_and(|t| t.is_zero()) {
            return Err(BuildError::MustBePositive {
                field: "read_timeout",
            });
        }
        HttpClient::new(&self.client_settings()).map_err(BuildError::Client)
    }

    /// The client settings of this builder.
    pub(super) fn client_settings(&self) -> ClientSettings {
        ClientSettings {
            connect_timeout: self.connect_timeout,
            read_timeout: self.read_timeout,
            pool_idle_timeout: self.pool_idle_timeout,
            pool_max_idle_per_host: self.pool_max_idle_per_host,
            proxy: self.proxy.clone(),
        }
    }
}

//! [`HttpProvider`]: the engine's `Provider` over an OpenAI-compatible HTTP
//! API.

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures_util::StreamExt;
use http::header::{ACCEPT, AUTHORIZATION, CONTENT_TYPE};
use http::{HeaderMap, HeaderName, HeaderValue, Response, Uri};
use serde::Deserialize;
use serde_json::value::RawValue;
use tokio::time::Instant;
use tollgate::lifecycle::{AttemptContext, ErrorKind, Provider, ProviderError, Reply};

use super::classify::{body_error, declared_message, sanitize, send_error, status_error};
use super::config::{BuildError, HttpProviderBuilder};
use super::dialect::usage_of_raw;
use super::members::members;
use super::request::{Endpoint, REQUEST_ID, UpstreamRequest};
use super::stream::{BodyStream, ChunkStream, parse_object, raw_value};
use super::transport::{BodyChunks, BodyError, HttpClient, SendError};
use crate::sse::SseDecoder;

/// The media type of a server-sent-events body.
const EVENT_STREAM: &[u8] = b"text/event-stream";

/// An OpenAI-compatible upstream reached over HTTP(S).
///
/// One provider holds one [`HttpClient`] (connection pooling, rustls)
/// and the endpoint URLs of one base URL; clones share both. Each attempt
/// is one `POST` of the request's pre-serialised body:
///
/// * the attempt's timeout ([`AttemptContext::timeout`], already
///   `min(local cap, remaining)`: SPEC DL-4) bounds the whole attempt up to
///   the response headers, and for a one-shot call the body too;
/// * a non-2xx answer is classified by its status (SPEC RT-2), with the
///   server's retry floor from the rate-limit headers (RT-3) and the
///   provider's message, with keys redacted;
/// * failing to connect (or losing the connection before a response) is
///   [`ErrorKind::Connect`], running out of time [`ErrorKind::Timeout`], a
///   2xx body that is not a JSON object [`ErrorKind::Protocol`].
///
/// Dropping a returned future or stream aborts the HTTP request and closes
/// its connection (SPEC DL-6, LC-5).
#[derive(Clone)]
pub struct HttpProvider {
    inner: Arc<Inner>,
}

struct Inner {
    client: HttpClient,
    base_url: String,
    /// One URL per endpoint, in [`Endpoint::ALL`] order.
    urls: [Uri; 4],
    /// Sent with one-shot requests (auth, content type, extra headers).
    one_shot_headers: HeaderMap,
    /// Sent with stream requests.
    stream_headers: HeaderMap,
    /// The key, to redact from any message.
    secret: Option<Arc<str>>,
    max_event_size: usize,
    max_error_body: usize,
    max_response_body: usize,
    stream_end_grace: Duration,
}

impl fmt::Debug for HttpProvider {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HttpProvider")
            .field("base_url", &self.inner.base_url)
            .field("api_key", &self.inner.secret.as_ref().map(|_| "[redacted]"))
            .finish_non_exhaustive()
    }
}

impl HttpProvider {
    /// Settings for an upstream whose API lives under `base_url` (e.g.
    /// `https://api.openai.com/v1`; `/chat/completions` and `/embeddings`
    /// are appended, a query string such as `?api-version=…` is kept).
    pub fn builder(base_url: impl Into<String>) -> HttpProviderBuilder {
        HttpProviderBuilder::new(base_url)
    }

    /// The base URL as configured.
    pub fn base_url(&self) -> &str {
        &self.inner.base_url
    }

    /// The URL an endpoint is sent to.
    pub fn url(&self, endpoint: Endpoint) -> &Uri {
        // `index` is always in range: one URL per endpoint.
        &self.inner.urls[endpoint.index()]
    }

    /// The HTTP client (share it with other providers through
    /// [`HttpProviderBuilder::client`] to share one connection pool).
    pub fn client(&self) -> &HttpClient {
        &self.inner.client
    }

    fn secret(&self) -> Option<&str> {
        self.inner.secret.as_deref()
    }

    /// Sends a one-shot request and waits for the response headers.
    async fn send(
        &self,
        request: &UpstreamRequest,
        for_attempt: &[(HeaderName, HeaderValue)],
        deadline: Option<Instant>,
        timeout: Option<Duration>,
    ) -> Result<Response<BodyChunks>, ProviderError> {
        let send = self.inner.client.post(
            self.url(request.endpoint()),
            &self.inner.one_shot_headers,
            [request.headers(), for_attempt],
            request.body().clone(),
        );
        let read = self.inner.client.read_timeout();
        let response = self.head(send, deadline, timeout).await?;
        Ok(response.map(|body| BodyChunks::new(body, read)))
    }

    /// Sends a stream request (on the driven path, see `h1`) and waits for
    /// the response headers.
    async fn send_stream(
        &self,
        request: &UpstreamRequest,
        for_attempt: &[(HeaderName, HeaderValue)],
        deadline: Option<Instant>,
        timeout: Option<Duration>,
    ) -> Result<Response<BodyChunks>, ProviderError> {
        let send = self.inner.client.post_stream(
            self.url(request.endpoint()),
            &self.inner.stream_headers,
            [request.headers(), for_attempt],
            request.body().clone(),
        );
        let read = self.inner.client.read_timeout();
        let response = self.head(send, deadline, timeout).await?;
        Ok(response.map(|body| BodyChunks::driven(body, read)))
    }

    /// Waits for the response headers of `send` under the attempt's time
    /// and the client's read timeout.
    async fn head<B>(
        &self,
        send: impl Future<Output = Result<Response<B>, SendError>>,
        deadline: Option<Instant>,
        timeout: Option<Duration>,
    ) -> Result<Response<B>, ProviderError> {
        let response = match self.inner.client.read_timeout() {
            None => within(deadline, timeout, "waiting for the response headers", send).await?,
            Some(read) => within(
                deadline,
                timeout,
                "waiting for the response headers",
                tokio::time::timeout(read, send),
            )
            .await?
            .map_err(|_| {
                ProviderError::new(
                    ErrorKind::Timeout,
                    format!(
                        "no response headers from the upstream within the read timeout of {read:?}"
                    ),
                )
            })?,
        };
        response.map_err(|err| send_error(&err, self.secret()))
    }

    /// The error for a non-2xx response, with as much of its body as fits
    /// in the limit and the time left.
    async fn status_error(
        &self,
        response: Response<BodyChunks>,
        deadline: Option<Instant>,
        timeout: Option<Duration>,
    ) -> ProviderError {
        let limit = self.inner.max_error_body;
        let (parts, mut chunks) = response.into_parts();
        let read = async {
            let mut body = Vec::new();
            while body.len() < limit {
                match chunks.next().await {
                    Some(Ok(chunk)) => {
                        let take = chunk.len().min(limit - body.len());
                        body.extend_from_slice(chunk.get(..take).unwrap_or_default());
                    }
                    None => return Some(body),
                    Some(Err(_)) => return None,
                }
            }
            Some(body)
        };
        let body = within(deadline, timeout, "reading an error body", read)
            .await
            .ok()
            .flatten();
        let err = status_error(parts.status, &parts.headers, body.as_deref(), self.secret());
        tracing::debug!(
            status = err.status,
            kind = %err.kind,
            retry_after_ms = err.retry_after.map(|d| d.as_millis() as u64),
            "upstream refused the attempt"
        );
        err
    }

    async fn one_shot(
        &self,
        request: &UpstreamRequest,
        for_attempt: &[(HeaderName, HeaderValue)],
        attempt: AttemptContext,
    ) -> Result<Reply<Bytes>, ProviderError> {
        if request.is_stream() {
            return Err(ProviderError::new(
                ErrorKind::Client,
                "a streaming request was sent through the one-shot call",
            ));
        }
        let (deadline, timeout) = attempt_deadline(attempt);
        let response = self.send(request, for_attempt, deadline, timeout).await?;
        let status = response.status();
        if !status.is_success() {
            return Err(self.status_error(response, deadline, timeout).await);
        }
        let budget = budgets_of(response.headers());
        let request_id = response
            .headers()
            .get(&REQUEST_ID)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        let body = within(
            deadline,
            timeout,
            "reading the response body",
            collect(response.into_body(), self.inner.max_response_body),
        )
        .await?
        .map_err(|err| body_error(&err, self.secret()))?;
        let usage = one_shot_usage(&body, status.as_u16(), self.secret(), request.endpoint())?;
        Ok(Reply::new(body, usage)
            .with_budget(budget)
            .with_request_id(request_id))
    }

    async fn open_stream(
        &self,
        request: &UpstreamRequest,
        for_attempt: &[(HeaderName, HeaderValue)],
        attempt: AttemptContext,
    ) -> Result<ChunkStream, ProviderError> {
        if !request.is_stream() {
            return Err(ProviderError::new(
                ErrorKind::Client,
                "a one-shot request was sent through the streaming call",
            ));
        }
        let (deadline, timeout) = attempt_deadline(attempt);
        let response = self
            .send_stream(request, for_attempt, deadline, timeout)
            .await?;
        if !response.status().is_success() {
            return Err(self.status_error(response, deadline, timeout).await);
        }
        if let Some(kind) = response.headers().get(CONTENT_TYPE)
            && !kind
                .as_bytes()
                .get(..EVENT_STREAM.len())
                .is_some_and(|start| start.eq_ignore_ascii_case(EVENT_STREAM))
        {
            return Err(ProviderError {
                status: Some(response.status().as_u16()),
                ..ProviderError::new(
                    ErrorKind::Protocol,
                    "upstream answered a stream request without an event stream",
                )
            });
        }
        let budget = budgets_of(response.headers());
        let body: BodyStream = Box::pin(response.into_body());
        let decoder = SseDecoder::with_max_event_size(self.inner.max_event_size);
        Ok(
            ChunkStream::with_decoder(body, decoder, request.forward_usage())
                .with_endpoint(request.endpoint())
                .with_end_grace(self.inner.stream_end_grace)
                .redacting(self.inner.secret.clone())
                .with_budget(budget),
        )
    }
}

/// The budget reports of a response's rate-limit headers (SPEC Q-14). The
/// wall clock is read only to turn absolute reset dates into durations.
fn budgets_of(headers: &http::HeaderMap) -> tollgate::lifecycle::Budgets {
    crate::rate_limit::RateLimitHints::from_headers(headers, std::time::SystemTime::now()).budgets()
}

impl HttpProvider {
    /// [`Provider::call`] with `headers` added for this attempt only (a
    /// trace's `traceparent`), after the request's own: the request itself
    /// is shared by every attempt and not copied.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future aborts the request; nothing keeps running.
    pub fn call_with<'a>(
        &'a self,
        request: &'a UpstreamRequest,
        headers: &'a [(HeaderName, HeaderValue)],
        attempt: AttemptContext,
    ) -> impl Future<Output = Result<Reply<Bytes>, ProviderError>> + Send + 'a {
        self.one_shot(request, headers, attempt)
    }

    /// [`Provider::stream`] with `headers` added for this attempt only, as
    /// [`HttpProvider::call_with`].
    ///
    /// # Cancel safety
    ///
    /// Dropping the future aborts the request; nothing keeps running.
    pub fn stream_with<'a>(
        &'a self,
        request: &'a UpstreamRequest,
        headers: &'a [(HeaderName, HeaderValue)],
        attempt: AttemptContext,
    ) -> impl Future<Output = Result<ChunkStream, ProviderError>> + Send + 'a {
        self.open_stream(request, headers, attempt)
    }
}

impl Provider for HttpProvider {
    type Request = UpstreamRequest;
    type Response = Bytes;
    type Chunk = Bytes;
    type Stream = ChunkStream;

    /// # Cancel safety
    ///
    /// Dropping the future aborts the request; nothing keeps running.
    fn call(
        &self,
        request: &UpstreamRequest,
        attempt: AttemptContext,
    ) -> impl Future<Output = Result<Reply<Bytes>, ProviderError>> + Send {
        self.one_shot(request, &[], attempt)
    }

    /// # Cancel safety
    ///
    /// Dropping the future aborts the request; nothing keeps running.
    fn stream(
        &self,
        request: &UpstreamRequest,
        attempt: AttemptContext,
    ) -> impl Future<Output = Result<ChunkStream, ProviderError>> + Send {
        self.open_stream(request, &[], attempt)
    }

    fn stream_budget(&self, stream: &ChunkStream) -> tollgate::lifecycle::Budgets {
        stream.budget()
    }

    fn stream_finished(&self, stream: &ChunkStream) -> bool {
        stream.is_finished()
    }
}

impl HttpProviderBuilder {
    /// Checks the settings and creates the provider (and its client, unless
    /// one was given).
    ///
    /// # Errors
    /// [`BuildError`] naming what is wrong; no request has been sent.
    pub fn build(self) -> Result<HttpProvider, BuildError> {
        let urls = endpoint_urls(&self.base_url)?;
        let chat_url = &urls[Endpoint::ChatCompletions.index()];
        if self.max_event_size == 0 {
            return Err(BuildError::MustBePositive {
                field: "max_event_size",
            });
        }
        if self.max_response_body == 0 {
            return Err(BuildError::MustBePositive {
                field: "max_response_body",
            });
        }
        if self.pool_idle_timeout.is_some_and(|t| t.is_zero()) {
            return Err(BuildError::MustBePositive {
                field: "pool_idle_timeout",
            });
        }
        let mut headers = self.headers.clone();
        for value in headers.values_mut() {
            value.set_sensitive(true);
        }
        headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        let secret = match &self.api_key {
            Some(key) => {
                let key = key.expose();
                if key.is_empty() || !key.bytes().all(|b| b.is_ascii_graphic()) {
                    return Err(BuildError::ApiKey);
                }
                let (name, prefix) = match &self.key_header {
                    Some((name, prefix)) => (name.clone(), prefix.as_str()),
                    None => (AUTHORIZATION, "Bearer "),
                };
                let mut value = HeaderValue::try_from(format!("{prefix}{key}"))
                    .map_err(|_| BuildError::ApiKey)?;
                value.set_sensitive(true);
                headers.insert(name, value);
                Some(Arc::<str>::from(key))
            }
            None => None,
        };
        let mut one_shot_headers = headers.clone();
        one_shot_headers.insert(ACCEPT, HeaderValue::from_static("application/json"));
        let mut stream_headers = headers;
        stream_headers.insert(ACCEPT, HeaderValue::from_static("text/event-stream"));
        let client = match self.client.clone() {
            Some(client) => client,
            None => self.build_client()?,
        };
        if chat_url.scheme_str() == Some("https") {
            client.check_https().map_err(BuildError::Client)?;
        }
        if let Some(proxy) = client.proxy_for(chat_url)
            && proxy.scheme_str() != Some("http")
        {
            return Err(BuildError::Proxy {
                proxy: format!(
                    "{}://{}",
                    proxy.scheme_str().unwrap_or(""),
                    proxy.authority().map(|a| a.host()).unwrap_or("")
                ),
                reason: "only http:// proxies (HTTP CONNECT) are supported",
            });
        }
        Ok(HttpProvider {
            inner: Arc::new(Inner {
                client,
                base_url: self.base_url,
                urls,
                one_shot_headers,
                stream_headers,
                secret,
                max_event_size: self.max_event_size,
                max_error_body: self.max_error_body,
                max_response_body: self.max_response_body,
                stream_end_grace: self.stream_end_grace,
            }),
        })
    }
}

/// The URL of every endpoint below `base` (its query string kept), in
/// [`Endpoint::ALL`] order.
fn endpoint_urls(base: &str) -> Result<[Uri; 4], BuildError> {
    let invalid = |reason: &str| BuildError::BaseUrl {
        url: base.to_owned(),
        reason: reason.to_owned(),
    };
    if base.contains('#') {
        return Err(invalid("it must not have a #fragment"));
    }
    let uri: Uri = base
        .parse()
        .map_err(|e: http::uri::InvalidUri| invalid(&e.to_string()))?;
    if !matches!(uri.scheme_str(), Some("http" | "https")) {
        return Err(invalid("the scheme must be http or https"));
    }
    let Some(authority) = uri.authority() else {
        return Err(invalid("it needs a host"));
    };
    if authority.host().is_empty() {
        return Err(invalid("it needs a host"));
    }
    if authority.as_str().contains('@') {
        return Err(invalid(
            "credentials in the URL are not supported (use api_key or headers)",
        ));
    }
    let at = |endpoint: Endpoint| {
        let path = format!("{}/{}", uri.path().trim_end_matches('/'), endpoint.path());
        let path_and_query = match uri.query() {
            Some(query) => format!("{path}?{query}"),
            None => path,
        };
        Uri::builder()
            .scheme(uri.scheme_str().unwrap_or("http"))
            .authority(authority.as_str())
            .path_and_query(path_and_query)
            .build()
            .map_err(|e| invalid(&e.to_string()))
    };
    Ok([
        at(Endpoint::ChatCompletions)?,
        at(Endpoint::Embeddings)?,
        at(Endpoint::Responses)?,
        at(Endpoint::Messages)?,
    ])
}

/// A one-shot body, whole, if it is at most `limit` bytes. A body of one
/// chunk is kept as it arrived.
async fn collect(mut chunks: BodyChunks, limit: usize) -> Result<Bytes, BodyError> {
    let too_large = |len: usize| {
        if len > limit {
            Err(BodyError::TooLarge { limit })
        } else {
            Ok(())
        }
    };
    let Some(first) = chunks.next().await.transpose()? else {
        return Ok(Bytes::new());
    };
    too_large(first.len())?;
    let Some(second) = chunks.next().await.transpose()? else {
        return Ok(first);
    };
    too_large(first.len().saturating_add(second.len()))?;
    let mut body = Vec::with_capacity(first.len() + second.len());
    body.extend_from_slice(&first);
    body.extend_from_slice(&second);
    while let Some(chunk) = chunks.next().await.transpose()? {
        too_large(body.len().saturating_add(chunk.len()))?;
        body.extend_from_slice(&chunk);
    }
    Ok(Bytes::from(body))
}

/// The instant the attempt's transport must be done by, if it is bounded.
fn attempt_deadline(attempt: AttemptContext) -> (Option<Instant>, Option<Duration>) {
    let timeout = attempt.timeout;
    let deadline = timeout.and_then(|t| Instant::now().checked_add(t));
    (deadline, timeout)
}

/// Runs `work` until `deadline`; past it, the attempt timed out (SPEC DL-4:
/// the deadline is computed once per attempt and shared by its phases).
async fn within<T>(
    deadline: Option<Instant>,
    timeout: Option<Duration>,
    phase: &str,
    work: impl Future<Output = T>,
) -> Result<T, ProviderError> {
    match deadline {
        None => Ok(work.await),
        Some(deadline) => tokio::time::timeout_at(deadline, work).await.map_err(|_| {
            let budget = timeout.map(|t| format!(" of {t:?}")).unwrap_or_default();
            ProviderError::new(
                ErrorKind::Timeout,
                format!("attempt timeout{budget} elapsed while {phase}"),
            )
        }),
    }
}

/// The members of a one-shot body the provider looks at (the body itself
/// is returned unchanged).
/// Both are borrowed as raw text and read only when present.
#[derive(Deserialize)]
struct BodyProbe<'a> {
    #[serde(default, borrow)]
    usage: Option<&'a RawValue>,
    #[serde(default, borrow)]
    error: Option<&'a RawValue>,
}

/// The usage of a 2xx one-shot body (SPEC Q-6), its top-level `usage` read
/// as `endpoint` reports it (Anthropic's counters for Messages). The body
/// must be a JSON object; one that declares an `error` is a declared
/// failure.
pub(super) fn one_shot_usage(
    body: &[u8],
    status: u16,
    secret: Option<&str>,
    endpoint: Endpoint,
) -> Result<tollgate::Usage, ProviderError> {
    let protocol = |reason: String| ProviderError {
        status: Some(status),
        ..ProviderError::new(
            ErrorKind::Protocol,
            format!("upstream response body is not a JSON object: {reason}"),
        )
    };
    // The one-pass reader when the body is text it can decide on, else
    // serde_json (which also words the error).
    let found = std::str::from_utf8(body).ok().and_then(members);
    let (usage, error) = match found {
        Some(m) => (m.usage, m.error),
        None => {
            let probe: BodyProbe<'_> = parse_object(body).map_err(protocol)?;
            (
                probe.usage.map(RawValue::get),
                probe.error.map(RawValue::get),
            )
        }
    };
    let usage = match usage {
        Some(raw) => usage_of_raw(endpoint, raw).map_err(protocol)?,
        None => tollgate::Usage::UNKNOWN,
    };
    if let Some(error) = raw_value(error).map_err(protocol)?.filter(|e| !e.is_null()) {
        let message = declared_message(&serde_json::json!({ "error": error }))
            .unwrap_or_else(|| "upstream declared an error".to_owned());
        return Err(ProviderError {
            status: Some(status),
            ..ProviderError::new(ErrorKind::Declared, sanitize(&message, secret))
        }
        .with_usage(usage));
    }
    Ok(usage)
}

#[cfg(test)]
mod tests {
    use super::*;

    // proves: CFG-3 (bad settings fail at build time, typed)
    #[test]
    fn bad_settings_fail_at_build() {
        for url in [
            "not a url",
            "ftp://host/v1",
            "http://host/v1#x",
            "mailto:x@y",
        ] {
            assert!(
                matches!(
                    HttpProvider::builder(url).build(),
                    Err(BuildError::BaseUrl { .. })
                ),
                "{url}"
            );
        }
        assert!(matches!(
            HttpProvider::builder("http://h/v1")
                .api_key("has space")
                .build(),
            Err(BuildError::ApiKey)
        ));
        assert!(matches!(
            HttpProvider::builder("http://h/v1").api_key("").build(),
            Err(BuildError::ApiKey)
        ));
        assert!(matches!(
            HttpProvider::builder("http://h/v1")
                .connect_timeout(Duration::ZERO)
                .build(),
            Err(BuildError::MustBePositive {
                field: "connect_timeout"
            })
        ));
        assert!(matches!(
            HttpProvider::builder("http://h/v1")
                .max_response_body(0)
                .build(),
            Err(BuildError::MustBePositive {
                field: "max_response_body"
            })
        ));
        assert!(matches!(
            HttpProvider::builder("http://h/v1")
                .max_event_size(0)
                .build(),
            Err(BuildError::MustBePositive {
                field: "max_event_size"
            })
        ));
    }

    // proves: CFG-3 (an https upstream without usable CA roots fails when
    // the provider is built, naming why; plain http upstreams, such as the
    // embedded simulator, do not need them)
    #[test]
    fn https_needs_ca_roots() {
        let builder = HttpProvider::builder("https://api.example.com/v1");
        let rootless = HttpClient::without_roots(&builder.client_settings());
        match builder.client(rootless.clone()).build() {
            Err(err @ BuildError::Client(_)) => {
                assert!(err.to_string().contains("no CA certificates"), "{err}")
            }
            other => panic!("expected a client error, got {other:?}"),
        }
        assert!(
            HttpProvider::builder("http://127.0.0.1:9/v1")
                .client(rootless)
                .build()
                .is_ok()
        );
    }

    #[test]
    fn endpoint_urls_keep_the_base_path_and_query() {
        let p = HttpProvider::builder("http://127.0.0.1:9/v1/")
            .api_key("sk-test")
            .build()
            .expect("provider");
        assert_eq!(
            p.url(Endpoint::ChatCompletions).to_string(),
            "http://127.0.0.1:9/v1/chat/completions"
        );
        assert_eq!(
            p.url(Endpoint::Embeddings).to_string(),
            "http://127.0.0.1:9/v1/embeddings"
        );
        let azure = HttpProvider::builder(
            "https://x.openai.azure.com/openai/deployments/d?api-version=2024-06-01",
        )
        .build()
        .expect("provider");
        assert_eq!(
            azure.url(Endpoint::ChatCompletions).to_string(),
            "https://x.openai.azure.com/openai/deployments/d/chat/completions?api-version=2024-06-01"
        );
        // The key never shows in debug output.
        assert!(!format!("{p:?}").contains("sk-test"));
        let mut extra = HeaderMap::new();
        extra.insert("api-key", HeaderValue::from_static("azure-secret"));
        let builder = HttpProvider::builder("http://h/v1")
            .api_key("sk-test")
            .headers(extra);
        let shown = format!("{builder:?}");
        assert!(
            !shown.contains("sk-test") && !shown.contains("azure-secret"),
            "{shown}"
        );
    }

    // proves: Q-6 (usage of a one-shot body), Q-5 (unknown vs known zero)
    #[test]
    fn one_shot_usage_follows_q6() {
        let usage =
            |body: &str| one_shot_usage(body.as_bytes(), 200, None, Endpoint::ChatCompletions);
        assert_eq!(
            usage(r#"{"usage":{"prompt_tokens":3,"completion_tokens":4,"total_tokens":7}}"#)
                .expect("usage")
                .total(),
            Some(7)
        );
        assert_eq!(
            usage(r#"{"usage":{"total_tokens":0}}"#)
                .expect("usage")
                .total(),
            Some(0)
        );
        assert_eq!(
            usage(r#"{"id":"x"}"#).expect("usage"),
            tollgate::Usage::UNKNOWN
        );
        assert_eq!(
            usage(r#"{"usage":null}"#).expect("usage"),
            tollgate::Usage::UNKNOWN
        );
        assert_eq!(
            usage(r#"{"usage":"lots"}"#).expect("usage"),
            tollgate::Usage::UNKNOWN
        );
        let err = usage("not json").expect_err("protocol");
        assert_eq!(err.kind, ErrorKind::Protocol);
        assert_eq!(
            usage("[1]").expect_err("protocol").kind,
            ErrorKind::Protocol
        );
        // A repeated counter: the last one counts, as in a whole parse.
        assert_eq!(
            usage(r#"{"usage":{"total_tokens":3,"total_tokens":9}}"#)
                .expect("usage")
                .total(),
            Some(9)
        );
        // A number no parse can hold is a broken body, wherever it is.
        for body in [
            r#"{"usage":{"total_tokens":1e999}}"#,
            r#"{"error":{"code":1e999}}"#,
        ] {
            assert_eq!(
                usage(body).expect_err("protocol").kind,
                ErrorKind::Protocol,
                "{body}"
            );
        }
        let err = usage(r#"{"error":{"message":"overloaded"}}"#).expect_err("declared");
        assert_eq!(
            (err.kind, err.message.as_str()),
            (ErrorKind::Declared, "overloaded")
        );
    }
}

//! What the gateway hands the provider once per call.

use bytes::Bytes;

use crate::wire::{ChatCompletionRequest, EmbeddingsRequest, MessagesRequest, ResponsesRequest};

/// `x-request-id`, both ways (SPEC GW-14).
pub(super) const REQUEST_ID: http::HeaderName = http::HeaderName::from_static("x-request-id");

/// The upstream API an [`UpstreamRequest`] is sent to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Endpoint {
    /// `POST {base}/chat/completions` (one-shot or stream).
    ChatCompletions,
    /// `POST {base}/embeddings` (one-shot only).
    Embeddings,
    /// `POST {base}/responses`: OpenAI's Responses API (one-shot or stream,
    /// SPEC WIRE-1).
    Responses,
    /// `POST {base}/messages`: Anthropic's Messages API (one-shot or
    /// stream, SPEC WIRE-3).
    Messages,
}

impl Endpoint {
    /// The path below the base URL, without a leading slash.
    pub const fn path(self) -> &'static str {
        match self {
            Endpoint::ChatCompletions => "chat/completions",
            Endpoint::Embeddings => "embeddings",
            Endpoint::Responses => "responses",
            Endpoint::Messages => "messages",
        }
    }

    /// Every endpoint, in declaration order.
    pub const ALL: [Endpoint; 4] = [
        Endpoint::ChatCompletions,
        Endpoint::Embeddings,
        Endpoint::Responses,
        Endpoint::Messages,
    ];

    /// The position of `self` in [`Endpoint::ALL`].
    pub const fn index(self) -> usize {
        self as usize
    }
}

/// One upstream request, serialised once per call and sent by every
/// attempt.
///
/// Cloning is cheap (the body is a reference-counted [`Bytes`]), so the
/// supervisor may hand a clone to each attempt. The body is final: the
/// upstream model name is already set, and for a chat completions stream
/// `stream_options.include_usage` is already `true`, so that the engine can
/// reconcile the call's tokens (SPEC Q-5, GW-5); the Responses and Messages
/// streams always carry usage in their terminal events.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UpstreamRequest {
    endpoint: Endpoint,
    body: Bytes,
    stream: bool,
    forward_usage: bool,
    /// Sent besides the provider's own headers (the request id, headers a
    /// route forwards from its client); replaces a provider header of the
    /// same name.
    headers: Vec<(http::HeaderName, http::HeaderValue)>,
}

impl UpstreamRequest {
    /// A request from parts: `body` is sent as is.
    ///
    /// `stream` says whether the body asks for a server-sent-events
    /// response; `forward_usage` whether the stream's usage-only chunk
    /// reaches the consumer (it is always reported to the engine). For
    /// one-shot requests `forward_usage` has no effect.
    pub fn new(endpoint: Endpoint, body: Bytes, stream: bool, forward_usage: bool) -> Self {
        UpstreamRequest {
            endpoint,
            body,
            stream,
            forward_usage,
            headers: Vec::new(),
        }
    }

    /// Sends `id` as the request's `x-request-id` header, so the upstream's
    /// logs can be matched with the gateway's (SPEC GW-14).
    #[must_use]
    pub fn with_request_id(self, id: http::HeaderValue) -> Self {
        self.with_header(REQUEST_ID, id)
    }

    /// Sends `name: value` with the request, replacing a header of that
    /// name (e.g. a client's `anthropic-beta`, forwarded by the Messages
    /// route). Setting a name twice keeps the last value.
    #[must_use]
    pub fn with_header(mut self, name: http::HeaderName, value: http::HeaderValue) -> Self {
        self.headers.retain(|(n, _)| *n != name);
        self.headers.push((name, value));
        self
    }

    /// The `x-request-id` sent upstream, if any.
    pub fn request_id(&self) -> Option<&http::HeaderValue> {
        self.header("x-request-id")
    }

    /// The value of a header set with [`UpstreamRequest::with_header`].
    pub fn header(&self, name: &str) -> Option<&http::HeaderValue> {
        self.headers.iter().find(|(n, _)| n == name).map(|(_, v)| v)
    }

    /// Every header set with [`UpstreamRequest::with_header`] (the request
    /// id included), in the order set.
    pub fn headers(&self) -> &[(http::HeaderName, http::HeaderValue)] {
        &self.headers
    }

    /// A chat completion for `upstream_model`.
    ///
    /// The client's request is left untouched; the body sent upstream is a
    /// copy with `model` replaced. For a stream, the copy also asks for the
    /// usage chunk ([`ChatCompletionRequest::request_stream_usage`]), and
    /// the chunk is forwarded to the consumer only when the client itself
    /// had asked for it (SPEC GW-5).
    ///
    /// # Errors
    /// When the request cannot be serialised (only possible for a map with
    /// non-string keys, which a parsed request never has).
    pub fn chat(
        request: &ChatCompletionRequest,
        upstream_model: &str,
    ) -> Result<Self, serde_json::Error> {
        let mut upstream = request.clone();
        upstream.model = upstream_model.to_owned();
        let stream = upstream.is_stream();
        let forward_usage = stream && upstream.request_stream_usage();
        let body = serde_json::to_vec(&upstream)?;
        Ok(UpstreamRequest::new(
            Endpoint::ChatCompletions,
            Bytes::from(body),
            stream,
            forward_usage,
        ))
    }

    /// An embeddings request for `upstream_model` (the client's request is
    /// left untouched).
    ///
    /// # Errors
    /// As [`UpstreamRequest::chat`].
    pub fn embeddings(
        request: &EmbeddingsRequest,
        upstream_model: &str,
    ) -> Result<Self, serde_json::Error> {
        let mut upstream = request.clone();
        upstream.model = upstream_model.to_owned();
        Self::serialised(Endpoint::Embeddings, &upstream, false)
    }

    /// A Responses API request for `upstream_model` (SPEC WIRE-1).
    ///
    /// The client's request is left untouched; the body sent upstream is a
    /// copy with `model` replaced and nothing else changed. Nothing needs
    /// injecting for a stream: its terminal event (`response.completed`,
    /// `response.incomplete` or `response.failed`) always carries the
    /// response's `usage`, so `forward_usage` is `true` for a stream (that
    /// event is part of the client's stream and is never stripped).
    ///
    /// # Errors
    /// As [`UpstreamRequest::chat`].
    pub fn responses(
        request: &ResponsesRequest,
        upstream_model: &str,
    ) -> Result<Self, serde_json::Error> {
        let mut upstream = request.clone();
        upstream.model = upstream_model.to_owned();
        Self::serialised(Endpoint::Responses, &upstream, upstream.is_stream())
    }

    /// An Anthropic Messages request for `upstream_model` (SPEC WIRE-3).
    ///
    /// The client's request is left untouched; the body sent upstream is a
    /// copy with `model` replaced and nothing else changed. Nothing needs
    /// injecting for a stream: `message_start` carries the input usage and
    /// `message_delta` the output usage, so `forward_usage` is `true` for a
    /// stream (those events are part of the client's stream and are never
    /// stripped).
    ///
    /// # Errors
    /// As [`UpstreamRequest::chat`].
    pub fn messages(
        request: &MessagesRequest,
        upstream_model: &str,
    ) -> Result<Self, serde_json::Error> {
        let mut upstream = request.clone();
        upstream.model = upstream_model.to_owned();
        Self::serialised(Endpoint::Messages, &upstream, upstream.is_stream())
    }

    /// `upstream` serialised for `endpoint`; a stream's usage (in its
    /// terminal events) is forwarded.
    fn serialised(
        endpoint: Endpoint,
        upstream: &impl serde::Serialize,
        stream: bool,
    ) -> Result<Self, serde_json::Error> {
        let body = serde_json::to_vec(upstream)?;
        Ok(UpstreamRequest::new(
            endpoint,
            Bytes::from(body),
            stream,
            stream,
        ))
    }

    /// The upstream API.
    pub fn endpoint(&self) -> Endpoint {
        self.endpoint
    }

    /// The JSON body, exactly as it is sent.
    pub fn body(&self) -> &Bytes {
        &self.body
    }

    /// Whether the body asks for a stream.
    pub fn is_stream(&self) -> bool {
        self.stream
    }

    /// Whether the stream's usage-only chunk is forwarded to the consumer.
    pub fn forward_usage(&self) -> bool {
        self.forward_usage
    }
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use super::*;

    fn body(req: &UpstreamRequest) -> Value {
        serde_json::from_slice(req.body()).expect("json body")
    }

    // proves: GW-5 (usage is always requested upstream; forwarded only when
    // the client asked)
    #[test]
    fn chat_streams_always_ask_for_usage() {
        let client: ChatCompletionRequest = serde_json::from_value(json!({
            "model": "alias", "messages": [{"role": "user", "content": "hi"}],
            "stream": true, "temperature": 0.5
        }))
        .expect("request");
        let up = UpstreamRequest::chat(&client, "gpt-4o-mini").expect("upstream");
        assert!(up.is_stream());
        assert!(!up.forward_usage());
        assert_eq!(up.endpoint(), Endpoint::ChatCompletions);
        let sent = body(&up);
        assert_eq!(sent["model"], "gpt-4o-mini");
        assert_eq!(sent["stream_options"], json!({"include_usage": true}));
        assert_eq!(sent["temperature"], 0.5);
        // The client's own request is unchanged.
        assert_eq!(client.model, "alias");
        assert!(client.stream_options.is_none());

        let asked: ChatCompletionRequest = serde_json::from_value(json!({
            "model": "alias", "messages": [], "stream": true,
            "stream_options": {"include_usage": true}
        }))
        .expect("request");
        let up = UpstreamRequest::chat(&asked, "m").expect("upstream");
        assert!(up.forward_usage());
    }

    #[test]
    fn one_shot_chat_and_embeddings_are_left_alone() {
        let client = ChatCompletionRequest::new("alias", vec![]);
        let up = UpstreamRequest::chat(&client, "m").expect("upstream");
        assert!(!up.is_stream());
        assert!(!up.forward_usage());
        let sent = body(&up);
        assert_eq!(sent, json!({"model": "m", "messages": []}));

        let emb: EmbeddingsRequest = serde_json::from_value(json!({
            "model": "alias", "input": ["a", "b"], "user": "u"
        }))
        .expect("request");
        let up = UpstreamRequest::embeddings(&emb, "text-embedding-3-small").expect("upstream");
        assert_eq!(up.endpoint(), Endpoint::Embeddings);
        assert!(!up.is_stream());
        assert_eq!(
            body(&up),
            json!({"model": "text-embedding-3-small", "input": ["a", "b"], "user": "u"})
        );
    }

    // proves: WIRE-1 (a Responses request is forwarded with only its model
    // replaced; a stream's usage lives in its terminal event, which is
    // forwarded)
    #[test]
    fn responses_requests_replace_only_the_model() {
        let raw = json!({
            "model": "alias", "input": [{"role": "user", "content": "hi"}],
            "instructions": "Be brief.", "max_output_tokens": 32, "stream": true,
            "tools": [{"type": "function", "name": "f"}], "store": false,
            "x-future": {"deep": [1.5, null]}
        });
        let client: ResponsesRequest = serde_json::from_value(raw.clone()).expect("request");
        let up = UpstreamRequest::responses(&client, "gpt-4.1-mini").expect("upstream");
        assert_eq!(up.endpoint(), Endpoint::Responses);
        assert!(up.is_stream());
        assert!(up.forward_usage());
        let mut expected = raw;
        expected["model"] = json!("gpt-4.1-mini");
        assert_eq!(body(&up), expected);
        assert!(body(&up).get("stream_options").is_none());
        assert_eq!(client.model, "alias");

        let one_shot = ResponsesRequest::new("alias", "hello");
        let up = UpstreamRequest::responses(&one_shot, "m").expect("upstream");
        assert!(!up.is_stream());
        assert!(!up.forward_usage());
        assert_eq!(body(&up), json!({"model": "m", "input": "hello"}));
    }

    // proves: WIRE-3, WIRE-4 (a Messages request passes through in its own
    // dialect with only its model replaced)
    #[test]
    fn messages_requests_replace_only_the_model() {
        let raw = json!({
            "model": "alias", "max_tokens": 64, "stream": true,
            "system": [{"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}}],
            "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}],
            "thinking": {"type": "enabled", "budget_tokens": 1024}
        });
        let client: MessagesRequest = serde_json::from_value(raw.clone()).expect("request");
        let up = UpstreamRequest::messages(&client, "claude-sonnet-4-5").expect("upstream");
        assert_eq!(up.endpoint(), Endpoint::Messages);
        assert!(up.is_stream());
        assert!(up.forward_usage());
        let mut expected = raw;
        expected["model"] = json!("claude-sonnet-4-5");
        assert_eq!(body(&up), expected);
        assert_eq!(client.model, "alias");

        let one_shot = MessagesRequest::new("alias", vec![], 8);
        let up = UpstreamRequest::messages(&one_shot, "m").expect("upstream");
        assert!(!up.is_stream());
        assert!(!up.forward_usage());
        assert_eq!(
            body(&up),
            json!({"model": "m", "max_tokens": 8, "messages": []})
        );
    }
}

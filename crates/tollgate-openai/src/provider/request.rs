//! What the gateway hands the provider once per call.

use bytes::Bytes;

use crate::wire::{ChatCompletionRequest, EmbeddingsRequest};

/// The upstream API an [`UpstreamRequest`] is sent to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Endpoint {
    /// `POST {base}/chat/completions` (one-shot or stream).
    ChatCompletions,
    /// `POST {base}/embeddings` (one-shot only).
    Embeddings,
}

impl Endpoint {
    /// The path below the base URL, without a leading slash.
    pub const fn path(self) -> &'static str {
        match self {
            Endpoint::ChatCompletions => "chat/completions",
            Endpoint::Embeddings => "embeddings",
        }
    }
}

/// One upstream request, serialised once per call and sent by every
/// attempt.
///
/// Cloning is cheap (the body is a reference-counted [`Bytes`]), so the
/// supervisor may hand a clone to each attempt. The body is final: the
/// upstream model name is already set, and for a stream
/// `stream_options.include_usage` is already `true`, so that the engine can
/// reconcile the call's tokens (SPEC Q-5, GW-5).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UpstreamRequest {
    endpoint: Endpoint,
    body: Bytes,
    stream: bool,
    forward_usage: bool,
    request_id: Option<http::HeaderValue>,
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
            request_id: None,
        }
    }

    /// Sends `id` as the request's `x-request-id` header, so the upstream's
    /// logs can be matched with the gateway's (SPEC GW-14).
    #[must_use]
    pub fn with_request_id(mut self, id: http::HeaderValue) -> Self {
        self.request_id = Some(id);
        self
    }

    /// The `x-request-id` sent upstream, if any.
    pub fn request_id(&self) -> Option<&http::HeaderValue> {
        self.request_id.as_ref()
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
        let body = serde_json::to_vec(&upstream)?;
        Ok(UpstreamRequest::new(
            Endpoint::Embeddings,
            Bytes::from(body),
            false,
            false,
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
}

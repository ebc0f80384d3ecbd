//! What the gateway hands the provider once per call.

use bytes::Bytes;
use serde_json::Value;

use super::edit::{Member, with_members};
use crate::wire::{
    CapField, ChatCompletionRequest, EmbeddingsRequest, MessagesRequest, ResponsesRequest,
};

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

    /// A chat completion for `upstream_model` made from `body`, the text
    /// `request` was parsed from, with the output cap `cap` (the allowance
    /// reserved and the deployment's field) set as
    /// [`ChatCompletionRequest::cap_to_set`] says. Like [`UpstreamRequest::chat`]
    /// (a stream asks for its usage chunk), but the body is the client's
    /// as it came with only those members set (no rewrite at all when
    /// nothing changes), so a large prompt is not cloned and serialised
    /// again. A body that cannot be edited as text (see
    /// [`UpstreamRequest::renamed`]), or a stream whose `stream_options`
    /// must be merged, goes through a serialised copy.
    ///
    /// # Errors
    /// As [`UpstreamRequest::chat`].
    pub fn chat_from(
        request: &ChatCompletionRequest,
        body: &Bytes,
        upstream_model: &str,
        cap: Option<(u64, CapField)>,
    ) -> Result<Self, serde_json::Error> {
        let stream = request.is_stream();
        let asked = request.wants_stream_usage();
        // The client's other stream options are kept by the copy's merge.
        let merge = stream && !asked && request.stream_options.is_some();
        if !merge {
            let to_set = cap.and_then(|(tokens, field)| {
                Some((field.member(), request.cap_to_set(tokens, field)?))
            });
            let usage: Member<'_> = ("stream_options", br#"{"include_usage":true}"#);
            let edited = Self::from_text(
                Endpoint::ChatCompletions,
                body,
                (&request.model, upstream_model),
                to_set,
                (stream && !asked).then_some(usage),
                (stream, stream && asked),
            );
            if let Some(edited) = edited {
                return Ok(edited);
            }
        }
        let mut upstream = request.clone();
        if let Some((tokens, field)) = cap {
            upstream.cap_output(tokens, field);
        }
        Self::chat(&upstream, upstream_model)
    }

    /// A Responses request for `upstream_model` made from `body`, the text
    /// `request` was parsed from, with `max_output_tokens = cap` when the
    /// request sets none; as [`UpstreamRequest::chat_from`] does.
    ///
    /// # Errors
    /// As [`UpstreamRequest::chat`].
    pub fn responses_from(
        request: &ResponsesRequest,
        body: &Bytes,
        upstream_model: &str,
        cap: Option<u64>,
    ) -> Result<Self, serde_json::Error> {
        let cap = cap.filter(|_| request.max_output_tokens.is_none());
        let stream = request.is_stream();
        let edited = Self::from_text(
            Endpoint::Responses,
            body,
            (&request.model, upstream_model),
            cap.map(|tokens| ("max_output_tokens", tokens)),
            None,
            (stream, stream),
        );
        if let Some(edited) = edited {
            return Ok(edited);
        }
        let mut upstream = request.clone();
        if let Some(tokens) = cap {
            upstream.cap_output(tokens);
        }
        Self::responses(&upstream, upstream_model)
    }

    /// A request to `endpoint` made from `body` as the client sent it,
    /// its top-level `model` set to `upstream_model` when it names
    /// `request_model`, nothing else changed; a stream's usage (in its
    /// terminal events) is forwarded. `None` when the model must change
    /// and the body cannot be edited as text (an escape in a top-level
    /// key, a repeated `model`, nesting deeper than 64): serialise a copy
    /// of the parsed request then.
    pub fn renamed(
        endpoint: Endpoint,
        request_model: &str,
        body: &Bytes,
        upstream_model: &str,
        stream: bool,
    ) -> Option<Self> {
        let rename = (request_model, upstream_model);
        Self::from_text(endpoint, body, rename, None, None, (stream, stream))
    }

    /// `body` as it came, with `model` set when `rename` (the request's
    /// model, the upstream's) changes it, the output cap `cap` (its member
    /// and value) and `extra` set too; the body itself when nothing is
    /// set. `None` when it cannot be edited as text (see
    /// [`with_members`]). `flags`: whether it streams, whether a stream's
    /// usage reaches the client.
    fn from_text(
        endpoint: Endpoint,
        body: &Bytes,
        (request_model, upstream_model): (&str, &str),
        cap: Option<(&'static str, u64)>,
        extra: Option<Member<'_>>,
        (stream, forward_usage): (bool, bool),
    ) -> Option<Self> {
        let model =
            (request_model != upstream_model).then(|| Value::from(upstream_model).to_string());
        let cap = cap.map(|(member, tokens)| (member, tokens.to_string()));
        let set: Vec<Member<'_>> = model
            .as_deref()
            .map(|m| ("model", m.as_bytes()))
            .into_iter()
            .chain(
                cap.as_ref()
                    .map(|(member, text)| (*member, text.as_bytes())),
            )
            .chain(extra)
            .collect();
        let body = if set.is_empty() {
            body.clone()
        } else {
            Bytes::from(with_members(body, &set)?)
        };
        Some(UpstreamRequest::new(endpoint, body, stream, forward_usage))
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
    use proptest::prelude::*;
    use serde_json::{Value, json};

    use super::*;

    /// A request body's members as text, in the order given, joined by
    /// `sep` (spacing serde_json never writes).
    fn object(members: &[(String, String)], sep: &str) -> Bytes {
        let inner: Vec<String> = members
            .iter()
            .map(|(k, v)| format!("{}:{v}", Value::from(k.as_str())))
            .collect();
        Bytes::from(format!("{{{}}}", inner.join(sep)))
    }

    /// An optional member: absent, `null`, or one of `values`.
    fn maybe(
        name: &'static str,
        values: Vec<&'static str>,
    ) -> impl Strategy<Value = Option<(String, String)>> {
        let mut options = vec![None, Some("null")];
        options.extend(values.into_iter().map(Some));
        proptest::sample::select(options)
            .prop_map(move |v| v.map(|v| (name.to_owned(), v.to_owned())))
    }

    fn cap() -> impl Strategy<Value = Option<(u64, CapField)>> {
        proptest::option::of((
            1u64..100_000,
            prop_oneof![
                Just(CapField::MaxTokens),
                Just(CapField::MaxCompletionTokens)
            ],
        ))
    }

    /// Text members a request may carry besides the ones the gateway sets.
    fn others() -> impl Strategy<Value = Vec<(String, String)>> {
        let value = prop_oneof![
            Just("1.50e3".to_owned()),
            Just("18446744073709551615".to_owned()),
            Just("\"caf\\u00e9 \\\"q\\\"\"".to_owned()),
            Just("{\"model\":\"nested\",\"a\":[1,{\"b\":null}]}".to_owned()),
            Just("[true,false]".to_owned()),
        ];
        proptest::collection::vec(("x_[a-z]{1,4}", value), 0..4).prop_map(|mut v| {
            v.sort_by(|a, b| a.0.cmp(&b.0));
            v.dedup_by(|a, b| a.0 == b.0);
            v
        })
    }

    const MODELS: [&str; 3] = ["gpt-4o", "other-model", "q\"\\é"];
    const SEP: &str = " ,\n ";

    proptest! {
        // proves: GW-5, GW-17 (a chat completion made from the client's
        // body as text is the request the parsed copy makes: the upstream
        // model, the output cap when it has none, a stream's usage chunk
        // asked for and forwarded only when the client asked; every other
        // member kept; and the text is edited, not serialised again,
        // unless stream options must be merged)
        #[test]
        fn a_chat_from_its_text_is_the_parsed_copys(
            model in proptest::sample::select(MODELS.to_vec()),
            upstream in proptest::sample::select(MODELS.to_vec()),
            stream in maybe("stream", vec!["true", "false"]),
            options in maybe("stream_options", vec![
                r#"{"include_usage":true}"#,
                r#"{"include_usage":false}"#,
                r#"{"x":1,"include_usage":false}"#,
            ]),
            max_tokens in maybe("max_tokens", vec!["7"]),
            max_completion in maybe("max_completion_tokens", vec!["9"]),
            others in others(),
            cap in cap(),
            shuffle in any::<proptest::sample::Index>(),
        ) {
            let mut members = vec![
                ("model".to_owned(), Value::from(model).to_string()),
                ("messages".to_owned(), r#"[{"role":"user","content":"hi \"there\""}]"#.to_owned()),
            ];
            members.extend([stream, options, max_tokens, max_completion].into_iter().flatten());
            members.extend(others);
            let at = shuffle.index(members.len());
            members.rotate_left(at);
            let body = object(&members, SEP);
            let request: ChatCompletionRequest = serde_json::from_slice(&body).unwrap();

            let made = UpstreamRequest::chat_from(&request, &body, upstream, cap).unwrap();

            let mut copy = request.clone();
            if let Some((tokens, field)) = cap {
                copy.cap_output(tokens, field);
            }
            copy.model = upstream.to_owned();
            let streams = copy.is_stream();
            let forward = streams && copy.request_stream_usage();
            let sent: ChatCompletionRequest = serde_json::from_slice(made.body()).unwrap();
            prop_assert_eq!(&sent, &copy);
            prop_assert_eq!(made.is_stream(), streams);
            prop_assert_eq!(made.forward_usage(), forward);
            let merged = streams && !request.wants_stream_usage() && request.stream_options.is_some();
            let text = std::str::from_utf8(made.body()).unwrap();
            prop_assert_eq!(text.contains(SEP), !merged, "{}", text);
        }

        // proves: GW-5, GW-17 (the same for a Responses request, its cap in
        // `max_output_tokens`, and for the renamed Messages request)
        #[test]
        fn a_responses_or_messages_request_from_its_text_is_the_parsed_copys(
            model in proptest::sample::select(MODELS.to_vec()),
            upstream in proptest::sample::select(MODELS.to_vec()),
            stream in maybe("stream", vec!["true", "false"]),
            max_output in maybe("max_output_tokens", vec!["5"]),
            others in others(),
            cap in proptest::option::of(1u64..100_000),
        ) {
            let mut members = vec![
                ("model".to_owned(), Value::from(model).to_string()),
                ("input".to_owned(), r#""hi""#.to_owned()),
            ];
            members.extend([stream.clone(), max_output].into_iter().flatten());
            members.extend(others.clone());
            let body = object(&members, SEP);
            let request: ResponsesRequest = serde_json::from_slice(&body).unwrap();
            let made = UpstreamRequest::responses_from(&request, &body, upstream, cap).unwrap();
            let mut copy = request.clone();
            if let Some(tokens) = cap {
                copy.cap_output(tokens);
            }
            copy.model = upstream.to_owned();
            let sent: ResponsesRequest = serde_json::from_slice(made.body()).unwrap();
            prop_assert_eq!(&sent, &copy);
            prop_assert_eq!((made.is_stream(), made.forward_usage()), (copy.is_stream(), copy.is_stream()));
            prop_assert!(std::str::from_utf8(made.body()).unwrap().contains(SEP));

            let mut members = vec![
                ("model".to_owned(), Value::from(model).to_string()),
                ("max_tokens".to_owned(), "10".to_owned()),
                ("messages".to_owned(), r#"[{"role":"user","content":"hi"}]"#.to_owned()),
            ];
            members.extend(stream.into_iter().chain(others));
            let body = object(&members, SEP);
            let request: MessagesRequest = serde_json::from_slice(&body).unwrap();
            let made = UpstreamRequest::renamed(Endpoint::Messages, &request.model, &body, upstream, request.is_stream()).unwrap();
            let mut copy = request.clone();
            copy.model = upstream.to_owned();
            let sent: MessagesRequest = serde_json::from_slice(made.body()).unwrap();
            prop_assert_eq!(&sent, &copy);
        }
    }

    // proves: GW-5 (a body that cannot be edited as text still goes with
    // the upstream model, its cap and its usage chunk: through the copy)
    #[test]
    fn an_unusual_body_goes_through_the_copy() {
        let body = Bytes::from_static(br#"{"mod\u0065l":"a","stream":true,"messages":[]}"#);
        let request: ChatCompletionRequest = serde_json::from_slice(&body).unwrap();
        assert_eq!(request.model, "a");
        let made = UpstreamRequest::chat_from(&request, &body, "b", Some((5, CapField::MaxTokens)))
            .unwrap();
        let sent: Value = serde_json::from_slice(made.body()).unwrap();
        assert_eq!(sent["model"], "b");
        assert_eq!(sent["max_tokens"], 5);
        assert_eq!(sent["stream_options"]["include_usage"], true);
        assert!(!made.forward_usage());
        let renamed = UpstreamRequest::renamed(Endpoint::Messages, "a", &body, "b", false);
        assert_eq!(renamed, None);
    }

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

//! What an SDK request is, read as the gateway reads its own (SPEC PY-4,
//! GW-5, Q-3, Q-16): which API it calls, what it may spend, whether it
//! streams, and the body to send.

use bytes::Bytes;
use tollgate_gateway::config::Flavor;
use tollgate_gateway::error::{ApiError, Dialect};
use tollgate_openai::provider::{Endpoint, UpstreamRequest};
use tollgate_openai::tokens::TokenEstimator;
use tollgate_openai::wire::{
    CapField, ChatCompletionRequest, EmbeddingsRequest, MessagesRequest, ResponsesRequest,
};

/// The API a `POST` to `path` calls, by the path's end: OpenAI's APIs by
/// their last segments (so `/v1/chat/completions`, an Azure deployment's
/// `/openai/deployments/<name>/chat/completions` and any proxy prefix
/// alike), Anthropic's Messages API by `/v1/messages` (the SDK's path
/// under its base URL, which may carry a proxy prefix), so that OpenAI's
/// `/v1/threads/<id>/messages` is not taken for it. `None` for anything
/// else (listing models, files, batches, threads, counting tokens), which
/// is not a model call and goes to the wrapped transport unadmitted.
pub(crate) fn endpoint(method: &str, path: &str) -> Option<Endpoint> {
    if !method.eq_ignore_ascii_case("POST") {
        return None;
    }
    let path = path.trim_end_matches('/');
    Endpoint::ALL.into_iter().find(|e| {
        let tail = match e {
            Endpoint::Messages => "v1/messages",
            other => other.path(),
        };
        path == tail
            || path
                .strip_suffix(tail)
                .is_some_and(|head| head.ends_with('/'))
    })
}

/// The flavour whose accounting profile counts `endpoint` when the
/// transport was given none: Anthropic's for its Messages API, OpenAI's
/// for the others.
pub(crate) fn flavor_of(endpoint: Endpoint) -> Flavor {
    match endpoint {
        Endpoint::Messages => Flavor::Anthropic,
        _ => Flavor::OpenAi,
    }
}

/// The error format clients of `endpoint` parse (SPEC WIRE-3).
pub(crate) fn dialect(endpoint: Endpoint) -> Dialect {
    match endpoint {
        Endpoint::Messages => Dialect::Anthropic,
        Endpoint::Responses => Dialect::Responses,
        Endpoint::ChatCompletions | Endpoint::Embeddings => Dialect::OpenAi,
    }
}

/// A model call, ready to be admitted.
pub(crate) struct Routed {
    /// The body to send: the SDK's own, except that a chat completions
    /// stream also asks for its usage chunk (SPEC GW-5).
    pub(crate) body: Bytes,
    pub(crate) stream: bool,
    /// Whether the usage chunk reaches the SDK (it asked for it).
    pub(crate) forward_usage: bool,
    pub(crate) estimate: tollgate::TokenEstimate,
}

/// Reads the body of a call to `endpoint` and estimates it with
/// `estimator` (the gateway's tokenizer and the flavour's accounting
/// profile). A body that is not a valid request of that API is the
/// gateway's 400 `invalid_body`.
///
/// A request without an output cap is sent with the allowance its
/// estimate reserved, in `cap_field` for chat completions, as the gateway
/// does (SPEC Q-7, BUD-2): the provider never writes more than reserved.
pub(crate) fn route(
    endpoint: Endpoint,
    body: &Bytes,
    estimator: &TokenEstimator,
    cap_field: CapField,
) -> Result<Routed, ApiError> {
    let (upstream, estimate) = match endpoint {
        Endpoint::ChatCompletions => {
            let req: ChatCompletionRequest = parse(body)?;
            let estimate = estimator.chat(&req);
            let cap = estimator.output_cap().map(|cap| (cap, cap_field));
            let upstream =
                UpstreamRequest::chat_from(&req, body, &req.model, cap).map_err(invalid)?;
            (upstream, estimate)
        }
        Endpoint::Embeddings => {
            let req: EmbeddingsRequest = parse(body)?;
            let estimate = estimator.embeddings(&req);
            (
                UpstreamRequest::new(endpoint, body.clone(), false, false),
                estimate,
            )
        }
        Endpoint::Responses => {
            let req: ResponsesRequest = parse(body)?;
            let estimate = estimator.responses(&req);
            let cap = estimator.responses_output_cap();
            let upstream =
                UpstreamRequest::responses_from(&req, body, &req.model, cap).map_err(invalid)?;
            (upstream, estimate)
        }
        Endpoint::Messages => {
            let req: MessagesRequest = parse(body)?;
            let stream = req.is_stream();
            let estimate = estimator.messages(&req);
            (
                UpstreamRequest::new(endpoint, body.clone(), stream, stream),
                estimate,
            )
        }
    };
    Ok(Routed {
        stream: upstream.is_stream(),
        forward_usage: upstream.forward_usage(),
        body: upstream.body().clone(),
        estimate: estimate.into(),
    })
}

/// Parses a JSON body: the gateway's 400 `invalid_body` when it is not a
/// valid request of the API.
fn parse<T: serde::de::DeserializeOwned>(body: &Bytes) -> Result<T, ApiError> {
    serde_json::from_slice(body).map_err(invalid)
}

fn invalid(e: serde_json::Error) -> ApiError {
    ApiError::bad_request("invalid_body", format!("Invalid JSON body: {e}"))
}

//! `POST /v1/messages`: Anthropic's Messages API passed through, one-shot
//! and streaming, admitted on requests, input tokens and output tokens
//! (SPEC WIRE-3, Q-12). Errors are Anthropic's; a client may present its
//! key as `x-api-key`.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::response::Response;
use bytes::Bytes;
use http::{HeaderMap, HeaderName};
use tollgate::TokenEstimate;
use tollgate_openai::tokens::TokenEstimator;
use tollgate_openai::{Endpoint, MessagesRequest, UpstreamRequest};

use super::flow::{Route, as_received_or, handle};
use crate::config::ApiRoute;
use crate::error::Dialect;
use crate::live::Live;
use crate::state::Deployment;

/// The client headers that select Anthropic API behaviour and so go
/// upstream with the request (the provider's configured
/// `anthropic-version` is the default).
const FORWARDED: [&str; 2] = ["anthropic-version", "anthropic-beta"];

/// The Messages route.
pub struct Messages;

impl Route for Messages {
    type Request = MessagesRequest;
    const NAME: &'static str = "messages";
    const ROUTE: ApiRoute = ApiRoute::Messages;
    const DIALECT: Dialect = Dialect::Anthropic;

    fn model(request: &MessagesRequest) -> &str {
        &request.model
    }

    fn estimate(estimator: &TokenEstimator, request: &MessagesRequest) -> TokenEstimate {
        estimator.messages(request).into()
    }

    fn output(estimator: &TokenEstimator, request: &MessagesRequest) -> u64 {
        estimator.messages_output(request)
    }

    fn upstream(
        request: &MessagesRequest,
        body: &Bytes,
        deployment: &Deployment,
    ) -> Result<UpstreamRequest, serde_json::Error> {
        let upstream_model = deployment.upstream_model.as_str();
        as_received_or(
            Endpoint::Messages,
            &request.model,
            request.is_stream(),
            body,
            upstream_model,
            || UpstreamRequest::messages(request, upstream_model),
        )
    }

    fn is_stream(request: &MessagesRequest) -> bool {
        request.is_stream()
    }

    fn forward(client: &HeaderMap, mut upstream: UpstreamRequest) -> UpstreamRequest {
        for name in FORWARDED {
            if let Some(value) = client.get(name) {
                upstream = upstream.with_header(HeaderName::from_static(name), value.clone());
            }
        }
        upstream
    }
}

/// The handler.
pub async fn messages(State(live): State<Arc<Live>>, request: Request) -> Response {
    handle::<Messages>(&live.current(), request).await
}

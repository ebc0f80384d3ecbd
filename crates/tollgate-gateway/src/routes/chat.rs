//! `POST /v1/chat/completions`, one-shot and streaming (SPEC GW-1, GW-5,
//! GW-6, GW-10).

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::response::Response;
use bytes::Bytes;
use tollgate::TokenEstimate;
use tollgate_openai::tokens::TokenEstimator;
use tollgate_openai::{ChatCompletionRequest, Endpoint, UpstreamRequest};

use super::flow::{Route, handle};
use crate::config::ApiRoute;
use crate::error::Dialect;
use crate::live::Live;
use crate::state::Deployment;

/// The chat completions route.
pub struct Chat;

impl Route for Chat {
    type Request = ChatCompletionRequest;
    const NAME: &'static str = "chat";
    const ROUTE: ApiRoute = ApiRoute::Chat;
    const DIALECT: Dialect = Dialect::OpenAi;

    fn model(request: &ChatCompletionRequest) -> &str {
        &request.model
    }

    fn estimate(estimator: &TokenEstimator, request: &ChatCompletionRequest) -> TokenEstimate {
        estimator.chat(request).into()
    }

    fn output(estimator: &TokenEstimator, request: &ChatCompletionRequest) -> u64 {
        estimator.chat_output(request)
    }

    fn upstream(
        request: &ChatCompletionRequest,
        body: &Bytes,
        deployment: &Deployment,
    ) -> Result<UpstreamRequest, serde_json::Error> {
        let upstream_model = deployment.upstream_model.as_str();
        if request.max_output_tokens().is_none()
            && let Some(cap) = deployment.estimator.output_cap()
        {
            let mut capped = request.clone();
            capped.cap_output(cap, deployment.cap_field);
            return UpstreamRequest::chat(&capped, upstream_model);
        }
        // The body goes as it came when the model keeps its name, sets its
        // own output cap and, for a stream, the client itself asks for the
        // usage chunk (GW-5).
        let stream = request.is_stream();
        if request.model == upstream_model && (!stream || request.wants_stream_usage()) {
            return Ok(UpstreamRequest::new(
                Endpoint::ChatCompletions,
                body.clone(),
                stream,
                stream,
            ));
        }
        UpstreamRequest::chat(request, upstream_model)
    }

    fn is_stream(request: &ChatCompletionRequest) -> bool {
        request.is_stream()
    }
}

/// The handler.
pub async fn chat(State(live): State<Arc<Live>>, request: Request) -> Response {
    handle::<Chat>(&live.current(), request).await
}

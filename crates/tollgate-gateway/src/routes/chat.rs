//! `POST /v1/chat/completions`, one-shot and streaming (SPEC GW-1, GW-5,
//! GW-6, GW-10).

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::response::Response;
use bytes::Bytes;
use tollgate::TokenEstimate;
use tollgate_openai::tokens::TokenEstimator;
use tollgate_openai::{ChatCompletionRequest, UpstreamRequest};

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
        // The body goes as it came, with the upstream model's name, the
        // output cap a request without one was reserved for, and for a
        // stream the usage chunk asked for (GW-5): members set in its text.
        let cap = deployment
            .estimator
            .output_cap()
            .map(|cap| (cap, deployment.cap_field));
        UpstreamRequest::chat_from(request, body, &deployment.upstream_model, cap)
    }

    fn is_stream(request: &ChatCompletionRequest) -> bool {
        request.is_stream()
    }
}

/// The handler.
pub async fn chat(State(live): State<Arc<Live>>, request: Request) -> Response {
    handle::<Chat>(&live.current(), request).await
}

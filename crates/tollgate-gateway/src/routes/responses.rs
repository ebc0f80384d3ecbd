//! `POST /v1/responses`: OpenAI's Responses API, one-shot and streaming,
//! under the same admission, deadline, retry and settlement rules as chat
//! completions (SPEC WIRE-1).

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::response::Response;
use bytes::Bytes;
use tollgate::TokenEstimate;
use tollgate_openai::tokens::TokenEstimator;
use tollgate_openai::{ResponsesRequest, UpstreamRequest};

use super::flow::{Route, handle};
use crate::config::ApiRoute;
use crate::error::Dialect;
use crate::live::Live;
use crate::state::Deployment;

/// The Responses route.
pub struct Responses;

impl Route for Responses {
    type Request = ResponsesRequest;
    const NAME: &'static str = "responses";
    const ROUTE: ApiRoute = ApiRoute::Responses;
    const DIALECT: Dialect = Dialect::Responses;

    fn model(request: &ResponsesRequest) -> &str {
        &request.model
    }

    fn estimate(estimator: &TokenEstimator, request: &ResponsesRequest) -> TokenEstimate {
        estimator.responses(request).into()
    }

    fn output(estimator: &TokenEstimator, request: &ResponsesRequest) -> u64 {
        estimator.responses_output(request)
    }

    fn upstream(
        request: &ResponsesRequest,
        body: &Bytes,
        deployment: &Deployment,
    ) -> Result<UpstreamRequest, serde_json::Error> {
        let cap = deployment.estimator.responses_output_cap();
        UpstreamRequest::responses_from(request, body, &deployment.upstream_model, cap)
    }

    fn is_stream(request: &ResponsesRequest) -> bool {
        request.is_stream()
    }
}

/// The handler.
pub async fn responses(State(live): State<Arc<Live>>, request: Request) -> Response {
    handle::<Responses>(&live.current(), request).await
}

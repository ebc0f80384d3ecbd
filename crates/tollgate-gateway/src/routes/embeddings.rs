//! `POST /v1/embeddings` (SPEC GW-1).

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::response::Response;
use bytes::Bytes;
use tollgate::TokenEstimate;
use tollgate_openai::tokens::TokenEstimator;
use tollgate_openai::{EmbeddingsRequest, Endpoint, UpstreamRequest};

use super::flow::{Route, as_received_or, handle};
use crate::config::ApiRoute;
use crate::error::Dialect;
use crate::live::Live;
use crate::state::Deployment;

/// The embeddings route.
pub struct Embeddings;

impl Route for Embeddings {
    type Request = EmbeddingsRequest;
    const NAME: &'static str = "embeddings";
    const OPERATION: &'static str = crate::telemetry::semconv::OP_EMBEDDINGS;
    const ROUTE: ApiRoute = ApiRoute::Embeddings;
    const DIALECT: Dialect = Dialect::OpenAi;

    fn model(request: &EmbeddingsRequest) -> &str {
        &request.model
    }

    fn estimate(estimator: &TokenEstimator, request: &EmbeddingsRequest) -> TokenEstimate {
        estimator.embeddings(request).into()
    }

    fn output(_: &TokenEstimator, _: &EmbeddingsRequest) -> u64 {
        0
    }

    fn upstream(
        request: &EmbeddingsRequest,
        body: &Bytes,
        deployment: &Deployment,
    ) -> Result<UpstreamRequest, serde_json::Error> {
        let upstream_model = deployment.upstream_model.as_str();
        as_received_or(
            Endpoint::Embeddings,
            &request.model,
            false,
            body,
            upstream_model,
            || UpstreamRequest::embeddings(request, upstream_model),
        )
    }

    fn is_stream(_: &EmbeddingsRequest) -> bool {
        false
    }
}

/// The handler.
pub async fn embeddings(State(live): State<Arc<Live>>, request: Request) -> Response {
    handle::<Embeddings>(&live.current(), request).await
}

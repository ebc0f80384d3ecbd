//! `POST /v1/embeddings` (SPEC GW-1).

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::response::Response;
use bytes::Bytes;
use tollgate::TokenEstimate;
use tollgate_openai::tokens::TokenEstimator;
use tollgate_openai::{EmbeddingsRequest, Endpoint, UpstreamRequest};

use super::flow::{Route, handle};
use crate::config::ApiRoute;
use crate::error::Dialect;
use crate::live::Live;

/// The embeddings route.
pub struct Embeddings;

impl Route for Embeddings {
    type Request = EmbeddingsRequest;
    const NAME: &'static str = "embeddings";
    const ROUTE: ApiRoute = ApiRoute::Embeddings;
    const DIALECT: Dialect = Dialect::OpenAi;

    fn model(request: &EmbeddingsRequest) -> &str {
        &request.model
    }

    fn estimate(estimator: &TokenEstimator, request: &EmbeddingsRequest) -> TokenEstimate {
        estimator.embeddings(request).into()
    }

    fn upstream(
        request: &EmbeddingsRequest,
        body: &Bytes,
        upstream_model: &str,
    ) -> Result<UpstreamRequest, serde_json::Error> {
        if request.model == upstream_model {
            let body = body.clone();
            return Ok(UpstreamRequest::new(
                Endpoint::Embeddings,
                body,
                false,
                false,
            ));
        }
        UpstreamRequest::embeddings(request, upstream_model)
    }

    fn is_stream(_: &EmbeddingsRequest) -> bool {
        false
    }
}

/// The handler.
pub async fn embeddings(State(live): State<Arc<Live>>, request: Request) -> Response {
    handle::<Embeddings>(&live.current(), request).await
}

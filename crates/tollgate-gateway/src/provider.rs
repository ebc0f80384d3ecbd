//! The gateway's view of an upstream: the HTTP provider, with each
//! request carrying its own token estimate.

use bytes::Bytes;
use tollgate::TokenEstimate;
use tollgate::lifecycle::{AttemptContext, Provider, ProviderError, Reply};
use tollgate_openai::provider::ChunkStream;
use tollgate_openai::{HttpProvider, UpstreamRequest};

/// An upstream request and the tokens it is expected to spend.
#[derive(Debug, Clone)]
pub struct GatewayRequest {
    /// What goes upstream.
    pub upstream: UpstreamRequest,
    /// Input plus output allowance, counted with the model's tokenizer.
    pub estimate: TokenEstimate,
}

/// [`HttpProvider`] taking [`GatewayRequest`]s.
#[derive(Debug, Clone)]
pub struct GatewayProvider {
    http: HttpProvider,
}

impl GatewayProvider {
    /// Wraps `http`.
    pub fn new(http: HttpProvider) -> Self {
        GatewayProvider { http }
    }
}

impl Provider for GatewayProvider {
    type Request = GatewayRequest;
    type Response = Bytes;
    type Chunk = Bytes;
    type Stream = ChunkStream;

    fn call(
        &self,
        request: &GatewayRequest,
        attempt: AttemptContext,
    ) -> impl Future<Output = Result<Reply<Bytes>, ProviderError>> + Send {
        Provider::call(&self.http, &request.upstream, attempt)
    }

    fn stream(
        &self,
        request: &GatewayRequest,
        attempt: AttemptContext,
    ) -> impl Future<Output = Result<ChunkStream, ProviderError>> + Send {
        Provider::stream(&self.http, &request.upstream, attempt)
    }
}

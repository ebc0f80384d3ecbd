//! The estimator as the engine's [`tollgate::TokenEstimator`] (SPEC Q-3,
//! Q-8, GW-5).

use tollgate::EstimateError;

use super::estimator::{TokenEstimate, TokenEstimator};
use crate::provider::{Endpoint, UpstreamRequest};
use crate::wire::{ChatCompletionRequest, EmbeddingsRequest, MessagesRequest, ResponsesRequest};

impl From<TokenEstimate> for tollgate::TokenEstimate {
    fn from(estimate: TokenEstimate) -> Self {
        tollgate::TokenEstimate::new(estimate.input, estimate.output)
    }
}

impl tollgate::TokenEstimator<ChatCompletionRequest> for TokenEstimator {
    fn estimate(
        &self,
        request: &ChatCompletionRequest,
    ) -> Result<tollgate::TokenEstimate, EstimateError> {
        Ok(self.chat(request).into())
    }
}

impl tollgate::TokenEstimator<EmbeddingsRequest> for TokenEstimator {
    fn estimate(
        &self,
        request: &EmbeddingsRequest,
    ) -> Result<tollgate::TokenEstimate, EstimateError> {
        Ok(self.embeddings(request).into())
    }
}

impl tollgate::TokenEstimator<ResponsesRequest> for TokenEstimator {
    fn estimate(
        &self,
        request: &ResponsesRequest,
    ) -> Result<tollgate::TokenEstimate, EstimateError> {
        Ok(self.responses(request).into())
    }
}

impl tollgate::TokenEstimator<MessagesRequest> for TokenEstimator {
    fn estimate(
        &self,
        request: &MessagesRequest,
    ) -> Result<tollgate::TokenEstimate, EstimateError> {
        Ok(self.messages(request).into())
    }
}

/// Estimates a request that is already serialised (e.g. a batch line's
/// body) by parsing it for its endpoint. Where the parsed request is at hand,
/// estimating it directly saves the parse.
impl tollgate::TokenEstimator<UpstreamRequest> for TokenEstimator {
    fn estimate(
        &self,
        request: &UpstreamRequest,
    ) -> Result<tollgate::TokenEstimate, EstimateError> {
        let invalid =
            |err: serde_json::Error| EstimateError::new(format!("request body is invalid: {err}"));
        let estimate = match request.endpoint() {
            Endpoint::ChatCompletions => self.chat(
                &serde_json::from_slice::<ChatCompletionRequest>(request.body())
                    .map_err(invalid)?,
            ),
            Endpoint::Embeddings => self.embeddings(
                &serde_json::from_slice::<EmbeddingsRequest>(request.body()).map_err(invalid)?,
            ),
            Endpoint::Responses => self.responses(
                &serde_json::from_slice::<ResponsesRequest>(request.body()).map_err(invalid)?,
            ),
            Endpoint::Messages => self.messages(
                &serde_json::from_slice::<MessagesRequest>(request.body()).map_err(invalid)?,
            ),
        };
        Ok(estimate.into())
    }
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;
    use serde_json::json;
    use tollgate::{Call, ScopeId, TokenEstimator as _};

    use super::*;
    use crate::wire::EmbeddingInput;

    // proves: Q-3 (the tokenizer estimate feeds admission), GW-5
    #[test]
    fn engine_estimates_match_the_tokenizer() {
        let est = TokenEstimator::new().with_default_output(100);
        let chat: ChatCompletionRequest = serde_json::from_value(json!({
            "model": "gpt-4o", "messages": [{"role": "user", "content": "hello world"}],
            "max_tokens": 50
        }))
        .expect("request");
        let want = est.chat(&chat);
        let got = tollgate::TokenEstimator::estimate(&est, &chat).expect("estimate");
        assert_eq!((got.input, got.output), (want.input, 50));

        let upstream = UpstreamRequest::chat(&chat, "gpt-4o").expect("upstream");
        assert_eq!(est.estimate(&upstream).expect("estimate"), got);

        let emb = EmbeddingsRequest::new(
            "text-embedding-3-small",
            EmbeddingInput::Text("hello world".into()),
        );
        let got = tollgate::TokenEstimator::estimate(&est, &emb).expect("estimate");
        assert_eq!((got.input, got.output), (2, 0));

        // The engine takes it as an estimator.
        let call = Call::new(ScopeId::FIRST)
            .estimated(&est, &chat)
            .expect("estimated");
        assert_eq!(call.estimate, Some(est.chat(&chat).into()));

        let bad =
            UpstreamRequest::new(Endpoint::Embeddings, Bytes::from_static(b"{"), false, false);
        assert!(est.estimate(&bad).is_err());
    }

    // proves: Q-3, WIRE-1, WIRE-3 (a serialised Responses or Messages
    // request gets an estimate; a malformed one fails estimation instead of
    // going out unestimated)
    #[test]
    fn responses_and_messages_bodies_are_estimated() {
        let est = TokenEstimator::new().with_default_output(100);
        let responses: ResponsesRequest = serde_json::from_value(json!({
            "model": "gpt-4o", "input": "hello world", "max_output_tokens": 20
        }))
        .expect("request");
        let direct = tollgate::TokenEstimator::estimate(&est, &responses).expect("estimate");
        assert_eq!(direct, est.responses(&responses).into());
        assert_eq!(direct.output, 20);
        let upstream = UpstreamRequest::responses(&responses, "gpt-4o").expect("upstream");
        assert_eq!(est.estimate(&upstream).expect("estimate"), direct);

        let messages: MessagesRequest = serde_json::from_value(json!({
            "model": "claude-haiku-4-5", "max_tokens": 30,
            "messages": [{"role": "user", "content": "hello world"}]
        }))
        .expect("request");
        let direct = tollgate::TokenEstimator::estimate(&est, &messages).expect("estimate");
        assert_eq!(direct, est.messages(&messages).into());
        assert_eq!(direct.output, 30);
        let upstream = UpstreamRequest::messages(&messages, "claude-haiku-4-5").expect("upstream");
        assert_eq!(est.estimate(&upstream).expect("estimate"), direct);

        for endpoint in [Endpoint::Responses, Endpoint::Messages] {
            for body in [&b"{"[..], b"[]", b"{\"model\": 1}"] {
                let bad =
                    UpstreamRequest::new(endpoint, Bytes::copy_from_slice(body), false, false);
                assert!(est.estimate(&bad).is_err(), "{endpoint:?}");
            }
        }
    }
}

//! Chat request JSON: deserialize arbitrary bytes; whatever parses must
//! re-serialize to JSON that parses back to the same value, must be
//! estimable without panicking, and the upstream request made from its
//! text (the model renamed, a cap added, a stream's usage asked for) must
//! be the request a parsed copy makes.

use bytes::Bytes;
use tollgate_openai::UpstreamRequest;
use tollgate_openai::tokens::TokenEstimator;
use tollgate_openai::wire::{CapField, ChatCompletionRequest};

/// Checks one input; panics on a finding.
pub fn check(data: &[u8]) {
    let Some(request) = super::shared::round_trip::<ChatCompletionRequest>(data) else {
        return;
    };
    let estimate = TokenEstimator::new().chat(&request);
    let _ = estimate.total();

    let body = Bytes::copy_from_slice(data);
    let cap = Some((7, CapField::MaxTokens));
    let made = UpstreamRequest::chat_from(&request, &body, "fuzz-model", cap).expect("made");
    let sent: ChatCompletionRequest =
        serde_json::from_slice(made.body()).expect("the body sent upstream parses");
    let mut copy = request.clone();
    copy.cap_output(7, CapField::MaxTokens);
    copy.model = "fuzz-model".to_owned();
    let forward = copy.is_stream() && copy.request_stream_usage();
    assert_eq!(sent, copy, "the edited text differs from the parsed copy");
    assert_eq!(made.forward_usage(), forward);
}

//! Chat request JSON: deserialize arbitrary bytes; whatever parses must
//! re-serialize to JSON that parses back to the same value, and must be
//! estimable without panicking.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tollgate_openai::tokens::TokenEstimator;
use tollgate_openai::wire::ChatCompletionRequest;

fuzz_target!(|data: &[u8]| {
    let Ok(request) = serde_json::from_slice::<ChatCompletionRequest>(data) else {
        return;
    };
    let json = serde_json::to_vec(&request).expect("a parsed request serializes");
    let again: ChatCompletionRequest =
        serde_json::from_slice(&json).expect("serialized request parses");
    assert_eq!(request, again, "round trip changed the request");
    let estimate = TokenEstimator::new().chat(&request);
    let _ = estimate.total();
});

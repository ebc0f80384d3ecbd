//! Chat request JSON: deserialize arbitrary bytes; whatever parses must
//! re-serialize to JSON that parses back to the same value, and must be
//! estimable without panicking.
#![no_main]

mod shared;

use libfuzzer_sys::fuzz_target;
use tollgate_openai::tokens::TokenEstimator;
use tollgate_openai::wire::ChatCompletionRequest;

fuzz_target!(|data: &[u8]| {
    let Some(request) = shared::round_trip::<ChatCompletionRequest>(data) else {
        return;
    };
    let estimate = TokenEstimator::new().chat(&request);
    let _ = estimate.total();
});

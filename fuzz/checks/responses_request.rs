//! Responses API request JSON (SPEC WIRE-1): deserialize arbitrary bytes;
//! whatever parses must re-serialize to JSON that parses back to the same
//! value, and must be estimable under every accounting profile without
//! panicking (the estimate saturates, it never overflows).

use tollgate_openai::wire::ResponsesRequest;

/// Checks one input; panics on a finding.
pub fn check(data: &[u8]) {
    let Some(request) = super::shared::round_trip::<ResponsesRequest>(data) else {
        return;
    };
    super::shared::estimable(request.max_output_tokens, |e| e.responses(&request), |_| {});
}

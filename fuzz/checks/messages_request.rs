//! Anthropic Messages request JSON (SPEC WIRE-3): deserialize arbitrary
//! bytes; whatever parses must re-serialize to JSON that parses back to the
//! same value, and must be estimable under every accounting profile without
//! panicking (the estimate saturates, it never overflows).

use tollgate_openai::tokens::ANTHROPIC_REQUEST_OVERHEAD;
use tollgate_openai::wire::MessagesRequest;

/// Checks one input; panics on a finding.
pub fn check(data: &[u8]) {
    let Some(request) = super::shared::round_trip::<MessagesRequest>(data) else {
        return;
    };
    super::shared::estimable(
        request.max_tokens,
        |e| e.messages(&request),
        |e| assert!(e.input >= ANTHROPIC_REQUEST_OVERHEAD),
    );
}

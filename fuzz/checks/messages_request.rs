//! Anthropic Messages request JSON (SPEC WIRE-3): deserialize arbitrary
//! bytes; whatever parses must re-serialize to JSON that parses back to the
//! same value, and must be estimable under every accounting profile without
//! panicking (the estimate saturates, it never overflows).

use tollgate_openai::tokens::{ANTHROPIC_REQUEST_OVERHEAD, Profile, TokenEstimator};
use tollgate_openai::wire::MessagesRequest;

/// Checks one input; panics on a finding.
pub fn check(data: &[u8]) {
    let Some(request) = super::shared::round_trip::<MessagesRequest>(data) else {
        return;
    };
    for profile in super::shared::PROFILES {
        let estimate = TokenEstimator::new()
            .with_profile(profile)
            .messages(&request);
        let _ = estimate.total();
        assert!(estimate.input >= ANTHROPIC_REQUEST_OVERHEAD);
        if let Some(cap) = request.max_tokens
            && !matches!(profile, Profile::Chars { output: false, .. })
        {
            assert_eq!(estimate.output, cap, "output allowance is the cap");
        }
    }
}

//! Anthropic Messages request JSON (SPEC WIRE-3): deserialize arbitrary
//! bytes; whatever parses must re-serialize to JSON that parses back to the
//! same value, and must be estimable under every accounting profile without
//! panicking (the estimate saturates, it never overflows).
#![no_main]

use libfuzzer_sys::fuzz_target;
use tollgate_openai::tokens::{ANTHROPIC_REQUEST_OVERHEAD, Profile, TokenEstimator};
use tollgate_openai::wire::MessagesRequest;

const PROFILES: [Profile; 6] = [
    Profile::Tokenizer,
    Profile::OpenAi,
    Profile::Anthropic,
    Profile::Chars {
        chars_per_token: 4,
        output: true,
    },
    Profile::Chars {
        chars_per_token: 1,
        output: false,
    },
    Profile::Chars {
        chars_per_token: 0,
        output: true,
    },
];

fuzz_target!(|data: &[u8]| {
    let Ok(request) = serde_json::from_slice::<MessagesRequest>(data) else {
        return;
    };
    let json = serde_json::to_vec(&request).expect("a parsed request serializes");
    let again: MessagesRequest = serde_json::from_slice(&json).expect("serialized request parses");
    assert_eq!(request, again, "round trip changed the request");
    for profile in PROFILES {
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
});

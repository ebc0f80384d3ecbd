//! What the request fuzz targets share: the round trip every parsed request
//! must survive, and the accounting profiles it must be estimable under.

use std::fmt::Debug;

use serde::Serialize;
use serde::de::DeserializeOwned;
use tollgate_openai::tokens::Profile;

/// Every accounting profile, with the degenerate character ratios.
#[allow(dead_code)]
pub const PROFILES: [Profile; 6] = [
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

/// Parses `data` as a `T`; whatever parses must serialize to JSON that
/// parses back to the same value.
pub fn round_trip<T: Serialize + DeserializeOwned + PartialEq + Debug>(data: &[u8]) -> Option<T> {
    let request = serde_json::from_slice::<T>(data).ok()?;
    let json = serde_json::to_vec(&request).expect("a parsed request serializes");
    let again: T = serde_json::from_slice(&json).expect("serialized request parses");
    assert_eq!(request, again, "round trip changed the request");
    Some(request)
}

//! What the checks share: the round trip every parsed request must
//! survive, the accounting profiles it must be estimable under, and the
//! cuts of a stream read in pieces.

use std::fmt::Debug;

use serde::Serialize;
use serde::de::DeserializeOwned;
use tollgate_openai::tokens::{Profile, TokenEstimate, TokenEstimator};

/// Every accounting profile, with the degenerate character ratios.
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

/// `rest` as up to `count` cut seeds then a body, and the body cut where
/// the seeds say (each seed's 256ths of its length, in order): the body
/// and its pieces.
pub fn cut(rest: &[u8], count: usize) -> (&[u8], Vec<&[u8]>) {
    let (seeds, body) = rest.split_at(count.min(rest.len()));
    let mut cuts: Vec<usize> = seeds
        .iter()
        .map(|&s| usize::from(s) * body.len() / 256)
        .collect();
    cuts.sort_unstable();
    let mut pieces = Vec::with_capacity(cuts.len() + 1);
    let mut start = 0;
    for cut in cuts {
        pieces.push(&body[start..cut]);
        start = cut;
    }
    pieces.push(&body[start..]);
    (body, pieces)
}

/// Estimates a parsed request under every profile of [`PROFILES`] with
/// `estimate` (it never panics, the total saturates) and checks each
/// estimate with `check`; where a profile counts output, the allowance is
/// the request's `cap` when it has one.
pub fn estimable(
    cap: Option<u64>,
    estimate: impl Fn(&TokenEstimator) -> TokenEstimate,
    check: impl Fn(&TokenEstimate),
) {
    for profile in PROFILES {
        let e = estimate(&TokenEstimator::new().with_profile(profile));
        let _ = e.total();
        check(&e);
        if let Some(cap) = cap
            && !matches!(profile, Profile::Chars { output: false, .. })
        {
            assert_eq!(e.output, cap, "output allowance is the cap");
        }
    }
}

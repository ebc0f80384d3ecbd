//! Request ids (SPEC GW-14): a client's `x-request-id` is kept when it is
//! a plain token (letters, digits, `-`, `_`, `.`, `:`; at most 128
//! characters), otherwise a new one is generated (32 hex digits). The id
//! is echoed on the response, sent upstream and written in the access log.

use http::{HeaderMap, HeaderName, HeaderValue};

/// `x-request-id`.
pub const HEADER: HeaderName = HeaderName::from_static("x-request-id");

/// Longest client id kept.
const MAX_LEN: usize = 128;

/// The request's id: the client's when it is a plain token, else a new one.
pub fn of(headers: &HeaderMap) -> HeaderValue {
    headers
        .get(&HEADER)
        .filter(|v| is_plain(v.as_bytes()))
        .cloned()
        .unwrap_or_else(generate)
}

fn is_plain(id: &[u8]) -> bool {
    !id.is_empty()
        && id.len() <= MAX_LEN
        && id
            .iter()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b':'))
}

/// 128 random bits as 32 lower-case hex digits.
pub fn generate() -> HeaderValue {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut id = [0u8; 32];
    for (pair, byte) in id.chunks_exact_mut(2).zip(fastrand::u128(..).to_be_bytes()) {
        pair[0] = HEX[usize::from(byte >> 4)];
        pair[1] = HEX[usize::from(byte & 0xf)];
    }
    HeaderValue::from_bytes(&id).unwrap_or_else(|_| HeaderValue::from_static("0"))
}

#[cfg(test)]
mod tests {
    use super::*;

    // proves: GW-14 (a plain client id is kept; anything else is replaced)
    #[test]
    fn plain_ids_are_kept_others_replaced() {
        let mut h = HeaderMap::new();
        assert_eq!(of(&h).len(), 32);
        h.insert(&HEADER, HeaderValue::from_static("req-42:a.b_c"));
        assert_eq!(of(&h), "req-42:a.b_c");
        h.insert(&HEADER, HeaderValue::from_static("has space"));
        assert_ne!(of(&h), "has space");
        h.insert(&HEADER, HeaderValue::from_str(&"x".repeat(129)).unwrap());
        assert_eq!(of(&h).len(), 32);
    }
}

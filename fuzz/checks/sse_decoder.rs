//! SSE decoder: arbitrary bytes, arbitrary splits, a small or default size
//! limit. Checks that nothing panics, that memory stays under the limit, and
//! that the split decode agrees with the one-piece decode.

use tollgate_openai::sse::{SseDecoder, SseError, SseItem};

fn decode(pieces: &[&[u8]], limit: usize) -> (Vec<SseItem>, Result<Option<SseItem>, SseError>) {
    let mut dec = SseDecoder::with_max_event_size(limit);
    let mut out = Vec::new();
    for piece in pieces {
        if let Err(err) = dec.push(piece, &mut out) {
            return (out, Err(err));
        }
        assert!(dec.buffered_bytes() <= limit, "buffer over the limit");
    }
    let end = dec.finish();
    (out, end)
}

/// Checks one input; panics on a finding.
pub fn check(data: &[u8]) {
    // Header: [limit selector, cut seeds...] then the stream.
    let Some((&selector, rest)) = data.split_first() else {
        return;
    };
    let limit = if selector & 0x80 == 0 {
        usize::from(selector)
    } else {
        tollgate_openai::sse::DEFAULT_MAX_EVENT_SIZE
    };
    let (stream, pieces) = super::shared::cut(rest, usize::from(selector & 0x07));

    let whole = decode(&[stream], limit);
    let split = decode(&pieces, limit);
    // An oversize error may surface at a different item count depending on
    // where the chunks end; everything else must agree exactly.
    let oversize =
        |r: &Result<Option<SseItem>, SseError>| matches!(r, Err(SseError::EventTooLarge { .. }));
    if !oversize(&whole.1) && !oversize(&split.1) {
        assert_eq!(whole, split, "split decode differs");
    }
}

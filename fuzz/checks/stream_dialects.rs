//! Provider stream adapter: arbitrary bytes, arbitrary splits, a small or
//! default event size limit, read as each streaming dialect (chat
//! completions, Responses, Anthropic Messages). Checks that nothing panics,
//! that usage is reported at most once, that the stream ends exactly once
//! (one final item, nothing after it, `None` for ever afterwards), that a
//! normal end has its dialect's shape, and that the split read agrees with
//! the one-piece read.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};

use bytes::Bytes;
use futures_util::Stream;
use tollgate::lifecycle::{ErrorKind, StreamEvent};
use tollgate_openai::Endpoint;
use tollgate_openai::provider::{ChunkItem, ChunkStream};
use tollgate_openai::sse::{DEFAULT_MAX_EVENT_SIZE, DONE_FRAME, SseDecoder, SseError};

const ENDPOINTS: [Endpoint; 3] = [
    Endpoint::ChatCompletions,
    Endpoint::Responses,
    Endpoint::Messages,
];

/// Reads `pieces` as one upstream body to the stream's end.
fn read(endpoint: Endpoint, pieces: &[&[u8]], limit: usize, forward_usage: bool) -> Vec<ChunkItem> {
    let body: Vec<Result<Bytes, io::Error>> = pieces
        .iter()
        .map(|p| Ok(Bytes::copy_from_slice(p)))
        .collect();
    let mut stream = ChunkStream::with_decoder(
        futures_util::stream::iter(body),
        SseDecoder::with_max_event_size(limit),
        forward_usage,
    )
    .with_endpoint(endpoint);
    let mut cx = Context::from_waker(Waker::noop());
    let mut items = Vec::new();
    loop {
        match Pin::new(&mut stream).poll_next(&mut cx) {
            Poll::Ready(Some(item)) => items.push(item),
            Poll::Ready(None) => break,
            Poll::Pending => panic!("an in-memory body never makes the stream wait"),
        }
    }
    assert!(stream.is_finished(), "ended but not finished");
    // The stream stays ended.
    for _ in 0..2 {
        assert!(
            matches!(Pin::new(&mut stream).poll_next(&mut cx), Poll::Ready(None)),
            "an item after the end"
        );
    }
    items
}

/// The invariants of one read.
fn check_read(endpoint: Endpoint, items: &[ChunkItem]) {
    let usage = items
        .iter()
        .filter(|i| matches!(i, Ok(StreamEvent::Usage(_))))
        .count();
    assert!(usage <= 1, "usage reported {usage} times");
    let Some((last, before)) = items.split_last() else {
        panic!("a stream always ends with an item");
    };
    let ends = |i: &ChunkItem| matches!(i, Err(_) | Ok(StreamEvent::Error(..)));
    assert!(!before.iter().any(ends), "an item after the end");
    if ends(last) {
        return;
    }
    // A normal end: the terminal frame is the last chunk.
    let Ok(StreamEvent::Chunk(frame)) = last else {
        panic!("a normal end without its terminal chunk: {last:?}");
    };
    match endpoint {
        Endpoint::ChatCompletions | Endpoint::Embeddings => {
            assert_eq!(frame.as_ref(), DONE_FRAME, "chat ends only at [DONE]");
        }
        Endpoint::Responses | Endpoint::Messages => {
            assert!(
                matches!(before.last(), Some(Ok(StreamEvent::Usage(_)))),
                "a terminal event without its usage report"
            );
        }
    }
}

/// Whether the read ended on an oversize event (its position may depend on
/// the split, as in the decoder's own fuzz target).
fn oversize(items: &[ChunkItem], limit: usize) -> bool {
    let message = SseError::EventTooLarge { limit }.to_string();
    matches!(items.last(), Some(Err(e)) if e.kind == ErrorKind::Protocol && e.message == message)
}

/// Checks one input; panics on a finding.
pub fn check(data: &[u8]) {
    // Header: [selector, cut seeds...] then the body. Selector bits: 0-2
    // the number of cuts, 3 forward_usage, 4-6 a small limit (x 64), 7 the
    // default limit.
    let Some((&selector, rest)) = data.split_first() else {
        return;
    };
    let limit = if selector & 0x80 == 0 {
        usize::from((selector >> 4) & 0x07) * 64
    } else {
        DEFAULT_MAX_EVENT_SIZE
    };
    let forward_usage = selector & 0x08 != 0;
    let (body, pieces) = super::shared::cut(rest, usize::from(selector & 0x07));

    for endpoint in ENDPOINTS {
        let whole = read(endpoint, &[body], limit, forward_usage);
        check_read(endpoint, &whole);
        let split = read(endpoint, &pieces, limit, forward_usage);
        check_read(endpoint, &split);
        if !oversize(&whole, limit) && !oversize(&split, limit) {
            assert_eq!(whole, split, "{endpoint:?}: the split read differs");
        }
    }
}

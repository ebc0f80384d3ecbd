//! Stream adapter tests: bytes fed directly, split anywhere.

use std::io;

use bytes::Bytes;
use futures_util::{StreamExt, stream};
use proptest::prelude::*;
use tollgate::lifecycle::{ErrorKind, StreamEvent};

use super::stream::{ChunkItem, ChunkStream};
use crate::sse::SseDecoder;

const ROLE: &str = "data: {\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"},\"finish_reason\":null}],\"usage\":null}\n\n";
const HELLO: &str = "data: {\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"H\u{e9}llo \u{2713}\"},\"finish_reason\":null}],\"usage\":null,\"x\":1.5e300}\n\n";
const FINISH: &str = "data: {\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}],\"usage\":null}\n\n";
const USAGE: &str = "data: {\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"m\",\"choices\":[],\"usage\":{\"prompt_tokens\":9,\"completion_tokens\":3,\"total_tokens\":12}}\n\n";
const DONE: &str = "data: [DONE]\n\n";
const KEEPALIVE: &str = ": keep-alive\n\n";

pub(super) fn body(
    parts: &[&str],
) -> impl futures_core::Stream<Item = Result<Bytes, io::Error>> + Unpin + use<> {
    let items: Vec<Result<Bytes, io::Error>> = parts
        .iter()
        .map(|p| Ok(Bytes::copy_from_slice(p.as_bytes())))
        .collect();
    stream::iter(items)
}

pub(super) fn block_on<F: std::future::Future>(future: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("runtime")
        .block_on(future)
}

fn collect(parts: &[&str], forward_usage: bool) -> Vec<ChunkItem> {
    let stream = ChunkStream::new(body(parts), forward_usage);
    block_on(stream.collect::<Vec<_>>())
}

fn chunk(s: &str) -> ChunkItem {
    Ok(StreamEvent::Chunk(Bytes::copy_from_slice(s.as_bytes())))
}

fn usage12() -> ChunkItem {
    Ok(StreamEvent::Usage(tollgate::Usage::from_counters(
        tollgate::Counter::Value(12),
        tollgate::Counter::Value(9),
        tollgate::Counter::Value(3),
        tollgate::Counter::Absent,
    )))
}

fn error_kind(item: Option<&ChunkItem>) -> Option<ErrorKind> {
    match item {
        Some(Err(e)) => Some(e.kind),
        _ => None,
    }
}

// proves: GW-5 (usage reported to the engine; chunk stripped unless the
// client asked), LC-3 ([DONE] is the only normal end)
#[test]
fn openai_stream_is_forwarded_byte_for_byte() {
    let parts = [ROLE, HELLO, KEEPALIVE, FINISH, USAGE, DONE];
    let stripped = collect(&parts, false);
    assert_eq!(
        stripped,
        vec![
            chunk(ROLE),
            chunk(HELLO),
            chunk(FINISH),
            usage12(),
            chunk(DONE)
        ]
    );
    let forwarded = collect(&parts, true);
    assert_eq!(
        forwarded,
        vec![
            chunk(ROLE),
            chunk(HELLO),
            chunk(FINISH),
            usage12(),
            chunk(USAGE),
            chunk(DONE)
        ]
    );
}

/// `bytes` cut at the given places (repeats and order do not matter), as
/// the upstream body's chunks.
fn split_at(bytes: &[u8], cuts: &[prop::sample::Index]) -> Vec<Result<Bytes, io::Error>> {
    let mut at: Vec<usize> = cuts.iter().map(|i| i.index(bytes.len() + 1)).collect();
    at.sort_unstable();
    at.dedup();
    let mut pieces = Vec::new();
    let mut start = 0;
    for cut in at.into_iter().chain([bytes.len()]) {
        pieces.push(Ok(Bytes::copy_from_slice(&bytes[start..cut])));
        start = cut;
    }
    pieces
}

proptest! {
    // Any split of the body gives the same events (the decoder is
    // incremental).
    // proves: GW-5
    #[test]
    fn splits_do_not_change_the_events(cuts in proptest::collection::vec(any::<prop::sample::Index>(), 0..8)) {
        let whole = [ROLE, HELLO, FINISH, USAGE, DONE].concat();
        let pieces = split_at(whole.as_bytes(), &cuts);
        let got = block_on(
            ChunkStream::new(stream::iter(pieces), false).collect::<Vec<_>>(),
        );
        prop_assert_eq!(got, vec![chunk(ROLE), chunk(HELLO), chunk(FINISH), usage12(), chunk(DONE)]);
    }
}

// proves: LC-4 (a declared error chunk is delivered once, then the stream
// ends with a typed error)
#[test]
fn declared_error_chunk_ends_the_stream() {
    let error = "data: {\"error\":{\"message\":\"The server is overloaded\",\"type\":\"server_error\",\"param\":null,\"code\":null}}\n\n";
    let items = collect(&[ROLE, error, HELLO, DONE], false);
    assert_eq!(items.len(), 2, "{items:?}");
    assert_eq!(items[0], chunk(ROLE));
    match &items[1] {
        Ok(StreamEvent::Error(bytes, err)) => {
            assert_eq!(bytes, &Bytes::from_static(error.as_bytes()));
            assert_eq!(err.kind, ErrorKind::Declared);
            assert_eq!(err.message, "The server is overloaded");
            assert!(!err.is_retryable());
        }
        other => panic!("expected a declared error, got {other:?}"),
    }

    // The `event: error` spelling of some compatible servers.
    let named = "event: error\ndata: {\"message\":\"quota exhausted\"}\n\n";
    let items = collect(&[ROLE, named, DONE], false);
    assert_eq!(items.len(), 2);
    match &items[1] {
        Ok(StreamEvent::Error(bytes, err)) => {
            assert_eq!(bytes, &Bytes::from_static(named.as_bytes()));
            assert_eq!(
                (err.kind, err.message.as_str()),
                (ErrorKind::Declared, "quota exhausted")
            );
        }
        other => panic!("expected a declared error, got {other:?}"),
    }
}

// proves: LC-3 (a body that ends or fails before [DONE] is never a normal
// end)
#[test]
fn early_ends_are_broken_streams() {
    // Ends between events.
    let items = collect(&[ROLE, HELLO], false);
    assert_eq!(&items[..2], &[chunk(ROLE), chunk(HELLO)]);
    assert_eq!(error_kind(items.get(2)), Some(ErrorKind::StreamBroken));
    assert_eq!(items.len(), 3);

    // Ends inside an event.
    let items = collect(&[ROLE, &HELLO[..40]], false);
    assert_eq!(items[0], chunk(ROLE));
    assert_eq!(error_kind(items.get(1)), Some(ErrorKind::StreamBroken));
    assert_eq!(items.len(), 2);

    // The body fails.
    let failing = stream::iter(vec![
        Ok(Bytes::from_static(ROLE.as_bytes())),
        Err(io::Error::new(
            io::ErrorKind::ConnectionReset,
            "reset by peer",
        )),
        Ok(Bytes::from_static(DONE.as_bytes())),
    ]);
    let items = block_on(ChunkStream::new(failing, false).collect::<Vec<_>>());
    assert_eq!(items.len(), 2);
    match &items[1] {
        Err(err) => {
            assert_eq!(err.kind, ErrorKind::StreamBroken);
            assert!(err.message.contains("reset by peer"), "{}", err.message);
        }
        other => panic!("expected a broken stream, got {other:?}"),
    }

    // An empty body.
    let items = collect(&[], false);
    assert_eq!(items.len(), 1);
    assert_eq!(error_kind(items.first()), Some(ErrorKind::StreamBroken));
}

// proves: Q-5 (usage seen before a break goes with the error, so the engine
// can still settle it)
#[test]
fn usage_before_a_break_travels_with_the_error() {
    let with_usage = "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"x\"}}],\"usage\":{\"total_tokens\":5}}\n\n";
    let items = collect(&[with_usage], false);
    assert_eq!(items[0], chunk(with_usage));
    match &items[1] {
        Err(err) => {
            assert_eq!(err.kind, ErrorKind::StreamBroken);
            assert_eq!(err.usage.total(), Some(5));
        }
        other => panic!("expected a broken stream, got {other:?}"),
    }
    // And at [DONE] it is reported as usage when no usage-only chunk came.
    let items = collect(&[with_usage, DONE], false);
    assert_eq!(
        items,
        vec![
            chunk(with_usage),
            Ok(StreamEvent::Usage(tollgate::Usage::known(5))),
            chunk(DONE)
        ]
    );
}

#[test]
fn protocol_violations_are_typed() {
    let items = collect(&[ROLE, "data: not json\n\n", DONE], false);
    assert_eq!(items.len(), 2);
    assert_eq!(error_kind(items.get(1)), Some(ErrorKind::Protocol));

    let items = collect(&["data: [1,2]\n\n", DONE], false);
    assert_eq!(error_kind(items.first()), Some(ErrorKind::Protocol));

    let big = format!("data: {{\"pad\":\"{}\"}}\n\n", "x".repeat(200));
    let stream = ChunkStream::with_decoder(
        body(&[ROLE, &big, DONE]),
        SseDecoder::with_max_event_size(100),
        false,
    );
    let items = block_on(stream.collect::<Vec<_>>());
    assert_eq!(items.len(), 1, "{items:?}");
    assert_eq!(error_kind(items.first()), Some(ErrorKind::Protocol));
}

// proves: GW-5, LC-4 (what the probe of an event's members decides, the
// same whether the event is relayed whole or decoded: `choices` that is
// not an array or null, or a member that is not valid JSON, is a protocol
// error; `choices` null or empty with `usage` is the usage chunk; `usage`
// or `error` null means absent; a non-object `usage` is unknown usage).
#[test]
fn event_members_are_judged_the_same_in_both_framings() {
    const USAGE: &str = r#""usage":{"prompt_tokens":9,"completion_tokens":3,"total_tokens":12}"#;
    let usage_only = |choices: &str| format!("data: {{{choices}{USAGE}}}\n\n");
    for framing in [false, true] {
        // CRLF line ends send the event through the decoder instead.
        let frame = |event: String| {
            if framing {
                event.replace('\n', "\r\n")
            } else {
                event
            }
        };
        let run = |event: String| collect(&[ROLE, &frame(event), &frame(DONE.to_owned())], false);

        for choices in ["", r#""choices":null,"#, r#""choices":[],"#] {
            let items = run(usage_only(choices));
            assert_eq!(
                items.get(1),
                Some(&usage12()),
                "{choices} framing {framing}: {items:?}"
            );
        }
        // With a choice, the usage rides on a content chunk: forwarded.
        let items = run(usage_only(r#""choices":[{"index":0}],"#));
        assert!(
            matches!(items.get(1), Some(Ok(StreamEvent::Chunk(_)))),
            "{items:?}"
        );

        for bad in [
            r#"data: {"choices":5}"#,
            r#"data: {"choices":{"a":1}}"#,
            r#"data: {"choices":[1,}"#,
            r#"data: {"usage":{"prompt_tokens":}}"#,
            // Values a whole parse refuses inside `usage` and `error`.
            r#"data: {"choices":[],"usage":{"total_tokens":1e400}}"#,
            r#"data: {"error":{"message":"x","code":1e400}}"#,
            r#"data: {"usage":{"note":"\ud800"}}"#,
        ] {
            let items = run(format!("{bad}\n\n"));
            assert_eq!(
                error_kind(items.get(1)),
                Some(ErrorKind::Protocol),
                "{bad}: {items:?}"
            );
        }

        let items = run(r#"data: {"choices":[],"usage":null,"error":null}"#.to_owned() + "\n\n");
        assert!(
            matches!(items.get(1), Some(Ok(StreamEvent::Chunk(_)))),
            "{items:?}"
        );
        // A repeated counter: the last one counts, as in every other path.
        let repeated = r#"data: {"choices":[],"usage":{"total_tokens":11,"prompt_tokens":9,"completion_tokens":3,"total_tokens":12}}"#;
        let items = run(repeated.to_owned() + "\n\n");
        assert_eq!(items.get(1), Some(&usage12()), "{items:?}");
        let items = run(r#"data: {"choices":[],"usage":7}"#.to_owned() + "\n\n");
        assert!(
            matches!(items.get(1), Some(Ok(StreamEvent::Usage(u))) if *u == tollgate::Usage::UNKNOWN),
            "{items:?}"
        );
        let items = run(r#"data: {"error":{"message":"overloaded"}}"#.to_owned() + "\n\n");
        match items.get(1) {
            Some(Ok(StreamEvent::Error(_, e))) => {
                assert!(e.message.contains("overloaded"), "{e:?}")
            }
            other => panic!("framing {framing}: {other:?}"),
        }
    }
}

// Nothing is read after the end, and the stream stays ended.
#[test]
fn the_stream_ends_once() {
    let mut stream = ChunkStream::new(body(&[DONE, ROLE]), false);
    block_on(async {
        assert_eq!(stream.next().await, Some(chunk(DONE)));
        assert!(stream.is_finished());
        assert_eq!(stream.next().await, None);
        assert_eq!(stream.next().await, None);
    });
}

/// A body mixing the canonical framing (relayed as is) with others (decoded
/// and re-encoded): a BOM, a keep-alive comment, CRLF line ends, an event
/// of two data lines, a named `message` event.
const MIXED: [&str; 9] = [
    "\u{feff}",
    ROLE,
    KEEPALIVE,
    "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"a\"}}]}\r\n\r\n",
    "data: {\"choices\":\ndata: [{\"index\":0}]}\n\n",
    "event: message\ndata: {\"x\":1}\n\n",
    HELLO,
    USAGE,
    DONE,
];

fn mixed_expected() -> Vec<ChunkItem> {
    vec![
        chunk(ROLE),
        chunk("data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"a\"}}]}\n\n"),
        chunk("data: {\"choices\":\ndata: [{\"index\":0}]}\n\n"),
        chunk("event: message\ndata: {\"x\":1}\n\n"),
        chunk(HELLO),
        usage12(),
        chunk(DONE),
    ]
}

proptest! {
    // The relay takes canonical events from the body as they are and
    // hands everything else to the decoder: at any split, and across the
    // switches between the two, the events are those of the decoder.
    // proves: GW-5, LC-3
    #[test]
    fn mixed_framings_relay_the_same_at_any_split(cuts in proptest::collection::vec(any::<prop::sample::Index>(), 0..12)) {
        let whole = MIXED.concat();
        let pieces = split_at(whole.as_bytes(), &cuts);
        let got = block_on(ChunkStream::new(stream::iter(pieces), false).collect::<Vec<_>>());
        prop_assert_eq!(got, mixed_expected());
    }
}

// proves: GW-5 (a stream fed one byte per chunk gives the same events)
#[test]
fn mixed_framings_one_byte_at_a_time() {
    let whole = MIXED.concat();
    let pieces: Vec<Result<Bytes, io::Error>> = whole
        .as_bytes()
        .iter()
        .map(|b| Ok(Bytes::copy_from_slice(std::slice::from_ref(b))))
        .collect();
    let got = block_on(ChunkStream::new(stream::iter(pieces), false).collect::<Vec<_>>());
    assert_eq!(got, mixed_expected());
}

// Canonical events are relayed without a copy: the chunks handed on are
// slices of the body's own buffer.
#[test]
fn canonical_events_are_slices_of_the_body() {
    let whole = Bytes::from([ROLE, HELLO, DONE].concat());
    let range = whole.as_ptr() as usize..whole.as_ptr() as usize + whole.len();
    let items = block_on(
        ChunkStream::new(stream::iter([Ok::<_, io::Error>(whole.clone())]), false)
            .collect::<Vec<_>>(),
    );
    assert_eq!(items.len(), 3);
    for item in &items[..2] {
        match item {
            Ok(StreamEvent::Chunk(c)) => {
                assert!(range.contains(&(c.as_ptr() as usize)), "copied: {c:?}");
            }
            other => panic!("expected a chunk, got {other:?}"),
        }
    }
}

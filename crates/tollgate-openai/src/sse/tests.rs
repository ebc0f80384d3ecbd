//! Decoder and encoder tests.

use std::time::Duration;

use bytes::Bytes;
use futures_util::StreamExt;
use proptest::prelude::*;

use super::*;
use crate::wire::{ChatCompletionChunk, Usage};

/// An OpenAI-shaped stream: role chunk, content chunks, a keep-alive
/// comment, the finish chunk, the usage chunk and `[DONE]`.
const OPENAI_STREAM: &str = concat!(
    "data: {\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"created\":1700000000,",
    "\"model\":\"gpt-4o-mini\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",",
    "\"content\":\"\"},\"finish_reason\":null}],\"usage\":null}\n\n",
    "data: {\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"created\":1700000000,",
    "\"model\":\"gpt-4o-mini\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hello\"},",
    "\"finish_reason\":null}],\"usage\":null}\n\n",
    ": keep-alive\n\n",
    "data: {\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"created\":1700000000,",
    "\"model\":\"gpt-4o-mini\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\" wörld ✓\"},",
    "\"finish_reason\":null}],\"usage\":null}\n\n",
    "data: {\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"created\":1700000000,",
    "\"model\":\"gpt-4o-mini\",\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}],",
    "\"usage\":null}\n\n",
    "data: {\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"created\":1700000000,",
    "\"model\":\"gpt-4o-mini\",\"choices\":[],\"usage\":{\"prompt_tokens\":9,",
    "\"completion_tokens\":3,\"total_tokens\":12,\"prompt_tokens_details\":{\"cached_tokens\":0}}}\n\n",
    "data: [DONE]\n\n",
);

/// Decodes `chunks` in order and finishes the stream.
fn decode_chunks<'a>(chunks: impl IntoIterator<Item = &'a [u8]>) -> Result<Vec<SseItem>, SseError> {
    let mut dec = SseDecoder::new();
    let mut out = Vec::new();
    for chunk in chunks {
        dec.push(chunk, &mut out)?;
    }
    if let Some(item) = dec.finish()? {
        out.push(item);
    }
    Ok(out)
}

fn decode_all(bytes: &[u8]) -> Result<Vec<SseItem>, SseError> {
    decode_chunks([bytes])
}

fn events(items: &[SseItem]) -> Vec<&SseEvent> {
    items
        .iter()
        .filter_map(|i| match i {
            SseItem::Event(e) => Some(e),
            SseItem::Done => None,
        })
        .collect()
}

fn with_line_endings(stream: &str, ending: &str) -> String {
    stream.replace('\n', ending)
}

// proves: GW-5 (the usage chunk is recognisable for stripping)
#[test]
fn openai_stream_decodes_to_chunks_usage_and_done() {
    let items = decode_all(OPENAI_STREAM.as_bytes()).expect("decode");
    assert_eq!(items.len(), 6);
    assert_eq!(items.last(), Some(&SseItem::Done));
    let chunks: Vec<ChatCompletionChunk> = events(&items)
        .iter()
        .map(|e| e.parse_json().expect("chunk json"))
        .collect();
    assert_eq!(
        chunks[0].choices[0].delta.role.as_deref(),
        Some("assistant")
    );
    assert_eq!(
        chunks[2].choices[0].delta.content.as_deref(),
        Some(" wörld ✓")
    );
    assert_eq!(chunks[3].choices[0].finish_reason.as_deref(), Some("stop"));
    assert!(chunks[4].is_usage_only());
    assert_eq!(
        chunks[4].usage.as_ref().and_then(Usage::known_total),
        Some(12)
    );
}

#[test]
fn every_two_way_split_gives_the_same_items() {
    let bytes = OPENAI_STREAM.as_bytes();
    let whole = decode_all(bytes).expect("decode");
    for cut in 0..=bytes.len() {
        let (a, b) = bytes.split_at(cut);
        assert_eq!(
            decode_chunks([a, b]).expect("decode"),
            whole,
            "cut at {cut}"
        );
    }
}

#[test]
fn byte_by_byte_gives_the_same_items() {
    let bytes = OPENAI_STREAM.as_bytes();
    let whole = decode_all(bytes).expect("decode");
    assert_eq!(
        decode_chunks(bytes.chunks(1)).expect("decode"),
        whole,
        "one byte at a time"
    );
}

#[test]
fn crlf_and_cr_line_endings_match_lf_at_every_split() {
    let whole = decode_all(OPENAI_STREAM.as_bytes()).expect("decode");
    for ending in ["\r\n", "\r"] {
        let stream = with_line_endings(OPENAI_STREAM, ending);
        let bytes = stream.as_bytes();
        assert_eq!(decode_all(bytes).expect("decode"), whole, "{ending:?}");
        // Includes every split between the CR and the LF of a CRLF.
        for cut in 0..=bytes.len() {
            let (a, b) = bytes.split_at(cut);
            assert_eq!(
                decode_chunks([a, b]).expect("decode"),
                whole,
                "{ending:?} cut {cut}"
            );
        }
    }
}

#[test]
fn cr_then_lf_in_the_next_chunk_is_one_line_break() {
    // `data: a` CR | LF `data: b` CRLF CRLF: one event "a\nb", not two.
    let items = decode_chunks([&b"data: a\r"[..], b"\ndata: b\r\n\r\n"]).expect("decode");
    assert_eq!(events(&items)[0].data, "a\nb");
    assert_eq!(items.len(), 1);
    // A lone CR followed by CR is a blank line.
    let items = decode_chunks([&b"data: a\r"[..], b"\r"]).expect("decode");
    assert_eq!(events(&items)[0].data, "a");
}

#[test]
fn mixed_line_endings_in_one_stream() {
    let items = decode_all(b"data: 1\rdata: 2\ndata: 3\r\n\r\ndata: x\n\r\n").expect("decode");
    let evs = events(&items);
    assert_eq!(evs[0].data, "1\n2\n3");
    assert_eq!(evs[1].data, "x");
}

// proves: GW-7 (comments are skipped without buffering)
#[test]
fn comments_are_ignored_even_when_longer_than_the_limit() {
    let mut dec = SseDecoder::with_max_event_size(16);
    let mut out = Vec::new();
    dec.push(b": ", &mut out).expect("push");
    dec.push(&[b'x'; 1000], &mut out)
        .expect("long comment is skipped, not buffered");
    dec.push(b"\ndata: ok\n:c\n\n", &mut out).expect("push");
    assert_eq!(dec.buffered_bytes(), 0);
    assert_eq!(out, vec![SseItem::Event(SseEvent::data("ok"))]);
    assert_eq!(dec.finish(), Ok(None));
}

#[test]
fn multi_line_data_and_colon_spacing() {
    let items = decode_all(
        concat!(
            "data: first\n",
            "data:second\n",
            "data:  third\n",
            "data\n",
            "data: with: colon\n",
            "\n"
        )
        .as_bytes(),
    )
    .expect("decode");
    assert_eq!(
        events(&items)[0].data,
        "first\nsecond\n third\n\nwith: colon"
    );
}

#[test]
fn event_id_and_retry_fields() {
    let mut dec = SseDecoder::new();
    let items = dec
        .decode(
            b"event: response.delta\nid: 7\nretry: 2500\ndata: {}\n\ndata: next\n\nretry: soon\nid: a\0b\ndata: z\n\n",
        )
        .expect("decode");
    let evs = events(&items);
    assert_eq!(evs[0].event.as_deref(), Some("response.delta"));
    assert_eq!(evs[0].id.as_deref(), Some("7"));
    assert_eq!(evs[0].retry, Some(Duration::from_millis(2500)));
    // The type does not carry over; the last id and retry persist.
    assert_eq!(evs[1].event, None);
    assert_eq!(evs[1].id, None);
    assert_eq!(dec.last_event_id(), Some("7"));
    assert_eq!(dec.retry(), Some(Duration::from_millis(2500)));
    // Invalid retry and an id with NUL are ignored.
    assert_eq!(evs[2].retry, None);
    assert_eq!(evs[2].id, None);
    // Unknown fields are ignored.
    let items = SseDecoder::new()
        .decode(b"foo: bar\ndata: x\n\n")
        .expect("decode");
    assert_eq!(items, vec![SseItem::Event(SseEvent::data("x"))]);
}

#[test]
fn events_without_data_are_not_dispatched_but_empty_data_is() {
    let items = SseDecoder::new()
        .decode(b"event: ping\n\nid: 1\n\ndata:\n\ndata\n\n\n\n")
        .expect("decode");
    assert_eq!(
        items,
        vec![
            SseItem::Event(SseEvent {
                id: None,
                ..SseEvent::data("")
            }),
            SseItem::Event(SseEvent::data("")),
        ]
    );
}

#[test]
fn done_sentinel_is_a_distinct_item() {
    let items = decode_all(b"data: [DONE]\n\ndata:[DONE] \n\nevent: error\ndata: [DONE]\n\n")
        .expect("decode");
    assert_eq!(items[0], SseItem::Done);
    assert_eq!(items[1], SseItem::Done);
    // With a non-default event type it is an ordinary event.
    assert_eq!(
        items[2],
        SseItem::Event(SseEvent::data("[DONE]").with_event("error"))
    );
}

#[test]
fn bom_at_stream_start_is_stripped_even_when_split() {
    let stream = b"\xEF\xBB\xBFdata: a\n\n";
    let whole = decode_all(stream).expect("decode");
    assert_eq!(whole, vec![SseItem::Event(SseEvent::data("a"))]);
    for cut in 0..=stream.len() {
        let (a, b) = stream.split_at(cut);
        assert_eq!(decode_chunks([a, b]).expect("decode"), whole, "cut {cut}");
    }
    assert_eq!(
        decode_chunks([&b"\xEF"[..], b"\xBB", b"\xBF", b"data: a\n\n"]).expect("decode"),
        whole
    );
    // Only one BOM, only at the start: a second one makes the field unknown.
    let items = decode_all(b"\xEF\xBB\xBF\xEF\xBB\xBFdata: a\n\n").expect("decode");
    assert!(items.is_empty());
    // A BOM prefix that is not a BOM is replayed as data bytes.
    let items = decode_all(b"\xEFdata: a\n\ndata: b\n\n").expect("decode");
    assert_eq!(items, vec![SseItem::Event(SseEvent::data("b"))]);
}

// proves: GW-7 (bounded memory per event)
#[test]
fn oversize_event_is_a_typed_error_and_the_decoder_stays_failed() {
    let mut dec = SseDecoder::with_max_event_size(32);
    let mut out = Vec::new();
    dec.push(b"data: small\n\n", &mut out).expect("fits");
    let err = dec
        .push(
            b"data: 0123456789\ndata: 0123456789\ndata: 0123456789\n",
            &mut out,
        )
        .expect_err("too large");
    assert_eq!(err, SseError::EventTooLarge { limit: 32 });
    assert_eq!(out, vec![SseItem::Event(SseEvent::data("small"))]);
    assert_eq!(dec.push(b"\n", &mut out), Err(err));
    assert_eq!(dec.finish(), Err(err));
    assert!(dec.buffered_bytes() <= 32);

    // One long line without any terminator is caught before it is buffered.
    let mut dec = SseDecoder::with_max_event_size(1024);
    let mut total = 0;
    let err = loop {
        match dec.push(&[b'd'; 100], &mut out) {
            Ok(()) => total += 100,
            Err(e) => break e,
        }
        assert!(total < 10_000, "no error");
    };
    assert_eq!(err, SseError::EventTooLarge { limit: 1024 });
    assert!(dec.buffered_bytes() <= 1024);
}

// Found by fuzzing: invalid UTF-8 in a field value grows when decoded
// lossily (one byte becomes a 3-byte U+FFFD); the limit must still hold.
// proves: GW-7
#[test]
fn lossy_decoding_cannot_push_the_buffer_over_the_limit() {
    for field in [&b"event: "[..], b"data: "] {
        let mut line = field.to_vec();
        line.extend_from_slice(&[0xCB; 20]);
        line.push(b'\n');
        let mut dec = SseDecoder::with_max_event_size(40);
        let mut out = Vec::new();
        let result = dec.push(&line, &mut out);
        assert_eq!(result, Err(SseError::EventTooLarge { limit: 40 }));
        assert!(dec.buffered_bytes() <= 40);
    }
}

#[test]
fn many_small_events_never_hit_the_limit() {
    let mut dec = SseDecoder::with_max_event_size(32);
    let items = dec
        .decode("data: 0123456789\n\n".repeat(100).as_bytes())
        .expect("each event is small");
    assert_eq!(items.len(), 100);
}

// proves: LC-3 (a cut stream is a typed error, never a silent end)
#[test]
fn end_of_stream_inside_an_event_is_truncated() {
    for partial in [
        &b"data: {\"a\":"[..],
        b"data: a\n",
        b"data: a\n\ndata: b",
        b"data: a\r",
    ] {
        let mut dec = SseDecoder::new();
        let mut out = Vec::new();
        dec.push(partial, &mut out).expect("push");
        assert!(
            matches!(dec.finish(), Err(SseError::Truncated { pending_bytes }) if pending_bytes > 0),
            "{partial:?}"
        );
    }
    // Clean ends: after a blank line, inside a comment, or after fields
    // that carry no data.
    for clean in [&b""[..], b"data: a\n\n", b": bye", b"event: x\n", b"\n\n"] {
        let mut dec = SseDecoder::new();
        let mut out = Vec::new();
        dec.push(clean, &mut out).expect("push");
        assert_eq!(dec.finish(), Ok(None), "{clean:?}");
    }
}

#[test]
fn unterminated_done_is_still_done() {
    for tail in [&b"data: [DONE]"[..], b"data: [DONE]\n", b"data: [DONE]\r\n"] {
        let mut dec = SseDecoder::new();
        let mut out = Vec::new();
        dec.push(b"data: x\n\n", &mut out).expect("push");
        dec.push(tail, &mut out).expect("push");
        assert_eq!(dec.finish(), Ok(Some(SseItem::Done)), "{tail:?}");
    }
}

#[test]
fn finish_resets_the_decoder() {
    let mut dec = SseDecoder::new();
    dec.decode(b"data: a").expect("push");
    assert!(dec.finish().is_err());
    assert_eq!(
        dec.decode(b"data: b\n\n").expect("decode"),
        vec![SseItem::Event(SseEvent::data("b"))]
    );
}

#[test]
fn invalid_utf8_is_replaced_not_rejected() {
    let items = decode_all(b"data: a\xFFb\n\n").expect("decode");
    assert_eq!(events(&items)[0].data, "a\u{FFFD}b");
}

#[test]
fn encoder_writes_the_wire_form() {
    assert_eq!(&encode_data("hi")[..], b"data: hi\n\n");
    assert_eq!(
        &encode_data("a\nb\r\nc\rd")[..],
        b"data: a\ndata: b\ndata: c\ndata: d\n\n"
    );
    assert_eq!(&encode_data("")[..], b"data: \n\n");
    assert_eq!(&SseItem::Done.encode()[..], DONE_FRAME);
    assert_eq!(&encode_comment("ping")[..], b": ping\n\n");
    assert_eq!(
        &encode_json(&serde_json::json!({"a": "x\ny"})).expect("json")[..],
        b"data: {\"a\":\"x\\ny\"}\n\n"
    );
    let ev = SseEvent::data("d")
        .with_event("bad\nname")
        .with_id("1\r2\u{0}3")
        .with_retry(Duration::from_millis(1500));
    assert_eq!(
        &ev.encode()[..],
        b"event: badname\nid: 123\nretry: 1500\ndata: d\n\n"
    );
    let chunk = ChatCompletionChunk::new("c", 1, "m").with_usage(Usage::from_counts(1, 2));
    let ev = SseEvent::json(&chunk).expect("json");
    let back: ChatCompletionChunk = ev.parse_json().expect("parse");
    assert_eq!(back, chunk);
}

#[test]
fn encoder_output_decodes_to_the_same_events() {
    let evs = vec![
        SseEvent::data("plain"),
        SseEvent::data(" leading space and trailing newline\n"),
        SseEvent::data("multi\nline\n\ndata"),
        SseEvent::data("").with_event("e").with_id("9"),
        SseEvent::data("r").with_retry(Duration::from_secs(3)),
    ];
    let mut wire = Vec::new();
    for ev in &evs {
        ev.encode_into(&mut wire);
    }
    wire.extend_from_slice(DONE_FRAME);
    let mut expected: Vec<SseItem> = evs.into_iter().map(SseItem::Event).collect();
    expected.push(SseItem::Done);
    assert_eq!(decode_all(&wire).expect("decode"), expected);
}

// proves: LC-3
#[tokio::test]
async fn stream_adapter_yields_items_and_reports_truncation() {
    let chunks: Vec<Result<Bytes, std::io::Error>> = OPENAI_STREAM
        .as_bytes()
        .chunks(7)
        .map(|c| Ok(Bytes::copy_from_slice(c)))
        .collect();
    let items: Vec<_> = SseStream::new(futures_util::stream::iter(chunks), SseDecoder::new())
        .collect()
        .await;
    let items: Vec<SseItem> = items.into_iter().map(|r| r.expect("item")).collect();
    assert_eq!(items, decode_all(OPENAI_STREAM.as_bytes()).expect("decode"));

    // Cut inside the second event: one event, then a typed error, then end.
    let cut: Vec<Result<Bytes, std::io::Error>> =
        vec![Ok(Bytes::copy_from_slice(&OPENAI_STREAM.as_bytes()[..300]))];
    let mut stream = SseStream::new(futures_util::stream::iter(cut), SseDecoder::new());
    assert!(matches!(stream.next().await, Some(Ok(SseItem::Event(_)))));
    assert!(matches!(
        stream.next().await,
        Some(Err(SseStreamError::Sse(SseError::Truncated { .. })))
    ));
    assert!(stream.next().await.is_none());

    // A body error is passed through and ends the stream.
    let failing: Vec<Result<Bytes, std::io::Error>> = vec![
        Ok(Bytes::from_static(b"data: a\n\n")),
        Err(std::io::Error::other("reset")),
        Ok(Bytes::from_static(b"data: b\n\n")),
    ];
    let mut stream = SseStream::new(futures_util::stream::iter(failing), SseDecoder::new());
    assert!(matches!(stream.next().await, Some(Ok(_))));
    assert!(matches!(
        stream.next().await,
        Some(Err(SseStreamError::Body(_)))
    ));
    assert!(stream.next().await.is_none());

    // Oversize: the complete events before it come out first.
    let big: Vec<Result<Bytes, std::io::Error>> = vec![Ok(Bytes::from_static(
        b"data: a\n\ndata: 0123456789abcdef\n\n",
    ))];
    let mut stream = SseStream::new(
        futures_util::stream::iter(big),
        SseDecoder::with_max_event_size(8),
    );
    assert!(matches!(stream.next().await, Some(Ok(_))));
    assert!(matches!(
        stream.next().await,
        Some(Err(SseStreamError::Sse(SseError::EventTooLarge {
            limit: 8
        })))
    ));
    assert!(stream.next().await.is_none());
}

/// Splits `bytes` at the given (unsorted, possibly out-of-range) cut points.
fn split_at_points(bytes: &[u8], cuts: &[usize]) -> Vec<Vec<u8>> {
    let mut points: Vec<usize> = cuts.iter().map(|c| c % (bytes.len() + 1)).collect();
    points.sort_unstable();
    let mut pieces = Vec::new();
    let mut start = 0;
    for p in points {
        pieces.push(bytes[start..p].to_vec());
        start = p;
    }
    pieces.push(bytes[start..].to_vec());
    pieces
}

fn arb_event() -> impl Strategy<Value = SseEvent> {
    (
        proptest::option::of("[a-z.]{1,12}"),
        "[^\r]{0,40}",
        proptest::option::of("[a-zA-Z0-9]{0,8}"),
        proptest::option::of(0u64..100_000),
    )
        .prop_map(|(event, data, id, retry)| SseEvent {
            event: event.filter(|e| e != "message"),
            data,
            id,
            retry: retry.map(Duration::from_millis),
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn arbitrary_bytes_never_panic(
        bytes in proptest::collection::vec(any::<u8>(), 0..600),
        cuts in proptest::collection::vec(any::<usize>(), 0..6),
        limit in 0usize..200,
    ) {
        let mut dec = SseDecoder::with_max_event_size(limit);
        let mut out = Vec::new();
        for piece in split_at_points(&bytes, &cuts) {
            if dec.push(&piece, &mut out).is_err() {
                break;
            }
            prop_assert!(dec.buffered_bytes() <= limit);
        }
        let _ = dec.finish();
    }

    #[test]
    fn sse_like_bytes_never_panic_and_splits_agree(
        lines in proptest::collection::vec(
            "(data|event|id|retry|:|data:|\u{FEFF}data| )[ -~]{0,10}(\n|\r|\r\n|\n\n)", 0..30),
        cuts in proptest::collection::vec(any::<usize>(), 0..8),
    ) {
        let bytes = lines.concat().into_bytes();
        let whole = decode_all(&bytes);
        let pieces = split_at_points(&bytes, &cuts);
        let split = decode_chunks(pieces.iter().map(Vec::as_slice));
        prop_assert_eq!(whole, split);
    }

    // proves: LC-3 (the parser half: a valid stream decodes identically
    // however it is split, so no event is lost or invented at a boundary)
    #[test]
    fn any_split_of_a_valid_stream_gives_the_same_events(
        evs in proptest::collection::vec(arb_event(), 0..12),
        ending in prop_oneof![Just("\n"), Just("\r\n"), Just("\r")],
        cuts in proptest::collection::vec(any::<usize>(), 0..10),
        done in any::<bool>(),
    ) {
        let mut wire = Vec::new();
        for ev in &evs {
            ev.encode_into(&mut wire);
        }
        if done {
            wire.extend_from_slice(DONE_FRAME);
        }
        let text = String::from_utf8(wire).expect("utf8");
        let bytes = text.replace('\n', ending).into_bytes();
        let mut expected: Vec<SseItem> = evs.into_iter().map(|ev| {
            if ev.event.is_none() && ev.data.trim() == "[DONE]" {
                SseItem::Done
            } else {
                SseItem::Event(ev)
            }
        }).collect();
        if done {
            expected.push(SseItem::Done);
        }
        let pieces = split_at_points(&bytes, &cuts);
        let got = decode_chunks(pieces.iter().map(Vec::as_slice)).expect("valid stream");
        prop_assert_eq!(got, expected);
    }
}

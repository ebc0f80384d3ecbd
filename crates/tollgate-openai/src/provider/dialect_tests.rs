//! Stream adapter tests for the Responses and Anthropic Messages dialects:
//! bytes fed directly, split anywhere; and the usage of their one-shot
//! bodies.

use std::io;

use bytes::Bytes;
use futures_util::{StreamExt, stream};
use proptest::prelude::*;
use serde_json::json;
use tollgate::lifecycle::{ErrorKind, StreamEvent};
use tollgate::{Counter, Usage};

use super::client::one_shot_usage;
use super::dialect::{anthropic_usage, usage_of};
use super::request::Endpoint;
use super::stream::{ChunkItem, ChunkStream};

// ---- Responses (OpenAI `POST /v1/responses`, stream: true) ----

const R_CREATED: &str = "event: response.created\ndata: {\"type\":\"response.created\",\"sequence_number\":0,\"response\":{\"id\":\"resp_1\",\"object\":\"response\",\"status\":\"in_progress\",\"output\":[],\"usage\":null,\"error\":null}}\n\n";
const R_ITEM: &str = "event: response.output_item.added\ndata: {\"type\":\"response.output_item.added\",\"sequence_number\":1,\"output_index\":0,\"item\":{\"type\":\"message\",\"id\":\"msg_1\",\"status\":\"in_progress\",\"role\":\"assistant\",\"content\":[]}}\n\n";
const R_DELTA: &str = "event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"sequence_number\":2,\"item_id\":\"msg_1\",\"output_index\":0,\"content_index\":0,\"delta\":\"H\u{e9}llo \u{2713}\"}\n\n";
const R_TEXT_DONE: &str = "event: response.output_text.done\ndata: {\"type\":\"response.output_text.done\",\"sequence_number\":3,\"item_id\":\"msg_1\",\"output_index\":0,\"content_index\":0,\"text\":\"H\u{e9}llo \u{2713}\"}\n\n";
const R_COMPLETED: &str = "event: response.completed\ndata: {\"type\":\"response.completed\",\"sequence_number\":4,\"response\":{\"id\":\"resp_1\",\"object\":\"response\",\"status\":\"completed\",\"output\":[{\"type\":\"message\",\"id\":\"msg_1\",\"role\":\"assistant\",\"content\":[{\"type\":\"output_text\",\"text\":\"H\u{e9}llo \u{2713}\",\"annotations\":[]}]}],\"usage\":{\"input_tokens\":11,\"input_tokens_details\":{\"cached_tokens\":4},\"output_tokens\":5,\"output_tokens_details\":{\"reasoning_tokens\":0},\"total_tokens\":16},\"error\":null,\"incomplete_details\":null}}\n\n";
const R_INCOMPLETE: &str = "event: response.incomplete\ndata: {\"type\":\"response.incomplete\",\"sequence_number\":4,\"response\":{\"id\":\"resp_1\",\"status\":\"incomplete\",\"incomplete_details\":{\"reason\":\"max_output_tokens\"},\"usage\":{\"input_tokens\":11,\"output_tokens\":2,\"total_tokens\":13}}}\n\n";

const RESPONSES: [&str; 5] = [R_CREATED, R_ITEM, R_DELTA, R_TEXT_DONE, R_COMPLETED];

// ---- Anthropic Messages (`POST /v1/messages`, stream: true) ----

const M_START: &str = "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_1\",\"type\":\"message\",\"role\":\"assistant\",\"content\":[],\"model\":\"claude-x\",\"stop_reason\":null,\"stop_sequence\":null,\"usage\":{\"input_tokens\":20,\"cache_creation_input_tokens\":100,\"cache_read_input_tokens\":50,\"output_tokens\":1}}}\n\n";
const M_BLOCK_START: &str = "event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n";
const M_PING: &str = "event: ping\ndata: {\"type\": \"ping\"}\n\n";
const M_TEXT: &str = "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"H\u{e9}llo\"}}\n\n";
const M_BLOCK_STOP: &str =
    "event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":0}\n\n";
/// A first `message_delta`: cumulative output so far.
const M_DELTA_1: &str = "event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":null},\"usage\":{\"output_tokens\":7}}\n\n";
/// The last `message_delta`, as newer API versions send it: the input
/// counters repeated (one as `null`), the cumulative output.
const M_DELTA_2: &str = "event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\",\"stop_sequence\":null},\"usage\":{\"input_tokens\":20,\"cache_creation_input_tokens\":null,\"cache_read_input_tokens\":50,\"output_tokens\":15}}\n\n";
const M_STOP: &str = "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n";

const MESSAGES: [&str; 8] = [
    M_START,
    M_BLOCK_START,
    M_PING,
    M_TEXT,
    M_BLOCK_STOP,
    M_DELTA_1,
    M_DELTA_2,
    M_STOP,
];

use super::tests::{block_on, body};

fn collect(endpoint: Endpoint, parts: &[&str]) -> Vec<ChunkItem> {
    let stream = ChunkStream::new(body(parts), false).with_endpoint(endpoint);
    block_on(stream.collect::<Vec<_>>())
}

fn chunk(s: &str) -> ChunkItem {
    Ok(StreamEvent::Chunk(Bytes::copy_from_slice(s.as_bytes())))
}

fn chunks(parts: &[&str]) -> Vec<ChunkItem> {
    parts.iter().map(|p| chunk(p)).collect()
}

fn usage(total: Counter, input: Counter, output: Counter, cached: Counter) -> Usage {
    Usage::from_counters(total, input, output, cached)
}

/// The Responses stream's usage: 11 in (4 of them cached), 5 out, 16.
fn responses_usage() -> Usage {
    responses_usage_with_reasoning(0)
}

/// [`responses_usage`] with `reasoning` of the 5 output tokens reasoning.
fn responses_usage_with_reasoning(reasoning: u64) -> Usage {
    usage(
        Counter::Value(16),
        Counter::Value(11),
        Counter::Value(5),
        Counter::Value(4),
    )
    .with_parts(Some(tollgate::Parts {
        cached_input: 4,
        reasoning,
        ..tollgate::Parts::plain(7, 5 - reasoning)
    }))
}

/// The Messages stream's usage: input 20 + 100 cache writes, output 15
/// (the last `message_delta`), 50 cache reads as telemetry.
fn messages_usage() -> Usage {
    usage(
        Counter::Absent,
        Counter::Value(120),
        Counter::Value(15),
        Counter::Value(50),
    )
    .with_parts(Some(tollgate::Parts {
        cached_input: 50,
        cache_write: 100,
        ..tollgate::Parts::plain(20, 15)
    }))
}

fn usage_reports(items: &[ChunkItem]) -> usize {
    items
        .iter()
        .filter(|i| matches!(i, Ok(StreamEvent::Usage(_))))
        .count()
}

fn broken(item: Option<&ChunkItem>) -> &tollgate::lifecycle::ProviderError {
    match item {
        Some(Err(err)) => err,
        other => panic!("expected an error, got {other:?}"),
    }
}

// proves: WIRE-1 (every Responses event is forwarded in order; usage is
// reported once, from `response.completed`, with the provider's numbers)
#[test]
fn responses_stream_forwards_every_event_and_reports_usage_once() {
    let items = collect(Endpoint::Responses, &RESPONSES);
    let mut expected = chunks(&RESPONSES[..4]);
    expected.push(Ok(StreamEvent::Usage(responses_usage())));
    expected.push(chunk(R_COMPLETED));
    assert_eq!(items, expected);
    assert_eq!(usage_reports(&items), 1);
    assert_eq!(responses_usage().total(), Some(16));
    assert_eq!(responses_usage().cached(), Some(4));

    // `response.incomplete` is a normal end too, with its usage.
    let items = collect(Endpoint::Responses, &[R_CREATED, R_DELTA, R_INCOMPLETE]);
    assert_eq!(
        items,
        vec![
            chunk(R_CREATED),
            chunk(R_DELTA),
            Ok(StreamEvent::Usage(usage(
                Counter::Value(13),
                Counter::Value(11),
                Counter::Value(2),
                Counter::Absent
            ))),
            chunk(R_INCOMPLETE),
        ]
    );
}

// proves: Q-5 (a terminal event without valid usage reports unknown usage,
// never zero)
#[test]
fn responses_terminal_without_usage_reports_unknown() {
    for terminal in [
        "event: response.completed\ndata: {\"type\":\"response.completed\",\"response\":{\"status\":\"completed\"}}\n\n",
        "event: response.completed\ndata: {\"type\":\"response.completed\",\"response\":{\"usage\":null}}\n\n",
        "event: response.completed\ndata: {\"type\":\"response.completed\",\"response\":{\"usage\":{\"input_tokens\":-1,\"output_tokens\":3}}}\n\n",
        "event: response.completed\ndata: {\"type\":\"response.completed\",\"response\":\"odd\"}\n\n",
    ] {
        let items = collect(Endpoint::Responses, &[R_CREATED, terminal]);
        assert_eq!(items.len(), 3, "{items:?}");
        assert_eq!(items[0], chunk(R_CREATED));
        match &items[1] {
            Ok(StreamEvent::Usage(u)) => {
                assert_eq!(u.total(), None, "{terminal}");
                assert!(!u.is_known());
            }
            other => panic!("expected usage, got {other:?}"),
        }
        assert_eq!(items[2], chunk(terminal));
    }
}

// proves: WIRE-3, Q-12 (every Messages event is forwarded in order; usage
// is reported once at `message_stop`: input includes cache writes, output
// is the last cumulative `message_delta` count, cache reads are telemetry)
#[test]
fn messages_stream_forwards_every_event_and_reports_usage_once() {
    let items = collect(Endpoint::Messages, &MESSAGES);
    let mut expected = chunks(&MESSAGES[..7]);
    expected.push(Ok(StreamEvent::Usage(messages_usage())));
    expected.push(chunk(M_STOP));
    assert_eq!(items, expected);
    assert_eq!(usage_reports(&items), 1);
    let reported = messages_usage();
    assert_eq!(
        (reported.input(), reported.output(), reported.total()),
        (Some(120), Some(15), Some(135))
    );
    assert_eq!(reported.cached(), Some(50));
}

// proves: WIRE-1, WIRE-3, LC-3 (the terminal event is the stream's normal
// end: nothing after it is forwarded, and the stream stays ended)
#[test]
fn the_terminal_event_ends_the_stream() {
    let items = collect(
        Endpoint::Responses,
        &[R_CREATED, R_COMPLETED, R_DELTA, R_COMPLETED],
    );
    assert_eq!(
        items,
        vec![
            chunk(R_CREATED),
            Ok(StreamEvent::Usage(responses_usage())),
            chunk(R_COMPLETED)
        ]
    );
    let items = collect(Endpoint::Messages, &[M_START, M_STOP, M_TEXT, M_STOP]);
    assert_eq!(items.len(), 3, "{items:?}");
    assert_eq!(items.last(), Some(&chunk(M_STOP)));

    let mut stream =
        ChunkStream::new(body(&[M_STOP, M_PING]), false).with_endpoint(Endpoint::Messages);
    block_on(async {
        assert_eq!(
            stream.next().await,
            Some(Ok(StreamEvent::Usage(Usage::UNKNOWN)))
        );
        assert_eq!(stream.next().await, Some(chunk(M_STOP)));
        assert!(stream.is_finished());
        assert_eq!(stream.next().await, None);
        assert_eq!(stream.next().await, None);
    });
}

// proves: LC-3 (a body that ends or fails before the terminal event is
// StreamBroken naming that event, never a normal end), Q-5 (the usage
// seen so far goes with the error)
#[test]
fn a_cut_before_the_terminal_event_is_a_broken_stream() {
    // Responses, between events.
    let items = collect(Endpoint::Responses, &[R_CREATED, R_DELTA]);
    assert_eq!(&items[..2], &chunks(&[R_CREATED, R_DELTA])[..]);
    let err = broken(items.get(2));
    assert_eq!(err.kind, ErrorKind::StreamBroken);
    assert!(
        err.message.contains("response.completed"),
        "{}",
        err.message
    );
    assert!(!err.message.contains("[DONE]"), "{}", err.message);
    assert_eq!(err.usage, Usage::UNKNOWN);
    assert_eq!(items.len(), 3);

    // Responses, inside the terminal event.
    let items = collect(Endpoint::Responses, &[R_CREATED, &R_COMPLETED[..60]]);
    assert_eq!(items.len(), 2, "{items:?}");
    let err = broken(items.get(1));
    assert_eq!(err.kind, ErrorKind::StreamBroken);
    assert!(!err.message.contains("[DONE]"), "{}", err.message);

    // Messages, after the usage of `message_start` and a `message_delta`.
    let items = collect(Endpoint::Messages, &MESSAGES[..6]);
    assert_eq!(&items[..6], &chunks(&MESSAGES[..6])[..]);
    let err = broken(items.get(6));
    assert_eq!(err.kind, ErrorKind::StreamBroken);
    assert!(err.message.contains("message_stop"), "{}", err.message);
    assert_eq!(
        err.usage,
        usage(
            Counter::Absent,
            Counter::Value(120),
            Counter::Value(7),
            Counter::Value(50)
        )
        .with_parts(Some(tollgate::Parts {
            cached_input: 50,
            cache_write: 100,
            ..tollgate::Parts::plain(20, 7)
        }))
    );
    assert_eq!(items.len(), 7);
    assert_eq!(usage_reports(&items), 0);

    // Messages, inside `message_stop` (its blank line missing).
    let items = collect(
        Endpoint::Messages,
        &[M_START, M_STOP.trim_end_matches('\n')],
    );
    assert_eq!(items.len(), 2, "{items:?}");
    let err = broken(items.get(1));
    assert_eq!(err.kind, ErrorKind::StreamBroken);
    assert_eq!(err.usage.input(), Some(120));
    // `message_start`'s output count is a placeholder: unknown until a
    // `message_delta` reports it.
    assert_eq!(err.usage.output(), None);
    assert_eq!(err.usage.total(), None);

    // The body fails.
    let failing = stream::iter(vec![
        Ok(Bytes::from_static(M_START.as_bytes())),
        Err(io::Error::new(
            io::ErrorKind::ConnectionReset,
            "reset by peer",
        )),
        Ok(Bytes::from_static(M_STOP.as_bytes())),
    ]);
    let items = block_on(
        ChunkStream::new(failing, false)
            .with_endpoint(Endpoint::Messages)
            .collect::<Vec<_>>(),
    );
    assert_eq!(items.len(), 2);
    let err = broken(items.get(1));
    assert_eq!(err.kind, ErrorKind::StreamBroken);
    assert!(err.message.contains("reset by peer"), "{}", err.message);
    assert!(err.message.contains("message_stop"), "{}", err.message);
    assert_eq!(err.usage.input(), Some(120));

    // An empty body.
    for endpoint in [Endpoint::Responses, Endpoint::Messages] {
        let items = collect(endpoint, &[]);
        assert_eq!(items.len(), 1);
        assert_eq!(broken(items.first()).kind, ErrorKind::StreamBroken);
    }
}

fn declared(item: Option<&ChunkItem>) -> (&Bytes, &tollgate::lifecycle::ProviderError) {
    match item {
        Some(Ok(StreamEvent::Error(frame, err))) => (frame, err),
        other => panic!("expected a declared error, got {other:?}"),
    }
}

// proves: LC-4 (a declared error event is delivered once, inside
// StreamEvent::Error, then the stream ends; usage it carries, or seen
// before it, goes with it)
#[test]
fn error_events_end_the_stream() {
    // Responses `error` event.
    let error = "event: error\ndata: {\"type\":\"error\",\"code\":\"server_error\",\"message\":\"The server had an error\",\"param\":null,\"sequence_number\":3}\n\n";
    let items = collect(
        Endpoint::Responses,
        &[R_CREATED, error, R_DELTA, R_COMPLETED],
    );
    assert_eq!(items.len(), 2, "{items:?}");
    assert_eq!(items[0], chunk(R_CREATED));
    let (frame, err) = declared(items.get(1));
    assert_eq!(frame, &Bytes::from_static(error.as_bytes()));
    assert_eq!(
        (err.kind, err.message.as_str()),
        (ErrorKind::Declared, "The server had an error")
    );
    assert_eq!(err.usage, Usage::UNKNOWN);

    // `response.failed`, with its usage.
    let failed = "event: response.failed\ndata: {\"type\":\"response.failed\",\"response\":{\"status\":\"failed\",\"error\":{\"code\":\"server_error\",\"message\":\"Something went wrong\"},\"usage\":{\"input_tokens\":11,\"output_tokens\":1,\"total_tokens\":12}}}\n\n";
    let items = collect(Endpoint::Responses, &[R_CREATED, R_DELTA, failed, R_DELTA]);
    assert_eq!(items.len(), 3, "{items:?}");
    let (frame, err) = declared(items.get(2));
    assert_eq!(frame, &Bytes::from_static(failed.as_bytes()));
    assert_eq!(
        (err.kind, err.message.as_str()),
        (ErrorKind::Declared, "Something went wrong")
    );
    assert_eq!(err.usage.total(), Some(12));
    assert_eq!(usage_reports(&items), 0);

    // `response.failed` without usage.
    let failed = "event: response.failed\ndata: {\"type\":\"response.failed\",\"response\":{\"error\":null,\"usage\":null}}\n\n";
    let items = collect(Endpoint::Responses, &[failed]);
    let (_, err) = declared(items.first());
    assert_eq!(err.kind, ErrorKind::Declared);
    assert_eq!(err.usage, Usage::UNKNOWN);

    // Anthropic `error` event mid-stream: the usage seen so far goes with
    // it.
    let overloaded = "event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\",\"message\":\"Overloaded\"}}\n\n";
    let items = collect(
        Endpoint::Messages,
        &[M_START, M_TEXT, overloaded, M_DELTA_2, M_STOP],
    );
    assert_eq!(items.len(), 3, "{items:?}");
    let (frame, err) = declared(items.get(2));
    assert_eq!(frame, &Bytes::from_static(overloaded.as_bytes()));
    assert_eq!(
        (err.kind, err.message.as_str()),
        (ErrorKind::Declared, "Overloaded")
    );
    assert_eq!(err.usage.input(), Some(120));
    // `message_start`'s output count is a placeholder: unknown until a
    // `message_delta` reports it.
    assert_eq!(err.usage.output(), None);
    assert_eq!(err.usage.total(), None);
    assert_eq!(usage_reports(&items), 0);

    // An error named only by the SSE event, or only by an `error` member.
    for (endpoint, event) in [
        (
            Endpoint::Messages,
            "event: error\ndata: {\"message\":\"quota\"}\n\n",
        ),
        (
            Endpoint::Responses,
            "data: {\"error\":{\"message\":\"quota\"}}\n\n",
        ),
    ] {
        let items = collect(endpoint, &[event, R_COMPLETED, M_STOP]);
        assert_eq!(items.len(), 1, "{items:?}");
        let (_, err) = declared(items.first());
        assert_eq!(
            (err.kind, err.message.as_str()),
            (ErrorKind::Declared, "quota")
        );
    }
}

// proves: LC-3 (an event that is not a JSON object, or `[DONE]` where the
// dialect has none, ends the stream with a typed Protocol error)
#[test]
fn protocol_violations_are_typed() {
    for endpoint in [Endpoint::Responses, Endpoint::Messages] {
        for bad in [
            "event: response.created\ndata: not json\n\n",
            "event: ping\ndata: [1,2]\n\n",
            "data: \"text\"\n\n",
            "data: [DONE]\n\n",
            "event: message\ndata: [DONE]\n\n",
        ] {
            let items = collect(endpoint, &[bad, R_COMPLETED, M_STOP]);
            assert_eq!(items.len(), 1, "{endpoint:?} {bad:?}: {items:?}");
            assert_eq!(
                broken(items.first()).kind,
                ErrorKind::Protocol,
                "{endpoint:?} {bad:?}"
            );
        }
        // An unterminated [DONE] at the body's end.
        let items = collect(endpoint, &[R_CREATED, "data: [DONE]"]);
        assert_eq!(items.len(), 2, "{items:?}");
        assert_eq!(broken(items.get(1)).kind, ErrorKind::Protocol);
    }
    // Usage seen before the violation goes with it (SPEC Q-5).
    let items = collect(Endpoint::Messages, &[M_START, "data: nope\n\n"]);
    let err = broken(items.get(1));
    assert_eq!(err.kind, ErrorKind::Protocol);
    assert_eq!(err.usage.input(), Some(120));
}

// proves: GW-5, LC-3 (chat stays the default dialect, unchanged by the
// endpoint setting: usage chunk stripped and [DONE] the only normal end,
// even after a Responses terminal event)
#[test]
fn chat_is_the_default_dialect() {
    let chat = [
        "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"a\"}}]}\n\n",
        "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":9,\"completion_tokens\":3,\"total_tokens\":12}}\n\n",
        "data: [DONE]\n\n",
    ];
    let default = block_on(ChunkStream::new(body(&chat), false).collect::<Vec<_>>());
    assert_eq!(default.len(), 3, "{default:?}");
    for endpoint in [Endpoint::ChatCompletions, Endpoint::Embeddings] {
        assert_eq!(collect(endpoint, &chat), default);
    }
    // Chat does not end at a Responses terminal event.
    let items = collect(Endpoint::ChatCompletions, &[R_COMPLETED]);
    assert_eq!(items.len(), 2);
    assert_eq!(items[0], chunk(R_COMPLETED));
    assert_eq!(broken(items.get(1)).kind, ErrorKind::StreamBroken);
}

// Canonical named events are relayed without a copy: the chunks handed on
// are slices of the body's own buffer.
#[test]
fn canonical_named_events_are_slices_of_the_body() {
    for (endpoint, parts) in [
        (Endpoint::Responses, &RESPONSES[..]),
        (Endpoint::Messages, &MESSAGES[..]),
    ] {
        let whole = Bytes::from(parts.concat());
        let range = whole.as_ptr() as usize..whole.as_ptr() as usize + whole.len();
        let items = block_on(
            ChunkStream::new(stream::iter([Ok::<_, io::Error>(whole.clone())]), false)
                .with_endpoint(endpoint)
                .collect::<Vec<_>>(),
        );
        assert_eq!(items.len(), parts.len() + 1);
        for item in &items {
            match item {
                Ok(StreamEvent::Chunk(c)) => {
                    assert!(range.contains(&(c.as_ptr() as usize)), "copied: {c:?}");
                }
                Ok(StreamEvent::Usage(_)) => {}
                other => panic!("expected a chunk, got {other:?}"),
            }
        }
    }
}

/// A Responses body mixing canonical events (relayed as is) with other
/// framings (decoded and re-encoded): a BOM, keep-alives, CRLF line ends,
/// `data:` without the space, an event of two data lines, an `id:`, an
/// event without its `event:` line.
const R_MIXED: [&str; 9] = [
    "\u{feff}",
    R_CREATED,
    ": keep-alive\n\n",
    "event: response.in_progress\r\ndata: {\"type\":\"response.in_progress\"}\r\n\r\n",
    "event:response.output_text.delta\ndata:{\"type\":\"response.output_text.delta\",\"delta\":\"a\"}\n\n",
    "event: response.output_text.delta\ndata: {\"type\":\ndata: \"response.output_text.delta\",\"delta\":\"b\"}\n\n",
    "event: response.output_text.delta\nid: 7\ndata: {\"type\":\"response.output_text.delta\",\"delta\":\"c\"}\n\n",
    "data: {\"type\":\"response.output_text.done\",\"text\":\"abc\"}\n\n",
    R_COMPLETED,
];

fn r_mixed_expected() -> Vec<ChunkItem> {
    vec![
        chunk(R_CREATED),
        chunk("event: response.in_progress\ndata: {\"type\":\"response.in_progress\"}\n\n"),
        chunk(
            "event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"delta\":\"a\"}\n\n",
        ),
        chunk(
            "event: response.output_text.delta\ndata: {\"type\":\ndata: \"response.output_text.delta\",\"delta\":\"b\"}\n\n",
        ),
        chunk(
            "event: response.output_text.delta\nid: 7\ndata: {\"type\":\"response.output_text.delta\",\"delta\":\"c\"}\n\n",
        ),
        chunk("data: {\"type\":\"response.output_text.done\",\"text\":\"abc\"}\n\n"),
        Ok(StreamEvent::Usage(responses_usage())),
        chunk(R_COMPLETED),
    ]
}

/// A Messages body with the same mix.
const M_MIXED: [&str; 9] = [
    M_START,
    ": keep-alive\n\n",
    "event: ping\r\ndata: {\"type\":\"ping\"}\r\n\r\n",
    M_BLOCK_START,
    "event:content_block_delta\ndata:{\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"x\"}}\n\n",
    M_BLOCK_STOP,
    M_DELTA_1,
    M_DELTA_2,
    M_STOP,
];

fn m_mixed_expected() -> Vec<ChunkItem> {
    vec![
        chunk(M_START),
        chunk("event: ping\ndata: {\"type\":\"ping\"}\n\n"),
        chunk(M_BLOCK_START),
        chunk(
            "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"x\"}}\n\n",
        ),
        chunk(M_BLOCK_STOP),
        chunk(M_DELTA_1),
        chunk(M_DELTA_2),
        Ok(StreamEvent::Usage(messages_usage())),
        chunk(M_STOP),
    ]
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

fn collect_split(endpoint: Endpoint, whole: &str, cuts: &[prop::sample::Index]) -> Vec<ChunkItem> {
    let pieces = split_at(whole.as_bytes(), cuts);
    block_on(
        ChunkStream::new(stream::iter(pieces), false)
            .with_endpoint(endpoint)
            .collect::<Vec<_>>(),
    )
}

proptest! {
    // Any split of the body gives the same events, for every framing and
    // across the switches between the relay and the decoder.
    // proves: WIRE-1 (Responses stream events at any split)
    #[test]
    fn responses_splits_do_not_change_the_events(cuts in proptest::collection::vec(any::<prop::sample::Index>(), 0..12)) {
        prop_assert_eq!(collect_split(Endpoint::Responses, &R_MIXED.concat(), &cuts), r_mixed_expected());
        let mut expected = chunks(&RESPONSES[..4]);
        expected.push(Ok(StreamEvent::Usage(responses_usage())));
        expected.push(chunk(R_COMPLETED));
        prop_assert_eq!(collect_split(Endpoint::Responses, &RESPONSES.concat(), &cuts), expected);
    }

    // proves: WIRE-3 (Messages stream events and usage at any split)
    #[test]
    fn messages_splits_do_not_change_the_events(cuts in proptest::collection::vec(any::<prop::sample::Index>(), 0..12)) {
        prop_assert_eq!(collect_split(Endpoint::Messages, &M_MIXED.concat(), &cuts), m_mixed_expected());
    }

    // A cut anywhere before the terminal event's end is a broken stream
    // (or, cut inside an event, the same); usage is never reported, and
    // the stream ends exactly once.
    // proves: LC-3
    #[test]
    fn any_truncation_is_broken(len_frac in 0.0f64..1.0, cuts in proptest::collection::vec(any::<prop::sample::Index>(), 0..6)) {
        for (endpoint, whole) in [
            (Endpoint::Responses, RESPONSES.concat()),
            (Endpoint::Messages, MESSAGES.concat()),
        ] {
            // Strictly shorter than the whole body minus its last blank line.
            let keep = ((whole.len() - 1) as f64 * len_frac) as usize;
            let cut = whole.as_bytes().get(..keep).expect("prefix");
            let pieces = split_at(cut, &cuts);
            let items = block_on(
                ChunkStream::new(stream::iter(pieces), false)
                    .with_endpoint(endpoint)
                    .collect::<Vec<_>>(),
            );
            prop_assert_eq!(usage_reports(&items), 0);
            let last = items.last();
            prop_assert!(
                matches!(last, Some(Err(e)) if e.kind == ErrorKind::StreamBroken),
                "{:?}", last
            );
            prop_assert_eq!(items.iter().filter(|i| i.is_err()).count(), 1);
        }
    }
}

// proves: WIRE-1, WIRE-3 (a stream fed one byte per chunk gives the same
// events)
#[test]
fn named_dialects_one_byte_at_a_time() {
    for (endpoint, whole, expected) in [
        (Endpoint::Responses, R_MIXED.concat(), r_mixed_expected()),
        (Endpoint::Messages, M_MIXED.concat(), m_mixed_expected()),
    ] {
        let pieces: Vec<Result<Bytes, io::Error>> = whole
            .as_bytes()
            .iter()
            .map(|b| Ok(Bytes::copy_from_slice(std::slice::from_ref(b))))
            .collect();
        let got = block_on(
            ChunkStream::new(stream::iter(pieces), false)
                .with_endpoint(endpoint)
                .collect::<Vec<_>>(),
        );
        assert_eq!(got, expected, "{endpoint:?}");
    }
}

// proves: Q-6, Q-12 (Anthropic usage: input = input_tokens + cache writes,
// output = output_tokens, total = their sum, cache reads are telemetry;
// absent/null counters count as not reported, invalid ones make the usage
// unknown)
#[test]
fn anthropic_usage_conversion() {
    let u = anthropic_usage(&json!({
        "input_tokens": 20, "cache_creation_input_tokens": 100,
        "cache_read_input_tokens": 50, "output_tokens": 15
    }));
    assert_eq!(u, messages_usage());
    assert_eq!(
        (u.input(), u.output(), u.total()),
        (Some(120), Some(15), Some(135))
    );

    let u = anthropic_usage(&json!({"input_tokens": 7, "output_tokens": 3}));
    assert_eq!(
        (u.input(), u.output(), u.total(), u.cached()),
        (Some(7), Some(3), Some(10), None)
    );
    let u = anthropic_usage(
        &json!({"input_tokens": 7, "cache_creation_input_tokens": null,
                                    "cache_read_input_tokens": null, "output_tokens": 0}),
    );
    assert_eq!((u.input(), u.total()), (Some(7), Some(7)));
    let u = anthropic_usage(&json!({"input_tokens": 0, "output_tokens": 0}));
    assert_eq!(u.total(), Some(0));

    // Invalid counters: unknown (Q-5 keeps the estimate).
    for raw in [
        json!({"input_tokens": -1, "output_tokens": 3}),
        json!({"input_tokens": 5, "cache_creation_input_tokens": "x", "output_tokens": 3}),
        json!({"input_tokens": 5, "output_tokens": 1.5}),
        json!({}),
        json!("lots"),
        json!([1]),
    ] {
        assert_eq!(anthropic_usage(&raw).total(), None, "{raw}");
    }
    // A bad cache-read counter loses only the telemetry.
    let u = anthropic_usage(
        &json!({"input_tokens": 5, "cache_read_input_tokens": -2, "output_tokens": 1}),
    );
    assert_eq!((u.total(), u.cached()), (Some(6), None));
    assert_eq!(anthropic_usage(&serde_json::Value::Null), Usage::UNKNOWN);

    // The dialect-aware choice.
    let raw = json!({"input_tokens": 4, "cache_creation_input_tokens": 6, "output_tokens": 2});
    assert_eq!(usage_of(Endpoint::Messages, raw.clone()).total(), Some(12));
    assert_eq!(usage_of(Endpoint::Responses, raw.clone()).total(), Some(6));
    assert_eq!(usage_of(Endpoint::ChatCompletions, raw).total(), Some(6));
}

// proves: WIRE-1, Q-6 (a one-shot Responses body's usage: its total, with
// input/output and cached tokens as telemetry)
#[test]
fn one_shot_responses_usage() {
    let body = r#"{"id":"resp_1","object":"response","status":"completed","output":[],
        "usage":{"input_tokens":11,"input_tokens_details":{"cached_tokens":4},
                 "output_tokens":5,"output_tokens_details":{"reasoning_tokens":1},"total_tokens":16},
        "error":null,"incomplete_details":null}"#;
    let u = one_shot_usage(body.as_bytes(), 200, None, Endpoint::Responses).expect("usage");
    assert_eq!(u, responses_usage_with_reasoning(1));
    // A failed response is a declared error carrying its usage.
    let failed = r#"{"status":"failed","error":{"code":"server_error","message":"boom"},
        "usage":{"input_tokens":3,"output_tokens":0,"total_tokens":3}}"#;
    let err =
        one_shot_usage(failed.as_bytes(), 200, None, Endpoint::Responses).expect_err("declared");
    assert_eq!(
        (err.kind, err.message.as_str(), err.usage.total()),
        (ErrorKind::Declared, "boom", Some(3))
    );
}

// proves: WIRE-3, Q-12 (a one-shot Anthropic body's usage: input includes
// cache writes, cache reads are telemetry)
#[test]
fn one_shot_anthropic_usage() {
    let body = r#"{"id":"msg_1","type":"message","role":"assistant","content":[{"type":"text","text":"hi"}],
        "model":"claude-x","stop_reason":"end_turn","stop_sequence":null,
        "usage":{"input_tokens":20,"cache_creation_input_tokens":100,"cache_read_input_tokens":50,"output_tokens":15}}"#;
    let u = one_shot_usage(body.as_bytes(), 200, None, Endpoint::Messages).expect("usage");
    assert_eq!(u, messages_usage());
    // The same body read as OpenAI's would miss the cache writes.
    let openai =
        one_shot_usage(body.as_bytes(), 200, None, Endpoint::ChatCompletions).expect("usage");
    assert_eq!(openai.total(), Some(35));
    let u = one_shot_usage(
        br#"{"type":"message","content":[]}"#,
        200,
        None,
        Endpoint::Messages,
    )
    .expect("usage");
    assert_eq!(u, Usage::UNKNOWN);
    let err = one_shot_usage(
        br#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}"#,
        200,
        None,
        Endpoint::Messages,
    )
    .expect_err("declared");
    assert_eq!(
        (err.kind, err.message.as_str()),
        (ErrorKind::Declared, "Overloaded")
    );
}

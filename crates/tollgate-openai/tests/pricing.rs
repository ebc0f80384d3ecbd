//! Exact prices on recorded usage (SPEC BUD-1, BUD-2): bodies and stream
//! events in the shapes OpenAI and Anthropic send, priced with the
//! repository's table, equal the hand-computed cost to the micro-dollar.

use std::convert::Infallible;

use bytes::Bytes;
use futures_util::StreamExt;
use futures_util::stream;
use serde_json::{Value, json};
use tollgate::Parts;
use tollgate::lifecycle::StreamEvent;
use tollgate_openai::Endpoint;
use tollgate_openai::prices::PriceTable;
use tollgate_openai::provider::ChunkStream;

/// The cost (µ$) of a one-shot body's usage at `model`'s table price.
fn priced(endpoint: Endpoint, body: &Value, model: &str) -> (tollgate::Usage, Option<u64>) {
    let price = PriceTable::builtin().price(model).expect("priced model");
    let usage = endpoint.engine_usage(body["usage"].clone()).priced(&price);
    (usage, usage.cost())
}

/// The usage a stream body settles with, priced at `model`.
async fn stream_priced(endpoint: Endpoint, body: &str, model: &str) -> Option<u64> {
    let price = PriceTable::builtin().price(model).expect("priced model");
    let chunks: Vec<Result<Bytes, Infallible>> = body
        .as_bytes()
        .chunks(37)
        .map(|c| Ok(Bytes::copy_from_slice(c)))
        .collect();
    let stream = ChunkStream::new(stream::iter(chunks), true).with_endpoint(endpoint);
    let items: Vec<_> = stream.collect().await;
    let usage = items.iter().rev().find_map(|i| match i {
        Ok(StreamEvent::Usage(u)) => Some(*u),
        _ => None,
    })?;
    usage.priced(&price).cost()
}

// proves: BUD-2 (an OpenAI chat completion of a reasoning model: cached
// input at the cached price, reasoning tokens billed as output, as OpenAI
// bills them)
#[test]
fn openai_chat_with_cached_and_reasoning_tokens() {
    let body = json!({
        "id": "chatcmpl-BXz1", "object": "chat.completion", "created": 1747000000,
        "model": "o4-mini-2025-04-16",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "42", "refusal": null,
                     "annotations": []}, "finish_reason": "stop"}],
        "usage": {
            "prompt_tokens": 1921, "completion_tokens": 1045, "total_tokens": 2966,
            "prompt_tokens_details": {"cached_tokens": 1536, "audio_tokens": 0},
            "completion_tokens_details": {"reasoning_tokens": 896, "audio_tokens": 0,
                "accepted_prediction_tokens": 0, "rejected_prediction_tokens": 0}
        },
        "service_tier": "default", "system_fingerprint": null
    });
    let (usage, cost) = priced(Endpoint::ChatCompletions, &body, "o4-mini-2025-04-16");
    assert_eq!(
        usage.parts(),
        Some(Parts {
            cached_input: 1536,
            reasoning: 896,
            ..Parts::plain(385, 149)
        })
    );
    // o4-mini: $1.10 input, $0.275 cached, $4.40 output per 1M.
    // 385 * 1.10 + 1536 * 0.275 + 1045 * 4.40 = 423.5 + 422.4 + 4598
    // = 5443.9 µ$, rounded up once: 5444.
    assert_eq!(cost, Some(5_444));
    // The token limits see OpenAI's own totals.
    assert_eq!(
        (usage.input(), usage.output(), usage.total()),
        (Some(1921), Some(1045), Some(2966))
    );
}

// proves: BUD-2 (the Responses API: input_tokens_details.cached_tokens at
// the cached price)
#[test]
fn openai_responses_with_cached_tokens() {
    let body = json!({
        "id": "resp_0cd5", "object": "response", "status": "completed", "model": "gpt-4.1-2025-04-14",
        "output": [{"type": "message", "role": "assistant",
                    "content": [{"type": "output_text", "text": "ok", "annotations": []}]}],
        "usage": {"input_tokens": 12033, "input_tokens_details": {"cached_tokens": 11904},
                  "output_tokens": 44, "output_tokens_details": {"reasoning_tokens": 0},
                  "total_tokens": 12077}
    });
    let (_, cost) = priced(Endpoint::Responses, &body, "gpt-4.1-2025-04-14");
    // gpt-4.1: $2 input, $0.50 cached, $8 output per 1M.
    // 129 * 2 + 11904 * 0.5 + 44 * 8 = 258 + 5952 + 352 = 6562 µ$.
    assert_eq!(cost, Some(6_562));
}

// proves: BUD-2 (Anthropic Messages: uncached input, cache writes at the
// five-minute and one-hour write prices, cache reads at the hit price)
#[test]
fn anthropic_messages_with_cache_creation_and_read() {
    let body = |one_hour: u64| {
        json!({
            "id": "msg_01Xf", "type": "message", "role": "assistant",
            "model": "claude-sonnet-4-5-20250929",
            "content": [{"type": "text", "text": "Here is the summary."}],
            "stop_reason": "end_turn", "stop_sequence": null,
            "usage": {"input_tokens": 21, "cache_creation_input_tokens": 1880,
                      "cache_read_input_tokens": 3072, "output_tokens": 393,
                      "cache_creation": {"ephemeral_5m_input_tokens": 1880 - one_hour,
                                         "ephemeral_1h_input_tokens": one_hour},
                      "service_tier": "standard"}
        })
    };
    let (usage, cost) = priced(Endpoint::Messages, &body(0), "claude-sonnet-4-5-20250929");
    // Sonnet 4.5: $3 input, $3.75 5-minute write, $6 1-hour write, $0.30
    // cache hit, $15 output per 1M.
    // 21 * 3 + 1880 * 3.75 + 3072 * 0.30 + 393 * 15
    // = 63 + 7050 + 921.6 + 5895 = 13929.6 µ$ → 13930.
    assert_eq!(cost, Some(13_930));
    // The input-token limit sees input plus cache writes.
    assert_eq!(usage.input(), Some(1901));
    let (_, cost) = priced(Endpoint::Messages, &body(1_000), "claude-sonnet-4-5");
    // 63 + 880 * 3.75 + 1000 * 6 + 921.6 + 5895 = 16179.6 µ$ → 16180.
    assert_eq!(cost, Some(16_180));
    // Without cache counters: plain input and output.
    let plain = json!({"usage": {"input_tokens": 1000, "output_tokens": 100}});
    let (_, cost) = priced(Endpoint::Messages, &plain, "claude-haiku-4-5");
    assert_eq!(cost, Some(1_000 + 500));
}

// proves: BUD-2, Q-5 (a report whose details do not add up, or whose
// split is unknown, leaves the cost unknown: the reservation stays)
#[test]
fn inconsistent_reports_leave_the_cost_unknown() {
    for usage in [
        json!({"prompt_tokens": 10, "completion_tokens": 5,
               "prompt_tokens_details": {"cached_tokens": 11}}),
        json!({"prompt_tokens": 10, "completion_tokens": 5,
               "completion_tokens_details": {"reasoning_tokens": "x"}}),
        json!({"total_tokens": 15}),
        json!({"prompt_tokens": 10, "completion_tokens": -1}),
    ] {
        let (_, cost) = priced(
            Endpoint::ChatCompletions,
            &json!({ "usage": usage }),
            "gpt-4o",
        );
        assert_eq!(cost, None, "{usage}");
    }
    let bad_cache = json!({"usage": {"input_tokens": 5, "output_tokens": 1,
                                     "cache_read_input_tokens": -3}});
    assert_eq!(
        priced(Endpoint::Messages, &bad_cache, "claude-haiku-4-5").1,
        None
    );
    // Known zero costs nothing.
    let zero = json!({"usage": {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}});
    assert_eq!(
        priced(Endpoint::ChatCompletions, &zero, "gpt-4o").1,
        Some(0)
    );
}

fn event(name: &str, data: &Value) -> String {
    format!("event: {name}\ndata: {data}\n\n")
}

// proves: BUD-2 (an Anthropic stream: message_start's cache counters and
// message_delta's cumulative output are priced together)
#[tokio::test]
async fn anthropic_stream_events_are_priced() {
    let mut body = event(
        "message_start",
        &json!({"type": "message_start", "message": {"id": "msg_1", "type": "message",
            "role": "assistant", "model": "claude-haiku-4-5", "content": [],
            "stop_reason": null, "stop_sequence": null,
            "usage": {"input_tokens": 12, "cache_creation_input_tokens": 2048,
                      "cache_read_input_tokens": 4096, "output_tokens": 1,
                      "cache_creation": {"ephemeral_5m_input_tokens": 2048,
                                         "ephemeral_1h_input_tokens": 0}}}}),
    );
    body.push_str(&event(
        "content_block_delta",
        &json!({"type": "content_block_delta", "index": 0,
                "delta": {"type": "text_delta", "text": "Hi"}}),
    ));
    body.push_str(&event(
        "message_delta",
        &json!({"type": "message_delta", "delta": {"stop_reason": "end_turn"},
                "usage": {"output_tokens": 250}}),
    ));
    body.push_str(&event("message_stop", &json!({"type": "message_stop"})));
    // Haiku 4.5: $1 input, $1.25 write, $0.10 hit, $5 output per 1M.
    // 12 * 1 + 2048 * 1.25 + 4096 * 0.10 + 250 * 5 = 12 + 2560 + 409.6 + 1250
    // = 4231.6 µ$ → 4232.
    let cost = stream_priced(Endpoint::Messages, &body, "claude-haiku-4-5").await;
    assert_eq!(cost, Some(4_232));
}

// proves: BUD-2 (an OpenAI chat stream's usage chunk with cached tokens)
#[tokio::test]
async fn openai_chat_stream_usage_chunk_is_priced() {
    let chunk = json!({"id": "c1", "object": "chat.completion.chunk", "created": 1, "model": "gpt-4o-mini",
        "choices": [{"index": 0, "delta": {"content": "Hi"}, "finish_reason": null}]});
    let last = json!({"id": "c1", "object": "chat.completion.chunk", "created": 1, "model": "gpt-4o-mini",
        "choices": [], "usage": {"prompt_tokens": 2000, "completion_tokens": 300, "total_tokens": 2300,
        "prompt_tokens_details": {"cached_tokens": 1024}}});
    let body = format!("data: {chunk}\n\ndata: {last}\n\ndata: [DONE]\n\n");
    // gpt-4o-mini: 976 * 0.15 + 1024 * 0.075 + 300 * 0.60
    // = 146.4 + 76.8 + 180 = 403.2 µ$ → 404.
    let cost = stream_priced(Endpoint::ChatCompletions, &body, "gpt-4o-mini").await;
    assert_eq!(cost, Some(404));
}

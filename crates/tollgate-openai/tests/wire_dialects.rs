//! The wider wire through the public API (SPEC WIRE-1..4, Q-5, Q-6, Q-12, Q-16, GW-5):
//! stream dialects and estimators, each test naming the rule it proves.

use std::convert::Infallible;

use bytes::Bytes;
use futures_util::StreamExt;
use futures_util::stream;
use serde_json::{Value, json};
use tollgate::lifecycle::{ErrorKind, StreamEvent};
use tollgate::quota::Actual;
use tollgate_openai::Endpoint;
use tollgate_openai::provider::{ChunkItem, ChunkStream};
use tollgate_openai::tokens::{Profile, TokenEstimator, TokenizerKind};
use tollgate_openai::wire::{MessagesRequest, ResponsesRequest};

/// One named SSE event, canonical framing.
fn event(name: &str, data: &Value) -> String {
    format!("event: {name}\ndata: {data}\n\n")
}

/// An Anthropic stream's body: `message_start` (its usage the API's
/// documented placeholder `output_tokens: 1`), `deltas` text deltas, then
/// `tail` events.
fn anthropic_body(deltas: usize, tail: &[(&str, Value)]) -> String {
    let mut body = event(
        "message_start",
        &json!({"type": "message_start", "message": {
            "id": "msg_1", "type": "message", "role": "assistant", "model": "claude",
            "content": [], "stop_reason": null, "stop_sequence": null,
            "usage": {"input_tokens": 25, "output_tokens": 1}
        }}),
    );
    body.push_str(&event(
        "content_block_start",
        &json!({"type": "content_block_start", "index": 0,
                "content_block": {"type": "text", "text": ""}}),
    ));
    for i in 0..deltas {
        body.push_str(&event(
            "content_block_delta",
            &json!({"type": "content_block_delta", "index": 0,
                    "delta": {"type": "text_delta", "text": format!("word{i} ")}}),
        ));
    }
    for (name, data) in tail {
        body.push_str(&event(name, data));
    }
    body
}

/// Runs `body` (split into chunks of `split` bytes) through a
/// [`ChunkStream`] of `endpoint`'s dialect; every item it yields.
async fn run(endpoint: Endpoint, body: &str, split: usize) -> Vec<ChunkItem> {
    let chunks: Vec<Result<Bytes, Infallible>> = body
        .as_bytes()
        .chunks(split.max(1))
        .map(|c| Ok(Bytes::copy_from_slice(c)))
        .collect();
    let stream = ChunkStream::new(stream::iter(chunks), true).with_endpoint(endpoint);
    stream.collect().await
}

/// The usage the stream hands to settlement: its `Usage` event, or the
/// usage attached to its final error.
fn settled_usage(items: &[ChunkItem]) -> Option<tollgate::Usage> {
    let mut usage = None;
    for item in items {
        match item {
            Ok(StreamEvent::Usage(u)) => usage = Some(*u),
            Ok(StreamEvent::Error(_, e)) | Err(e) => usage = Some(e.usage),
            Ok(StreamEvent::Chunk(_)) => {}
        }
    }
    usage
}

/// The output tokens settlement would charge on an `output_tokens` limit
/// whose reservation was `allowance` (SPEC Q-5, Q-12).
fn output_settled(usage: &tollgate::Usage, allowance: u64) -> u64 {
    match Actual::from_usage(usage) {
        None => allowance,
        Some(actual) => actual
            .output
            .unwrap_or_else(|| allowance.min(actual.tokens)),
    }
}

// proves: Q-5, Q-12: a Messages stream whose `message_delta` carries no
// `usage` does not settle message_start's placeholder output (1 token): its
// output stays unknown, so the allowance stays charged.
#[tokio::test]
async fn messages_stream_without_delta_usage_does_not_settle_the_placeholder() {
    let body = anthropic_body(
        40,
        &[
            (
                "content_block_stop",
                json!({"type": "content_block_stop", "index": 0}),
            ),
            (
                "message_delta",
                json!({"type": "message_delta",
                       "delta": {"stop_reason": "end_turn", "stop_sequence": null}}),
            ),
            ("message_stop", json!({"type": "message_stop"})),
        ],
    );
    let items = run(Endpoint::Messages, &body, 64).await;
    assert!(
        items.iter().all(Result::is_ok),
        "the stream ends normally: {items:?}"
    );
    let usage = settled_usage(&items).expect("usage reported at message_stop");
    let output = output_settled(&usage, 500);
    assert!(
        output >= 40,
        "40 deltas were generated but settlement charges {output} output token(s) \
         (usage {usage:?}): the message_start placeholder is taken as the final count"
    );
}

// proves: Q-6: the normal Anthropic stream settles input from
// message_start and output from the last message_delta, at any split.
#[tokio::test]
async fn messages_stream_settles_input_and_final_output_at_any_split() {
    let body = anthropic_body(
        5,
        &[
            (
                "message_delta",
                json!({"type": "message_delta", "delta": {"stop_reason": "end_turn"},
                       "usage": {"output_tokens": 42}}),
            ),
            ("message_stop", json!({"type": "message_stop"})),
            // Bytes after the terminal event are not forwarded.
            (
                "content_block_delta",
                json!({"type": "content_block_delta"}),
            ),
        ],
    );
    for split in [1, 2, 3, 7, 13, 64, 4096] {
        let items = run(Endpoint::Messages, &body, split).await;
        let usages: Vec<_> = items
            .iter()
            .filter_map(|i| match i {
                Ok(StreamEvent::Usage(u)) => Some(*u),
                _ => None,
            })
            .collect();
        assert_eq!(usages.len(), 1, "split {split}: usage exactly once");
        assert_eq!(usages[0].input(), Some(25), "split {split}");
        assert_eq!(usages[0].output(), Some(42), "split {split}");
        let last = items.last().expect("items");
        match last {
            Ok(StreamEvent::Chunk(c)) => assert!(
                String::from_utf8_lossy(c).contains("message_stop"),
                "split {split}: message_stop is the last chunk"
            ),
            other => panic!("split {split}: {other:?}"),
        }
    }
}

// proves: WIRE-1: `[DONE]` in a Responses stream before its terminal
// event is a protocol error, never a normal end; `response.incomplete`
// settles with its usage; `response.failed` is a declared error.
#[tokio::test]
async fn responses_terminal_events() {
    let created = event(
        "response.created",
        &json!({"type": "response.created", "response": {"usage": null}}),
    );
    let done = format!("{created}data: [DONE]\n\n");
    let items = run(Endpoint::Responses, &done, 5).await;
    assert!(
        matches!(items.last(), Some(Err(e)) if e.kind == ErrorKind::Protocol),
        "{items:?}"
    );
    let incomplete = format!(
        "{created}{}",
        event(
            "response.incomplete",
            &json!({"type": "response.incomplete", "response": {"usage":
                {"input_tokens": 7, "output_tokens": 9, "total_tokens": 16}}})
        )
    );
    let items = run(Endpoint::Responses, &incomplete, 11).await;
    let usage = settled_usage(&items).expect("usage");
    assert_eq!(usage.total(), Some(16));
    let failed = format!(
        "{created}{}",
        event(
            "response.failed",
            &json!({"type": "response.failed", "response": {"usage":
                {"input_tokens": 7, "output_tokens": 0, "total_tokens": 7},
                "error": {"code": "server_error", "message": "boom"}}})
        )
    );
    let items = run(Endpoint::Responses, &failed, 3).await;
    match items.last() {
        Some(Ok(StreamEvent::Error(_, e))) => {
            assert_eq!(e.kind, ErrorKind::Declared);
            assert_eq!(e.usage.total(), Some(7));
        }
        other => panic!("{other:?}"),
    }
}

/// The tokenizer's count of `text` for gpt-4o.
fn tokens(text: &str) -> u64 {
    TokenizerKind::for_model("gpt-4o").count(text)
}

/// Lines of code-like text, `n` lines long.
fn code(n: usize) -> String {
    (0..n)
        .map(|i| format!("result_{i} = compute_something(alpha_{i}, beta_{i}) * {i}\n"))
        .collect()
}

// proves: GW-5, WIRE-1: text a Responses item carries outside
// `content`/`arguments`/`input`/`output`/`summary` (a code interpreter's code
// and logs, file search results, an MCP tool list, a patch's diff, a stored
// prompt's variables) is counted, not estimated at the framing alone.
#[test]
fn responses_items_with_text_outside_content_are_counted() {
    let est = TokenEstimator::new();
    let text = code(400);
    let text_tokens = tokens(&text);
    assert!(text_tokens > 5_000, "{text_tokens}");
    let cases: Vec<(&str, Value)> = vec![
        (
            "code_interpreter_call.code + outputs.logs",
            json!({"model": "gpt-4o", "input": [
                {"type": "code_interpreter_call", "id": "ci_1", "status": "completed",
                 "container_id": "cntr_1", "code": text,
                 "outputs": [{"type": "logs", "logs": text}]}
            ]}),
        ),
        (
            "file_search_call.results[].text",
            json!({"model": "gpt-4o", "input": [
                {"type": "file_search_call", "id": "fs_1", "status": "completed",
                 "queries": ["what"],
                 "results": [{"file_id": "file_1", "filename": "a.py", "score": 0.9, "text": text}]}
            ]}),
        ),
        (
            "mcp_list_tools.tools",
            json!({"model": "gpt-4o", "input": [
                {"type": "mcp_list_tools", "id": "mcpl_1", "server_label": "srv",
                 "tools": [{"name": "run", "description": text,
                            "input_schema": {"type": "object"}}]}
            ]}),
        ),
        (
            "apply_patch_call.operation.diff",
            json!({"model": "gpt-4o", "input": [
                {"type": "apply_patch_call", "call_id": "call_1", "status": "completed",
                 "operation": {"type": "update_file", "path": "a.py", "diff": text}}
            ]}),
        ),
        (
            "prompt.variables",
            json!({"model": "gpt-4o", "input": "go",
                   "prompt": {"id": "pmpt_1", "variables": {"document": text}}}),
        ),
    ];
    let mut under = Vec::new();
    for (what, raw) in cases {
        let req: ResponsesRequest = serde_json::from_value(raw).expect("request");
        let input = est.responses(&req).input;
        if input < text_tokens {
            under.push(format!(
                "{what}: estimated {input} < {text_tokens} in the request"
            ));
        }
    }
    assert!(
        under.is_empty(),
        "Responses inputs under-reserved:\n{}",
        under.join("\n")
    );
}

// proves: Q-16, WIRE-3: Anthropic's schema-less built-in tools reserve the
// fixed input cost Anthropic documents (text editor 700, computer use 735 +
// its system prompt, bash 245) on top of the tool-use system prompt.
#[test]
fn anthropic_schema_less_tools_reserve_their_documented_cost() {
    let est = TokenEstimator::new().with_profile(Profile::Anthropic);
    let cases: [(&str, Value, u64); 3] = [
        (
            "text editor",
            json!({"type": "text_editor_20250728", "name": "str_replace_based_edit_tool"}),
            346 + 700,
        ),
        (
            "computer use",
            json!({"type": "computer_20250124", "name": "computer",
                   "display_width_px": 1024, "display_height_px": 768}),
            466 + 735,
        ),
        (
            "bash",
            json!({"type": "bash_20250124", "name": "bash"}),
            346 + 245,
        ),
    ];
    let mut under = Vec::new();
    for (what, tool, documented) in cases {
        let req: MessagesRequest = serde_json::from_value(json!({
            "model": "claude-sonnet-4-5", "max_tokens": 16,
            "tools": [tool],
            "messages": [{"role": "user", "content": "hi"}]
        }))
        .expect("request");
        let input = est.messages(&req).input;
        if input < documented {
            under.push(format!(
                "{what}: estimated {input} < documented {documented}"
            ));
        }
    }
    assert!(under.is_empty(), "{}", under.join("\n"));
}

// proves: WIRE-1, WIRE-3: a duplicated `model` or `stream` member is
// refused, so the gateway cannot judge one model while the upstream reads
// another in a body it forwards unchanged.
#[test]
fn duplicate_members_are_refused() {
    for text in [
        r#"{"model":"a","model":"b","messages":[]}"#,
        r#"{"model":"a","messages":[],"stream":false,"stream":true}"#,
        r#"{"model":"a","mod\u0065l":"b","messages":[]}"#,
    ] {
        assert!(
            serde_json::from_str::<MessagesRequest>(text).is_err(),
            "{text}"
        );
    }
    for text in [
        r#"{"model":"a","model":"b"}"#,
        r#"{"model":"a","stream":false,"stream":true}"#,
    ] {
        assert!(
            serde_json::from_str::<ResponsesRequest>(text).is_err(),
            "{text}"
        );
    }
}

/// The forwarded chunks, decoded back to (event name, data) pairs, and the
/// usage reported, of `body` read at `split`.
async fn semantics(
    endpoint: Endpoint,
    body: &str,
    split: usize,
) -> (Vec<(Option<String>, String)>, Vec<tollgate::Usage>, bool) {
    let items = run(endpoint, body, split).await;
    let mut wire = Vec::new();
    let mut usage = Vec::new();
    let mut failed = false;
    for item in &items {
        match item {
            Ok(StreamEvent::Chunk(c)) | Ok(StreamEvent::Error(c, _)) => wire.extend_from_slice(c),
            Ok(StreamEvent::Usage(u)) => usage.push(*u),
            Err(_) => failed = true,
        }
        if matches!(item, Ok(StreamEvent::Error(..))) {
            failed = true;
        }
    }
    let mut decoder = tollgate_openai::SseDecoder::new();
    let mut events = Vec::new();
    for item in decoder.decode(&wire).expect("forwarded bytes are SSE") {
        if let tollgate_openai::SseItem::Event(e) = item {
            events.push((e.event.clone(), e.data.clone()));
        }
    }
    (events, usage, failed)
}

// proves: WIRE-1, WIRE-3: what a named-dialect stream forwards and reports
// does not depend on where the body is split, with canonical events mixed
// with CRLF framing, `event:` without a space, comments and `id:` lines,
// and bytes after the terminal event.
#[tokio::test]
async fn named_dialects_are_split_invariant() {
    let messages = [
        "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":11,\"output_tokens\":1}}}\n\n",
        ": keep-alive\n\n",
        "event:content_block_delta\r\ndata: {\"type\":\"content_block_delta\",\"delta\":{\"text\":\"a\"}}\r\n\r\n",
        "id: 7\nevent: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"delta\":{\"text\":\"b\"}}\n\n",
        "event: ping\ndata: {\"type\": \"ping\"}\n\n",
        "event: message_delta\ndata: {\"type\":\"message_delta\",\"usage\":{\"output_tokens\":9}}\n\n",
        "event: message_stop\r\ndata: {\"type\":\"message_stop\"}\r\n\r\n",
        "event: content_block_delta\ndata: {\"type\":\"content_block_delta\"}\n\n",
    ]
    .concat();
    let responses = [
        "event: response.created\ndata: {\"type\":\"response.created\",\"response\":{\"usage\":null}}\n\n",
        "event:response.output_text.delta\r\ndata: {\"type\":\"response.output_text.delta\",\"delta\":\"x\"}\r\n\r\n",
        "data: {\"type\":\"response.output_text.delta\",\"delta\":\"y\"}\n\n",
        "event: response.completed\ndata: {\"type\":\"response.completed\",\"response\":{\"usage\":{\"input_tokens\":3,\"output_tokens\":4,\"total_tokens\":7}}}\n\n",
        "data: [DONE]\n\n",
    ]
    .concat();
    for (endpoint, body) in [
        (Endpoint::Messages, &messages),
        (Endpoint::Responses, &responses),
    ] {
        let whole = semantics(endpoint, body, body.len()).await;
        assert!(!whole.2, "{endpoint:?} ends normally");
        assert_eq!(whole.1.len(), 1, "{endpoint:?}: usage once");
        for split in 1..body.len() {
            let got = semantics(endpoint, body, split).await;
            assert_eq!(got, whole, "{endpoint:?} at split {split}");
        }
    }
}

// proves: Q-16, GW-5: the `anthropic` profile on a chat or Responses
// request (Anthropic's OpenAI-compatible endpoint) never drops the tools,
// images and files the tokenizer estimate counts.
#[test]
fn anthropic_profile_keeps_tools_and_images_on_openai_shaped_requests() {
    let tool = json!({"type": "function", "name": "lookup",
        "description": code(60),
        "parameters": {"type": "object", "properties": {"q": {"type": "string"}}}});
    let tool_tokens = tokens(&tool.to_string());
    let image = json!({"type": "input_image", "image_url": "https://x/y.png"});
    let responses: ResponsesRequest = serde_json::from_value(json!({
        "model": "gpt-4o", "max_output_tokens": 10, "tools": [tool],
        "input": [{"role": "user", "content": [
            {"type": "input_text", "text": "what are these?"}, image, image
        ]}]
    }))
    .expect("request");
    let chat: tollgate_openai::ChatCompletionRequest = serde_json::from_value(json!({
        "model": "gpt-4o", "max_tokens": 10,
        "tools": [{"type": "function", "function": tool}],
        "messages": [{"role": "user", "content": [
            {"type": "text", "text": "what are these?"},
            {"type": "image_url", "image_url": {"url": "https://x/y.png"}},
            {"type": "image_url", "image_url": {"url": "https://x/z.png"}}
        ]}]
    }))
    .expect("chat");
    let tokenizer = TokenEstimator::new();
    let anthropic = TokenEstimator::new().with_profile(Profile::Anthropic);
    let floor = tool_tokens + 2 * tollgate_openai::tokens::DEFAULT_NON_TEXT_PART_TOKENS;
    let r = (
        tokenizer.responses(&responses).input,
        anthropic.responses(&responses).input,
    );
    let c = (tokenizer.chat(&chat).input, anthropic.chat(&chat).input);
    assert!(
        r.1 >= floor && c.1 >= floor,
        "tools ({tool_tokens} tokens) + 2 images ({} each) need at least {floor}; \
         responses: tokenizer {} vs anthropic profile {}; chat: tokenizer {} vs anthropic \
         profile {}",
        tollgate_openai::tokens::DEFAULT_NON_TEXT_PART_TOKENS,
        r.0,
        r.1,
        c.0,
        c.1
    );
}

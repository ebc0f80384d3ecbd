//! Responses API request estimation (SPEC WIRE-1, GW-5, Q-3).

use std::borrow::Cow;

use serde_json::{Map, Value};

use super::encoding::TokenizerKind;
use super::estimator::{
    DEFINITIONS_OVERHEAD_TOKENS, MIN_RESPONSES_OUTPUT_TOKENS, REPLY_PRIMING_TOKENS,
    TOKENS_PER_MESSAGE, TOKENS_PER_TOOL_CALL, TokenEstimate, TokenEstimator, json_tokens,
};
use crate::wire::ResponsesRequest;

/// What one piece of a Responses request contributes to its estimate.
enum Piece<'a> {
    /// Text the model reads: counted by the tokenizer and, for
    /// character-based profiles, by its characters.
    Text(Cow<'a, str>),
    /// A role, name or call id: tokenizer only (as chat counts them).
    Label(&'a str),
    /// Fixed framing tokens.
    Framing(u64),
    /// A non-text part (image, file, audio, screenshot).
    NonText,
}

impl TokenEstimator {
    /// Estimates a Responses API request (SPEC WIRE-1) with the tokenizer
    /// of the model family, counted as the equivalent chat conversation.
    ///
    /// Input: `instructions` as one `system` message, then every input
    /// item, each [`TOKENS_PER_MESSAGE`] + its role + what it carries: a
    /// string input is one `user` message; an item's `content` string, or
    /// the text of its parts (`input_text`, `output_text`, `refusal`, …)
    /// and [`TokenEstimator::with_non_text_part_tokens`] for every other
    /// part (`input_image`, `input_file`, `input_audio`, …); a call
    /// (`function_call`, `custom_tool_call`, …) its `name` and
    /// `arguments`/`input` ([`TOKENS_PER_TOOL_CALL`] extra); a call output
    /// its `call_id` and `output` (a string, or parts as above); a
    /// `reasoning` item its summary text. Then [`REPLY_PRIMING_TOKENS`];
    /// then the tool definitions and a `text.format` JSON schema as
    /// compact JSON text ([`DEFINITIONS_OVERHEAD_TOKENS`] once when there
    /// is any).
    ///
    /// Output: `max_output_tokens`, else the default allowance, at least
    /// [`MIN_RESPONSES_OUTPUT_TOKENS`] (the cap the request is sent with,
    /// see [`TokenEstimator::responses_output_cap`]).
    ///
    /// The accounting profile is applied as for chat; its character count
    /// is the characters of the instructions and of every text the items
    /// carry. Context the request only refers to (`previous_response_id`,
    /// `conversation`, `item_reference`, encrypted reasoning) is not
    /// visible here: the provider's reported usage settles it.
    pub fn responses(&self, request: &ResponsesRequest) -> TokenEstimate {
        let output = self.responses_output(request);
        // Under a `chars` rule only the characters are read: the
        // tokenizer does not run.
        let kind = self
            .tokenizes()
            .then(|| TokenizerKind::for_model(&request.model));
        let mut input = REPLY_PRIMING_TOKENS;
        let mut chars = 0u64;
        visit_request(request, &mut |piece| {
            if let Piece::Text(text) = &piece {
                chars = chars.saturating_add(text.chars().count() as u64);
            }
            let Some(kind) = kind else { return };
            let tokens = match piece {
                Piece::Text(text) => kind.count(&text),
                Piece::Label(label) => kind.count(label),
                Piece::Framing(tokens) => tokens,
                Piece::NonText => self.non_text_part,
            };
            input = input.saturating_add(tokens);
        });
        let Some(kind) = kind else {
            let input = self.input(0, || chars);
            return TokenEstimate { input, output };
        };
        let definitions: Vec<&Value> = request
            .tools
            .iter()
            .flatten()
            .chain(json_schema_format(&request.extra))
            .collect();
        if !definitions.is_empty() {
            input = input.saturating_add(DEFINITIONS_OVERHEAD_TOKENS);
            for definition in definitions {
                input = input.saturating_add(json_tokens(kind, definition));
            }
        }
        TokenEstimate {
            input: self.input(input, || chars),
            output,
        }
    }

    /// [`responses`](Self::responses)'s output allowance alone (no text
    /// is counted).
    pub fn responses_output(&self, request: &ResponsesRequest) -> u64 {
        self.counted_output(
            request
                .max_output_tokens
                .unwrap_or(self.default_output.max(MIN_RESPONSES_OUTPUT_TOKENS)),
        )
    }
}

/// `text.format` when it is a JSON schema (the Responses spelling of chat's
/// `response_format.json_schema`).
fn json_schema_format(extra: &Map<String, Value>) -> Option<&Value> {
    extra
        .get("text")
        .and_then(|text| text.get("format"))
        .filter(|format| format.get("type").and_then(Value::as_str) == Some("json_schema"))
}

fn visit_request<'a>(request: &'a ResponsesRequest, f: &mut impl FnMut(Piece<'a>)) {
    if let Some(instructions) = &request.instructions {
        f(Piece::Framing(TOKENS_PER_MESSAGE));
        f(Piece::Label("system"));
        f(Piece::Text(Cow::Borrowed(instructions)));
    }
    match &request.input {
        Some(Value::Array(items)) => items.iter().for_each(|item| visit_item(item, f)),
        Some(other) => visit_item(other, f),
        None => {}
    }
    // A stored prompt's variables are text the model reads too.
    if let Some(variables) = request.extra.get("prompt").and_then(|p| p.get("variables")) {
        visit_leaves(variables, 0, f);
    }
}

/// The members of an item [`visit_item`] reads for what they are; every
/// other member's text is counted by [`visit_leaves`].
const ITEM_KNOWN: [&str; 11] = [
    "type",
    "id",
    "status",
    "role",
    "content",
    "arguments",
    "input",
    "name",
    "call_id",
    "output",
    "summary",
];

/// How deep [`visit_leaves`] follows nested arrays and objects.
const MAX_LEAF_DEPTH: u8 = 6;

/// Every string inside `value` as text, so that an item type this
/// estimator does not know (a code interpreter's code and logs, file
/// search results, an MCP tool list, a patch's diff, ...) is never
/// counted as nothing. A nested input image, file or audio part gets the
/// non-text allowance instead of its (base64) data; numbers and booleans
/// count nothing; deeper than [`MAX_LEAF_DEPTH`], a value counts as its
/// JSON text.
fn visit_leaves<'a>(value: &'a Value, depth: u8, f: &mut impl FnMut(Piece<'a>)) {
    match value {
        Value::String(text) => f(Piece::Text(Cow::Borrowed(text))),
        Value::Array(values) if depth < MAX_LEAF_DEPTH => {
            values.iter().for_each(|v| visit_leaves(v, depth + 1, f));
        }
        Value::Object(map) if depth < MAX_LEAF_DEPTH => {
            let kind = map.get("type").and_then(Value::as_str).unwrap_or_default();
            if [
                "input_image",
                "input_file",
                "input_audio",
                "computer_screenshot",
            ]
            .contains(&kind)
            {
                f(Piece::NonText);
                return;
            }
            map.values().for_each(|v| visit_leaves(v, depth + 1, f));
        }
        Value::Array(_) | Value::Object(_) => f(Piece::Text(Cow::Owned(value.to_string()))),
        Value::Null | Value::Bool(_) | Value::Number(_) => {}
    }
}

/// One input item. A bare string (the whole `input`, or an array element
/// a lenient provider might accept) is a `user` message.
fn visit_item<'a>(item: &'a Value, f: &mut impl FnMut(Piece<'a>)) {
    f(Piece::Framing(TOKENS_PER_MESSAGE));
    let map = match item {
        Value::String(text) => {
            f(Piece::Label("user"));
            f(Piece::Text(Cow::Borrowed(text)));
            return;
        }
        Value::Object(map) => map,
        // Not an item the API accepts; the provider will judge it.
        _ => return,
    };
    let str_field = |key: &str| map.get(key).and_then(Value::as_str);
    if let Some(role) = str_field("role") {
        f(Piece::Label(role));
    }
    if let Some(content) = map.get("content") {
        visit_content(content, f);
    }
    // A call: `function_call` / `mcp_call` carry `arguments`,
    // `custom_tool_call` carries `input`.
    let arguments = str_field("arguments");
    let call_input = str_field("input");
    if arguments.is_some() || call_input.is_some() {
        f(Piece::Framing(TOKENS_PER_TOOL_CALL));
        if let Some(name) = str_field("name") {
            f(Piece::Label(name));
        }
        for text in arguments.into_iter().chain(call_input) {
            f(Piece::Text(Cow::Borrowed(text)));
        }
    }
    // A call's output answers its `call_id` (as chat counts a tool
    // message's `tool_call_id`).
    if str_field("type").is_some_and(|t| t.ends_with("_output"))
        && let Some(id) = str_field("call_id")
    {
        f(Piece::Label(id));
    }
    match map.get("output") {
        Some(Value::String(text)) => f(Piece::Text(Cow::Borrowed(text))),
        Some(Value::Array(parts)) => parts.iter().for_each(|part| visit_part(part, f)),
        Some(Value::Null) | None => {}
        Some(other) => visit_part(other, f),
    }
    if let Some(Value::Array(summary)) = map.get("summary") {
        summary.iter().for_each(|part| visit_part(part, f));
    }
    for (key, value) in map {
        if !ITEM_KNOWN.contains(&key.as_str()) {
            visit_leaves(value, 0, f);
        }
    }
}

/// An item's `content`: a string, or an array of parts.
fn visit_content<'a>(content: &'a Value, f: &mut impl FnMut(Piece<'a>)) {
    match content {
        Value::String(text) => f(Piece::Text(Cow::Borrowed(text))),
        Value::Array(parts) => parts.iter().for_each(|part| visit_part(part, f)),
        Value::Null => {}
        // Another shape: counted as its JSON text, as chat does.
        other => f(Piece::Text(Cow::Owned(other.to_string()))),
    }
}

/// One content part: its `text` (`input_text`, `output_text`,
/// `summary_text`, …) or `refusal`; anything else gets the non-text
/// allowance.
fn visit_part<'a>(part: &'a Value, f: &mut impl FnMut(Piece<'a>)) {
    let text = match part {
        Value::String(text) => Some(text.as_str()),
        _ => ["text", "refusal"]
            .iter()
            .find_map(|key| part.get(key).and_then(Value::as_str)),
    };
    f(text.map_or(Piece::NonText, |t| Piece::Text(Cow::Borrowed(t))));
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::tokens::{DEFAULT_NON_TEXT_PART_TOKENS, Profile};
    use crate::wire::{ChatCompletionRequest, ResponsesRequest};

    fn responses(raw: Value) -> ResponsesRequest {
        serde_json::from_value(raw).expect("request")
    }

    fn count(model: &str, text: &str) -> u64 {
        TokenizerKind::for_model(model).count(text)
    }

    // proves: WIRE-1 (a Responses request is estimated as the equivalent
    // chat conversation), GW-5
    #[test]
    fn string_input_and_instructions_count_as_the_chat_conversation() {
        let est = TokenEstimator::new();
        let req = responses(json!({"model": "gpt-4o", "input": "hello world",
            "instructions": "You are terse.", "max_output_tokens": 50}));
        let chat: ChatCompletionRequest = serde_json::from_value(json!({
            "model": "gpt-4o", "max_tokens": 50, "messages": [
                {"role": "system", "content": "You are terse."},
                {"role": "user", "content": "hello world"}
            ]
        }))
        .expect("chat");
        assert_eq!(est.responses(&req), est.chat(&chat));
        let m = "gpt-4o";
        assert_eq!(
            est.responses(&req).input,
            REPLY_PRIMING_TOKENS
                + (TOKENS_PER_MESSAGE + count(m, "system") + count(m, "You are terse."))
                + (TOKENS_PER_MESSAGE + count(m, "user") + count(m, "hello world"))
        );
        // Nothing at all: just the priming.
        let bare = responses(json!({"model": m}));
        assert_eq!(est.responses(&bare).input, REPLY_PRIMING_TOKENS);
    }

    // proves: WIRE-1, GW-5 (items, text and non-text parts, calls and
    // their outputs are counted)
    #[test]
    fn item_arrays_with_parts_calls_and_outputs() {
        let est = TokenEstimator::new().with_non_text_part_tokens(100);
        let m = "gpt-4.1-mini";
        let req = responses(json!({"model": m, "input": [
            {"role": "user", "content": [
                {"type": "input_text", "text": "what is this"},
                {"type": "input_image", "image_url": "https://x/y.png"},
                {"type": "input_file", "file_id": "file_1"}
            ]},
            {"type": "message", "role": "assistant", "content": [
                {"type": "output_text", "text": "a cat", "annotations": []}
            ]},
            {"type": "function_call", "call_id": "call_1", "name": "lookup",
             "arguments": "{\"q\":\"cat\"}"},
            {"type": "function_call_output", "call_id": "call_1", "output": "a small cat"},
            {"type": "reasoning", "id": "rs_1", "encrypted_content": "opaque",
             "summary": [{"type": "summary_text", "text": "thought"}]}
        ]}));
        let expected = REPLY_PRIMING_TOKENS
            + (TOKENS_PER_MESSAGE + count(m, "user") + count(m, "what is this") + 200)
            + (TOKENS_PER_MESSAGE + count(m, "assistant") + count(m, "a cat"))
            + (TOKENS_PER_MESSAGE
                + TOKENS_PER_TOOL_CALL
                + count(m, "lookup")
                + count(m, "{\"q\":\"cat\"}"))
            + (TOKENS_PER_MESSAGE + count(m, "call_1") + count(m, "a small cat"))
            // The reasoning item's other text (here `encrypted_content`)
            // is counted too, as is any member the estimator does not know.
            + (TOKENS_PER_MESSAGE + count(m, "thought") + count(m, "opaque"));
        assert_eq!(est.responses(&req).input, expected);

        // Output parts of a call output count like content parts.
        let parts = responses(json!({"model": m, "input": [
            {"type": "function_call_output", "call_id": "c", "output": [
                {"type": "input_text", "text": "done"},
                {"type": "input_image", "image_url": "data:image/png;base64,AAAA"}
            ]}
        ]}));
        assert_eq!(
            est.responses(&parts).input,
            REPLY_PRIMING_TOKENS + TOKENS_PER_MESSAGE + count(m, "c") + count(m, "done") + 100
        );
        // A custom tool call counts its raw `input`.
        let custom = responses(json!({"model": m, "input": [
            {"type": "custom_tool_call", "call_id": "c", "name": "sh", "input": "ls -la"}
        ]}));
        assert_eq!(
            est.responses(&custom).input,
            REPLY_PRIMING_TOKENS
                + TOKENS_PER_MESSAGE
                + TOKENS_PER_TOOL_CALL
                + count(m, "sh")
                + count(m, "ls -la")
        );
    }

    // proves: GW-5 (tool definitions and a JSON schema format are counted)
    #[test]
    fn tools_and_json_schema_format_are_counted() {
        let est = TokenEstimator::new();
        let m = "gpt-4o";
        let tool = json!({"type": "function", "name": "lookup",
            "parameters": {"type": "object", "properties": {"q": {"type": "string"}}}});
        let plain = responses(json!({"model": m, "input": "x"}));
        let with_tool = responses(json!({"model": m, "input": "x", "tools": [tool]}));
        let base = est.responses(&plain).input;
        let tool_text = serde_json::to_string(&tool).expect("json");
        assert_eq!(
            est.responses(&with_tool).input,
            base + DEFINITIONS_OVERHEAD_TOKENS + count(m, &tool_text)
        );
        let format = json!({"type": "json_schema", "name": "s",
            "schema": {"type": "object", "properties": {"answer": {"type": "string"}}}});
        let schema = responses(json!({"model": m, "input": "x", "text": {"format": format}}));
        let format_text = serde_json::to_string(&format).expect("json");
        assert_eq!(
            est.responses(&schema).input,
            base + DEFINITIONS_OVERHEAD_TOKENS + count(m, &format_text)
        );
        // A plain text format and an empty tool list add nothing.
        let text = responses(json!({"model": m, "input": "x", "tools": [],
            "text": {"format": {"type": "text"}}}));
        assert_eq!(est.responses(&text).input, base);
    }

    // proves: GW-5 (output allowance: max_output_tokens, else the default)
    #[test]
    fn output_allowance_from_max_output_tokens_or_default() {
        let est = TokenEstimator::new().with_default_output(500);
        let m = "gpt-4o-mini";
        assert_eq!(
            est.responses(&responses(json!({"model": m, "input": "hi"})))
                .output,
            500
        );
        assert_eq!(
            est.responses(&responses(
                json!({"model": m, "input": "hi", "max_output_tokens": 64})
            ))
            .output,
            64
        );
        let huge = responses(json!({"model": m, "input": "hi", "max_output_tokens": u64::MAX}));
        assert_eq!(est.responses(&huge).output, u64::MAX);
        assert_eq!(est.responses(&huge).total(), u64::MAX);
    }

    // proves: Q-16 (profiles apply to the Responses route as to chat)
    #[test]
    fn profiles_apply_to_responses() {
        let text = "The quick brown fox jumps over the lazy dog. ".repeat(20);
        let instructions = "Answer in French.";
        let req = responses(json!({"model": "gpt-4o", "max_output_tokens": 50,
        "instructions": instructions,
        "input": [{"role": "user", "content": [
            {"type": "input_text", "text": text},
            {"type": "input_image", "image_url": "https://x/y.png"}
        ]}]}));
        let chars = (text.chars().count() + instructions.chars().count()) as u64;
        let tokenizer = TokenEstimator::new().responses(&req);
        assert_eq!(tokenizer.output, 50);
        assert!(tokenizer.input > DEFAULT_NON_TEXT_PART_TOKENS);
        let openai = TokenEstimator::new()
            .with_profile(Profile::OpenAi)
            .responses(&req);
        assert_eq!(openai.input, tokenizer.input.max(chars.div_ceil(4)));
        assert_eq!(openai.output, 50);
        let custom = TokenEstimator::new()
            .with_profile(Profile::Chars {
                chars_per_token: 2,
                output: false,
            })
            .responses(&req);
        assert_eq!(
            custom,
            TokenEstimate {
                input: chars.div_ceil(2),
                output: 0
            }
        );
        let anthropic = TokenEstimator::new()
            .with_profile(Profile::Anthropic)
            .responses(&req);
        assert_eq!(
            anthropic,
            TokenEstimate {
                input: tokenizer.input.max(chars.div_ceil(3)),
                output: 50
            }
        );
    }

    #[test]
    fn odd_shapes_are_estimated_without_panicking() {
        let est = TokenEstimator::new().with_non_text_part_tokens(7);
        let m = "mystery-model";
        for (input, expected) in [
            // A bare string item is a user message.
            (json!(["abcd"]), TOKENS_PER_MESSAGE + 1 + 1),
            // Numbers and nulls: framing only.
            (json!([1, null]), 2 * TOKENS_PER_MESSAGE),
            // An object input is one item.
            (
                json!({"role": "user", "content": "abcd"}),
                TOKENS_PER_MESSAGE + 1 + 1,
            ),
            // Odd content is counted as its JSON text (`{"a":1}` = 7 chars).
            (json!([{"content": {"a": 1}}]), TOKENS_PER_MESSAGE + 2),
            // An output object is one part; a screenshot has no text.
            (
                json!([{"type": "computer_call_output", "call_id": "abcd",
                        "output": {"type": "computer_screenshot", "image_url": "x"}}]),
                TOKENS_PER_MESSAGE + 1 + 7,
            ),
            (json!(7), TOKENS_PER_MESSAGE),
        ] {
            let req = responses(json!({"model": m, "input": input}));
            assert_eq!(
                est.responses(&req).input,
                REPLY_PRIMING_TOKENS + expected,
                "{input}"
            );
        }
    }
}

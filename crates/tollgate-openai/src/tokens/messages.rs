//! Anthropic Messages request estimation (SPEC WIRE-3, Q-12, Q-16).
//!
//! Anthropic publishes no offline tokenizer for its current models (its
//! `count_tokens` endpoint is a network call, which admission must not
//! wait for), so a Messages request is estimated from its characters at a
//! fixed ratio, with framing allowances on top.
//!
//! The ratio, [`ANTHROPIC_CHARS_PER_TOKEN`] = 3, is deliberately
//! conservative: Claude's tokenizer averages about 3.5 characters per
//! English token, so 3 reserves roughly 15 % more input than an English
//! prompt uses, and settlement refunds the difference once the response
//! reports `usage.input_tokens` (SPEC Q-5). Code, non-Latin scripts and
//! numbers tokenise denser than English; the margin covers part of that
//! and the rest is recorded as debt at settlement.
//!
//! Calibrating it: every line of the gateway's access log carries
//! `tokens_estimated` (input estimate + output allowance) and
//! `tokens_reported` (the provider's input + output). On calls that ran to
//! their `max_tokens` cap (`stop_reason` `max_tokens`), or after taking the
//! output allowance and the reported output out of each side, the two
//! differ only by the input estimate's error. Then `3 × Σ estimated input
//! / Σ reported input` is the traffic's characters per token (a little
//! high, since the framing allowances are rounded up: judge it on long
//! prompts, where framing is negligible). When it is 4 or more (typical of
//! plain English prose),
//! `accounting = { chars_per_token = 4, output = "max_tokens" }`
//! reserves closer; a `chars` rule's ratio replaces
//! [`ANTHROPIC_CHARS_PER_TOKEN`] here (rounded down: a larger ratio reserves
//! less, and a shortfall is recorded as debt at settlement). Every other
//! profile uses 3.

use serde_json::Value;

use super::estimator::{Profile, TokenEstimate, TokenEstimator};

/// Characters per token of the Anthropic estimate: 3, below Claude's
/// average of about 3.5 characters per English token, so that the
/// estimate errs high and settlement refunds the difference (see the
/// module documentation for how to calibrate it).
pub const ANTHROPIC_CHARS_PER_TOKEN: u32 = 3;

/// Once per Messages request: the fixed framing Claude's prompt format
/// wraps a conversation in (turn markers around the conversation and the
/// primed assistant turn). 8 is rounded up from the few tokens such
/// framing takes, and is above the simulator's documented 3, so the
/// estimate never falls below what the simulator charges.
pub const ANTHROPIC_REQUEST_OVERHEAD: u64 = 8;

/// Per message: the turn marker and role (`Human:` / `Assistant:`) that
/// frame each turn. 4 is rounded up from the two or three tokens a turn
/// marker takes, and is above the simulator's documented 3 per message.
pub const ANTHROPIC_TOKENS_PER_MESSAGE: u64 = 4;

/// Once per request with tool definitions: the tool-use system prompt
/// Anthropic adds, which it documents as 346 tokens for current Claude
/// models with `tool_choice` `auto` or `none` (313 with `any` or a named
/// tool); the larger figure is reserved. Each definition is then counted
/// as its compact JSON text at the character ratio.
pub const ANTHROPIC_TOOLS_OVERHEAD_TOKENS: u64 = 346;

/// How deep `tool_result` / `document` content is followed; deeper content
/// (never valid, only possible in hostile input) is counted as JSON text.
const MAX_NESTING: u8 = 2;

impl TokenEstimator {
    /// Estimates an Anthropic Messages request (SPEC WIRE-3, Q-12): input
    /// tokens for the input-token limit, the `max_tokens` allowance for the
    /// output-token limit.
    ///
    /// With `ratio` = the `chars` profile's `chars_per_token`, else
    /// [`ANTHROPIC_CHARS_PER_TOKEN`], and `T(text)` = `ceil(chars / ratio)`
    /// (characters are Unicode scalar values; each text is rounded up on
    /// its own):
    ///
    /// Input = [`ANTHROPIC_REQUEST_OVERHEAD`] + the `system` content + Σ
    /// over messages ([`ANTHROPIC_TOKENS_PER_MESSAGE`] + its content) + the
    /// tool definitions ([`ANTHROPIC_TOOLS_OVERHEAD_TOKENS`] once, then `T`
    /// of each definition's compact JSON). Content is `T` of a string, or
    /// the sum over its blocks of: `T(text)` of any block's `text`; plus,
    /// by type, `T(thinking)`; for `tool_use` (and server / MCP tool uses)
    /// `T` of its `id`, `name` and compact JSON `input`; for `tool_result`
    /// (and server tool results) `T(tool_use_id)` and its content counted
    /// the same way; for `image` and `document` the non-text allowance
    /// ([`TokenEstimator::with_non_text_part_tokens`]), or a plain-text
    /// document's text; nothing for `redacted_thinking` (opaque); `T` of
    /// the compact JSON of any other block without text.
    ///
    /// Output: `max_tokens`, else the default allowance; 0 under a `chars`
    /// profile that does not count output.
    ///
    /// With a ratio of at most 4 the input is never below the simulator's
    /// documented count for the same request (`3 + T₄(system) + Σ (3 +
    /// T₄(content))` with 4 characters per token).
    pub fn messages(&self, request: &crate::wire::MessagesRequest) -> TokenEstimate {
        let ratio = match self.profile {
            Profile::Chars {
                chars_per_token, ..
            } => chars_per_token.max(1),
            Profile::Tokenizer | Profile::OpenAi | Profile::Anthropic => ANTHROPIC_CHARS_PER_TOKEN,
        };
        let counter = Counter {
            ratio: u64::from(ratio),
            non_text: self.non_text_part,
        };
        let mut input = ANTHROPIC_REQUEST_OVERHEAD;
        if let Some(system) = &request.system {
            input = input.saturating_add(counter.content(system, 0));
        }
        for message in &request.messages {
            input = input
                .saturating_add(ANTHROPIC_TOKENS_PER_MESSAGE)
                .saturating_add(counter.content(&message.content, 0));
        }
        if let Some(tools) = request.tools.as_ref().filter(|t| !t.is_empty()) {
            input = input.saturating_add(ANTHROPIC_TOOLS_OVERHEAD_TOKENS);
            for tool in tools {
                input = input
                    .saturating_add(counter.json(tool))
                    .saturating_add(builtin_tool_tokens(tool));
            }
        }
        TokenEstimate {
            input,
            output: self.messages_output(request),
        }
    }

    /// [`messages`](Self::messages)'s output allowance alone (no text is
    /// counted).
    pub fn messages_output(&self, request: &crate::wire::MessagesRequest) -> u64 {
        self.counted_output(request.max_tokens.unwrap_or(self.default_output))
    }
}

/// The fixed cost Anthropic documents for one of its schema-less built-in
/// client tools (the definition itself is a type and a name, so its JSON
/// says almost nothing of it): `bash_*` 245 input tokens, `text_editor_*`
/// 700, `computer_*` 735 plus the 499 of its system prompt. Other tools
/// (custom tools, server tools such as web search, which bill per use)
/// add nothing here.
fn builtin_tool_tokens(tool: &Value) -> u64 {
    let kind = tool.get("type").and_then(Value::as_str).unwrap_or_default();
    if kind.starts_with("bash_") {
        245
    } else if kind.starts_with("text_editor_") {
        700
    } else if kind.starts_with("computer_") {
        735 + 499
    } else {
        0
    }
}

/// Counts Anthropic content at a character ratio.
struct Counter {
    ratio: u64,
    non_text: u64,
}

impl Counter {
    /// `ceil(chars / ratio)`.
    fn text(&self, text: &str) -> u64 {
        (text.chars().count() as u64).div_ceil(self.ratio)
    }

    /// `text` of the compact JSON of `value`.
    fn json(&self, value: &Value) -> u64 {
        self.text(&value.to_string())
    }

    /// A `content` (or `system`): a string, or an array of blocks.
    fn content(&self, content: &Value, depth: u8) -> u64 {
        match content {
            Value::String(text) => self.text(text),
            Value::Array(blocks) => blocks
                .iter()
                .map(|block| self.block(block, depth))
                .fold(0, u64::saturating_add),
            Value::Null => 0,
            other => self.json(other),
        }
    }

    fn block(&self, block: &Value, depth: u8) -> u64 {
        let map = match block {
            Value::Object(map) => map,
            Value::String(text) => return self.text(text),
            other => return self.json(other),
        };
        let str_field = |key: &str| map.get(key).and_then(Value::as_str);
        let text = str_field("text").map_or(0, |t| self.text(t));
        let nested = |content: Option<&Value>| match content {
            Some(content) if depth < MAX_NESTING => self.content(content, depth + 1),
            Some(content) => self.json(content),
            None => 0,
        };
        let kind = str_field("type").unwrap_or_default();
        let extra = match kind {
            "text" => 0,
            "thinking" => str_field("thinking").map_or(0, |t| self.text(t)),
            "redacted_thinking" => 0,
            "image" | "container_upload" => self.non_text,
            "document" => {
                let source = map.get("source");
                let source_kind = source
                    .and_then(|s| s.get("type"))
                    .and_then(Value::as_str)
                    .unwrap_or_default();
                let body = match source_kind {
                    "text" => source
                        .and_then(|s| s.get("data"))
                        .and_then(Value::as_str)
                        .map_or(0, |t| self.text(t)),
                    "content" => nested(source.and_then(|s| s.get("content"))),
                    _ => self.non_text,
                };
                ["title", "context"]
                    .iter()
                    .filter_map(|key| str_field(key))
                    .map(|t| self.text(t))
                    .fold(body, u64::saturating_add)
            }
            "tool_use" | "server_tool_use" | "mcp_tool_use" => {
                let input = map.get("input").map_or(0, |i| self.json(i));
                ["id", "name"]
                    .iter()
                    .filter_map(|key| str_field(key))
                    .map(|t| self.text(t))
                    .fold(input, u64::saturating_add)
            }
            k if k.ends_with("tool_result") => str_field("tool_use_id")
                .map_or(0, |id| self.text(id))
                .saturating_add(nested(map.get("content"))),
            _ if str_field("text").is_some() => 0,
            _ => self.json(block),
        };
        text.saturating_add(extra)
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;
    use serde_json::json;

    use super::*;
    use crate::wire::MessagesRequest;

    fn messages(raw: Value) -> MessagesRequest {
        serde_json::from_value(raw).expect("request")
    }

    /// `ceil(chars / 3)`.
    fn t3(text: &str) -> u64 {
        (text.chars().count() as u64).div_ceil(3)
    }

    /// The simulator's own count of a request's input tokens.
    fn sim_input(request: &MessagesRequest) -> u64 {
        tollgate_sim::tokens::messages_input_tokens(
            request.system.as_ref(),
            request.messages.iter().map(|m| Some(&m.content)),
        )
    }

    // proves: WIRE-3, Q-12 (input from the documented character ratio and
    // framing; output allowance from max_tokens)
    #[test]
    fn text_conversation_counts_by_the_documented_formula() {
        let est = TokenEstimator::new();
        let req = messages(json!({"model": "claude-sonnet-4-5", "max_tokens": 300,
        "system": "You are terse.",
        "messages": [
            {"role": "user", "content": "Hello there."},
            {"role": "assistant", "content": [{"type": "text", "text": "Hi!"}]},
            {"role": "user", "content": [
                {"type": "text", "text": "Explain LLMs"},
                {"type": "text", "text": "in one line."}
            ]}
        ]}));
        let expected = ANTHROPIC_REQUEST_OVERHEAD
            + t3("You are terse.")
            + (ANTHROPIC_TOKENS_PER_MESSAGE + t3("Hello there."))
            + (ANTHROPIC_TOKENS_PER_MESSAGE + t3("Hi!"))
            + (ANTHROPIC_TOKENS_PER_MESSAGE + t3("Explain LLMs") + t3("in one line."));
        assert_eq!(
            est.messages(&req),
            TokenEstimate {
                input: expected,
                output: 300
            }
        );
        assert!(est.messages(&req).input >= sim_input(&req));
        // System as blocks counts the same as the string.
        let blocks = messages(json!({"model": "m", "max_tokens": 1,
            "system": [{"type": "text", "text": "You are terse.", "cache_control": {"type": "ephemeral"}}],
            "messages": []}));
        assert_eq!(
            est.messages(&blocks).input,
            ANTHROPIC_REQUEST_OVERHEAD + t3("You are terse.")
        );
    }

    // proves: Q-12, WIRE-3 (output allowance: max_tokens, else the default;
    // none under a chars profile that does not count output)
    #[test]
    fn output_allowance_from_max_tokens_or_default() {
        let est = TokenEstimator::new().with_default_output(700);
        let with = messages(json!({"model": "m", "max_tokens": 64,
            "messages": [{"role": "user", "content": "hi"}]}));
        let without = messages(json!({"model": "m",
            "messages": [{"role": "user", "content": "hi"}]}));
        assert_eq!(est.messages(&with).output, 64);
        assert_eq!(est.messages(&without).output, 700);
        let no_output = est.with_profile(Profile::Chars {
            chars_per_token: 4,
            output: false,
        });
        assert_eq!(no_output.messages(&with).output, 0);
        let huge = messages(json!({"model": "m", "max_tokens": u64::MAX, "messages": []}));
        assert_eq!(est.messages(&huge).total(), u64::MAX);
    }

    // proves: WIRE-3 (tools, tool use and results, images and documents
    // are counted)
    #[test]
    fn tools_blocks_and_non_text_content_are_counted() {
        let est = TokenEstimator::new().with_non_text_part_tokens(100);
        let tool = json!({"name": "lookup", "description": "Look a word up.",
            "input_schema": {"type": "object", "properties": {"q": {"type": "string"}}}});
        let input = json!({"q": "cat"});
        let req = messages(json!({"model": "claude-haiku-4-5", "max_tokens": 10,
        "tools": [tool],
        "messages": [
            {"role": "user", "content": [
                {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AAAA"}},
                {"type": "document", "source": {"type": "base64", "media_type": "application/pdf", "data": "AAAA"}},
                {"type": "document", "title": "Notes", "source": {"type": "text", "media_type": "text/plain", "data": "plain text"}},
                {"type": "text", "text": "what is this?"}
            ]},
            {"role": "assistant", "content": [
                {"type": "thinking", "thinking": "Let me look.", "signature": "sig"},
                {"type": "redacted_thinking", "data": "opaque"},
                {"type": "tool_use", "id": "toolu_1", "name": "lookup", "input": input}
            ]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "toolu_1", "content": [
                    {"type": "text", "text": "a small cat"},
                    {"type": "image", "source": {"type": "url", "url": "https://x/y.png"}}
                ]},
                {"type": "tool_result", "tool_use_id": "toolu_2", "content": "42", "is_error": false}
            ]}
        ]}));
        let expected = ANTHROPIC_REQUEST_OVERHEAD
            + ANTHROPIC_TOOLS_OVERHEAD_TOKENS
            + t3(&tool.to_string())
            + (ANTHROPIC_TOKENS_PER_MESSAGE
                + 100
                + 100
                + (t3("Notes") + t3("plain text"))
                + t3("what is this?"))
            + (ANTHROPIC_TOKENS_PER_MESSAGE
                + t3("Let me look.")
                + (t3("toolu_1") + t3("lookup") + t3(&input.to_string())))
            + (ANTHROPIC_TOKENS_PER_MESSAGE
                + (t3("toolu_1") + t3("a small cat") + 100)
                + (t3("toolu_2") + t3("42")));
        assert_eq!(est.messages(&req).input, expected);
        assert!(est.messages(&req).input >= sim_input(&req));
        // An empty tool list adds nothing.
        let empty = messages(json!({"model": "m", "tools": [], "messages": []}));
        assert_eq!(est.messages(&empty).input, ANTHROPIC_REQUEST_OVERHEAD);
    }

    // proves: Q-16 (the profile decides the ratio; Tokenizer, OpenAi and
    // Anthropic all count Anthropic's way)
    #[test]
    fn profiles_apply_to_messages() {
        let text = "The quick brown fox jumps over the lazy dog. ".repeat(20);
        let req = messages(json!({"model": "claude-sonnet-4-5", "max_tokens": 50,
            "messages": [{"role": "user", "content": text}]}));
        let at = |ratio: u64| {
            ANTHROPIC_REQUEST_OVERHEAD
                + ANTHROPIC_TOKENS_PER_MESSAGE
                + (text.chars().count() as u64).div_ceil(ratio)
        };
        for profile in [Profile::Tokenizer, Profile::OpenAi, Profile::Anthropic] {
            assert_eq!(
                TokenEstimator::new().with_profile(profile).messages(&req),
                TokenEstimate {
                    input: at(3),
                    output: 50
                },
                "{profile:?}"
            );
        }
        let custom = TokenEstimator::new().with_profile(Profile::Chars {
            chars_per_token: 4,
            output: true,
        });
        assert_eq!(
            custom.messages(&req),
            TokenEstimate {
                input: at(4),
                output: 50
            }
        );
        // A zero ratio is read as 1, never a division by zero.
        let zero = TokenEstimator::new().with_profile(Profile::Chars {
            chars_per_token: 0,
            output: true,
        });
        assert_eq!(zero.messages(&req).input, at(1));
        assert_eq!(Profile::Anthropic.as_str(), "anthropic");
    }

    #[test]
    fn odd_and_deeply_nested_shapes_do_not_panic() {
        let est = TokenEstimator::new();
        let mut deep = json!("x");
        for _ in 0..100 {
            deep = json!([{"type": "tool_result", "tool_use_id": "t", "content": deep}]);
        }
        for content in [
            json!(null),
            json!(5),
            json!({"a": "b"}),
            json!(["loose string", 1, null, {"no_type": true}]),
            json!([{"type": "document"}, {"type": "document", "source": 3}]),
            json!([{"type": "tool_use"}, {"type": "web_search_tool_result", "content": {"type": "error"}}]),
            deep,
        ] {
            let req = messages(json!({"model": "m", "messages": [
                {"role": "user", "content": content}
            ]}));
            let estimate = est.messages(&req);
            assert!(estimate.input >= sim_input(&req), "{content}");
        }
    }

    fn text_strategy() -> impl Strategy<Value = String> {
        prop_oneof![
            ".{0,200}",
            "[a-z ]{0,300}",
            "[\\u{0}-\\u{7f}]{0,50}",
            "[日本語한국어éü🦀]{0,40}",
        ]
    }

    fn block_strategy() -> impl Strategy<Value = Value> {
        (text_strategy(), 0..6u8).prop_map(|(text, kind)| match kind {
            0 => json!({"type": "text", "text": text}),
            1 => json!({"type": "image", "source": {"type": "base64", "data": text}}),
            2 => json!({"type": "tool_use", "id": "toolu_1", "name": "f", "input": {"q": text}}),
            3 => json!({"type": "tool_result", "tool_use_id": "toolu_1", "content": text}),
            4 => json!({"type": "tool_result", "tool_use_id": "toolu_1",
                        "content": [{"type": "text", "text": text}]}),
            _ => json!({"type": "thinking", "thinking": text, "text": text}),
        })
    }

    fn content_strategy() -> impl Strategy<Value = Value> {
        prop_oneof![
            text_strategy().prop_map(Value::String),
            prop::collection::vec(block_strategy(), 0..5).prop_map(Value::Array),
        ]
    }

    proptest! {
        // proves: WIRE-3, Q-12 (the estimate never reserves less input than
        // the simulator's documented count charges for the same request)
        #[test]
        fn estimate_is_never_below_the_simulators_count(
            system in prop::option::of(content_strategy()),
            contents in prop::collection::vec(content_strategy(), 0..6),
            ratio in prop::option::of(1..=4u32),
        ) {
            let mut raw = json!({"model": "claude-sonnet-4-5", "max_tokens": 16,
                "messages": contents.iter().enumerate().map(|(i, c)| json!({
                    "role": if i % 2 == 0 { "user" } else { "assistant" },
                    "content": c
                })).collect::<Vec<_>>()});
            if let (Some(system), Some(obj)) = (system, raw.as_object_mut()) {
                obj.insert("system".into(), system);
            }
            let req = messages(raw);
            let profile = ratio.map_or(Profile::Anthropic, |r| Profile::Chars {
                chars_per_token: r,
                output: true,
            });
            let estimate = TokenEstimator::new().with_profile(profile).messages(&req);
            prop_assert!(estimate.input >= sim_input(&req),
                "estimate {} < simulator {}", estimate.input, sim_input(&req));
            prop_assert_eq!(estimate.output, 16);
        }
    }
}

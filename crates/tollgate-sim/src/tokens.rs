//! The simulator's own token count. It is not a real tokenizer, on purpose:
//! it is simple, documented and deterministic, so a test can compute exactly
//! what a request will be charged.
//!
//! * text: `ceil(chars / 4)` where `chars` counts Unicode scalar values;
//! * chat prompt: `3 + Σ over messages (3 + text tokens of its content)`,
//!   where a message's content is its string, or the `text` fields of its
//!   content parts; other fields (role, name, tool calls) are not counted;
//! * embeddings input: text tokens of each string, or the length of each
//!   token-id array;
//! * completion: `min(max_completion_tokens or max_tokens, configured length)`;
//! * Responses API input: the chat prompt count over the `instructions` (if
//!   any, as one message) and the input items (a string `input` is one
//!   item; an item's content is its string or the `text` of its parts);
//!   output `min(max_output_tokens, configured length)`;
//! * Anthropic Messages input: `3 + text tokens of system (string or text
//!   blocks) + Σ over messages (3 + text tokens of its content)`; output
//!   `min(max_tokens, configured length)`. Anthropic publishes no offline
//!   tokenizer: this is the simulator's documented character-based count,
//!   the one its ITPM bucket charges and its `usage` reports.

use serde_json::Value;

/// Tokens the simulator counts for a piece of text: `ceil(chars / 4)`.
pub fn text_tokens(text: &str) -> u64 {
    (text.chars().count() as u64).div_ceil(4)
}

/// Tokens the simulator counts for one chat message's `content` value.
pub fn content_tokens(content: &Value) -> u64 {
    match content {
        Value::String(s) => text_tokens(s),
        Value::Array(parts) => parts
            .iter()
            .map(|part| match part.get("text") {
                Some(Value::String(s)) => text_tokens(s),
                _ => 0,
            })
            .sum(),
        _ => 0,
    }
}

/// Characters (Unicode scalar values) of one chat message's `content`: its
/// string, or the `text` fields of its content parts. What a character-based
/// charge mode ([`crate::ChargeMode::Chars`]) counts.
pub fn content_chars(content: &Value) -> u64 {
    let chars = |s: &str| s.chars().count() as u64;
    match content {
        Value::String(s) => chars(s),
        Value::Array(parts) => parts
            .iter()
            .map(|part| match part.get("text") {
                Some(Value::String(s)) => chars(s),
                _ => 0,
            })
            .sum(),
        _ => 0,
    }
}

/// Per-message overhead of the chat prompt count.
pub const PER_MESSAGE: u64 = 3;
/// Fixed overhead of every chat prompt (the primed assistant reply).
pub const PER_PROMPT: u64 = 3;

/// Prompt tokens of a chat request, given each message's `content` (absent
/// content counts as `None`).
pub fn chat_prompt_tokens<'a>(contents: impl IntoIterator<Item = Option<&'a Value>>) -> u64 {
    contents.into_iter().fold(PER_PROMPT, |sum, content| {
        sum.saturating_add(PER_MESSAGE)
            .saturating_add(content.map_or(0, content_tokens))
    })
}

/// Input tokens of a Responses API request: the chat prompt count over the
/// `instructions` (one message, when present) and the `contents` of the
/// input items.
pub fn responses_input_tokens<'a>(
    instructions: Option<&'a Value>,
    contents: impl IntoIterator<Item = Option<&'a Value>>,
) -> u64 {
    chat_prompt_tokens(instructions.map(Some).into_iter().chain(contents))
}

/// Input tokens of an Anthropic Messages request: `PER_PROMPT` + the text
/// tokens of `system` + Σ (`PER_MESSAGE` + text tokens of each message's
/// content).
pub fn messages_input_tokens<'a>(
    system: Option<&'a Value>,
    contents: impl IntoIterator<Item = Option<&'a Value>>,
) -> u64 {
    chat_prompt_tokens(contents).saturating_add(system.map_or(0, content_tokens))
}

/// Completion tokens a chat request will generate: the smaller of what it
/// allows and what the simulator generates.
pub fn completion_tokens(requested: Option<u64>, configured: u32) -> u64 {
    let configured = u64::from(configured);
    requested.map_or(configured, |r| r.min(configured))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn text_is_a_quarter_of_its_characters_rounded_up() {
        assert_eq!(text_tokens(""), 0);
        assert_eq!(text_tokens("a"), 1);
        assert_eq!(text_tokens("abcd"), 1);
        assert_eq!(text_tokens("abcde"), 2);
        // Characters, not bytes.
        assert_eq!(text_tokens("éééé"), 1);
    }

    #[test]
    fn chat_prompts_add_the_documented_overheads() {
        let a = json!("Hello, world!"); // 13 chars -> 4
        let b = json!([{"type": "text", "text": "abcd"}, {"type": "image_url"}]);
        assert_eq!(chat_prompt_tokens([Some(&a)]), 3 + 3 + 4);
        assert_eq!(
            chat_prompt_tokens([Some(&a), Some(&b), None]),
            3 + 7 + 4 + 3
        );
        assert_eq!(chat_prompt_tokens([]), 3);
    }

    #[test]
    fn responses_and_messages_inputs_follow_the_documented_counts() {
        let instructions = json!("Be brief."); // 9 chars -> 3
        let a = json!("Hello, world!"); // 13 chars -> 4
        let b = json!([{"type": "input_text", "text": "abcd"}]);
        assert_eq!(responses_input_tokens(None, [Some(&a)]), 3 + 3 + 4);
        assert_eq!(
            responses_input_tokens(Some(&instructions), [Some(&a), Some(&b)]),
            3 + (3 + 3) + (3 + 4) + (3 + 1)
        );
        let system = json!([{"type": "text", "text": "abcdefgh"}]);
        assert_eq!(messages_input_tokens(None, [Some(&a)]), 3 + 3 + 4);
        assert_eq!(
            messages_input_tokens(Some(&system), [Some(&a), Some(&b)]),
            3 + 2 + (3 + 4) + (3 + 1)
        );
    }

    #[test]
    fn completion_is_capped_by_the_request() {
        assert_eq!(completion_tokens(None, 16), 16);
        assert_eq!(completion_tokens(Some(5), 16), 5);
        assert_eq!(completion_tokens(Some(500), 16), 16);
    }
}

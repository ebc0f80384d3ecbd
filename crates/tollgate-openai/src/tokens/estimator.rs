//! The estimator, accounting profiles, and chat and embeddings request
//! estimation.

use serde_json::Value;

use super::encoding::TokenizerKind;
use super::messages::ANTHROPIC_CHARS_PER_TOKEN;
use crate::wire::{
    ChatCompletionRequest, ChatMessage, ContentPart, EmbeddingInput, EmbeddingsRequest,
    MessageContent,
};

/// Framing tokens around every message (`<|start|>role…<|end|>`), as in
/// OpenAI's published counting recipe for current chat models.
pub const TOKENS_PER_MESSAGE: u64 = 3;
/// Extra token when a message has a `name`.
pub const TOKENS_PER_NAME: u64 = 1;
/// Tokens that prime the reply (`<|start|>assistant<|message|>`), once per
/// request.
pub const REPLY_PRIMING_TOKENS: u64 = 3;
/// Framing of one tool call (or legacy function call) in a message, on top
/// of its name and arguments.
pub const TOKENS_PER_TOOL_CALL: u64 = 3;
/// Once per request with tool or function definitions: the preamble the
/// provider wraps them in. Each definition is then counted as its compact
/// JSON text, which is a little more than the provider's own rendering.
pub const DEFINITIONS_OVERHEAD_TOKENS: u64 = 10;
/// Default allowance for one non-text content part (image, audio, file):
/// 765 is a 1024×1024 image at high detail on gpt-4o (85 + 4 tiles × 170).
pub const DEFAULT_NON_TEXT_PART_TOKENS: u64 = 765;
/// Default output allowance when a request sets neither
/// `max_completion_tokens` nor `max_tokens`.
pub const DEFAULT_OUTPUT_TOKENS: u64 = 1024;
/// The smallest `max_output_tokens` the Responses API takes (OpenAI and
/// Azure refuse less): the least a Responses request without a cap is
/// reserved and sent with.
pub const MIN_RESPONSES_OUTPUT_TOKENS: u64 = 16;

/// An estimate: tokens the request sends and tokens it may generate.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct TokenEstimate {
    /// Prompt tokens.
    pub input: u64,
    /// Output allowance (all choices).
    pub output: u64,
}

impl TokenEstimate {
    /// `input + output`, saturating: the amount to reserve.
    pub fn total(&self) -> u64 {
        self.input.saturating_add(self.output)
    }
}

/// How a provider's rate limiter counts a request's tokens (SPEC Q-16):
/// what tollgate reserves, so that its window fills as the provider's does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Profile {
    /// The model family's tokenizer: what the provider bills (the default).
    #[default]
    Tokenizer,
    /// OpenAI's documented rate-limit rule: the request is counted from its
    /// character count (about four characters per token) together with its
    /// output cap (`max_completion_tokens`/`max_tokens`). Reserved: the
    /// larger of `ceil(chars / 4)` and the tokenizer's count, plus the
    /// output allowance, so neither reading of the rule is under-reserved.
    OpenAi,
    /// A custom rule: `ceil(chars / chars_per_token)` input tokens, plus the
    /// output allowance when `output` is set.
    Chars {
        /// Characters per token (at least 1).
        chars_per_token: u32,
        /// Whether the output cap is counted too.
        output: bool,
    },
    /// Anthropic's rate limiter: input tokens on the input-token limit
    /// (ITPM), the `max_tokens` output allowance on the output-token limit
    /// (OTPM), counted at admission; estimated at
    /// [`ANTHROPIC_CHARS_PER_TOKEN`] characters per token.
    ///
    /// A Messages request is estimated by [`TokenEstimator::messages`];
    /// any other request (e.g. sent to Anthropic's OpenAI-compatible
    /// endpoint) reserves `ceil(chars / ANTHROPIC_CHARS_PER_TOKEN)` of its
    /// text, never less than the tokenizer's count (which also covers its
    /// tools, schemas and non-text parts), plus the output cap.
    Anthropic,
}

impl Profile {
    /// The configuration name: `tokenizer`, `openai`, `chars`, `anthropic`.
    pub const fn as_str(&self) -> &'static str {
        match self {
            Profile::Tokenizer => "tokenizer",
            Profile::OpenAi => "openai",
            Profile::Chars { .. } => "chars",
            Profile::Anthropic => "anthropic",
        }
    }
}

/// Estimates requests. Cheap to copy; the tokenizers are process-wide.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TokenEstimator {
    pub(super) default_output: u64,
    pub(super) non_text_part: u64,
    pub(super) profile: Profile,
}

impl Default for TokenEstimator {
    fn default() -> Self {
        Self::new()
    }
}

impl TokenEstimator {
    /// An estimator with [`DEFAULT_OUTPUT_TOKENS`] and
    /// [`DEFAULT_NON_TEXT_PART_TOKENS`].
    pub fn new() -> Self {
        TokenEstimator {
            default_output: DEFAULT_OUTPUT_TOKENS,
            non_text_part: DEFAULT_NON_TEXT_PART_TOKENS,
            profile: Profile::Tokenizer,
        }
    }

    /// Counts as the provider's rate limiter does (SPEC Q-16).
    pub fn with_profile(mut self, profile: Profile) -> Self {
        self.profile = profile;
        self
    }

    /// The accounting profile.
    pub fn profile(&self) -> Profile {
        self.profile
    }

    /// Output allowance per choice for requests without an output cap.
    pub fn with_default_output(mut self, tokens: u64) -> Self {
        self.default_output = tokens;
        self
    }

    /// Allowance for each non-text content part.
    pub fn with_non_text_part_tokens(mut self, tokens: u64) -> Self {
        self.non_text_part = tokens;
        self
    }

    /// The configured default output allowance.
    pub fn default_output(&self) -> u64 {
        self.default_output
    }

    /// The output cap a request without one is sent with: the default
    /// allowance its estimate reserved, so that no completion outgrows
    /// its reservation (SPEC Q-7, BUD-2); `None` when the profile leaves
    /// the output uncounted (`output = "none"`).
    pub fn output_cap(&self) -> Option<u64> {
        match self.profile {
            Profile::Chars { output: false, .. } => None,
            _ => Some(self.default_output),
        }
    }

    /// The same for a Responses request: at least
    /// [`MIN_RESPONSES_OUTPUT_TOKENS`], as its estimate reserves.
    pub fn responses_output_cap(&self) -> Option<u64> {
        self.output_cap()
            .map(|cap| cap.max(MIN_RESPONSES_OUTPUT_TOKENS))
    }

    /// Tokens of `text` for `model`.
    pub fn count_text(&self, model: &str, text: &str) -> u64 {
        TokenizerKind::for_model(model).count(text)
    }

    /// Estimates a chat completion request.
    ///
    /// Input: for every message [`TOKENS_PER_MESSAGE`] + role + content
    /// (text, text parts, and [`TokenEstimator::with_non_text_part_tokens`]
    /// per other part) + name ([`TOKENS_PER_NAME`] extra) + refusal + tool
    /// call id + each tool call's name and arguments
    /// ([`TOKENS_PER_TOOL_CALL`] extra each); then [`REPLY_PRIMING_TOKENS`];
    /// then tool and function definitions and a `response_format` JSON
    /// schema as compact JSON text ([`DEFINITIONS_OVERHEAD_TOKENS`] once
    /// when there is any).
    ///
    /// Output: `max_completion_tokens`, else `max_tokens`, else the default
    /// allowance, times `n`.
    pub fn chat(&self, request: &ChatCompletionRequest) -> TokenEstimate {
        let output = self.chat_output(request);
        let chars = || {
            request
                .messages
                .iter()
                .map(message_chars)
                .fold(0, u64::saturating_add)
        };
        if !self.tokenizes() {
            let input = self.input(0, chars);
            return TokenEstimate { input, output };
        }
        let kind = TokenizerKind::for_model(&request.model);
        let mut input = REPLY_PRIMING_TOKENS;
        for message in &request.messages {
            input = input.saturating_add(self.message(kind, message));
        }
        let definitions: Vec<&Value> = request
            .tools
            .iter()
            .flatten()
            .chain(request.functions.iter().flatten())
            .chain(
                request
                    .extra
                    .get("response_format")
                    .and_then(|f| f.get("json_schema")),
            )
            .collect();
        if !definitions.is_empty() {
            input = input.saturating_add(DEFINITIONS_OVERHEAD_TOKENS);
            for definition in definitions {
                input = input.saturating_add(json_tokens(kind, definition));
            }
        }
        TokenEstimate {
            input: self.input(input, chars),
            output,
        }
    }

    /// [`chat`](Self::chat)'s output allowance alone (no text is counted).
    pub fn chat_output(&self, request: &ChatCompletionRequest) -> u64 {
        let per_choice = request.max_output_tokens().unwrap_or(self.default_output);
        self.counted_output(per_choice.saturating_mul(request.choice_count()))
    }

    /// `cap`, or 0 under a `chars` rule that leaves the output uncounted.
    pub(super) fn counted_output(&self, cap: u64) -> u64 {
        match self.profile {
            Profile::Chars { output: false, .. } => 0,
            _ => cap,
        }
    }

    /// Whether this estimator and `other` count every request's input
    /// alike: they differ at most in their default output allowance, so
    /// one's input estimate is the other's, and the text need be counted
    /// once (the output, [`chat_output`](Self::chat_output) and its kin,
    /// is cheap).
    pub fn same_input(&self, other: &TokenEstimator) -> bool {
        self.profile == other.profile && self.non_text_part == other.non_text_part
    }

    /// Whether the profile reads the tokenizer's count: every profile but
    /// a `chars` rule, whose estimate is the characters alone (so under
    /// it the tokenizer does not run at all).
    pub fn tokenizes(&self) -> bool {
        !matches!(self.profile, Profile::Chars { .. })
    }

    /// The input the accounting profile reserves, given the tokenizer's
    /// count `tokenized` and the request's character count. A `chars`
    /// rule reads only the characters: when [`tokenizes`](Self::tokenizes)
    /// is false, `tokenized` may be left 0. (The output side of the
    /// profile is [`counted_output`](Self::counted_output).)
    pub(super) fn input(&self, tokenized: u64, chars: impl FnOnce() -> u64) -> u64 {
        match self.profile {
            Profile::Tokenizer => tokenized,
            Profile::OpenAi => tokenized.max(chars().div_ceil(4)),
            Profile::Chars {
                chars_per_token, ..
            } => chars().div_ceil(u64::from(chars_per_token.max(1))),
            // On an OpenAI-shaped request (an OpenAI-compatible endpoint
            // of Anthropic's): the character rule for the text, never
            // below the tokenizer's count, which also holds the tools,
            // schemas and non-text parts the character count leaves out.
            Profile::Anthropic => {
                tokenized.max(chars().div_ceil(u64::from(ANTHROPIC_CHARS_PER_TOKEN)))
            }
        }
    }

    /// Estimates an embeddings request: the tokens of every input (a
    /// pre-tokenised input counts its length), no framing, no output.
    pub fn embeddings(&self, request: &EmbeddingsRequest) -> TokenEstimate {
        let texts: &[String] = match &request.input {
            EmbeddingInput::Text(text) => std::slice::from_ref(text),
            EmbeddingInput::Texts(texts) => texts,
            // Token ids are one token each, whatever the profile (a
            // character rule must not divide them).
            EmbeddingInput::Tokens(tokens) => {
                return TokenEstimate {
                    input: tokens.len() as u64,
                    output: 0,
                };
            }
            EmbeddingInput::TokenBatches(batches) => {
                let ids = batches.iter().map(|b| b.len() as u64);
                return TokenEstimate {
                    input: ids.fold(0, u64::saturating_add),
                    output: 0,
                };
            }
        };
        let chars = || {
            texts
                .iter()
                .map(|t| t.chars().count() as u64)
                .fold(0, u64::saturating_add)
        };
        if !self.tokenizes() {
            let input = self.input(0, chars);
            return TokenEstimate { input, output: 0 };
        }
        let kind = TokenizerKind::for_model(&request.model);
        let input = texts
            .iter()
            .map(|t| kind.count(t))
            .fold(0, u64::saturating_add);
        TokenEstimate {
            input: self.input(input, chars),
            output: 0,
        }
    }

    fn message(&self, kind: TokenizerKind, message: &ChatMessage) -> u64 {
        let mut tokens = TOKENS_PER_MESSAGE.saturating_add(kind.count(&message.role));
        if let Some(content) = &message.content {
            tokens = tokens.saturating_add(self.content(kind, content));
        }
        if let Some(name) = &message.name {
            tokens = tokens
                .saturating_add(kind.count(name))
                .saturating_add(TOKENS_PER_NAME);
        }
        if let Some(refusal) = &message.refusal {
            tokens = tokens.saturating_add(kind.count(refusal));
        }
        if let Some(id) = &message.tool_call_id {
            tokens = tokens.saturating_add(kind.count(id));
        }
        let calls = message
            .tool_calls
            .iter()
            .flatten()
            .filter_map(|c| c.function.as_ref())
            .chain(message.function_call.as_ref());
        for call in calls {
            tokens = tokens
                .saturating_add(TOKENS_PER_TOOL_CALL)
                .saturating_add(call.name.as_deref().map_or(0, |n| kind.count(n)))
                .saturating_add(call.arguments.as_deref().map_or(0, |a| kind.count(a)));
        }
        tokens
    }

    fn content(&self, kind: TokenizerKind, content: &MessageContent) -> u64 {
        match content {
            MessageContent::Text(text) => kind.count(text),
            MessageContent::Parts(parts) => parts
                .iter()
                .map(|part| self.part(kind, part))
                .fold(0, u64::saturating_add),
            MessageContent::Other(value) => json_tokens(kind, value),
        }
    }

    fn part(&self, kind: TokenizerKind, part: &ContentPart) -> u64 {
        match part {
            ContentPart::Text { text, .. } => kind.count(text),
            // Text-bearing parts of other spellings (`input_text`,
            // `refusal`) count their text; everything else gets the
            // allowance.
            ContentPart::Other(value) => ["text", "refusal"]
                .iter()
                .find_map(|key| value.get(key).and_then(Value::as_str))
                .map_or(self.non_text_part, |text| kind.count(text)),
        }
    }
}

/// Characters of a message's text content (text, and text parts), the
/// count that character-based accounting rules apply to.
fn message_chars(message: &ChatMessage) -> u64 {
    let text = |t: &str| t.chars().count() as u64;
    match &message.content {
        Some(MessageContent::Text(t)) => text(t),
        Some(MessageContent::Parts(parts)) => parts
            .iter()
            .map(|part| match part {
                ContentPart::Text { text: t, .. } => text(t),
                ContentPart::Other(value) => {
                    value.get("text").and_then(Value::as_str).map_or(0, text)
                }
            })
            .fold(0, u64::saturating_add),
        Some(MessageContent::Other(value)) => text(&value.to_string()),
        None => 0,
    }
}

pub(super) fn json_tokens(kind: TokenizerKind, value: &Value) -> u64 {
    // Serialising a `Value` cannot fail (its map keys are strings).
    let text = serde_json::to_string(value).unwrap_or_default();
    kind.count(&text)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn chat(raw: Value) -> ChatCompletionRequest {
        serde_json::from_value(raw).expect("request")
    }

    fn count(model: &str, text: &str) -> u64 {
        TokenizerKind::for_model(model).count(text)
    }

    // proves: Q-16 (the openai profile reserves at least ceil(chars / 4)
    // plus the output cap; the chars profile follows its own rule)
    #[test]
    fn profiles_count_as_the_provider_does() {
        let text = "The quick brown fox jumps over the lazy dog. ".repeat(20);
        let req = chat(json!({"model": "gpt-4o", "max_tokens": 50, "messages": [
            {"role": "user", "content": text}
        ]}));
        let chars = text.chars().count() as u64;
        let tokenizer = TokenEstimator::new().chat(&req);
        assert!(
            tokenizer.input < chars.div_ceil(4),
            "English text: fewer tokens than chars/4"
        );
        let openai = TokenEstimator::new()
            .with_profile(Profile::OpenAi)
            .chat(&req);
        assert_eq!(openai.input, chars.div_ceil(4));
        assert_eq!(openai.output, 50);
        let custom = TokenEstimator::new()
            .with_profile(Profile::Chars {
                chars_per_token: 3,
                output: false,
            })
            .chat(&req);
        assert_eq!(
            custom,
            TokenEstimate {
                input: chars.div_ceil(3),
                output: 0
            }
        );
        let embed: EmbeddingsRequest =
            serde_json::from_value(json!({"model": "text-embedding-3-small", "input": text}))
                .unwrap();
        let e = TokenEstimator::new()
            .with_profile(Profile::OpenAi)
            .embeddings(&embed);
        assert_eq!(e.input, chars.div_ceil(4));
    }

    // proves: Q-16 (a `chars` rule counts characters only: the estimate
    // of a chat, a Responses and an embeddings request is its rule's (token
    // ids one token each, not divided like characters), and the tokenizer,
    // whose count the rule never reads, does not run; every other profile
    // runs it)
    #[test]
    fn a_chars_rule_runs_no_tokenizer() {
        use crate::tokens::encoding::tests::bpe_runs;
        use crate::wire::ResponsesRequest;
        let text = "Counted by characters, not by byte pairs. ".repeat(30);
        let chars = text.chars().count() as u64;
        let rule = TokenEstimator::new().with_profile(Profile::Chars {
            chars_per_token: 3,
            output: true,
        });
        let tool = json!({"type": "function", "function": {"name": "f", "parameters": {}}});
        let req = chat(
            json!({"model": "gpt-4o", "max_tokens": 20, "n": 2, "tools": [tool],
            "messages": [{"role": "user", "content": text}]}),
        );
        let responses: ResponsesRequest = serde_json::from_value(json!({
            "model": "gpt-4o", "instructions": text, "input": text, "max_output_tokens": 40,
            "tools": [{"type": "function", "name": "f", "parameters": {}}]
        }))
        .unwrap();
        let texts: EmbeddingsRequest = serde_json::from_value(
            json!({"model": "text-embedding-3-small", "input": [text, text]}),
        )
        .unwrap();
        let ids: EmbeddingsRequest = serde_json::from_value(
            json!({"model": "text-embedding-3-small", "input": [[1, 2, 3], [4]]}),
        )
        .unwrap();
        let mut got = Vec::new();
        let runs = bpe_runs(|| {
            got.push(rule.chat(&req));
            got.push(rule.responses(&responses));
            got.push(rule.embeddings(&texts));
            got.push(rule.embeddings(&ids));
        });
        assert_eq!(runs, 0, "the tokenizer ran under a chars rule");
        let expected = [
            (chars.div_ceil(3), 40),
            ((2 * chars).div_ceil(3), 40),
            ((2 * chars).div_ceil(3), 0),
            (4, 0),
        ]
        .map(|(input, output)| TokenEstimate { input, output });
        assert_eq!(got, expected);
        for profile in [Profile::Tokenizer, Profile::OpenAi, Profile::Anthropic] {
            let est = TokenEstimator::new().with_profile(profile);
            assert!(
                bpe_runs(|| {
                    let _ = est.chat(&req);
                }) > 0,
                "{profile:?}"
            );
            assert!(
                bpe_runs(|| {
                    let _ = est.responses(&responses);
                }) > 0,
                "{profile:?}"
            );
            assert!(
                bpe_runs(|| {
                    let _ = est.embeddings(&texts);
                }) > 0,
                "{profile:?}"
            );
        }
    }

    // proves: Q-16, GW-5 (the output allowance computed alone is the
    // estimate's, on every route, profile and default allowance; and two
    // estimators that differ only in their default allowance estimate the
    // same input, so a chain of such deployments counts its text once)
    #[test]
    fn the_output_alone_and_the_shared_input_match_the_estimate() {
        use crate::wire::{MessagesRequest, ResponsesRequest};
        let text = "Output is priced apart from input. ".repeat(8);
        let chats = [
            json!({"model": "gpt-4o", "messages": [{"role": "user", "content": text}]}),
            json!({"model": "gpt-4o", "n": 3, "max_completion_tokens": 9,
                   "messages": [{"role": "user", "content": text}]}),
        ]
        .map(chat);
        let responses = [
            json!({"model": "gpt-4o", "input": text}),
            json!({"model": "gpt-4o", "input": text, "max_output_tokens": 7}),
        ]
        .map(|r| serde_json::from_value::<ResponsesRequest>(r).unwrap());
        let messages = [
            json!({"model": "claude-sonnet-4", "max_tokens": 11,
                   "messages": [{"role": "user", "content": text}]}),
            json!({"model": "claude-sonnet-4", "messages": [{"role": "user", "content": text}]}),
        ]
        .map(|r| serde_json::from_value::<MessagesRequest>(r).unwrap());
        let embeddings: EmbeddingsRequest =
            serde_json::from_value(json!({"model": "text-embedding-3-small", "input": text}))
                .unwrap();
        let profiles = [
            Profile::Tokenizer,
            Profile::OpenAi,
            Profile::Anthropic,
            Profile::Chars {
                chars_per_token: 3,
                output: true,
            },
            Profile::Chars {
                chars_per_token: 3,
                output: false,
            },
        ];
        for profile in profiles {
            let base = TokenEstimator::new().with_profile(profile);
            for default in [0, 100, 5_000] {
                let e = base.with_default_output(default);
                assert!(e.same_input(&base) && base.same_input(&e));
                let at = format!("{profile:?}, default {default}");
                for r in &chats {
                    assert_eq!(e.chat_output(r), e.chat(r).output, "{at}");
                    assert_eq!(e.chat(r).input, base.chat(r).input, "{at}");
                }
                for r in &responses {
                    assert_eq!(e.responses_output(r), e.responses(r).output, "{at}");
                    assert_eq!(e.responses(r).input, base.responses(r).input, "{at}");
                }
                for r in &messages {
                    assert_eq!(e.messages_output(r), e.messages(r).output, "{at}");
                    assert_eq!(e.messages(r).input, base.messages(r).input, "{at}");
                }
                assert_eq!(e.embeddings(&embeddings).output, 0, "{at}");
                assert_eq!(
                    e.embeddings(&embeddings).input,
                    base.embeddings(&embeddings).input
                );
            }
            for other in profiles.iter().filter(|p| **p != profile) {
                assert!(!base.same_input(&base.with_profile(*other)), "{profile:?}");
            }
            let parts = base.with_non_text_part_tokens(DEFAULT_NON_TEXT_PART_TOKENS + 1);
            assert!(!base.same_input(&parts), "{profile:?}");
        }
    }

    // proves: GW-5
    #[test]
    fn framing_overhead_per_message_name_and_priming() {
        let est = TokenEstimator::new();
        let req = chat(json!({"model": "gpt-4o", "messages": [
            {"role": "system", "content": "You are terse."},
            {"role": "user", "name": "ann", "content": "hello world"}
        ]}));
        let expected = REPLY_PRIMING_TOKENS
            + (TOKENS_PER_MESSAGE + count("gpt-4o", "system") + count("gpt-4o", "You are terse."))
            + (TOKENS_PER_MESSAGE
                + count("gpt-4o", "user")
                + count("gpt-4o", "hello world")
                + count("gpt-4o", "ann")
                + TOKENS_PER_NAME);
        assert_eq!(est.chat(&req).input, expected);
        // An empty conversation is just the priming.
        let empty = chat(json!({"model": "gpt-4o", "messages": []}));
        assert_eq!(est.chat(&empty).input, REPLY_PRIMING_TOKENS);
    }

    // The classic two-message conversation, worked by hand with the
    // published recipe and cl100k_base token counts.
    // proves: GW-5
    #[test]
    fn matches_the_cookbook_reference_for_a_simple_conversation() {
        let req = chat(json!({"model": "gpt-4-0613", "messages": [
            {"role": "system", "content": "You are a helpful assistant."},
            {"role": "user", "content": "Hello!"}
        ]}));
        // 3+1+6 (system) + 3+1+2 (user) + 3 priming = 19.
        assert_eq!(TokenEstimator::new().chat(&req).input, 19);
    }

    // proves: GW-5
    #[test]
    fn output_allowance_uses_caps_default_and_n() {
        let est = TokenEstimator::new().with_default_output(500);
        let base = json!({"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}]});
        let with = |extra: Value| {
            let mut raw = base.clone();
            if let (Some(obj), Some(add)) = (raw.as_object_mut(), extra.as_object()) {
                obj.extend(add.clone());
            }
            est.chat(&chat(raw)).output
        };
        assert_eq!(with(json!({})), 500);
        assert_eq!(with(json!({"n": 3})), 1500);
        assert_eq!(with(json!({"max_tokens": 100})), 100);
        assert_eq!(with(json!({"max_tokens": 100, "n": 2})), 200);
        // Both caps: the larger, whichever field the provider reads.
        assert_eq!(
            with(json!({"max_tokens": 100, "max_completion_tokens": 40})),
            100
        );
        assert_eq!(
            with(json!({"max_tokens": 40, "max_completion_tokens": 100})),
            100
        );
        assert_eq!(with(json!({"max_completion_tokens": 40, "n": 4})), 160);
        assert_eq!(
            with(json!({"max_completion_tokens": u64::MAX, "n": 2})),
            u64::MAX
        );
        assert_eq!(
            TokenEstimator::new().default_output(),
            DEFAULT_OUTPUT_TOKENS
        );
    }

    #[test]
    fn content_parts_tools_and_calls_are_counted() {
        let est = TokenEstimator::new().with_non_text_part_tokens(100);
        let m = "gpt-4o";
        let tool = json!({"type": "function", "function": {"name": "lookup",
            "parameters": {"type": "object", "properties": {"q": {"type": "string"}}}}});
        let req = chat(json!({"model": m, "messages": [
            {"role": "user", "content": [
                {"type": "text", "text": "what is this"},
                {"type": "image_url", "image_url": {"url": "https://x/y.png"}},
                {"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}}
            ]},
            {"role": "assistant", "tool_calls": [
                {"id": "call_1", "type": "function", "function": {"name": "lookup", "arguments": "{\"q\":\"cat\"}"}}
            ]},
            {"role": "tool", "tool_call_id": "call_1", "content": "a cat"}
        ], "tools": [tool]}));
        let tool_text = serde_json::to_string(&tool).expect("json");
        let expected = REPLY_PRIMING_TOKENS
            + (TOKENS_PER_MESSAGE + count(m, "user") + count(m, "what is this") + 200)
            + (TOKENS_PER_MESSAGE
                + count(m, "assistant")
                + TOKENS_PER_TOOL_CALL
                + count(m, "lookup")
                + count(m, "{\"q\":\"cat\"}"))
            + (TOKENS_PER_MESSAGE + count(m, "tool") + count(m, "call_1") + count(m, "a cat"))
            + DEFINITIONS_OVERHEAD_TOKENS
            + count(m, &tool_text);
        assert_eq!(est.chat(&req).input, expected);
    }

    #[test]
    fn legacy_functions_and_json_schema_are_counted() {
        let est = TokenEstimator::new();
        let plain =
            chat(json!({"model": "gpt-4o", "messages": [{"role": "user", "content": "x"}]}));
        let schema = chat(
            json!({"model": "gpt-4o", "messages": [{"role": "user", "content": "x"}],
            "response_format": {"type": "json_schema", "json_schema": {"name": "s",
                "schema": {"type": "object", "properties": {"answer": {"type": "string"}}}}}}),
        );
        let functions = chat(json!({"model": "gpt-4o", "messages": [
            {"role": "assistant", "content": null, "function_call": {"name": "f", "arguments": "{}"}}
        ], "functions": [{"name": "f", "parameters": {}}]}));
        let base = est.chat(&plain).input;
        assert!(est.chat(&schema).input > base + DEFINITIONS_OVERHEAD_TOKENS);
        assert!(est.chat(&functions).input > REPLY_PRIMING_TOKENS + DEFINITIONS_OVERHEAD_TOKENS);
        // A json_object response format adds nothing.
        let json_mode = chat(
            json!({"model": "gpt-4o", "messages": [{"role": "user", "content": "x"}],
            "response_format": {"type": "json_object"}}),
        );
        assert_eq!(est.chat(&json_mode).input, base);
    }

    // proves: Q-3 (every model gets an estimate, unknown ones by ratio)
    #[test]
    fn unknown_models_fall_back_to_the_character_ratio() {
        let est = TokenEstimator::new();
        let text = "a".repeat(41);
        let req = chat(json!({"model": "claude-3-haiku", "messages": [
            {"role": "user", "content": text}
        ], "max_tokens": 7}));
        // role "user" = ceil(4/4) = 1; content = ceil(41/4) = 11.
        assert_eq!(
            est.chat(&req),
            TokenEstimate {
                input: REPLY_PRIMING_TOKENS + TOKENS_PER_MESSAGE + 1 + 11,
                output: 7
            }
        );
        assert_eq!(est.count_text("mystery-model", "abcdefgh"), 2);
    }

    #[test]
    fn embeddings_count_every_input_shape() {
        let est = TokenEstimator::new();
        let m = "text-embedding-3-small";
        let cases = [
            (json!("hello world"), 2),
            (json!(["hello world", "hello world"]), 4),
            (json!([1, 2, 3, 4]), 4),
            (json!([[1, 2], [3], []]), 3),
            (json!([]), 0),
        ];
        for (input, expected) in cases {
            let req: EmbeddingsRequest =
                serde_json::from_value(json!({"model": m, "input": input})).expect("request");
            assert_eq!(
                est.embeddings(&req),
                TokenEstimate {
                    input: expected,
                    output: 0
                },
                "{input}"
            );
        }
        assert_eq!(
            TokenEstimate {
                input: u64::MAX,
                output: 1
            }
            .total(),
            u64::MAX
        );
    }
}

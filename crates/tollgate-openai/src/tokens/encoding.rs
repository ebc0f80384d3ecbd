//! Model family → tokenizer, and text counting.

use std::panic::{AssertUnwindSafe, catch_unwind};

use tiktoken_rs::CoreBPE;

/// Longest slice handed to the BPE in one call, in bytes.
///
/// Byte-pair merging is quadratic in the length of one pre-tokenised piece,
/// and a piece can be as long as a run of letters (a base64 blob, say), so
/// long texts are counted in slices. Slices are cut just before a space
/// that precedes a non-space character, which is where the tokenizers'
/// pre-tokenisation starts a new piece anyway, so ordinary text counts
/// exactly as a whole; a cut inside a long unbroken run may differ from the
/// whole-text count by a token or so per cut.
const SLICE_BYTES: usize = 2048;

/// Which tokenizer counts a model's text.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TokenizerKind {
    /// `o200k_base`.
    O200kBase,
    /// `cl100k_base`.
    Cl100kBase,
    /// No known tokenizer: `ceil(chars / 4)`.
    CharRatio,
}

impl TokenizerKind {
    /// The tokenizer for a model name.
    ///
    /// The name is lower-cased, a routing prefix up to the last `/`
    /// (`openai/gpt-4o`) and a fine-tune prefix `ft:` are removed, then the
    /// family is recognised by prefix (dated snapshots such as
    /// `gpt-4o-2024-08-06` and Azure spellings such as `gpt-35-turbo`
    /// included).
    pub fn for_model(model: &str) -> TokenizerKind {
        const O200K: [&str; 11] = [
            "gpt-4o",
            "chatgpt-4o",
            "gpt-4.1",
            "gpt-4.5",
            "gpt-5",
            "o1",
            "o3",
            "o4",
            "gpt-oss",
            "codex-mini",
            "computer-use",
        ];
        const CL100K: [&str; 7] = [
            "gpt-4",
            "gpt-3.5",
            "gpt-35",
            "text-embedding-3",
            "text-embedding-ada-002",
            "davinci-002",
            "babbage-002",
        ];
        let lower = model.trim().to_ascii_lowercase();
        let base = lower.rsplit('/').next().unwrap_or_default();
        let base = base.strip_prefix("ft:").unwrap_or(base);
        // o200k first: `gpt-4o` and `gpt-4.1` also start with `gpt-4`.
        if O200K.iter().any(|p| base.starts_with(p)) {
            TokenizerKind::O200kBase
        } else if CL100K.iter().any(|p| base.starts_with(p)) {
            TokenizerKind::Cl100kBase
        } else {
            TokenizerKind::CharRatio
        }
    }

    /// Tokens in `text`.
    ///
    /// Special-token spellings such as `<|endoftext|>` are counted as
    /// ordinary text (as providers do for user content). Never panics: should
    /// the tokenizer library panic, the character ratio is used instead.
    pub fn count(self, text: &str) -> u64 {
        let bpe = match self {
            TokenizerKind::O200kBase => bpe(tiktoken_rs::o200k_base_singleton),
            TokenizerKind::Cl100kBase => bpe(tiktoken_rs::cl100k_base_singleton),
            TokenizerKind::CharRatio => None,
        };
        let Some(bpe) = bpe else {
            return char_ratio(text);
        };
        #[cfg(test)]
        tests::BPE_RUNS.with(|n| n.set(n.get() + 1));
        slices(text)
            .map(|slice| {
                catch_unwind(AssertUnwindSafe(|| bpe.count_ordinary(slice)))
                    .map_or_else(|_| char_ratio(slice), |n| n as u64)
            })
            .fold(0u64, u64::saturating_add)
    }
}

/// Builds both tokenizers now, so the first request does not pay for it.
pub fn warm_up() {
    let _ = bpe(tiktoken_rs::o200k_base_singleton);
    let _ = bpe(tiktoken_rs::cl100k_base_singleton);
}

/// The singleton, or `None` if building it panicked (the vocabularies are
/// compiled into tiktoken-rs, so that would be a bug in the library).
fn bpe(singleton: fn() -> &'static CoreBPE) -> Option<&'static CoreBPE> {
    catch_unwind(singleton).ok()
}

/// `ceil(chars / 4)`.
pub(crate) fn char_ratio(text: &str) -> u64 {
    (text.chars().count() as u64).div_ceil(4)
}

/// Splits `text` into slices of at most about [`SLICE_BYTES`] bytes.
fn slices(text: &str) -> impl Iterator<Item = &str> {
    let mut rest = text;
    std::iter::from_fn(move || {
        if rest.is_empty() {
            return None;
        }
        let cut = cut_point(rest);
        let (slice, tail) = rest.split_at_checked(cut).unwrap_or((rest, ""));
        rest = tail;
        Some(slice)
    })
}

/// Where to end the next slice of `text` (always > 0 for non-empty text,
/// always a char boundary).
fn cut_point(text: &str) -> usize {
    if text.len() <= SLICE_BYTES {
        return text.len();
    }
    let bytes = text.as_bytes();
    // Prefer a space followed by a non-space, searching back from the limit
    // over the second half of the window.
    let preferred = (SLICE_BYTES / 2..SLICE_BYTES).rev().find(|&i| {
        bytes.get(i) == Some(&b' ') && bytes.get(i + 1).is_some_and(|b| !b.is_ascii_whitespace())
    });
    if let Some(i) = preferred {
        return i;
    }
    // Otherwise the last char boundary at or before the limit (a UTF-8
    // character is at most 4 bytes, so one is found within 4 steps).
    (1..=SLICE_BYTES)
        .rev()
        .find(|&i| text.is_char_boundary(i))
        .unwrap_or(text.len())
}

#[cfg(test)]
pub(crate) mod tests {
    use std::cell::Cell;

    use super::*;

    thread_local! {
        /// How many texts this thread handed to a BPE tokenizer.
        pub(crate) static BPE_RUNS: Cell<u64> = const { Cell::new(0) };
    }

    /// How many texts `f` hands to a BPE tokenizer on this thread.
    pub(crate) fn bpe_runs(f: impl FnOnce()) -> u64 {
        let before = BPE_RUNS.with(Cell::get);
        f();
        BPE_RUNS.with(Cell::get) - before
    }

    #[test]
    fn model_family_mapping() {
        use TokenizerKind::*;
        let cases = [
            ("gpt-4o", O200kBase),
            ("gpt-4o-mini-2024-07-18", O200kBase),
            ("chatgpt-4o-latest", O200kBase),
            ("gpt-4.1-nano", O200kBase),
            ("gpt-4.5-preview", O200kBase),
            ("gpt-5", O200kBase),
            ("gpt-5-mini", O200kBase),
            ("o1", O200kBase),
            ("o1-mini", O200kBase),
            ("o3-pro", O200kBase),
            ("o4-mini-2025-04-16", O200kBase),
            ("GPT-4O", O200kBase),
            ("openai/gpt-4o", O200kBase),
            ("ft:gpt-4o-mini:acme::abc123", O200kBase),
            ("gpt-4", Cl100kBase),
            ("gpt-4-turbo", Cl100kBase),
            ("gpt-4-0613", Cl100kBase),
            ("gpt-3.5-turbo", Cl100kBase),
            ("gpt-35-turbo-16k", Cl100kBase),
            ("text-embedding-3-small", Cl100kBase),
            ("text-embedding-3-large", Cl100kBase),
            ("text-embedding-ada-002", Cl100kBase),
            ("claude-3-5-sonnet", CharRatio),
            ("llama-3.1-70b", CharRatio),
            ("", CharRatio),
            ("my-deployment", CharRatio),
        ];
        for (model, kind) in cases {
            assert_eq!(TokenizerKind::for_model(model), kind, "{model}");
        }
    }

    // Reference encodings from OpenAI's tiktoken (the cookbook's
    // "tiktoken is great!" example and "hello world").
    #[test]
    fn counts_match_known_tiktoken_values() {
        let cl = TokenizerKind::Cl100kBase;
        let o2 = TokenizerKind::O200kBase;
        let cl_bpe = tiktoken_rs::cl100k_base_singleton();
        let o2_bpe = tiktoken_rs::o200k_base_singleton();
        assert_eq!(
            cl_bpe.encode_ordinary("tiktoken is great!"),
            [83, 1609, 5963, 374, 2294, 0]
        );
        assert_eq!(
            o2_bpe.encode_ordinary("tiktoken is great!"),
            [83, 8251, 2488, 382, 2212, 0]
        );
        assert_eq!(cl_bpe.encode_ordinary("hello world"), [15339, 1917]);
        assert_eq!(o2_bpe.encode_ordinary("hello world"), [24912, 2375]);
        assert_eq!(cl.count("hello world"), 2);
        assert_eq!(o2.count("hello world"), 2);
        assert_eq!(cl.count("tiktoken is great!"), 6);
        assert_eq!(o2.count("tiktoken is great!"), 6);
        assert_eq!(cl.count(""), 0);
        // Special-token spellings count as text, never as one special token.
        assert!(cl.count("<|endoftext|>") > 1);
    }

    #[test]
    fn char_ratio_rounds_up() {
        let r = TokenizerKind::CharRatio;
        assert_eq!(r.count(""), 0);
        assert_eq!(r.count("a"), 1);
        assert_eq!(r.count("abcd"), 1);
        assert_eq!(r.count("abcde"), 2);
        // Characters, not bytes.
        assert_eq!(r.count("ééééé"), 2);
    }

    #[test]
    fn slicing_keeps_ordinary_text_exact() {
        let text = "The quick brown fox jumps over the lazy dog. ".repeat(400);
        assert!(text.len() > 4 * SLICE_BYTES);
        let pieces: Vec<&str> = slices(&text).collect();
        assert!(pieces.len() > 4);
        assert_eq!(pieces.concat(), text);
        for kind in [TokenizerKind::Cl100kBase, TokenizerKind::O200kBase] {
            let bpe = match kind {
                TokenizerKind::O200kBase => tiktoken_rs::o200k_base_singleton(),
                _ => tiktoken_rs::cl100k_base_singleton(),
            };
            assert_eq!(kind.count(&text), bpe.count_ordinary(&text) as u64);
        }
    }

    #[test]
    fn slicing_handles_unbroken_and_multibyte_text() {
        let text = "é".repeat(3 * SLICE_BYTES);
        let pieces: Vec<&str> = slices(&text).collect();
        assert_eq!(pieces.concat(), text);
        assert!(pieces.iter().all(|p| p.len() <= SLICE_BYTES));
        let long_run = "a".repeat(200_000);
        let n = TokenizerKind::Cl100kBase.count(&long_run);
        assert!(n > 0);
    }
}

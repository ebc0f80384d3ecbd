//! The few top-level members of an upstream JSON object the provider looks
//! at (`choices`, `usage`, `error`), found in one pass over the text.
//!
//! Every stream event and one-shot body goes through this, so it is the
//! hottest parse of the relay. The pass is a fast path only: it accepts
//! what is plainly valid (what serde_json accepts for the same probe, with
//! the same members) and answers `None` for everything else: invalid JSON,
//! but also what is merely unusual (an escape in a top-level key, a
//! repeated member, deep nesting). The caller then parses with serde_json,
//! which gives the verdict and the error message. So an answer of this
//! pass never differs from serde_json's, and an error is always
//! serde_json's (`tests::agrees_with_serde_json` checks the first half on
//! generated and mutated JSON).

/// The members found: whether `choices` has an element, and the text of
/// `usage` and `error` when present and not `null`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(super) struct Members<'a> {
    /// `choices` is an array with at least one element (absent or `null`:
    /// `false`).
    pub choices: bool,
    /// The `usage` member's value as written (without surrounding space).
    pub usage: Option<&'a str>,
    /// The `error` member's value as written.
    pub error: Option<&'a str>,
}

/// Nesting this pass follows before it leaves the text to serde_json.
const MAX_DEPTH: u32 = 64;

/// The members of `text`, an object with nothing but JSON whitespace
/// around it, or `None` when serde_json must decide (see the module
/// documentation).
pub(super) fn members(text: &str) -> Option<Members<'_>> {
    let mut s = Scan {
        b: text.as_bytes(),
        i: 0,
    };
    let mut found = Members::default();
    let mut seen = [false; 3];
    s.ws();
    s.eat(b'{')?;
    s.ws();
    if s.peek() == Some(b'}') {
        s.i += 1;
    } else {
        loop {
            let key = s.member_head()?;
            let slot = match key {
                b"choices" => 0,
                b"usage" => 1,
                b"error" => 2,
                _ => {
                    s.value()?;
                    if s.next_member()? {
                        continue;
                    }
                    break;
                }
            };
            if std::mem::replace(&mut seen[slot], true) {
                return None;
            }
            let start = s.i;
            if s.null() {
                // `null`: absent, for all three.
            } else if slot == 0 {
                if s.peek() != Some(b'[') {
                    return None;
                }
                s.value()?;
                // `[` then anything but (space and) `]`: an element.
                found.choices = text
                    .get(start + 1..s.i - 1)
                    .is_some_and(|inner| !inner.trim_matches(is_ws_char).is_empty());
            } else {
                s.value()?;
                let raw = text.get(start..s.i)?;
                if slot == 1 {
                    found.usage = Some(raw);
                } else {
                    found.error = Some(raw);
                }
            }
            if !s.next_member()? {
                break;
            }
        }
    }
    s.ws();
    (s.i == s.b.len()).then_some(found)
}

/// Every top-level member of an object, as [`top_level`] finds them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct TopLevel<'a> {
    /// Each member's key (its bytes between the quotes: no escape in it)
    /// and where its value's text is, in order.
    pub members: Vec<(&'a [u8], std::ops::Range<usize>)>,
    /// Where the object's closing `}` is.
    pub close: usize,
}

/// Every top-level member of `b`, an object with nothing but JSON
/// whitespace around it, or `None` when serde_json must decide (as for
/// [`members`]: an escape in a top-level key, deep nesting, anything
/// invalid).
pub(super) fn top_level(b: &[u8]) -> Option<TopLevel<'_>> {
    let mut s = Scan { b, i: 0 };
    let mut members = Vec::new();
    s.ws();
    s.eat(b'{')?;
    s.ws();
    if s.peek() != Some(b'}') {
        loop {
            let key = s.member_head()?;
            let start = s.i;
            s.value()?;
            members.push((key, start..s.i));
            s.ws();
            if s.peek() == Some(b'}') {
                break;
            }
            s.eat(b',')?;
        }
    }
    let close = s.i;
    s.eat(b'}')?;
    s.ws();
    (s.i == b.len()).then_some(TopLevel { members, close })
}

/// JSON's whitespace (serde_json's too): space, tab, line feed, return.
fn is_ws(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | b'\r')
}

fn is_ws_char(c: char) -> bool {
    u8::try_from(c).is_ok_and(is_ws)
}

/// Where the plain run of a string's bytes starting at `i` stops: the
/// index of the first `"`, `\\` or control character, or the end. Eight
/// bytes are tested at a time (the lowest flagged byte of each test is
/// exact).
fn string_stop(b: &[u8], mut i: usize) -> usize {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGH: u64 = 0x8080_8080_8080_8080;
    let zero_byte = |v: u64| v.wrapping_sub(ONES) & !v & HIGH;
    while let Some(chunk) = b.get(i..i + 8) {
        let Ok(word) = <[u8; 8]>::try_from(chunk) else {
            break;
        };
        let w = u64::from_le_bytes(word);
        let found = zero_byte(w ^ (ONES * u64::from(b'"')))
            | zero_byte(w ^ (ONES * u64::from(b'\\')))
            | (w.wrapping_sub(ONES * 0x20) & !w & HIGH);
        if found != 0 {
            return i + (found.trailing_zeros() / 8) as usize;
        }
        i += 8;
    }
    while let Some(&c) = b.get(i) {
        if c == b'"' || c == b'\\' || c < 0x20 {
            break;
        }
        i += 1;
    }
    i
}

struct Scan<'a> {
    b: &'a [u8],
    i: usize,
}

impl<'a> Scan<'a> {
    fn peek(&self) -> Option<u8> {
        self.b.get(self.i).copied()
    }

    fn ws(&mut self) {
        while self.peek().is_some_and(is_ws) {
            self.i += 1;
        }
    }

    fn eat(&mut self, c: u8) -> Option<()> {
        (self.peek() == Some(c)).then(|| self.i += 1)
    }

    /// After a member and its space: `,` (another follows: `true`) or `}`
    /// (the end: `false`).
    fn next_member(&mut self) -> Option<bool> {
        self.ws();
        match self.peek()? {
            b',' => {
                self.i += 1;
                Some(true)
            }
            b'}' => {
                self.i += 1;
                Some(false)
            }
            _ => None,
        }
    }

    /// `null` (eaten) or not (nothing eaten).
    fn null(&mut self) -> bool {
        let is = self.b.get(self.i..self.i + 4) == Some(b"null");
        if is {
            self.i += 4;
        }
        is
    }

    /// A top-level member's key (no escape in it), its colon and the
    /// space around them: the key's bytes, the scan at its value.
    #[inline]
    fn member_head(&mut self) -> Option<&'a [u8]> {
        self.ws();
        let key = self.plain_key()?;
        self.ws();
        self.eat(b':')?;
        self.ws();
        Some(key)
    }

    /// A key with no escape in it: its bytes between the quotes.
    fn plain_key(&mut self) -> Option<&'a [u8]> {
        self.eat(b'"')?;
        let start = self.i;
        self.i = string_stop(self.b, start);
        if self.peek()? != b'"' {
            return None;
        }
        let key = self.b.get(start..self.i)?;
        self.i += 1;
        Some(key)
    }

    /// A string's rest after its opening quote: escapes checked as
    /// serde_json checks a string it skips (the escape letter, four hex
    /// digits after `\u`), no control character.
    fn string_rest(&mut self) -> Option<()> {
        loop {
            self.i = string_stop(self.b, self.i);
            match self.peek()? {
                b'"' => {
                    self.i += 1;
                    return Some(());
                }
                b'\\' => {
                    self.i += 1;
                    match self.peek()? {
                        b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't' => self.i += 1,
                        b'u' => {
                            let hex = self.b.get(self.i + 1..self.i + 5)?;
                            if !hex.iter().all(u8::is_ascii_hexdigit) {
                                return None;
                            }
                            self.i += 5;
                        }
                        _ => return None,
                    }
                }
                // A control character.
                _ => return None,
            }
        }
    }

    fn digits(&mut self) -> usize {
        let start = self.i;
        while self.peek().is_some_and(|c| c.is_ascii_digit()) {
            self.i += 1;
        }
        self.i - start
    }

    /// A number: `-`? (`0` | [1-9][0-9]*) (`.` [0-9]+)? ([eE] [+-]? [0-9]+)?
    fn number(&mut self) -> Option<()> {
        if self.peek() == Some(b'-') {
            self.i += 1;
        }
        match self.peek()? {
            b'0' => {
                self.i += 1;
                if self.peek().is_some_and(|c| c.is_ascii_digit()) {
                    return None;
                }
            }
            b'1'..=b'9' => {
                self.digits();
            }
            _ => return None,
        }
        if self.peek() == Some(b'.') {
            self.i += 1;
            if self.digits() == 0 {
                return None;
            }
        }
        if matches!(self.peek(), Some(b'e' | b'E')) {
            self.i += 1;
            if matches!(self.peek(), Some(b'+' | b'-')) {
                self.i += 1;
            }
            if self.digits() == 0 {
                return None;
            }
        }
        Some(())
    }

    fn literal(&mut self, word: &[u8]) -> Option<()> {
        (self.b.get(self.i..self.i + word.len()) == Some(word)).then(|| self.i += word.len())
    }

    /// One value of any kind, nested to at most [`MAX_DEPTH`]. Which kind
    /// of container each open level is, is kept in a bit stack (1: an
    /// object).
    fn value(&mut self) -> Option<()> {
        let mut depth: u32 = 0;
        let mut objects: u64 = 0;
        loop {
            // A value.
            self.ws();
            match self.peek()? {
                b'"' => {
                    self.i += 1;
                    self.string_rest()?;
                }
                b'n' => self.literal(b"null")?,
                b't' => self.literal(b"true")?,
                b'f' => self.literal(b"false")?,
                b'-' | b'0'..=b'9' => self.number()?,
                open @ (b'[' | b'{') => {
                    self.i += 1;
                    depth += 1;
                    if depth > MAX_DEPTH {
                        return None;
                    }
                    let is_object = open == b'{';
                    objects = (objects << 1) | u64::from(is_object);
                    self.ws();
                    let close = if is_object { b'}' } else { b']' };
                    if self.peek() == Some(close) {
                        self.i += 1;
                        depth -= 1;
                        objects >>= 1;
                    } else {
                        if is_object {
                            self.member_key()?;
                        }
                        continue;
                    }
                }
                _ => return None,
            }
            // After a value: close levels until one continues with `,`.
            loop {
                if depth == 0 {
                    return Some(());
                }
                self.ws();
                let in_object = objects & 1 == 1;
                match self.peek()? {
                    b',' => {
                        self.i += 1;
                        if in_object {
                            self.ws();
                            self.member_key()?;
                        }
                        break;
                    }
                    b'}' if in_object => {}
                    b']' if !in_object => {}
                    _ => return None,
                }
                self.i += 1;
                depth -= 1;
                objects >>= 1;
            }
        }
    }

    /// A nested object's key (any string) and its colon.
    fn member_key(&mut self) -> Option<()> {
        self.eat(b'"')?;
        self.string_rest()?;
        self.ws();
        self.eat(b':')
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    /// What serde_json reads: the stream's own fallback.
    fn by_serde(text: &str) -> Option<Members<'_>> {
        crate::provider::stream::probed_members(text).ok()
    }

    // proves: LC-4, Q-6 (the members a stream event and a body are judged
    // by are read as serde_json reads them; the usual upstream shapes take
    // the fast path)
    #[test]
    fn reads_the_usual_shapes() {
        let chunk = r#"{"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"content":" gate \"q\" \u00e9"},"logprobs":null,"finish_reason":null}],"usage":null}"#;
        let last = "{\"choices\":[],\"usage\": {\"prompt_tokens\":9,\"completion_tokens\":16,\"total_tokens\":25} }\n";
        let error = r#"{"error":{"message":"overloaded","type":"server_error","code":null}}"#;
        let empty = " {} ";
        for (text, want) in [
            (
                chunk,
                Members {
                    choices: true,
                    usage: None,
                    error: None,
                },
            ),
            (
                last,
                Members {
                    choices: false,
                    usage: Some(r#"{"prompt_tokens":9,"completion_tokens":16,"total_tokens":25}"#),
                    error: None,
                },
            ),
            (
                error,
                Members {
                    choices: false,
                    usage: None,
                    error: Some(r#"{"message":"overloaded","type":"server_error","code":null}"#),
                },
            ),
            (empty, Members::default()),
        ] {
            assert_eq!(members(text), Some(want), "{text}");
            assert_eq!(by_serde(text), Some(want), "{text}");
        }
    }

    // proves: LC-4 (what serde_json refuses is never accepted; the unusual
    // is left to it)
    #[test]
    fn leaves_the_invalid_and_the_unusual_to_serde_json() {
        for text in [
            "",
            "[]",
            "{",
            r#"{"a":1,}"#,
            r#"{"a":01}"#,
            r#"{"a":1.}"#,
            r#"{"a":1e}"#,
            r#"{"a":-}"#,
            r#"{"a":"\x"}"#,
            r#"{"a":"\u12"}"#,
            "{\"a\":\"\u{1}\"}",
            r#"{"a":[1,]}"#,
            r#"{"a":{"b"}}"#,
            r#"{"a":[1}}"#,
            r#"{"a":{"b":1]}"#,
            r#"{"a":[{"b":1]]}"#,
            r#"{"a":{"b":1,}}"#,
            r#"{"a":tru}"#,
            r#"{"a":1} x"#,
            r#"{"choices":{}}"#,
            r#"{"choices":[],"choices":[]}"#,
            r#"{"usage":1,"usage":2}"#,
            r#"{"us\u0061ge":1}"#,
        ] {
            assert_eq!(members(text), None, "{text}");
        }
        let deep = format!("{{\"a\":{}{}}}", "[".repeat(65), "]".repeat(65));
        assert_eq!(members(&deep), None);
        assert!(by_serde(&deep).is_some());
    }

    /// JSON-like text: valid values, sometimes with a flaw.
    fn json(depth: u32) -> BoxedStrategy<String> {
        let leaf = prop_oneof![
            Just("null".to_owned()),
            Just("true".to_owned()),
            Just("false".to_owned()),
            "-?(0|[1-9][0-9]{0,3})(\\.[0-9]{1,3})?([eE][+-]?[0-9]{1,3})?",
            "\"([a-z \"\\\\/é]|\\\\[\"\\\\/bfnrtu]|\\\\u[0-9a-fA-F]{4}|\\\\u[dD][89abAB][0-9a-f]{2}){0,6}\"",
            "-?[0-9.eE+-]{1,5}",
            "\"[\\x00-\\x7f]{0,3}\"",
            Just("[1,]".to_owned()),
        ];
        if depth == 0 {
            return leaf.boxed();
        }
        let key = prop_oneof![
            Just("choices"),
            Just("usage"),
            Just("error"),
            Just("id"),
            Just("us\\u0061ge"),
        ];
        prop_oneof![
            3 => leaf,
            1 => proptest::collection::vec(json(depth - 1), 0..4)
                .prop_map(|v| format!("[{}]", v.join(","))),
            1 => proptest::collection::vec((key, json(depth - 1)), 0..4).prop_map(|v| {
                let members: Vec<String> =
                    v.into_iter().map(|(k, v)| format!("\"{k}\" : {v}")).collect();
                format!("{{{}}}", members.join(","))
            }),
        ]
        .boxed()
    }

    /// Up to four members, each key one of `keys` (as written in JSON).
    fn members_of(keys: &[&'static str]) -> impl Strategy<Value = Vec<(&'static str, String)>> {
        proptest::collection::vec((proptest::sample::select(keys.to_vec()), json(3)), 0..5)
    }

    /// An object of `members_of` (keys as written), `space` around every
    /// token.
    fn object_text(members_of: &[(&str, String)], space: &str) -> String {
        let inner: Vec<String> = members_of
            .iter()
            .map(|(k, v)| format!("\"{k}\"{space}:{space}{v}"))
            .collect();
        format!("{space}{{{space}{}{space}}}{space}", inner.join(","))
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(8192))]

        // proves: LC-4 (a string's plain run stops exactly where a byte by
        // byte scan stops)
        #[test]
        fn string_stop_is_exact(
            bytes in proptest::collection::vec(prop_oneof![3 => 0x20u8..0x7f, 1 => any::<u8>()], 0..40),
            from in any::<prop::sample::Index>(),
        ) {
            let i = from.index(bytes.len() + 1);
            let naive = (i..bytes.len())
                .find(|&j| matches!(bytes[j], b'"' | b'\\' | 0..=0x1f))
                .unwrap_or(bytes.len());
            prop_assert_eq!(string_stop(&bytes, i), naive);
        }

        // proves: LC-4, Q-6 (an answer of the fast pass is serde_json's)
        #[test]
        fn agrees_with_serde_json(
            members_of in members_of(&["choices", "usage", "error", "id", "x\\n"]),
            space in "[ \t\r\n]{0,2}",
            cut in any::<prop::sample::Index>(),
            flip in any::<prop::sample::Index>(),
            byte in prop_oneof![3 => proptest::sample::select(b"{}[],:\"\\0-.eEtfnu \x01".to_vec()), 1 => any::<u8>()],
            mutate in 0u8..5,
            mark in proptest::sample::select(b"{}[],:\"".to_vec()),
        ) {
            // Sometimes a flaw: cut short, or one byte changed.
            let mut bytes = object_text(&members_of, &space).into_bytes();
            match mutate {
                1 => bytes.truncate(cut.index(bytes.len() + 1)),
                2 if !bytes.is_empty() => {
                    let at = flip.index(bytes.len());
                    bytes[at] = byte;
                }
                // One of the punctuation marks changed.
                3 => {
                    let marks: Vec<usize> = (0..bytes.len())
                        .filter(|&i| b"{}[],:\"\\".contains(&bytes[i]))
                        .collect();
                    if !marks.is_empty() {
                        bytes[marks[flip.index(marks.len())]] = mark;
                    }
                }
                _ => {}
            }
            let Ok(text) = String::from_utf8(bytes) else {
                return Ok(());
            };
            if let Some(fast) = members(&text) {
                prop_assert_eq!(Some(fast), by_serde(&text), "{}", text);
            }
        }

        // proves: GW-5 (the members `top_level` finds are serde_json's: on
        // any text both accept (a body is edited only once serde_json has
        // parsed it), serde_json reads an object with exactly those keys,
        // each value (the last of a repeated key) the text of its range;
        // and the closing brace is where it says)
        #[test]
        fn top_level_agrees_with_serde_json(
            members_of in members_of(&["model", "max_tokens", "id", "x\\n", "é"]),
            space in "[ \t\r\n]{0,2}",
            flip in any::<prop::sample::Index>(),
            byte in proptest::sample::select(b"{}[],:\"\\0-.eEtfnu \x01".to_vec()),
            mutate in any::<bool>(),
        ) {
            let mut bytes = object_text(&members_of, &space).into_bytes();
            if mutate && !bytes.is_empty() {
                let at = flip.index(bytes.len());
                bytes[at] = byte;
            }
            let Some(top) = top_level(&bytes) else {
                return Ok(());
            };
            let Ok(serde) = serde_json::from_slice::<serde_json::Value>(&bytes) else {
                return Ok(());
            };
            let object = serde.as_object().expect("an object");
            prop_assert_eq!(bytes.get(top.close), Some(&b'}'));
            let mut distinct: Vec<&[u8]> = top.members.iter().map(|(k, _)| *k).collect();
            distinct.sort_unstable();
            distinct.dedup();
            // serde_json's map keeps its keys sorted.
            let serde_keys: Vec<&[u8]> = object.keys().map(|k| k.as_bytes()).collect();
            prop_assert_eq!(&serde_keys, &distinct);
            for (key, range) in &top.members {
                let value: serde_json::Value = serde_json::from_slice(&bytes[range.clone()])
                    .map_err(|e| TestCaseError::fail(format!("a member's range is not its value: {e}")))?;
                let last = top.members.iter().rev().find(|(k, _)| k == key).map(|(_, r)| r.clone());
                if last == Some(range.clone()) {
                    prop_assert_eq!(Some(&value), object.get(std::str::from_utf8(key).unwrap()));
                }
            }
        }
    }
}

//! Reading and validating an OpenAI Batch input file (SPEC BATCH-1, BATCH-5).
//!
//! The whole file is checked before anything is sent: every line must be a
//! JSON object with a unique non-empty `custom_id`, `method` `POST`, a
//! supported `url` and a `body` that parses as that endpoint's request.
//! Every problem is reported with its 1-based line number and a stable
//! code; one bad line stops the run before any request.

use std::collections::HashMap;
use std::fmt;
use std::io::BufRead;

use bytes::Bytes;
use serde_json::Value;
use sha2::{Digest, Sha256};
use tollgate_openai::provider::{Endpoint, UpstreamRequest};
use tollgate_openai::tokens::{MIN_RESPONSES_OUTPUT_TOKENS, TokenEstimator};
use tollgate_openai::wire::{ChatCompletionRequest, EmbeddingsRequest, ResponsesRequest};

/// The batch URL of chat completions.
pub const CHAT_URL: &str = "/v1/chat/completions";
/// The batch URL of embeddings.
pub const EMBEDDINGS_URL: &str = "/v1/embeddings";
/// The batch URL of the Responses API.
pub const RESPONSES_URL: &str = "/v1/responses";

/// How many problems are kept for the report; the count is always exact.
pub const MAX_REPORTED_ERRORS: usize = 50;

/// The stable codes of input problems (SPEC BATCH-1, BATCH-5, BATCH-3).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum InputErrorCode {
    /// A line is not a JSON object.
    InvalidJsonLine,
    /// A line has no `custom_id`, or it is not a non-empty string.
    MissingCustomId,
    /// A `custom_id` appears on two lines.
    DuplicateCustomId,
    /// The `method` is not `POST`, or the `url` is not one of
    /// `/v1/chat/completions` and `/v1/embeddings`.
    UnsupportedUrl,
    /// The `body` is missing or is not a valid request for its `url`.
    InvalidBody,
    /// The file holds no request.
    EmptyFile,
    /// An item's token estimate is larger than a whole token limit (SPEC
    /// Q-3): waiting cannot admit it.
    EstimateExceedsLimit,
    /// The output already holds a result for this `custom_id`, made from a
    /// different request (method, url or body changed since).
    ChangedInput,
}

impl InputErrorCode {
    /// The stable code, e.g. `duplicate_custom_id`.
    pub const fn as_str(self) -> &'static str {
        match self {
            InputErrorCode::InvalidJsonLine => "invalid_json_line",
            InputErrorCode::MissingCustomId => "missing_custom_id",
            InputErrorCode::DuplicateCustomId => "duplicate_custom_id",
            InputErrorCode::UnsupportedUrl => "unsupported_url",
            InputErrorCode::InvalidBody => "invalid_body",
            InputErrorCode::EmptyFile => "empty_file",
            InputErrorCode::EstimateExceedsLimit => "estimate_exceeds_limit",
            InputErrorCode::ChangedInput => "changed_input",
        }
    }
}

impl fmt::Display for InputErrorCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One problem of the input file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InputError {
    /// The 1-based line number (`None` for the whole file).
    pub line: Option<usize>,
    /// The stable code.
    pub code: InputErrorCode,
    /// What is wrong, for a person.
    pub message: String,
}

impl fmt::Display for InputError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.line {
            Some(line) => write!(f, "line {line}: {}: {}", self.code, self.message),
            None => write!(f, "{}: {}", self.code, self.message),
        }
    }
}

/// Every problem found in an input file (the first
/// [`MAX_REPORTED_ERRORS`] are kept, `total` counts all).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InputErrors {
    /// The problems kept, in line order.
    pub errors: Vec<InputError>,
    /// How many problems there were.
    pub total: usize,
}

impl InputErrors {
    pub(crate) fn new() -> Self {
        InputErrors {
            errors: Vec::new(),
            total: 0,
        }
    }

    pub(crate) fn push(&mut self, line: Option<usize>, code: InputErrorCode, message: String) {
        self.total += 1;
        if self.errors.len() < MAX_REPORTED_ERRORS {
            self.errors.push(InputError {
                line,
                code,
                message,
            });
        }
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.total == 0
    }
}

impl fmt::Display for InputErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} problem(s) in the input", self.total)?;
        for e in &self.errors {
            write!(f, "\n  {e}")?;
        }
        if self.total > self.errors.len() {
            write!(f, "\n  ... and {} more", self.total - self.errors.len())?;
        }
        Ok(())
    }
}

impl std::error::Error for InputErrors {}

/// One validated request of the input file.
///
/// The body is not kept: an item is its place in the file, its estimate
/// and its hash (about 200 bytes), so a queue of 100,000 items costs a few
/// MiB whatever the prompts' size. The body is read again when a worker
/// takes the item ([`request_from_line`]), and its hash checked.
#[derive(Debug, Clone)]
pub struct Item {
    /// Its 1-based line number.
    pub line: usize,
    /// Byte offset of the line in the file.
    pub offset: u64,
    /// Length of the line in bytes (without its line break).
    pub len: usize,
    /// The caller's id, unique in the file.
    pub custom_id: String,
    /// The endpoint.
    pub endpoint: Endpoint,
    /// The tokens reserved for each attempt (the accounting profile's
    /// count of input plus the output cap).
    pub estimate: tollgate::TokenEstimate,
    /// The model the body names (its price, SPEC BUD-6).
    pub model: String,
    /// `sha256:` and the hex digest of `POST`, the URL and the body, to
    /// recognise a changed request under the same `custom_id` on resume.
    pub hash: String,
}

impl Item {
    /// The batch URL (`/v1/chat/completions` or `/v1/embeddings`).
    pub fn url(&self) -> &'static str {
        url_of(self.endpoint)
    }
}

fn url_of(endpoint: Endpoint) -> &'static str {
    match endpoint {
        Endpoint::ChatCompletions => CHAT_URL,
        Endpoint::Embeddings => EMBEDDINGS_URL,
        Endpoint::Responses => RESPONSES_URL,
        Endpoint::Messages => "/v1/messages",
    }
}

/// The request of `item` from its line `raw` as read again from the file:
/// the body re-serialised with sorted keys, checked against the hash the
/// item was validated with. A chat completions or Responses body without
/// an output cap is sent with `output_cap`, the allowance its estimate
/// reserved (`max_completion_tokens`, `max_output_tokens`), so that the
/// provider never writes more than was reserved (SPEC Q-7, BUD-2).
///
/// # Errors
/// The line no longer parses or no longer hashes the same (the input file
/// changed during the run).
pub fn request_from_line(
    item: &Item,
    raw: &[u8],
    output_cap: Option<u64>,
) -> Result<UpstreamRequest, String> {
    let changed = || {
        format!(
            "input line {} (custom_id `{}`) changed while the run was going on",
            item.line,
            printable(&item.custom_id)
        )
    };
    let Ok(Value::Object(mut object)) = serde_json::from_slice::<Value>(raw) else {
        return Err(changed());
    };
    let mut body = object.remove("body").ok_or_else(changed)?;
    let mut canonical = serde_json::to_vec(&body).map_err(|_| changed())?;
    if request_hash(item.url(), &canonical) != item.hash {
        return Err(changed());
    }
    if let Some(cap) = output_cap
        && cap_output(item.endpoint, &mut body, cap)
    {
        canonical = serde_json::to_vec(&body).map_err(|_| changed())?;
    }
    Ok(UpstreamRequest::new(
        item.endpoint,
        Bytes::from(canonical),
        false,
        false,
    ))
}

/// Sets the output cap of a chat completions or Responses `body` that has
/// none (absent or `null`) to `cap`; returns whether it did.
fn cap_output(endpoint: Endpoint, body: &mut Value, cap: u64) -> bool {
    let fields: &[&str] = match endpoint {
        Endpoint::ChatCompletions => &["max_completion_tokens", "max_tokens"],
        Endpoint::Responses => &["max_output_tokens"],
        Endpoint::Embeddings | Endpoint::Messages => return false,
    };
    let Value::Object(object) = body else {
        return false;
    };
    if fields
        .iter()
        .any(|f| object.get(*f).is_some_and(|v| !v.is_null()))
    {
        return false;
    }
    let cap = match endpoint {
        Endpoint::Responses => cap.max(MIN_RESPONSES_OUTPUT_TOKENS),
        _ => cap,
    };
    object.insert(fields[0].to_owned(), Value::from(cap));
    true
}

/// The hash stored with each result: `sha256:` and the hex digest of
/// `"POST " + url + "\n" + body`, where the body is serialised with sorted
/// keys and no whitespace, so reformatting a line does not change it.
pub fn request_hash(url: &str, canonical_body: &[u8]) -> String {
    let mut h = Sha256::new();
    h.update(b"POST ");
    h.update(url.as_bytes());
    h.update(b"\n");
    h.update(canonical_body);
    let digest = h.finalize();
    let mut out = String::with_capacity(7 + 64);
    out.push_str("sha256:");
    for b in digest {
        out.push_str(&format!("{b:02x}"));
    }
    out
}

/// Parses and validates a whole input file held in memory (SPEC BATCH-1);
/// see [`read`].
///
/// # Errors
/// Every problem found, each with its line and code.
pub fn parse(data: &[u8], estimator: &TokenEstimator) -> Result<Vec<Item>, InputErrors> {
    match read(std::io::Cursor::new(data), estimator) {
        Ok(result) => result,
        Err(e) => {
            let mut errors = InputErrors::new();
            errors.push(None, InputErrorCode::InvalidJsonLine, e.to_string());
            Err(errors)
        }
    }
}

/// Reads and validates a whole input file line by line (SPEC BATCH-1):
/// only one line is in memory at a time.
///
/// Blank lines are skipped; a `\r` before a line's `\n` is ignored, and
/// so is a UTF-8 byte order mark at the start of the file.
///
/// # Errors
/// The outer error is a read error; the inner one every problem found,
/// each with its line and code.
pub fn read(
    mut reader: impl BufRead,
    estimator: &TokenEstimator,
) -> std::io::Result<Result<Vec<Item>, InputErrors>> {
    let mut errors = InputErrors::new();
    let mut items = Vec::new();
    let mut seen: HashMap<String, usize> = HashMap::new();
    let mut buf = Vec::new();
    let mut offset = 0u64;
    let mut line = 0usize;
    loop {
        buf.clear();
        let n = reader.read_until(b'\n', &mut buf)?;
        if n == 0 {
            break;
        }
        line += 1;
        let mut start = offset;
        offset += n as u64;
        let raw = buf.strip_suffix(b"\n").unwrap_or(&buf);
        let mut raw = raw.strip_suffix(b"\r").unwrap_or(raw);
        // A UTF-8 byte order mark (some Windows editors write one) is not
        // part of the first line's JSON.
        if line == 1
            && let Some(rest) = raw.strip_prefix(b"\xEF\xBB\xBF")
        {
            raw = rest;
            start += 3;
        }
        if raw.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        match parse_line(line, raw, estimator) {
            Ok(mut item) => match seen.get(&item.custom_id) {
                Some(first) => errors.push(
                    Some(line),
                    InputErrorCode::DuplicateCustomId,
                    format!(
                        "custom_id `{}` was already used on line {first}",
                        printable(&item.custom_id)
                    ),
                ),
                None => {
                    item.offset = start;
                    item.len = raw.len();
                    seen.insert(item.custom_id.clone(), line);
                    items.push(item);
                }
            },
            Err((code, message, id)) => {
                // A bad line still claims its id, so a later duplicate of
                // it is reported too.
                if let Some(id) = id {
                    if let Some(first) = seen.get(&id) {
                        errors.push(
                            Some(line),
                            InputErrorCode::DuplicateCustomId,
                            format!(
                                "custom_id `{}` was already used on line {first}",
                                printable(&id)
                            ),
                        );
                    } else {
                        seen.insert(id, line);
                    }
                }
                errors.push(Some(line), code, message);
            }
        }
    }
    if items.is_empty() && errors.is_empty() {
        errors.push(
            None,
            InputErrorCode::EmptyFile,
            "the input file holds no request".to_owned(),
        );
    }
    if errors.is_empty() {
        items.shrink_to_fit();
        Ok(Ok(items))
    } else {
        errors.errors.sort_by_key(|e| e.line);
        Ok(Err(errors))
    }
}

type LineError = (InputErrorCode, String, Option<String>);

fn parse_line(line: usize, raw: &[u8], estimator: &TokenEstimator) -> Result<Item, LineError> {
    let value: Value = serde_json::from_slice(raw).map_err(|e| {
        (
            InputErrorCode::InvalidJsonLine,
            format!("not valid JSON: {e}"),
            None,
        )
    })?;
    let Value::Object(mut object) = value else {
        return Err((
            InputErrorCode::InvalidJsonLine,
            "not a JSON object".to_owned(),
            None,
        ));
    };
    let custom_id = match object.get("custom_id") {
        Some(Value::String(s)) if !s.is_empty() => s.clone(),
        Some(Value::String(_)) => {
            return Err((
                InputErrorCode::MissingCustomId,
                "`custom_id` is empty".to_owned(),
                None,
            ));
        }
        Some(_) => {
            return Err((
                InputErrorCode::MissingCustomId,
                "`custom_id` is not a string".to_owned(),
                None,
            ));
        }
        None => {
            return Err((
                InputErrorCode::MissingCustomId,
                "no `custom_id`".to_owned(),
                None,
            ));
        }
    };
    let id = || Some(custom_id.clone());
    match object.get("method") {
        Some(Value::String(m)) if m == "POST" => {}
        Some(Value::String(m)) => {
            return Err((
                InputErrorCode::UnsupportedUrl,
                format!("method `{}` is not supported (only POST)", printable(m)),
                id(),
            ));
        }
        Some(_) => {
            return Err((
                InputErrorCode::UnsupportedUrl,
                "`method` is not a string".to_owned(),
                id(),
            ));
        }
        None => {
            return Err((
                InputErrorCode::UnsupportedUrl,
                "no `method` (expected \"POST\")".to_owned(),
                id(),
            ));
        }
    }
    let endpoint = match object.get("url") {
        Some(Value::String(u)) if u == CHAT_URL => Endpoint::ChatCompletions,
        Some(Value::String(u)) if u == EMBEDDINGS_URL => Endpoint::Embeddings,
        Some(Value::String(u)) if u == RESPONSES_URL => Endpoint::Responses,
        Some(Value::String(u)) => {
            return Err((
                InputErrorCode::UnsupportedUrl,
                format!(
                    "url `{}` is not supported (only {CHAT_URL}, {EMBEDDINGS_URL} and \
                     {RESPONSES_URL})",
                    printable(u)
                ),
                id(),
            ));
        }
        Some(_) => {
            return Err((
                InputErrorCode::UnsupportedUrl,
                "`url` is not a string".to_owned(),
                id(),
            ));
        }
        None => {
            return Err((InputErrorCode::UnsupportedUrl, "no `url`".to_owned(), id()));
        }
    };
    let body = match object.remove("body") {
        Some(b @ Value::Object(_)) => b,
        Some(_) => {
            return Err((
                InputErrorCode::InvalidBody,
                "`body` is not a JSON object".to_owned(),
                id(),
            ));
        }
        None => {
            return Err((InputErrorCode::InvalidBody, "no `body`".to_owned(), id()));
        }
    };
    let invalid = |what: String| (InputErrorCode::InvalidBody, what, id());
    let model = body
        .get("model")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_owned();
    let estimate = match endpoint {
        Endpoint::ChatCompletions => {
            let req: ChatCompletionRequest = serde_json::from_value(body.clone())
                .map_err(|e| invalid(format!("not a chat completions request: {e}")))?;
            if req.model.is_empty() {
                return Err(invalid("`model` is empty".to_owned()));
            }
            if req.messages.is_empty() {
                return Err(invalid("`messages` is empty".to_owned()));
            }
            if req.is_stream() {
                return Err(invalid(
                    "`stream: true` is not supported in a batch".to_owned(),
                ));
            }
            estimator.chat(&req)
        }
        Endpoint::Embeddings => {
            let req: EmbeddingsRequest = serde_json::from_value(body.clone())
                .map_err(|e| invalid(format!("not an embeddings request: {e}")))?;
            if req.model.is_empty() {
                return Err(invalid("`model` is empty".to_owned()));
            }
            estimator.embeddings(&req)
        }
        Endpoint::Responses => {
            let req: ResponsesRequest = serde_json::from_value(body.clone())
                .map_err(|e| invalid(format!("not a Responses API request: {e}")))?;
            if req.model.is_empty() {
                return Err(invalid("`model` is empty".to_owned()));
            }
            if req.is_stream() {
                return Err(invalid(
                    "`stream: true` is not supported in a batch".to_owned(),
                ));
            }
            estimator.responses(&req)
        }
        // Not produced by the `url` match above: the Batch API has no
        // Messages endpoint.
        Endpoint::Messages => {
            return Err((
                InputErrorCode::UnsupportedUrl,
                format!("url `{}` is not supported", url_of(endpoint)),
                id(),
            ));
        }
    };
    let canonical = serde_json::to_vec(&body)
        .map_err(|e| invalid(format!("cannot be serialised again: {e}")))?;
    let hash = request_hash(url_of(endpoint), &canonical);
    Ok(Item {
        line,
        offset: 0,
        len: raw.len(),
        custom_id,
        endpoint,
        estimate: tollgate::TokenEstimate::new(estimate.input, estimate.output),
        model,
        hash,
    })
}

/// An id as shown in a message: at most 80 characters, control characters
/// escaped.
pub(crate) fn printable(s: &str) -> String {
    let mut out: String = s.chars().take(80).flat_map(char::escape_debug).collect();
    if s.chars().count() > 80 {
        out.push('…');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn codes(data: &str) -> Vec<(Option<usize>, &'static str)> {
        match parse(data.as_bytes(), &TokenEstimator::new()) {
            Ok(_) => Vec::new(),
            Err(e) => e.errors.iter().map(|e| (e.line, e.code.as_str())).collect(),
        }
    }

    const CHAT: &str = r#"{"custom_id":"a","method":"POST","url":"/v1/chat/completions","body":{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":5}}"#;

    // proves: BATCH-1 (each bad-input kind has its code and line number)
    #[test]
    fn every_problem_has_its_code_and_line() {
        assert!(codes(CHAT).is_empty());
        assert_eq!(codes(""), vec![(None, "empty_file")]);
        assert_eq!(codes("\n  \n"), vec![(None, "empty_file")]);
        let dup = format!("{CHAT}\n{CHAT}\n");
        assert_eq!(codes(&dup), vec![(Some(2), "duplicate_custom_id")]);
        let bad = format!(
            "{CHAT}\n{{oops\n[1]\n{}\n{}\n{}\n{}\n{}\n{}\n",
            r#"{"method":"POST","url":"/v1/embeddings","body":{"model":"e","input":"x"}}"#,
            r#"{"custom_id":"c","method":"POST","url":"/v1/completions","body":{}}"#,
            r#"{"custom_id":"d","method":"GET","url":"/v1/embeddings","body":{}}"#,
            r#"{"custom_id":"e","method":"POST","url":"/v1/embeddings","body":{"model":"e"}}"#,
            r#"{"custom_id":"f","method":"POST","url":"/v1/chat/completions","body":{"model":"m","messages":[],"max_tokens":1}}"#,
            r#"{"custom_id":"g","method":"POST","url":"/v1/chat/completions"}"#,
        );
        assert_eq!(
            codes(&bad),
            vec![
                (Some(2), "invalid_json_line"),
                (Some(3), "invalid_json_line"),
                (Some(4), "missing_custom_id"),
                (Some(5), "unsupported_url"),
                (Some(6), "unsupported_url"),
                (Some(7), "invalid_body"),
                (Some(8), "invalid_body"),
                (Some(9), "invalid_body"),
            ]
        );
    }

    // proves: BATCH-1 (Responses API lines are accepted and estimated;
    // a streaming or model-less one is refused with its code), WIRE-1
    #[test]
    fn responses_lines_are_accepted() {
        let line = r#"{"custom_id":"r","method":"POST","url":"/v1/responses","body":{"model":"m","input":"hi","max_output_tokens":7}}"#;
        let items = parse(line.as_bytes(), &TokenEstimator::new()).expect("valid");
        assert_eq!(items[0].estimate.output, 7);
        let req = request_from_line(&items[0], line.as_bytes(), None).expect("request");
        assert_eq!(req.endpoint(), Endpoint::Responses);
        let bad = format!(
            "{}\n{}\n",
            r#"{"custom_id":"s","method":"POST","url":"/v1/responses","body":{"model":"m","input":"hi","stream":true}}"#,
            r#"{"custom_id":"t","method":"POST","url":"/v1/responses","body":{"model":"","input":"hi"}}"#,
        );
        assert_eq!(
            codes(&bad),
            vec![(Some(1), "invalid_body"), (Some(2), "invalid_body")]
        );
    }

    // proves: Q-7, BUD-2 (a chat or Responses line without an output cap,
    // or with a null one, is sent capped at the allowance its estimate
    // reserved; one with a cap of its own, and an embeddings line, go as
    // they are)
    #[test]
    fn a_line_without_a_cap_is_sent_with_its_allowance() {
        let est = TokenEstimator::new().with_default_output(64);
        let lines = [
            r#"{"custom_id":"a","method":"POST","url":"/v1/chat/completions","body":{"model":"m","messages":[{"role":"user","content":"hi"}]}}"#,
            r#"{"custom_id":"b","method":"POST","url":"/v1/chat/completions","body":{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":null}}"#,
            r#"{"custom_id":"c","method":"POST","url":"/v1/chat/completions","body":{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":5}}"#,
            r#"{"custom_id":"d","method":"POST","url":"/v1/responses","body":{"model":"m","input":"hi"}}"#,
            r#"{"custom_id":"e","method":"POST","url":"/v1/embeddings","body":{"model":"e","input":"hi"}}"#,
        ];
        let sent = |line: &str| -> Value {
            let items = parse(line.as_bytes(), &est).expect("valid");
            let req =
                request_from_line(&items[0], line.as_bytes(), est.output_cap()).expect("request");
            serde_json::from_slice(req.body()).expect("json")
        };
        assert_eq!(sent(lines[0])["max_completion_tokens"], 64);
        assert_eq!(sent(lines[1])["max_completion_tokens"], 64);
        assert_eq!(sent(lines[2])["max_tokens"], 5);
        assert!(sent(lines[2]).get("max_completion_tokens").is_none());
        assert_eq!(sent(lines[3])["max_output_tokens"], 64);
        assert!(sent(lines[4]).get("max_completion_tokens").is_none());
        for line in lines {
            let items = parse(line.as_bytes(), &est).expect("valid");
            let uncapped = request_from_line(&items[0], line.as_bytes(), None).expect("request");
            let body: Value = serde_json::from_slice(uncapped.body()).expect("json");
            assert!(body.get("max_completion_tokens").is_none() || line.contains("max_completion"));
        }
    }

    #[test]
    fn the_hash_ignores_formatting_but_not_content() {
        let est = TokenEstimator::new();
        let a = parse(CHAT.as_bytes(), &est).expect("valid");
        let spaced = CHAT.replace(r#""max_tokens":5"#, r#" "max_tokens" :  5 "#);
        let b = parse(spaced.as_bytes(), &est).expect("valid");
        assert_eq!(a[0].hash, b[0].hash);
        let changed = CHAT.replace(r#""max_tokens":5"#, r#""max_tokens":6"#);
        let c = parse(changed.as_bytes(), &est).expect("valid");
        assert_ne!(a[0].hash, c[0].hash);
        assert!(a[0].estimate.output == 5);
        let req = request_from_line(&b[0], spaced.as_bytes(), None).expect("same request");
        assert_eq!(req.endpoint(), Endpoint::ChatCompletions);
        assert!(request_from_line(&a[0], changed.as_bytes(), None).is_err());
        let two = format!("\n{CHAT}\r\n");
        let items = parse(two.as_bytes(), &est).expect("valid");
        assert_eq!(
            (items[0].line, items[0].offset, items[0].len),
            (2, 1, CHAT.len())
        );
    }
}

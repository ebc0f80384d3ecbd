//! Configuration errors: which file, which setting, why (SPEC GW-9, CFG-3).

use std::fmt;
use std::ops::Range;

/// The class of a [`ConfigError`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConfigErrorKind {
    /// The file does not exist.
    NotFound,
    /// The file exists but cannot be read (permissions, a directory, not
    /// UTF-8).
    Unreadable,
    /// The text is not TOML (the position says where it stops being TOML).
    Syntax,
    /// Valid TOML that does not match the schema: an unknown or missing
    /// field, or a value of the wrong type.
    Schema,
    /// A value breaks a rule: a zero limit, an unknown reference, a fallback
    /// cycle, too many pools, and so on.
    Invalid,
}

impl ConfigErrorKind {
    /// A stable lower-case name.
    pub const fn as_str(self) -> &'static str {
        match self {
            ConfigErrorKind::NotFound => "not_found",
            ConfigErrorKind::Unreadable => "unreadable",
            ConfigErrorKind::Syntax => "syntax",
            ConfigErrorKind::Schema => "schema",
            ConfigErrorKind::Invalid => "invalid",
        }
    }
}

/// An invalid gateway configuration, found before the gateway starts any
/// provider work (SPEC CFG-3, GW-9). Never retryable.
///
/// Displays as `<file>: <field>: <reason>`, or `<file>: <reason>` when no
/// single setting is at fault, followed by ` (line L, column C)` when the
/// place in the file is known. Line and column count from 1.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct ConfigError {
    /// What kind of problem this is.
    pub kind: ConfigErrorKind,
    /// The file (or the origin given to
    /// [`GatewayConfig::from_toml`](super::GatewayConfig::from_toml)).
    pub file: String,
    /// Dotted path of the offending setting, e.g.
    /// `models.gpt-4o.fallbacks[0]`; keys that are not bare TOML keys are
    /// quoted (`models."gpt-3.5-turbo".provider`).
    pub field: Option<String>,
    /// Why it is wrong, in words a user can act on. Never contains a secret.
    pub reason: String,
    /// 1-based line of the offending text, when known.
    pub line: Option<usize>,
    /// 1-based column (in characters) of the offending text, when known.
    pub column: Option<usize>,
}

impl ConfigError {
    /// The file the error is about.
    pub fn file(&self) -> &str {
        &self.file
    }

    /// The dotted path of the offending setting, if one applies.
    pub fn field(&self) -> Option<&str> {
        self.field.as_deref()
    }

    /// Why the configuration is rejected.
    pub fn reason(&self) -> &str {
        &self.reason
    }

    /// `(line, column)`, both from 1, when the place in the file is known.
    pub fn position(&self) -> Option<(usize, usize)> {
        Some((self.line?, self.column?))
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: ", self.file)?;
        if let Some(field) = &self.field {
            write!(f, "{field}: ")?;
        }
        f.write_str(&self.reason)?;
        if let Some((line, column)) = self.position() {
            write!(f, " (line {line}, column {column})")?;
        }
        Ok(())
    }
}

/// One step of a [`FieldPath`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Segment {
    /// A table key.
    Key(String),
    /// An array index.
    Index(usize),
}

/// The path of a setting inside the document, e.g. `scopes.main.limits[1]`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) struct FieldPath(pub(crate) Vec<Segment>);

impl FieldPath {
    /// The path of a top-level key.
    pub(crate) fn top(key: &str) -> Self {
        FieldPath(vec![Segment::Key(key.to_owned())])
    }

    /// This path extended by a key.
    pub(crate) fn key(&self, key: &str) -> Self {
        let mut next = self.clone();
        next.0.push(Segment::Key(key.to_owned()));
        next
    }

    /// This path extended by an array index.
    pub(crate) fn index(&self, index: usize) -> Self {
        let mut next = self.clone();
        next.0.push(Segment::Index(index));
        next
    }

    /// The segments.
    pub(crate) fn segments(&self) -> &[Segment] {
        &self.0
    }
}

/// Whether `key` can be written bare in a dotted TOML key.
fn is_bare(key: &str) -> bool {
    !key.is_empty()
        && key
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

impl fmt::Display for FieldPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, segment) in self.0.iter().enumerate() {
            match segment {
                Segment::Index(n) => write!(f, "[{n}]")?,
                Segment::Key(key) => {
                    if i > 0 {
                        f.write_str(".")?;
                    }
                    if is_bare(key) {
                        f.write_str(key)?;
                    } else {
                        f.write_str("\"")?;
                        for c in key.chars() {
                            match c {
                                '"' => f.write_str("\\\"")?,
                                '\\' => f.write_str("\\\\")?,
                                c if c.is_control() => write!(f, "\\u{:04X}", u32::from(c))?,
                                c => write!(f, "{c}")?,
                            }
                        }
                        f.write_str("\"")?;
                    }
                }
            }
        }
        Ok(())
    }
}

/// A problem found while reading or checking a configuration, before the
/// file name and position are attached.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Problem {
    pub(crate) kind: ConfigErrorKind,
    pub(crate) path: Option<FieldPath>,
    pub(crate) reason: String,
    /// Byte range in the source text, when known directly (TOML errors).
    pub(crate) span: Option<Range<usize>>,
}

impl Problem {
    /// A rule broken by the value at `path`.
    pub(crate) fn invalid(path: &FieldPath, reason: impl fmt::Display) -> Self {
        Problem {
            kind: ConfigErrorKind::Invalid,
            path: Some(path.clone()),
            reason: reason.to_string(),
            span: None,
        }
    }

    /// The error for `file`, without a position.
    pub(crate) fn into_error(self, file: &str) -> ConfigError {
        ConfigError {
            kind: self.kind,
            file: file.to_owned(),
            field: self.path.map(|p| p.to_string()),
            reason: self.reason,
            line: None,
            column: None,
        }
    }
}

/// 1-based (line, column) of byte `offset` in `text`; the column counts
/// characters. An offset past the end points just after the last character.
pub(crate) fn line_column(text: &str, offset: usize) -> (usize, usize) {
    let mut offset = offset.min(text.len());
    while !text.is_char_boundary(offset) {
        offset -= 1;
    }
    let before = &text[..offset];
    let line = before.matches('\n').count() + 1;
    let line_start = before.rfind('\n').map_or(0, |i| i + 1);
    let column = before[line_start..].chars().count() + 1;
    (line, column)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_render_as_dotted_toml_keys() {
        let p = FieldPath::top("models")
            .key("gpt-4o")
            .key("fallbacks")
            .index(0);
        assert_eq!(p.to_string(), "models.gpt-4o.fallbacks[0]");
        let p = FieldPath::top("models").key("gpt-3.5").key("provider");
        assert_eq!(p.to_string(), "models.\"gpt-3.5\".provider");
    }

    #[test]
    fn positions_count_lines_and_characters_from_one() {
        let text = "a = 1\nbé = 2\n";
        assert_eq!(line_column(text, 0), (1, 1));
        assert_eq!(line_column(text, 6), (2, 1));
        // 'é' is two bytes; the '=' after it is the 4th character.
        assert_eq!(line_column(text, 10), (2, 4));
        assert_eq!(line_column(text, 999), (3, 1));
    }

    #[test]
    fn display_names_file_field_reason_and_position() {
        let e = ConfigError {
            kind: ConfigErrorKind::Invalid,
            file: "gw.toml".into(),
            field: Some("server.listen".into()),
            reason: "bad".into(),
            line: Some(3),
            column: Some(10),
        };
        assert_eq!(
            e.to_string(),
            "gw.toml: server.listen: bad (line 3, column 10)"
        );
        let e = ConfigError {
            field: None,
            line: None,
            column: None,
            ..e
        };
        assert_eq!(e.to_string(), "gw.toml: bad");
    }
}

//! The price table (SPEC BUD-1): list prices of common models, read from
//! the repository's `data/prices.toml` (embedded at build time), with
//! entries a configuration adds or overrides.
//!
//! A price is written in dollars per million tokens with at most six
//! decimals, as a TOML number (`2.50`) or a string (`"2.50"`), and read
//! into the engine's integer [`Price`] (micro-dollars per million tokens)
//! without floating-point arithmetic: a TOML float is read through its
//! shortest decimal form, which is the text that was written.
//!
//! A model is found by its name or one of its aliases; a name ending in a
//! date (`gpt-4o-2024-08-06`, `claude-sonnet-4-20250514`) that is not
//! listed itself is priced like the name without the date.

use std::collections::HashMap;
use std::sync::OnceLock;

use tollgate::Price;
use tollgate::price::parse_usd;

/// The embedded table, as written in the repository.
pub const BUILTIN_TOML: &str = include_str!("../../../data/prices.toml");

/// The dearest price accepted: $100,000 per million tokens (published
/// prices are below $1,000). Larger values are a mistake, and bounded
/// prices keep every cost computation far from overflow.
pub const MAX_PRICE_MICROS: u64 = 100_000 * 1_000_000;

/// The price fields of an entry, in the order they are documented.
pub const PRICE_FIELDS: [&str; 8] = [
    "input",
    "cached_input",
    "cache_write",
    "cache_write_1h",
    "input_audio",
    "output",
    "reasoning",
    "output_audio",
];

/// One model's entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PriceEntry {
    /// The model's name.
    pub model: String,
    /// Its prices.
    pub price: Price,
    /// Where the prices come from (a URL), if given.
    pub source: Option<String>,
    /// When they were taken from there, if given.
    pub as_of: Option<String>,
}

/// A table entry that could not be read: the field (a dotted path from the
/// table's top) and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {reason}")]
pub struct PriceError {
    /// Dotted path of the offending value, e.g. `models.gpt-4o.input`.
    pub field: String,
    /// What is wrong with it.
    pub reason: String,
}

impl PriceError {
    fn new(field: impl Into<String>, reason: impl Into<String>) -> Self {
        PriceError {
            field: field.into(),
            reason: reason.into(),
        }
    }
}

/// Models and their prices.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PriceTable {
    entries: Vec<PriceEntry>,
    /// Name or alias → index in `entries`.
    names: HashMap<String, usize>,
}

impl PriceTable {
    /// The table of `data/prices.toml`, read once.
    pub fn builtin() -> &'static PriceTable {
        static TABLE: OnceLock<PriceTable> = OnceLock::new();
        TABLE.get_or_init(|| {
            // Checked by this module's tests: the file in the repository
            // always reads.
            PriceTable::parse(BUILTIN_TOML).unwrap_or_default()
        })
    }

    /// Reads a table in the format of `data/prices.toml`: a `[models]`
    /// table of entries.
    pub fn parse(text: &str) -> Result<PriceTable, PriceError> {
        let value: toml::Table =
            toml::from_str(text).map_err(|e| PriceError::new("", e.message().to_owned()))?;
        let mut table = PriceTable::default();
        for (key, v) in &value {
            if key != "models" {
                return Err(PriceError::new(key, "unknown table (only [models])"));
            }
            let Some(models) = v.as_table() else {
                return Err(PriceError::new(key, "must be a table of models"));
            };
            for (model, entry) in models {
                let at = format!("models.{model}");
                let Some(entry) = entry.as_table() else {
                    return Err(PriceError::new(at, "must be a table"));
                };
                table.read_entry(&at, model, entry)?;
            }
        }
        Ok(table)
    }

    fn read_entry(&mut self, at: &str, model: &str, entry: &toml::Table) -> Result<(), PriceError> {
        const OTHER: [&str; 3] = ["aliases", "source", "as_of"];
        if let Some(key) = entry
            .keys()
            .find(|k| !PRICE_FIELDS.contains(&k.as_str()) && !OTHER.contains(&k.as_str()))
        {
            return Err(PriceError::new(
                format!("{at}.{key}"),
                format!(
                    "unknown field (expected {} or aliases, source, as_of)",
                    PRICE_FIELDS.join(", ")
                ),
            ));
        }
        let price = read_price(entry)
            .map_err(|e| PriceError::new(format!("{at}.{}", e.field), e.reason))?;
        let text = |key: &str| -> Result<Option<String>, PriceError> {
            match entry.get(key) {
                None => Ok(None),
                Some(toml::Value::String(s)) => Ok(Some(s.clone())),
                Some(_) => Err(PriceError::new(format!("{at}.{key}"), "must be a string")),
            }
        };
        let mut names = vec![model.to_owned()];
        match entry.get("aliases") {
            None => {}
            Some(toml::Value::Array(list)) => {
                for (i, a) in list.iter().enumerate() {
                    let Some(a) = a.as_str() else {
                        return Err(PriceError::new(
                            format!("{at}.aliases[{i}]"),
                            "must be a string",
                        ));
                    };
                    names.push(a.to_owned());
                }
            }
            Some(_) => {
                return Err(PriceError::new(
                    format!("{at}.aliases"),
                    "must be an array of model names",
                ));
            }
        }
        let entry = PriceEntry {
            model: model.to_owned(),
            price,
            source: text("source")?,
            as_of: text("as_of")?,
        };
        for name in &names {
            if self.names.contains_key(name) {
                return Err(PriceError::new(
                    at,
                    format!("{name:?} is listed twice (as a model or an alias)"),
                ));
            }
        }
        self.entries.push(entry);
        for name in names {
            self.names.insert(name, self.entries.len() - 1);
        }
        Ok(())
    }

    /// Adds `price` for `model`, replacing what the table had for that
    /// exact name (an override from the configuration).
    pub fn set(&mut self, model: &str, price: Price) {
        let entry = PriceEntry {
            model: model.to_owned(),
            price,
            source: None,
            as_of: None,
        };
        match self.names.get(model) {
            Some(&i) if self.entries[i].model == model => self.entries[i] = entry,
            _ => {
                self.entries.push(entry);
                self.names.insert(model.to_owned(), self.entries.len() - 1);
            }
        }
    }

    /// The entry of `model`: by name or alias, else by the name without a
    /// date suffix.
    pub fn get(&self, model: &str) -> Option<&PriceEntry> {
        let found = self
            .names
            .get(model)
            .or_else(|| without_date(model).and_then(|m| self.names.get(m)));
        found.and_then(|&i| self.entries.get(i))
    }

    /// The price of `model`, if the table has one.
    pub fn price(&self, model: &str) -> Option<Price> {
        self.get(model).map(|e| e.price)
    }

    /// Every entry, in the order read.
    pub fn entries(&self) -> &[PriceEntry] {
        &self.entries
    }
}

/// `model` without a trailing `-YYYY-MM-DD` or `-YYYYMMDD`.
fn without_date(model: &str) -> Option<&str> {
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    let b = model.as_bytes();
    if b.len() > 11 && b[b.len() - 11] == b'-' {
        let (head, date) = model.split_at(model.len() - 11);
        let parts: Vec<&str> = date[1..].split('-').collect();
        if let [y, m, d] = parts[..]
            && y.len() == 4
            && m.len() == 2
            && d.len() == 2
            && digits(y)
            && digits(m)
            && digits(d)
        {
            return Some(head);
        }
    }
    if b.len() > 9 && b[b.len() - 9] == b'-' {
        let (head, date) = model.split_at(model.len() - 9);
        if digits(&date[1..]) {
            return Some(head);
        }
    }
    None
}

/// A price field that could not be read: its key and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldError {
    /// The key within the entry (`input`, `output`, ...).
    pub field: String,
    /// What is wrong.
    pub reason: String,
}

/// Reads the price fields of `entry` (other keys are the caller's to
/// judge): `input` and `output` are required; each is a non-negative
/// number of dollars per million tokens with at most six decimals, at most
/// [`MAX_PRICE_MICROS`].
pub fn read_price(entry: &toml::Table) -> Result<Price, FieldError> {
    let field = |key: &str| -> Result<Option<u64>, FieldError> {
        entry.get(key).map(|v| dollars(key, v)).transpose()
    };
    let required = |key: &str| -> Result<u64, FieldError> {
        field(key)?.ok_or_else(|| FieldError {
            field: key.to_owned(),
            reason: format!(
                "is required: the price of {key} tokens in dollars per million tokens, e.g. {key} = 2.50"
            ),
        })
    };
    Ok(Price {
        input: required("input")?,
        cached_input: field("cached_input")?,
        cache_write: field("cache_write")?,
        cache_write_1h: field("cache_write_1h")?,
        input_audio: field("input_audio")?,
        output: required("output")?,
        reasoning: field("reasoning")?,
        output_audio: field("output_audio")?,
    })
}

/// One price: dollars per million tokens, into micro-dollars.
fn dollars(key: &str, value: &toml::Value) -> Result<u64, FieldError> {
    let error = |reason: String| FieldError {
        field: key.to_owned(),
        reason,
    };
    let text = match value {
        toml::Value::Integer(n) if *n < 0 => return Err(error("must not be negative".to_owned())),
        toml::Value::Integer(n) => n.to_string(),
        toml::Value::Float(f) if !f.is_finite() => {
            return Err(error("must be a finite number".to_owned()));
        }
        toml::Value::Float(f) if *f < 0.0 => return Err(error("must not be negative".to_owned())),
        // The shortest decimal that reads back as this float: the text
        // that was written (no arithmetic on the float).
        toml::Value::Float(f) => format!("{f}"),
        toml::Value::String(s) => s.clone(),
        other => {
            return Err(error(format!(
                "must be a number of dollars per million tokens, not a {}",
                other.type_str()
            )));
        }
    };
    parse_usd(&text, MAX_PRICE_MICROS)
        .map_err(|e| error(format!("{} per million tokens", e.reason)))
}

#[cfg(test)]
mod tests {
    use super::*;

    // proves: BUD-1 (the table in the repository reads, every entry has its
    // source and date, and the common models are priced as published)
    #[test]
    fn the_builtin_table_reads() {
        let table = PriceTable::parse(BUILTIN_TOML).expect("data/prices.toml reads");
        assert!(table.entries().len() >= 20);
        for e in table.entries() {
            assert!(
                e.source
                    .as_deref()
                    .is_some_and(|s| s.starts_with("https://")),
                "{} has no source",
                e.model
            );
            assert!(e.as_of.is_some(), "{} has no date", e.model);
        }
        assert_eq!(PriceTable::builtin(), &table);
        let mini = table.price("gpt-4o-mini").expect("priced");
        assert_eq!(
            (mini.input, mini.cached_input, mini.output),
            (150_000, Some(75_000), 600_000)
        );
        let sonnet = table.price("claude-sonnet-4-5").expect("priced");
        assert_eq!(sonnet.cache_write, Some(3_750_000));
        assert_eq!(sonnet.cache_write_1h, Some(6_000_000));
        assert_eq!(sonnet.cached_input, Some(300_000));
        assert_eq!(sonnet.output, 15_000_000);
        for model in [
            "gpt-4o",
            "gpt-4.1",
            "gpt-4.1-mini",
            "gpt-4.1-nano",
            "o3",
            "o4-mini",
            "claude-opus-4-1",
            "claude-haiku-4-5",
            "claude-3-5-haiku",
        ] {
            assert!(table.price(model).is_some(), "{model}");
        }
    }

    // proves: BUD-1 (a model is found by name, alias, or its name without a
    // date suffix; an explicitly dated entry wins over the stripped name)
    #[test]
    fn names_aliases_and_dated_snapshots() {
        let t = PriceTable::builtin();
        assert_eq!(
            t.get("gpt-4o-2024-08-06").map(|e| e.model.as_str()),
            Some("gpt-4o")
        );
        assert_eq!(
            t.price("gpt-4o-2024-05-13").map(|p| p.input),
            Some(5_000_000)
        );
        assert_eq!(
            t.get("claude-sonnet-4-20250514").map(|e| e.model.as_str()),
            Some("claude-sonnet-4-0")
        );
        assert_eq!(
            t.get("claude-3-5-haiku-latest").map(|e| e.model.as_str()),
            Some("claude-3-5-haiku")
        );
        assert_eq!(
            t.get("gpt-4o-mini-2024-07-18").map(|e| e.model.as_str()),
            Some("gpt-4o-mini")
        );
        assert!(t.get("gpt-4o-prod").is_none());
        assert!(t.get("llama-3").is_none());
        assert_eq!(without_date("x-2024-13"), None);
        assert_eq!(without_date("model-1234567"), None);
    }

    // proves: BUD-1 (overrides replace or add entries)
    #[test]
    fn overrides() {
        let mut t = PriceTable::builtin().clone();
        t.set("gpt-4o", Price::new(1, 2));
        assert_eq!(t.price("gpt-4o"), Some(Price::new(1, 2)));
        // An alias of another entry keeps that entry unless overridden by
        // its own name.
        t.set("my-llama", Price::new(0, 0));
        assert_eq!(t.price("my-llama"), Some(Price::new(0, 0)));
        t.set("chatgpt-4o-latest", Price::new(3, 4));
        assert_eq!(t.price("chatgpt-4o-latest"), Some(Price::new(3, 4)));
        assert_eq!(t.price("gpt-4o"), Some(Price::new(1, 2)));
    }

    // proves: BUD-1 (bad prices are located errors: negative, too many
    // decimals, huge, not a number, missing; zero is a price)
    #[test]
    fn bad_prices_are_located() {
        let bad = [
            ("input = -1\noutput = 1", "models.m.input", "negative"),
            ("input = -0.5\noutput = 1", "models.m.input", "negative"),
            (
                "input = 1\noutput = 0.0000001",
                "models.m.output",
                "six decimals",
            ),
            ("input = 1\noutput = 100001", "models.m.output", "too large"),
            ("input = 1\noutput = 1e30", "models.m.output", "too large"),
            ("input = 1\noutput = nan", "models.m.output", "finite"),
            ("input = 1\noutput = true", "models.m.output", "boolean"),
            ("input = \"abc\"\noutput = 1", "models.m.input", "decimal"),
            ("output = 1", "models.m.input", "required"),
            ("input = 1", "models.m.output", "required"),
            (
                "input = 1\noutput = 1\ncached = 1",
                "models.m.cached",
                "unknown field",
            ),
            (
                "input = 1\noutput = 1\naliases = \"x\"",
                "models.m.aliases",
                "array",
            ),
        ];
        for (body, field, why) in bad {
            let e = PriceTable::parse(&format!("[models.m]\n{body}\n")).unwrap_err();
            assert_eq!(e.field, field, "{body}");
            assert!(e.reason.contains(why), "{body}: {}", e.reason);
        }
        let ok = PriceTable::parse("[models.m]\ninput = 0\noutput = \"0.000001\"\n").unwrap();
        assert_eq!(ok.price("m"), Some(Price::new(0, 1)));
        let e = PriceTable::parse("[models.a]\ninput = 1\noutput = 1\naliases = [\"b\"]\n[models.b]\ninput = 1\noutput = 1\n")
            .unwrap_err();
        assert!(e.reason.contains("twice"), "{}", e.reason);
    }

    // proves: BUD-1 (a float is read through its decimal text: no rounding
    // drift on prices such as 0.075 or 1.10)
    #[test]
    fn floats_read_exactly() {
        let t = PriceTable::parse(
            "[models.m]\ninput = 0.075\noutput = 1.10\ncached_input = 0.1\nreasoning = 4.4\n",
        )
        .unwrap();
        let p = t.price("m").unwrap();
        assert_eq!(
            (p.input, p.output, p.cached_input, p.reasoning),
            (75_000, 1_100_000, Some(100_000), Some(4_400_000))
        );
    }
}

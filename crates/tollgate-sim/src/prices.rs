//! The simulator's own bill (SPEC SIM-4, BUD-1): what a provider with the
//! list prices of the repository's `data/prices.toml` would charge for the
//! requests it served, counted independently of tollgate (its own reading
//! of the file, its own arithmetic, no rounding).
//!
//! The simulator reports plain input and output tokens (no cache, no
//! reasoning, no audio), so a request's bill is `prompt × input price +
//! completion × output price`. Prices are read in micro-dollars per
//! million tokens, which is exactly pico-dollars per token: a bill in
//! pico-dollars is an exact integer. A model is found by its name or an
//! alias listed in the file; a model without a price is served and
//! counted as unpriced.
//!
//! Billed: every request admitted and not failed by an injected 5xx,
//! whole (prompt and the full completion it generates), even when the
//! client goes away or the stream is cut: a provider generates what it
//! was asked for. Not billed: refusals (429) and injected 5xx.

use std::collections::HashMap;
use std::sync::OnceLock;

/// The price file of the repository, embedded.
const PRICES: &str = include_str!("../../../data/prices.toml");

/// Pico-dollars per input token and per output token.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SimPrice {
    /// Per input token.
    pub input: u64,
    /// Per output token.
    pub output: u64,
}

impl SimPrice {
    /// The bill of `input` and `output` tokens, in pico-dollars.
    pub fn bill(&self, input: u64, output: u64) -> u128 {
        u128::from(input) * u128::from(self.input) + u128::from(output) * u128::from(self.output)
    }
}

/// The price of `model` in the repository's table, if it has one.
pub fn price(model: &str) -> Option<SimPrice> {
    static TABLE: OnceLock<HashMap<String, SimPrice>> = OnceLock::new();
    TABLE.get_or_init(|| read(PRICES)).get(model).copied()
}

/// Reads the table; entries that do not read are left out (the file is
/// checked by this module's test).
fn read(text: &str) -> HashMap<String, SimPrice> {
    let mut out = HashMap::new();
    let Ok(doc) = text.parse::<toml::Table>() else {
        return out;
    };
    let Some(models) = doc.get("models").and_then(toml::Value::as_table) else {
        return out;
    };
    for (name, entry) in models {
        let field = |k: &str| entry.get(k).and_then(pico_per_token);
        let (Some(input), Some(output)) = (field("input"), field("output")) else {
            continue;
        };
        let price = SimPrice { input, output };
        out.insert(name.clone(), price);
        for alias in entry
            .get("aliases")
            .and_then(toml::Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(toml::Value::as_str)
        {
            out.insert(alias.to_owned(), price);
        }
    }
    out
}

/// Dollars per million tokens (a number or a decimal string, at most six
/// decimals) as pico-dollars per token: the decimal digits themselves.
fn pico_per_token(value: &toml::Value) -> Option<u64> {
    let text = match value {
        toml::Value::Integer(n) => u64::try_from(*n).ok()?.to_string(),
        toml::Value::Float(f) if f.is_finite() && *f >= 0.0 => format!("{f}"),
        toml::Value::String(s) => s.trim().to_owned(),
        _ => return None,
    };
    let (whole, frac) = text.split_once('.').unwrap_or((&text, ""));
    if frac.len() > 6 || !(whole.bytes().chain(frac.bytes())).all(|b| b.is_ascii_digit()) {
        return None;
    }
    let padded = format!("{frac:0<6}");
    let whole: u64 = if whole.is_empty() {
        0
    } else {
        whole.parse().ok()?
    };
    whole
        .checked_mul(1_000_000)?
        .checked_add(padded.parse().ok()?)
}

#[cfg(test)]
mod tests {
    use super::*;

    // proves: SIM-4, BUD-1 (the simulator reads every entry of the
    // repository's price file on its own, to the pico-dollar)
    #[test]
    fn the_price_file_reads() {
        let table = read(PRICES);
        let entries = PRICES.matches("[models.").count();
        assert!(table.len() >= entries, "{} of {entries} read", table.len());
        let mini = price("gpt-4o-mini").expect("priced");
        assert_eq!(
            mini,
            SimPrice {
                input: 150_000,
                output: 600_000
            }
        );
        // 1000 input + 100 output: 0.15 + 0.06 = 0.21 m$ = 210_000_000 p$.
        assert_eq!(mini.bill(1_000, 100), 210_000_000);
        assert_eq!(price("claude-3-5-haiku-latest"), price("claude-3-5-haiku"));
        assert_eq!(price("sim-chat"), None);
        assert_eq!(pico_per_token(&toml::Value::Float(0.075)), Some(75_000));
        assert_eq!(pico_per_token(&toml::Value::Float(1e-7)), None);
        assert_eq!(pico_per_token(&toml::Value::Integer(-1)), None);
    }
}

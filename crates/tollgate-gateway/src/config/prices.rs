//! Prices and budgets in the configuration (SPEC BUD-1, BUD-2): the
//! `[prices.<model>]` overrides of the built-in price table, `usd` limits,
//! and the rule that every model a budget covers has a price.
//!
//! ```toml
//! [prices."my-llama"]              # a self-hosted model: its own prices
//! input = 0.05
//! output = 0.10
//!
//! [prices."gpt-4o-prod"]           # an Azure deployment name
//! same_as = "gpt-4o"               # priced like a model of the table
//!
//! [tenants.team-a]
//! limits = [{ usd = 50, per = "1d" }]
//! ```
//!
//! A price is looked up by a deployment's `upstream_model`: the overrides
//! first (exact name), then the built-in table (`data/prices.toml`: name,
//! alias, or the name without a date suffix).

use tollgate::Price;
use tollgate::price::parse_usd;
use tollgate::quota::Dimension;
use tollgate_openai::prices::{PRICE_FIELDS, PriceTable, read_price};
use tollgate_openai::tokens::Profile;

use super::deployment::DeploymentConfig;
use super::error::{FieldPath, Problem};
use super::types::{GatewayConfig, ModelConfig};

/// The largest budget accepted: one billion dollars per window.
pub const MAX_BUDGET_USD: u64 = 1_000_000_000;

/// `[prices.<model>]`: the price of one upstream model, replacing or
/// adding to the built-in table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PriceOverride {
    /// The upstream model name it prices (exact).
    pub model: String,
    /// Its prices.
    pub price: Price,
}

/// The key of a limit's amount in a `limits` entry: `requests`, `tokens`,
/// `input_tokens`, `output_tokens`, or `usd` for a budget.
pub(crate) fn limit_key(dimension: Dimension) -> &'static str {
    match dimension {
        Dimension::Cost => "usd",
        other => other.as_str(),
    }
}

/// A `usd` amount: dollars (a number or a decimal string, at most six
/// decimals) into micro-dollars. Zero is refused by the limit checks
/// (CFG-1).
pub(crate) fn budget(at: &FieldPath, value: &toml::Value) -> Result<u64, Problem> {
    let text = match value {
        toml::Value::Integer(n) if *n < 0 => {
            return Err(Problem::invalid(at, "must not be negative"));
        }
        toml::Value::Integer(n) => n.to_string(),
        toml::Value::Float(f) if !f.is_finite() || *f < 0.0 => {
            return Err(Problem::invalid(at, "must be a positive number of dollars"));
        }
        // The shortest text that reads back as the float: what was written.
        toml::Value::Float(f) => format!("{f}"),
        toml::Value::String(s) => s.clone(),
        other => {
            return Err(Problem::invalid(
                at,
                format!(
                    "must be a number of dollars, e.g. usd = 50 or usd = 2.5, not a {}",
                    other.type_str()
                ),
            ));
        }
    };
    parse_usd(&text, MAX_BUDGET_USD * 1_000_000).map_err(|e| Problem::invalid(at, e.reason))
}

/// One `[prices.<model>]` entry: price fields, or `same_as = "<model>"`
/// naming a model of the built-in table.
pub(crate) fn override_entry(model: String, value: &toml::Value) -> Result<PriceOverride, Problem> {
    let at = FieldPath::top("prices").key(&model);
    let Some(table) = value.as_table() else {
        return Err(Problem::invalid(
            &at,
            "must be a table of prices, e.g. [prices.\"my-model\"] input = 0.5, output = 1.5",
        ));
    };
    if let Some(key) = table
        .keys()
        .find(|k| !PRICE_FIELDS.contains(&k.as_str()) && k.as_str() != "same_as")
    {
        return Err(Problem::invalid(
            &at.key(key),
            format!(
                "unknown field; a price has {} (dollars per million tokens) or same_as",
                PRICE_FIELDS.join(", ")
            ),
        ));
    }
    if let Some(same) = table.get("same_as") {
        if table.len() > 1 {
            return Err(Problem::invalid(
                &at.key("same_as"),
                "either names a model of the built-in table or sits beside prices, not both",
            ));
        }
        let Some(name) = same.as_str() else {
            return Err(Problem::invalid(&at.key("same_as"), "must be a model name"));
        };
        let Some(price) = PriceTable::builtin().price(name) else {
            return Err(Problem::invalid(
                &at.key("same_as"),
                format!("{name:?} is not in the built-in price table (data/prices.toml)"),
            ));
        };
        return Ok(PriceOverride { model, price });
    }
    let price = read_price(table).map_err(|e| Problem::invalid(&at.key(&e.field), e.reason))?;
    Ok(PriceOverride { model, price })
}

impl GatewayConfig {
    /// The price of an upstream model: its `[prices]` override, else the
    /// built-in table's (SPEC BUD-1).
    pub fn price_of(&self, upstream_model: &str) -> Option<Price> {
        self.prices
            .iter()
            .find(|p| p.model == upstream_model)
            .map(|p| p.price)
            .or_else(|| PriceTable::builtin().price(upstream_model))
    }

    /// The price of a deployment's upstream model.
    pub fn deployment_price(&self, d: &DeploymentConfig) -> Option<Price> {
        self.price_of(&d.upstream_model)
    }

    /// `model` and the fallbacks its calls may move to, once each (the
    /// models whose prices a budget on `model` covers).
    fn chain_of<'a>(&'a self, model: &'a ModelConfig) -> Vec<&'a ModelConfig> {
        let mut out = vec![model];
        let mut i = 0;
        while let Some(m) = out.get(i).copied() {
            for f in &m.fallbacks {
                if let Some(next) = self.model(f)
                    && !out.iter().any(|o| o.name == next.name)
                {
                    out.push(next);
                }
            }
            i += 1;
        }
        out
    }

    /// Every model a budget covers must have a price (SPEC BUD-1: a call
    /// under a budget is never counted as free): a scope's budget covers
    /// the deployments spending the scope; a tenant's, every model it may
    /// call and their fallbacks; a tenant's budget on one model, that
    /// model and its fallbacks.
    pub(crate) fn check_budgets(&self) -> Result<(), Problem> {
        let budget_at = |at: FieldPath, limits: &[tollgate::config::Limit]| {
            limits
                .iter()
                .position(|l| l.dimension.is_cost())
                .map(|i| at.key("limits").index(i))
        };
        for s in &self.scopes {
            let Some(budget) = budget_at(FieldPath::top("scopes").key(&s.name), &s.limits) else {
                continue;
            };
            for m in &self.models {
                for d in m
                    .deployments
                    .iter()
                    .filter(|d| m.deployment_scope(d) == s.name)
                {
                    self.priced(m, d, &budget)?;
                }
            }
        }
        for t in &self.tenants {
            let at = FieldPath::top("tenants").key(&t.name);
            if let Some(budget) = budget_at(at.clone(), &t.limits) {
                for m in self.models.iter().filter(|m| t.allows(&m.name)) {
                    for c in self.chain_of(m) {
                        for d in &c.deployments {
                            self.priced(c, d, &budget)?;
                        }
                    }
                }
            }
            for pm in &t.per_model {
                let Some(budget) = budget_at(at.key("per_model").key(&pm.model), &pm.limits) else {
                    continue;
                };
                let Some(m) = self.model(&pm.model) else {
                    continue;
                };
                for c in self.chain_of(m) {
                    for d in &c.deployments {
                        self.priced(c, d, &budget)?;
                    }
                }
            }
        }
        Ok(())
    }

    /// A located error unless deployment `d` of `m` has a price and its
    /// provider's accounting counts the output allowance (the worst case
    /// a budget reserves is input and output, SPEC BUD-2).
    fn priced(
        &self,
        m: &ModelConfig,
        d: &DeploymentConfig,
        budget: &FieldPath,
    ) -> Result<(), Problem> {
        if let Some(p) = self.provider(&d.provider)
            && matches!(p.accounting, Profile::Chars { output: false, .. })
        {
            return Err(Problem::invalid(
                &FieldPath::top("providers").key(&p.name).key("accounting"),
                format!(
                    "leaves the output out, and the budget at {budget} covers its model {:?}: a \
                     call would reserve no cost for its output and could spend past the budget; \
                     use output = \"max_tokens\"",
                    m.name
                ),
            ));
        }
        if self.deployment_price(d).is_some() {
            return Ok(());
        }
        let at = if m.listed {
            FieldPath::top("models")
                .key(&m.name)
                .key("deployments")
                .key(&d.name)
        } else {
            FieldPath::top("models").key(&m.name)
        };
        Err(Problem::invalid(
            &at.key("upstream_model"),
            format!(
                "{:?} has no price, and the budget at {budget} covers it (a call under a budget \
                 is never counted as free); add [prices.{:?}] with input and output (dollars per \
                 million tokens) or same_as = \"<a model of the price table>\"",
                d.upstream_model, d.upstream_model
            ),
        ))
    }
}

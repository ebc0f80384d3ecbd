//! Prices and budgets in the configuration (SPEC BUD-1, BUD-2, CFG-1,
//! CFG-3): every bad value is an error naming the file, the setting and
//! the reason.

use tollgate::Price;
use tollgate::quota::Dimension;

use super::*;
use crate::auth::{hash_key, to_hex};

const FILE: &str = "gw.toml";

/// A provider, a tenant with `tenant` settings, and model `m` served as
/// `upstream`, plus `extra`.
fn config(upstream: &str, tenant: &str, extra: &str) -> String {
    format!(
        "[providers.p]\nbase_url = \"http://127.0.0.1:9/v1\"\n\
         [models.m]\nprovider = \"p\"\nupstream_model = \"{upstream}\"\n\
         [tenants.t]\nkeys_sha256 = [\"{}\"]\n{tenant}\n{extra}\n",
        to_hex(&hash_key("sk-t"))
    )
}

fn fail_at(text: &str, field: &str, reason: &str) {
    match GatewayConfig::from_toml(text, FILE) {
        Ok(_) => panic!("expected an error at {field} for:\n{text}"),
        Err(e) => {
            assert_eq!(e.file, FILE);
            assert_eq!(e.field.as_deref(), Some(field), "{e}");
            assert!(e.reason.contains(reason), "{:?} lacks {reason:?}", e.reason);
        }
    }
}

fn ok(text: &str) -> GatewayConfig {
    GatewayConfig::from_toml(text, FILE).unwrap_or_else(|e| panic!("{e}\n---\n{text}"))
}

const BUDGET: &str = "limits = [{ usd = 50, per = \"1d\" }]";

// proves: BUD-1, BUD-2 (a budget reads exactly into micro-dollars; a model
// of the price table is priced, dated names included)
#[test]
fn budgets_and_table_prices() {
    let c = ok(&config("gpt-4o-mini-2024-07-18", BUDGET, ""));
    let t = &c.tenants[0];
    assert_eq!(t.limits[0].dimension, Dimension::Cost);
    assert_eq!(t.limits[0].amount, 50_000_000);
    assert_eq!(
        c.deployment_price(&c.models[0].deployments[0])
            .map(|p| p.input),
        Some(150_000)
    );
    for (usd, micros) in [
        ("2.5", 2_500_000),
        ("\"0.000001\"", 1),
        ("1000000000", 1_000_000_000_000_000),
    ] {
        let c = ok(&config(
            "gpt-4o",
            &format!("limits = [{{ usd = {usd}, per = \"1h\" }}]"),
            "",
        ));
        assert_eq!(c.tenants[0].limits[0].amount, micros, "{usd}");
    }
}

// proves: BUD-1 (a budget over a model without a price is a located
// configuration error, never a silent $0: on a tenant, a tenant's model,
// a scope, or a fallback the budget's calls may move to)
#[test]
fn a_budget_over_an_unpriced_model_is_refused() {
    let unpriced = "models.m.upstream_model";
    fail_at(&config("my-llama", BUDGET, ""), unpriced, "no price");
    fail_at(
        &config(
            "my-llama",
            "[tenants.t.per_model.m]\nlimits = [{ usd = 5, per = \"1d\" }]",
            "",
        ),
        unpriced,
        "tenants.t.per_model.m.limits[0]",
    );
    fail_at(
        &config(
            "my-llama",
            "",
            "[scopes.acct]\nlimits = [{ usd = 5, per = \"1d\" }]\n",
        )
        .replace(
            "upstream_model = \"my-llama\"",
            "upstream_model = \"my-llama\"\nscope = \"acct\"",
        ),
        unpriced,
        "scopes.acct.limits[0]",
    );
    // A fallback: the tenant may call only `m`, which falls back to `f`.
    let text = config(
        "gpt-4o",
        &format!("models = [\"m\"]\n{BUDGET}"),
        "[models.f]\nprovider = \"p\"\nupstream_model = \"my-llama\"\n",
    )
    .replace(
        "upstream_model = \"gpt-4o\"",
        "upstream_model = \"gpt-4o\"\nfallbacks = [\"f\"]",
    );
    fail_at(&text, "models.f.upstream_model", "no price");
    // Priced by an override, or like a model of the table: accepted.
    let c = ok(&config(
        "my-llama",
        BUDGET,
        "[prices.\"my-llama\"]\ninput = 0.05\noutput = \"0.10\"\ncached_input = 0\n",
    ));
    assert_eq!(
        c.price_of("my-llama"),
        Some(Price {
            cached_input: Some(0),
            ..Price::new(50_000, 100_000)
        })
    );
    let c = ok(&config(
        "gpt4o-prod",
        BUDGET,
        "[prices.\"gpt4o-prod\"]\nsame_as = \"gpt-4o\"\n",
    ));
    assert_eq!(c.price_of("gpt4o-prod").map(|p| p.output), Some(10_000_000));
    // Without a budget an unpriced model is fine.
    ok(&config("my-llama", "", ""));
}

// proves: BUD-1, CFG-1 (bad prices and budgets are located errors:
// negative, zero budgets, huge, too many decimals, wrong types, unknown
// fields)
#[test]
fn bad_prices_and_budgets_are_located() {
    let price = |body: &str| config("x", "", &format!("[prices.x]\n{body}\n"));
    fail_at(
        &price("input = -1\noutput = 1"),
        "prices.x.input",
        "negative",
    );
    fail_at(
        &price("input = 1\noutput = -0.5"),
        "prices.x.output",
        "negative",
    );
    fail_at(
        &price("input = 1\noutput = 100001"),
        "prices.x.output",
        "too large",
    );
    fail_at(
        &price("input = 1\noutput = 1e300"),
        "prices.x.output",
        "too large",
    );
    fail_at(
        &price("input = 1\noutput = 0.0000001"),
        "prices.x.output",
        "six decimals",
    );
    fail_at(&price("input = 1"), "prices.x.output", "required");
    fail_at(
        &price("input = 1\noutput = [1]"),
        "prices.x.output",
        "array",
    );
    fail_at(
        &price("input = 1\noutput = 1\ncache_read = 1"),
        "prices.x.cache_read",
        "unknown field",
    );
    fail_at(
        &price("same_as = \"nope\""),
        "prices.x.same_as",
        "not in the built-in price table",
    );
    fail_at(
        &price("same_as = \"gpt-4o\"\ninput = 1"),
        "prices.x.same_as",
        "not both",
    );
    fail_at(&config("x", "", "[prices]\nx = 3\n"), "prices.x", "table");
    let budget = |usd: &str| {
        config(
            "gpt-4o",
            &format!("limits = [{{ usd = {usd}, per = \"1d\" }}]"),
            "",
        )
    };
    fail_at(&budget("0"), "tenants.t.limits[0].usd", "positive");
    fail_at(&budget("-3"), "tenants.t.limits[0].usd", "negative");
    fail_at(
        &budget("0.0000001"),
        "tenants.t.limits[0].usd",
        "six decimals",
    );
    fail_at(
        &budget("1000000001"),
        "tenants.t.limits[0].usd",
        "too large",
    );
    fail_at(&budget("\"ten\""), "tenants.t.limits[0].usd", "decimal");
    fail_at(&budget("true"), "tenants.t.limits[0].usd", "boolean");
    fail_at(
        &config(
            "gpt-4o",
            "limits = [{ usd = 5, tokens = 9, per = \"1d\" }]",
            "",
        ),
        "tenants.t.limits[0]",
        "sets both tokens and usd",
    );
    fail_at(
        &config(
            "gpt-4o",
            "limits = [{ usd = 5, per = \"1d\" }, { usd = 6, per = \"1d\" }]",
            "",
        ),
        "tenants.t.limits[1]",
        "repeats the usd limit",
    );
    // A zero price is a price: the model costs nothing.
    let c = ok(&config("x", BUDGET, "[prices.x]\ninput = 0\noutput = 0\n"));
    assert_eq!(c.price_of("x"), Some(Price::new(0, 0)));
}

// proves: BUD-2 (a budget reserves each call's worst case, output
// allowance included: a provider whose accounting leaves the output out
// cannot serve a model a budget covers, a located error)
#[test]
fn a_budget_needs_the_output_counted() {
    let none = "[providers.p]\nbase_url = \"http://127.0.0.1:9/v1\"\n\
                accounting = { chars_per_token = 4, output = \"none\" }";
    let text = config("gpt-4o", BUDGET, "")
        .replace("[providers.p]\nbase_url = \"http://127.0.0.1:9/v1\"", none);
    fail_at(&text, "providers.p.accounting", "tenants.t.limits[0]");
    // Without a budget, or with the output counted: accepted.
    ok(&config("gpt-4o", "", "")
        .replace("[providers.p]\nbase_url = \"http://127.0.0.1:9/v1\"", none));
    ok(&config("gpt-4o", BUDGET, "").replace(
        "[providers.p]\nbase_url = \"http://127.0.0.1:9/v1\"",
        "[providers.p]\nbase_url = \"http://127.0.0.1:9/v1\"\n\
         accounting = { chars_per_token = 4, output = \"max_tokens\" }",
    ));
}

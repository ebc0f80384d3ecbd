//! Calendar windows in the configuration (SPEC BUD-3): `per = "day"`,
//! `"month"`, `"week"`, `"hour"` with an optional `timezone`, on scopes,
//! tenants and tenant × model limits, and located errors for what does not
//! parse.

use tollgate::config::{Calendar, Limit, Period, Zone};
use tollgate::quota::Dimension;

use super::*;
use crate::auth::{hash_key, to_hex};

const FILE: &str = "gw.toml";

/// A provider, a model `m` spending scope `s` (with `scope` as its body)
/// and a tenant `t` (with `tenant` as its body).
fn config(scope: &str, tenant: &str) -> String {
    format!(
        "[providers.p]\nbase_url = \"http://127.0.0.1:9/v1\"\n\
         [scopes.s]\n{scope}\n\
         [models.m]\nprovider = \"p\"\nscope = \"s\"\n\
         [tenants.t]\nkeys_sha256 = [\"{}\"]\n{tenant}\n",
        to_hex(&hash_key("sk-t"))
    )
}

fn ok(text: &str) -> GatewayConfig {
    GatewayConfig::from_toml(text, FILE).unwrap_or_else(|e| panic!("{e}\n---\n{text}"))
}

/// The error at `field` (with a line) whose reason contains `reason`.
fn fail_at(text: &str, field: &str, reason: &str) {
    let e = GatewayConfig::from_toml(text, FILE).expect_err(text);
    assert_eq!(e.field.as_deref(), Some(field), "{e}");
    assert!(e.reason.contains(reason), "{e}");
    assert!(e.line.is_some(), "located: {e}");
}

// proves: BUD-3 (calendar windows beside rolling ones, for every dimension,
// on scopes, tenants and tenant × model limits, in UTC or a time zone)
#[test]
fn calendar_windows_parse_everywhere() {
    let c = ok(&config(
        "limits = [{ requests = 1000, per = \"day\" }, { tokens = 5000, per = \"1d\" }]",
        "limits = [{ input_tokens = 70, per = \"month\", timezone = \"Europe/Paris\" }]\n\
         [tenants.t.per_model.m]\nlimits = [{ output_tokens = 9, per = \"week\" }, \
         { requests = 3, per = \"hour\", timezone = \"UTC\" }]",
    ));
    let scope = c.scope("s").unwrap().to_scope_config();
    let day = Limit::per(Dimension::Requests, 1000, Calendar::new(Period::Day));
    assert_eq!(scope.limits()[0], day);
    assert_eq!(scope.limits()[1].calendar, None, "\"1d\" stays rolling");
    let t = &c.tenants[0];
    let paris = Zone::named("Europe/Paris").unwrap();
    assert_eq!(
        t.quota_scope().unwrap().limits(),
        &[Limit::per(
            Dimension::InputTokens,
            70,
            Calendar::new(Period::Month).zone(paris)
        )]
    );
    let per_model: Vec<Limit> = t.model_scopes().flat_map(|s| s.limits().to_vec()).collect();
    assert_eq!(
        per_model,
        vec![
            Limit::per(Dimension::OutputTokens, 9, Calendar::new(Period::Week)),
            Limit::per(Dimension::Requests, 3, Calendar::new(Period::Hour)),
        ]
    );
}

// proves: BUD-3, CFG-3 (an unknown `per`, an unknown time zone and a time
// zone on a rolling window are errors located at the field)
#[test]
fn calendar_mistakes_are_located() {
    fail_at(
        &config("limits = [{ requests = 10, per = \"fortnight\" }]", ""),
        "scopes.s.limits[0].per",
        "nor a calendar period",
    );
    fail_at(
        &config(
            "",
            "limits = [{ requests = 10, per = \"day\", timezone = \"Europe/Pariss\" }]",
        ),
        "tenants.t.limits[0].timezone",
        "unknown time zone \"Europe/Pariss\"",
    );
    fail_at(
        &config(
            "",
            "[tenants.t.per_model.m]\nlimits = [{ tokens = 10, per = \"1d\", timezone = \"UTC\" }]",
        ),
        "tenants.t.per_model.m.limits[0].timezone",
        "applies only to calendar windows",
    );
    fail_at(
        &config(
            "limits = [{ tokens = 10, per = \"day\" }, { tokens = 20, per = \"day\", timezone = \"UTC\" }]",
            "",
        ),
        "scopes.s.limits[1]",
        "repeats the tokens limit per day (UTC)",
    );
    // A rolling day and a calendar day are two limits.
    ok(&config(
        "limits = [{ tokens = 10, per = \"day\" }, { tokens = 20, per = \"24h\" }]",
        "",
    ));
}

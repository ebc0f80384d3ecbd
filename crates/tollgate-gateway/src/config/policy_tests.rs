//! Configuration of deployments (SPEC GW-11), tenant policies (GW-12) and
//! the new `[server]` settings: what parses, and located errors for what
//! does not.

use tollgate::config::{DAY, MINUTE};
use tollgate::quota::Dimension;

use super::*;
use crate::auth::{hash_key, to_hex};

const FILE: &str = "gw.toml";

fn base() -> String {
    "[providers.p]\nbase_url = \"http://127.0.0.1:9/v1\"\n\
     [providers.q]\nbase_url = \"http://127.0.0.1:10/v1\"\n\
     [scopes.s]\nrpm = 10\n"
        .to_owned()
}

fn tenant(extra: &str) -> String {
    format!(
        "[tenants.t]\nkeys_sha256 = [\"{}\"]\n{extra}\n",
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
    assert!(e.to_string().starts_with("gw.toml: "), "{e}");
}

const TWO: &str = "[models.m.deployments.east]\nprovider = \"p\"\nscope = \"s\"\nconcurrency = 4\n\
                   [models.m.deployments.west]\nprovider = \"q\"\nupstream_model = \"m-west\"\nweight = 3\n";

// proves: GW-11 (a model lists deployments, each with its provider,
// upstream name, scope, pool and weight; a classic model is one deployment
// with the names it always had)
#[test]
fn deployments_parse_with_their_scopes_pools_and_weights() {
    let c = ok(&format!(
        "{}{TWO}[models.classic]\nprovider = \"p\"\n{}",
        base(),
        tenant("")
    ));
    let m = c.model("m").unwrap();
    let ds = &m.deployments;
    assert_eq!(ds.len(), 2);
    assert_eq!((ds[0].name.as_str(), ds[0].weight), ("east", 1));
    assert_eq!(ds[0].upstream_model, "m", "defaults to the model's name");
    assert_eq!(m.deployment_scope(&ds[0]), "s");
    assert_eq!(m.deployment_pool(&ds[0]), "model:m/east");
    assert_eq!(m.deployment_pool_config(&ds[0]).map(|p| p.limit), Some(4));
    assert_eq!((ds[1].upstream_model.as_str(), ds[1].weight), ("m-west", 3));
    assert_eq!(m.deployment_scope(&ds[1]), "model:m/west", "private scope");
    let classic = c.model("classic").unwrap();
    let only = &classic.deployments;
    assert_eq!(only.len(), 1);
    assert_eq!(classic.deployment_scope(&only[0]), "model:classic");
    assert_eq!(classic.deployment_pool(&only[0]), "model:classic");
    let scopes: Vec<String> = c
        .scope_configs()
        .iter()
        .map(|s| s.name().to_owned())
        .collect();
    assert_eq!(
        scopes,
        ["s", "model:classic", "model:m/west"],
        "models sorted by name"
    );
}

// proves: GW-9, GW-11 (deployment mistakes are located errors)
#[test]
fn deployment_mistakes_are_located_errors() {
    let t = tenant("");
    fail_at(
        &format!("{}{TWO}[models.m]\nprovider = \"p\"\n{t}", base()),
        "models.m.provider",
        "not both",
    );
    fail_at(
        &format!("{}{TWO}[models.m]\nconcurrency = 2\n{t}", base()),
        "models.m.concurrency",
        "belongs to each deployment",
    );
    fail_at(
        &format!(
            "{}[models.m.deployments.d]\nprovider = \"nope\"\n{t}",
            base()
        ),
        "models.m.deployments.d.provider",
        "unknown provider \"nope\"",
    );
    fail_at(
        &format!(
            "{}[models.m.deployments.d]\nprovider = \"p\"\nweight = 0\n{t}",
            base()
        ),
        "models.m.deployments.d.weight",
        "at least 1",
    );
    fail_at(
        &format!(
            "{}[models.m.deployments.d]\nprovider = \"p\"\nscope = \"x\"\n{t}",
            base()
        ),
        "models.m.deployments.d.scope",
        "unknown scope \"x\"",
    );
    fail_at(
        &format!(
            "{}[models.m.deployments.d]\nprovider = \"p\"\nmax_waiting = 2\n{t}",
            base()
        ),
        "models.m.deployments.d.max_waiting",
        "without concurrency",
    );
}

// proves: GW-12 (allowed models, limits of any window, per-model limits)
#[test]
fn tenant_policies_parse() {
    let c = ok(&format!(
        "{}[models.m]\nprovider = \"p\"\n[models.n]\nprovider = \"p\"\n{}",
        base(),
        tenant(
            "models = [\"m\"]\nlimits = [{ tokens = 2000000, per = \"1d\" }]\n\
             [tenants.t.per_model.m]\nrpm = 5\nlimits = [{ requests = 100, per = \"1d\" }]"
        )
    ));
    let t = &c.tenants[0];
    assert!(t.allows("m") && !t.allows("n"));
    let own = t.quota_scope().unwrap();
    assert_eq!(own.name(), "tenant:t");
    assert_eq!(t.all_limits().len(), 1);
    assert_eq!(t.all_limits()[0].dimension, Dimension::Tokens);
    assert_eq!(t.all_limits()[0].window, DAY);
    let per: Vec<_> = t.model_scopes().collect();
    assert_eq!(per.len(), 1);
    assert_eq!(per[0].name(), "tenant:t/m");
    let limits = t.per_model[0].all_limits();
    assert_eq!(
        limits
            .iter()
            .map(|l| (l.amount, l.window))
            .collect::<Vec<_>>(),
        [(5, MINUTE), (100, DAY)]
    );
}

// proves: GW-9, GW-12 (tenant policy mistakes are located errors)
#[test]
fn tenant_policy_mistakes_are_located_errors() {
    let models = "[models.m]\nprovider = \"p\"\n[models.n]\nprovider = \"p\"\n";
    let with = |extra: &str| format!("{}{models}{}", base(), tenant(extra));
    fail_at(
        &with("models = [\"m\", \"zz\"]"),
        "tenants.t.models[1]",
        "unknown model \"zz\"",
    );
    fail_at(
        &with("[tenants.t.per_model.zz]\nrpm = 1"),
        "tenants.t.per_model.zz",
        "unknown model",
    );
    fail_at(
        &with("models = [\"m\"]\n[tenants.t.per_model.n]\nrpm = 1"),
        "tenants.t.per_model.n",
        "may not call",
    );
    fail_at(
        &with("limits = [{ requests = 0, per = \"1d\" }]"),
        "tenants.t.limits[0].requests",
        "positive",
    );
    fail_at(
        &with("[tenants.t.per_model.m]\nrpm = 1\nlimits = [{ requests = 3, per = \"1m\" }]"),
        "tenants.t.per_model.m.limits[0]",
        "repeats",
    );
}

// proves: OBS-2, GW-14 (metrics_listen and access_log settings)
#[test]
fn server_metrics_listen_and_access_log() {
    let m = "[models.m]\nprovider = \"p\"\n";
    let c = ok(&format!(
        "[server]\nmetrics_listen = \"127.0.0.1:9100\"\naccess_log = false\n{}{m}{}",
        base(),
        tenant("")
    ));
    assert_eq!(
        c.server.metrics_listen,
        Some("127.0.0.1:9100".parse().unwrap())
    );
    assert!(!c.server.access_log);
    assert!(
        ok(&format!("{}{m}{}", base(), tenant("")))
            .server
            .access_log
    );
    fail_at(
        &format!(
            "[server]\nlisten = \"127.0.0.1:9100\"\nmetrics_listen = \"127.0.0.1:9100\"\n{}{m}{}",
            base(),
            tenant("")
        ),
        "server.metrics_listen",
        "same address",
    );
}

// proves: CFG-1 (connection_threads: unset by default, a positive count,
// zero or an absurd count a located error)
#[test]
fn server_connection_threads() {
    let m = "[models.m]\nprovider = \"p\"\n";
    let file = |server: &str| format!("[server]\n{server}\n{}{m}{}", base(), tenant(""));
    assert_eq!(ok(&file("")).server.connection_threads, None);
    assert_eq!(
        ok(&file("connection_threads = 2"))
            .server
            .connection_threads,
        Some(2)
    );
    assert_eq!(
        crate::server::ServeOptions::from_config(&ok(&file("connection_threads = 3")).server)
            .connection_threads,
        Some(3)
    );
    fail_at(
        &file("connection_threads = 0"),
        "server.connection_threads",
        "",
    );
    fail_at(
        &file("connection_threads = 5000"),
        "server.connection_threads",
        "at most 256",
    );
}

const MODEL: &str = "[models.m]\nprovider = \"p\"\nscope = \"s\"\n";

// proves: FAIR-7, CFG-3 (a tenant's weight and priority ceiling parse with
// their defaults; an out-of-range weight or an unknown class is a located
// error naming the field)
#[test]
fn tenant_weight_and_priority_parse_and_are_validated() {
    let c = ok(&format!("{}{MODEL}{}", base(), tenant("")));
    let t = &c.tenants[0];
    assert_eq!((t.weight, t.priority), (1, tollgate::Priority::Standard));
    let c = ok(&format!(
        "{}{MODEL}{}",
        base(),
        tenant("weight = 3\npriority = \"interactive\"")
    ));
    let t = &c.tenants[0];
    assert_eq!((t.weight, t.priority), (3, tollgate::Priority::Interactive));
    fail_at(
        &format!("{}{MODEL}{}", base(), tenant("weight = 0")),
        "tenants.t.weight",
        "between 1 and 1000",
    );
    fail_at(
        &format!("{}{MODEL}{}", base(), tenant("weight = 1001")),
        "tenants.t.weight",
        "between 1 and 1000",
    );
    fail_at(
        &format!("{}{MODEL}{}", base(), tenant("priority = \"urgent\"")),
        "tenants.t.priority",
        "interactive, standard or batch",
    );
}

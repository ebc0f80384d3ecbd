//! Configuration tests: the example file, the embedded default, and one
//! test per class of error (each asserting the exact setting path and that
//! the message names the file).

use std::path::{Path, PathBuf};
use std::time::Duration;

use tollgate::config::{Algorithm, DAY, Limit, MINUTE, Overflow};
use tollgate::quota::{Dimension, RefusalCost};
use tollgate_openai::tokens::Profile;

use super::*;
use crate::auth::{Authenticator, KeyHash, hash_key, to_hex};

const FILE: &str = "gw.toml";

/// A provider and a tenant: with one model this is a valid configuration.
fn base() -> String {
    format!(
        "[providers.p]\nbase_url = \"http://127.0.0.1:9/v1\"\n\
         [tenants.t]\nkeys_sha256 = [\"{}\"]\n",
        to_hex(&hash_key("sk-t"))
    )
}

/// `base()` plus one chat model `m` plus `extra`.
fn with_model(extra: &str) -> String {
    format!("{}[models.m]\nprovider = \"p\"\n{extra}", base())
}

fn ok(text: &str) -> GatewayConfig {
    match GatewayConfig::from_toml(text, FILE) {
        Ok(c) => c,
        Err(e) => panic!("expected a valid configuration, got: {e}\n---\n{text}"),
    }
}

/// The error for `text`, checked to name the file.
fn fail(text: &str) -> ConfigError {
    match GatewayConfig::from_toml(text, FILE) {
        Ok(_) => panic!("expected a configuration error for:\n{text}"),
        Err(e) => {
            assert_eq!(e.file, FILE);
            assert!(e.to_string().starts_with("gw.toml: "), "{e}");
            e
        }
    }
}

/// The error for `text`, checked to be an `Invalid` error at `field` whose
/// message names the file, the field and contains `reason`.
fn fail_at(text: &str, field: &str, reason: &str) -> ConfigError {
    let e = fail(text);
    assert_eq!(e.field.as_deref(), Some(field), "{e}");
    assert!(
        e.reason.contains(reason),
        "reason {:?} lacks {reason:?}",
        e.reason
    );
    assert!(
        e.to_string().starts_with(&format!("gw.toml: {field}: ")),
        "{e}"
    );
    e
}

fn example_path() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/tollgate.toml")
}

// proves: GW-9 (the annotated example covers every option and is valid)
#[test]
fn annotated_example_loads_and_validates() {
    let c = match GatewayConfig::load(&example_path()) {
        Ok(c) => c,
        Err(e) => panic!("{e}"),
    };
    assert!(c.origin.ends_with("tollgate.toml"));
    assert_eq!(c.server.listen.to_string(), "127.0.0.1:8080");
    assert_eq!(
        c.server.admin_key_env.as_deref(),
        Some("TOLLGATE_ADMIN_KEY")
    );
    assert_eq!(c.server.log_format, LogFormat::Text);
    assert_eq!(c.admission.max_wait, Some(Duration::from_secs(30)));
    assert_eq!(c.admission.overflow, Overflow::Reject);
    assert_eq!(c.retry.base_delay, Duration::from_millis(500));

    let main = c.scope("openai-main").unwrap();
    assert_eq!(
        main.all_limits(),
        vec![
            Limit::new(Dimension::Requests, 500, MINUTE),
            Limit::new(Dimension::Tokens, 200_000, MINUTE),
            Limit::new(Dimension::Requests, 10_000, DAY),
            Limit::new(Dimension::Tokens, 5_000_000, DAY),
        ]
    );
    let split = c.scope("split-demo").unwrap();
    let dims: Vec<_> = split.all_limits().iter().map(|l| l.dimension).collect();
    assert_eq!(
        dims,
        [
            Dimension::Requests,
            Dimension::InputTokens,
            Dimension::OutputTokens,
            Dimension::InputTokens
        ]
    );
    let engine = main.to_scope_config();
    assert_eq!(engine.name(), "openai-main");
    assert_eq!(engine.limits().len(), 4);
    assert!(engine.has_token_limit());
    assert_eq!(
        c.scope("burst-demo").unwrap().algorithm,
        Algorithm::TokenBucket {
            burst: Some(Duration::from_secs(10))
        }
    );

    let mini = c.model("gpt-4o-mini").unwrap();
    assert_eq!(mini.fallbacks, ["local-llama"]);
    let d = &mini.deployments[0];
    assert_eq!(mini.deployment_scope(d), "openai-main");
    let pool = mini.deployment_pool_config(d).unwrap();
    assert_eq!((pool.name.as_str(), pool.limit), ("model:gpt-4o-mini", 64));
    assert_eq!(pool.max_waiting, Some(128));
    let llama = c.model("local-llama").unwrap();
    let d = &llama.deployments[0];
    assert_eq!(llama.deployment_scope(d), "model:local-llama");
    assert_eq!(d.upstream_model, "llama-3.1-8b-instruct");
    assert_eq!(d.learn_limits, Some(MINUTE));
    assert_eq!(
        llama.deployment_private_scope(d).unwrap().learns(),
        Some(MINUTE)
    );
    let openai = c.provider("openai").unwrap();
    assert_eq!(openai.accounting, Profile::OpenAi);
    // Left out, the flavour's (SPEC Q-16).
    for name in ["openai-second", "azure-east"] {
        assert_eq!(c.provider(name).unwrap().accounting, Profile::OpenAi);
    }
    assert_eq!(
        openai.engine_accounting(),
        tollgate::lifecycle::Accounting::default()
    );
    let local = c.provider("local").unwrap();
    assert_eq!(
        (local.accounting, local.refusals),
        (Profile::Tokenizer, RefusalCost::Free)
    );
    let embed = c.model("text-embedding-3-small").unwrap();
    assert_eq!(embed.kind, ModelKind::Embeddings);
    assert_eq!(
        embed.deployments[0].upstream_model,
        "text-embedding-3-small"
    );
    assert_eq!(c.provider_of(embed).unwrap().name, "openai");
    assert_eq!(
        c.provider("openai").unwrap().url("/chat/completions"),
        "https://api.openai.com/v1/chat/completions"
    );

    // Every engine conversion is accepted by the engine's own checks.
    let controller = c.controller_config();
    assert_eq!(controller.validate(), Ok(()));
    let scopes: Vec<&str> = controller.scopes.iter().map(|s| s.name()).collect();
    assert_eq!(
        scopes,
        [
            "anthropic",
            "burst-demo",
            "openai-main",
            "split-demo",
            "model:gpt-4o/second-key",
            "model:gpt-4o-azure",
            "model:local-llama",
            "tenant:team-a",
            "tenant:team-a/gpt-4o"
        ]
    );
    // Flavours and routes (SPEC WIRE-2, WIRE-4).
    let routes = |m: &str| c.model_routes(c.model(m).unwrap());
    assert_eq!(routes("gpt-4o-mini"), [ApiRoute::Chat, ApiRoute::Responses]);
    assert_eq!(routes("gpt-4o-azure"), [ApiRoute::Chat]);
    assert_eq!(routes("claude-sonnet"), [ApiRoute::Messages]);
    assert_eq!(routes("local-llama"), [ApiRoute::Chat]);
    let azure = c.provider("azure-east").unwrap();
    assert_eq!(
        azure.wire.base_url(&azure.base_url, "gpt-4o-prod"),
        "https://contoso-east.openai.azure.com/openai/deployments/gpt-4o-prod?api-version=2024-10-21"
    );
    assert_eq!(
        c.provider("anthropic").unwrap().accounting,
        Profile::Anthropic
    );
    // Two deployments of gpt-4o, gpt-4o-mini, local-llama and team-a have
    // concurrency.
    assert_eq!(controller.pools.len(), 5);
    // Deployments, tenant policies and the new [server] settings (SPEC
    // GW-11, GW-12, GW-14).
    let four = c.model("gpt-4o").unwrap();
    let ds = &four.deployments;
    assert_eq!(
        ds.iter()
            .map(|d| (d.name.as_str(), d.weight))
            .collect::<Vec<_>>(),
        [("main", 2), ("second-key", 1)]
    );
    assert_eq!(ds[1].learn_limits, Some(MINUTE));
    let team_a = &c.tenants[0];
    assert!(team_a.allows("gpt-4o") && !team_a.allows("local-llama"));
    assert_eq!(team_a.all_limits().len(), 4);
    assert!(
        team_a.limits[1].calendar.is_some(),
        "a calendar month (BUD-3)"
    );
    assert!(c.server.access_log);
    assert_eq!(c.server.metrics_listen, None);
    assert_eq!(c.retry.validate(), Ok(()));
    assert_eq!(c.cooldown.validate(), Ok(()));
    for p in &c.providers {
        assert_eq!(p.circuit.validate(), Ok(()));
    }

    let auth = Authenticator::new(&c);
    let a = auth.authenticate(Some("Bearer sk-example-team-a")).unwrap();
    let a2 = auth
        .authenticate(Some("Bearer sk-example-team-a-rotated"))
        .unwrap();
    let b = auth.authenticate(Some("Bearer sk-example-team-b")).unwrap();
    assert_eq!((a, auth.tenant_name(b)), (a2, Some("team-b")));
    assert_eq!(c.tenant_pool(a).unwrap().name, "tenant:team-a");
    assert_eq!(c.tenant_pool(b), None);
}

// proves: GW-9 (the built-in default routes to the simulator and is valid)
#[test]
fn embedded_default_validates() {
    let c = GatewayConfig::embedded("http://127.0.0.1:41234/v1/", "demo-key");
    assert_eq!(c.validate(), Ok(()));
    assert_eq!(c.controller_config().validate(), Ok(()));
    assert_eq!(c.origin, EMBEDDED_ORIGIN);
    assert_eq!(c.server.listen.to_string(), "127.0.0.1:8080");
    assert_eq!(c.providers.len(), 2);
    assert_eq!(c.providers[0].base_url, "http://127.0.0.1:41234/v1");
    assert_eq!(c.providers[1].wire.flavor, Flavor::Anthropic);
    assert_eq!(c.providers[1].base_url, "http://127.0.0.1:41234/v1");
    let scope = c.scope("sim").unwrap();
    assert_eq!((scope.rpm, scope.tpm), (Some(600), Some(60_000)));
    assert_eq!(scope.algorithm, Algorithm::SlidingWindow);
    let chat = c.model("sim-chat").unwrap();
    let embed = c.model("sim-embed").unwrap();
    assert_eq!(
        (chat.kind, embed.kind),
        (ModelKind::Chat, ModelKind::Embeddings)
    );
    assert_eq!(chat.deployments[0].scope.as_deref(), Some("sim"));
    assert_eq!(embed.deployments[0].upstream_model, "sim-embedding");
    let auth = Authenticator::new(&c);
    let demo = auth.authenticate(Some("Bearer demo-key")).unwrap();
    assert_eq!(auth.tenant_name(demo), Some("demo"));
    assert!(auth.authenticate(None).is_err());
    // Its engine conversions agree with the file-based path: the same text
    // written as TOML gives the same configuration.
    let text = format!(
        r#"
[providers.sim]
base_url = "http://127.0.0.1:41234/v1"
accounting = "openai"
refusals = "free"
[providers.sim-anthropic]
base_url = "http://127.0.0.1:41234/v1"
flavor = "anthropic"
[scopes.sim]
rpm = 600
tpm = 60000
[scopes.sim-anthropic]
algorithm = "token_bucket"
rpm = 300
itpm = 40000
otpm = 8000
[models.sim-chat]
provider = "sim"
scope = "sim"
concurrency = 16
max_waiting = 64
max_wait = "10s"
default_max_tokens = 256
[models.sim-claude]
provider = "sim-anthropic"
scope = "sim-anthropic"
concurrency = 16
max_waiting = 64
max_wait = "10s"
default_max_tokens = 256
[models.sim-embed]
provider = "sim"
upstream_model = "sim-embedding"
scope = "sim"
kind = "embeddings"
concurrency = 8
max_waiting = 64
max_wait = "10s"
[tenants.demo]
keys_sha256 = ["{}"]
concurrency = 16
max_waiting = 1000
"#,
        to_hex(&hash_key("demo-key"))
    );
    let parsed = GatewayConfig {
        origin: EMBEDDED_ORIGIN.into(),
        ..ok(&text)
    };
    assert_eq!(parsed, c);
}

// proves: GW-9 (a minimal file is complete: every default is the documented one)
#[test]
fn minimal_file_gets_documented_defaults() {
    let c = ok(&with_model(""));
    assert_eq!(c.server, ServerConfig::default());
    assert_eq!(c.server.max_body_bytes, 1_048_576);
    assert_eq!(c.server.header_read_timeout, Duration::from_secs(10));
    assert_eq!(c.admission, AdmissionConfig::default());
    assert_eq!(c.admission.queue_capacity, 256);
    assert_eq!(c.admission.overflow, Overflow::Reject);
    assert_eq!(c.retry.max_attempts, 3);
    assert_eq!(c.retry.max_delay, Duration::from_secs(10));
    assert_eq!(c.cooldown.max, Duration::from_secs(60));
    let p = &c.providers[0];
    assert_eq!(p.connect_timeout, Duration::from_secs(5));
    assert_eq!(p.attempt_timeout, Duration::from_secs(120));
    assert_eq!(p.circuit.failure_threshold, 5);
    assert_eq!(p.accounting, Profile::OpenAi);
    assert_eq!(
        p.engine_accounting(),
        tollgate::lifecycle::Accounting::default()
    );
    assert_eq!(p.arrival_floor, Duration::from_millis(500));
    let m = c.model("m").unwrap();
    assert_eq!(m.deployments[0].learn_limits, None);
    assert_eq!(m.deployments[0].upstream_model, "m");
    assert_eq!(m.kind, ModelKind::Chat);
    assert_eq!(m.default_max_tokens, DEFAULT_MAX_TOKENS);
    assert_eq!(m.deployment_pool_config(&m.deployments[0]), None);
    assert!(!c.anonymous.enabled);
    assert_eq!(c.anonymous_tenant(), None);
    // GW-3: the client's timeout is capped; none means the default.
    let a = c.admission;
    assert_eq!(a.request_timeout(None), Duration::from_secs(60));
    assert_eq!(
        a.request_timeout(Some(Duration::from_secs(5))),
        Duration::from_secs(5)
    );
    assert_eq!(
        a.request_timeout(Some(Duration::from_secs(9999))),
        Duration::from_secs(300)
    );
}

// proves: CFG-1 (zero is an error naming the field, never "unlimited")
#[test]
fn zero_limits_are_errors() {
    let scope = |body: &str| with_model(&format!("scope = \"s\"\n[scopes.s]\n{body}\n"));
    let e = fail_at(
        &scope("rpm = 0"),
        "scopes.s.rpm",
        "leave it unset for unlimited",
    );
    assert_eq!(e.kind, ConfigErrorKind::Invalid);
    assert!(e.position().is_some());
    fail_at(&scope("tpm = 0"), "scopes.s.tpm", "positive");
    fail_at(
        &scope("limits = [{ requests = 5, per = \"1d\" }, { tokens = 0, per = \"1d\" }]"),
        "scopes.s.limits[1].tokens",
        "positive",
    );
    fail_at(
        &with_model("concurrency = 0"),
        "models.m.concurrency",
        "positive",
    );
    fail_at(
        &with_model("default_max_tokens = 0"),
        "models.m.default_max_tokens",
        "positive",
    );
    let tenant = |body: &str| {
        with_model(&format!(
            "[tenants.u]\nkeys_sha256 = [\"{}\"]\n{body}\n",
            to_hex(&hash_key("sk-u"))
        ))
    };
    fail_at(&tenant("tpm = 0"), "tenants.u.tpm", "positive");
    fail_at(
        &tenant("concurrency = 0"),
        "tenants.u.concurrency",
        "positive",
    );
    fail_at(
        &with_model("[admission]\nqueue_capacity = 0"),
        "admission.queue_capacity",
        "at least 1",
    );
    fail_at(
        &scope("queue_capacity = 0"),
        "scopes.s.queue_capacity",
        "at least 1",
    );
    fail_at(
        &with_model("[server]\nmax_body_bytes = 0"),
        "server.max_body_bytes",
        "positive",
    );
    fail_at(
        &base().replace(
            "base_url = \"http://127.0.0.1:9/v1\"\n",
            "base_url = \"http://127.0.0.1:9/v1\"\nmax_response_bytes = 0\n",
        ),
        "providers.p.max_response_bytes",
        "positive",
    );
    fail_at(
        &with_model("[retry]\nmax_attempts = 0"),
        "retry.max_attempts",
        "at least 1",
    );
    fail_at(
        &with_model("[providers.p.circuit]\nfailure_threshold = 0"),
        "providers.p.circuit.failure_threshold",
        "at least 1",
    );
}

// proves: GW-4, GW-9 (a `default_max_tokens` past what one call may ask
// for is a located error at start: every call without `max_tokens` would
// otherwise be refused, blaming the client)
#[test]
fn a_default_allowance_past_one_call_is_an_error() {
    fail_at(
        &with_model(&format!("default_max_tokens = {}", (1u64 << 32) + 1)),
        "models.m.default_max_tokens",
        "more than one call may ask for",
    );
    ok(&with_model(&format!("default_max_tokens = {}", 1u64 << 32)));
}

// proves: CFG-2 (zero durations where zero makes no sense; factor >= 1;
// jitter within 0..=1)
#[test]
fn zero_durations_and_bad_factors_are_errors() {
    let scope = |body: &str| with_model(&format!("scope = \"s\"\n[scopes.s]\n{body}\n"));
    fail_at(
        &scope("limits = [{ requests = 5, per = \"0s\" }]"),
        "scopes.s.limits[0].per",
        "longer than zero",
    );
    fail_at(
        &scope("algorithm = \"token_bucket\"\nburst = \"0ms\"\nrpm = 5"),
        "scopes.s.burst",
        "longer than zero",
    );
    fail_at(
        &with_model("[admission]\ndefault_timeout = \"0s\""),
        "admission.default_timeout",
        "longer than zero",
    );
    fail_at(
        &with_model("[providers.p.circuit]\nrecovery_time = \"0s\""),
        "providers.p.circuit.recovery_time",
        "longer than zero",
    );
    fail_at(
        &with_model("concurrency = 2\nmax_wait = \"0s\""),
        "models.m.max_wait",
        "longer than zero",
    );
    fail_at(&with_model("[retry]\nfactor = 0.5"), "retry.factor", ">= 1");
    fail_at(
        &with_model("[retry]\njitter = 1.5"),
        "retry.jitter",
        "between 0 and 1",
    );
    fail_at(
        &with_model("[retry]\nbase_delay = \"2s\"\nmax_delay = \"1s\""),
        "retry.max_delay",
        "base_delay",
    );
    fail_at(
        &with_model("[cooldown]\nbase = \"0s\""),
        "cooldown.base",
        "longer than zero",
    );
    fail_at(
        &with_model("[cooldown]\nbase = \"2m\"\nmax = \"1m\""),
        "cooldown.max",
        "cooldown.base",
    );
    // Delays may be zero (CFG-2: >= 0 for delays).
    ok(&with_model(
        "[retry]\nbase_delay = \"0s\"\nmax_delay = \"0s\"\n[server]\nshutdown_grace = \"0s\"",
    ));
    // Integers are accepted where a float is expected.
    assert_eq!(ok(&with_model("[retry]\nfactor = 3")).retry.factor, 3.0);
}

// proves: GW-9 (a duration that does not parse names its field)
#[test]
fn unparsable_durations_are_errors() {
    let e = fail_at(
        &with_model("[server]\nidle_timeout = \"10\""),
        "server.idle_timeout",
        "is not a duration",
    );
    assert!(e.reason.contains("\"10s\""), "{e}");
    assert_eq!(e.position(), Some((8, 16)));
    fail_at(
        &with_model("scope = \"s\"\n[scopes.s]\nlimits = [{ requests = 1, per = \"a day\" }]"),
        "scopes.s.limits[0].per",
        "is not a duration",
    );
}

// proves: GW-9 (unknown references are errors)
#[test]
fn unknown_provider_and_scope_are_errors() {
    let text = format!("{}[models.m]\nprovider = \"nope\"\n", base());
    let e = fail_at(&text, "models.m.provider", "unknown provider \"nope\"");
    assert!(e.reason.contains("defined: \"p\""), "{e}");
    fail_at(
        &with_model("scope = \"missing\""),
        "models.m.scope",
        "unknown scope \"missing\"",
    );
}

// proves: GW-10 (fallbacks must exist, differ from the model, match its kind)
#[test]
fn bad_fallbacks_are_errors() {
    fail_at(
        &with_model("fallbacks = [\"ghost\"]"),
        "models.m.fallbacks[0]",
        "unknown model \"ghost\"",
    );
    fail_at(
        &with_model("fallbacks = [\"m\"]"),
        "models.m.fallbacks[0]",
        "its own fallback",
    );
    let two = "fallbacks = [\"n\", \"n\"]\n[models.n]\nprovider = \"p\"\n";
    fail_at(&with_model(two), "models.m.fallbacks[1]", "listed twice");
    let kinds = "fallbacks = [\"e\"]\n[models.e]\nprovider = \"p\"\nkind = \"embeddings\"\n";
    fail_at(&with_model(kinds), "models.m.fallbacks[0]", "same route");
    // The path quotes keys that are not bare TOML keys.
    let dotted = format!(
        "{}[models.\"gpt-3.5\"]\nprovider = \"p\"\nfallbacks = [\"x\"]\n",
        base()
    );
    fail_at(&dotted, "models.\"gpt-3.5\".fallbacks[0]", "unknown model");
}

// proves: GW-10 (fallback chains may not loop)
#[test]
fn fallback_cycles_are_errors() {
    let text = format!(
        "{}[models.a]\nprovider = \"p\"\nfallbacks = [\"b\"]\n\
         [models.b]\nprovider = \"p\"\nfallbacks = [\"c\"]\n\
         [models.c]\nprovider = \"p\"\nfallbacks = [\"a\"]\n",
        base()
    );
    fail_at(&text, "models.c.fallbacks[0]", "cycle: a -> b -> c -> a");
    // A chain and a diamond are fine.
    ok(&format!(
        "{}[models.a]\nprovider = \"p\"\nfallbacks = [\"b\", \"c\"]\n\
         [models.b]\nprovider = \"p\"\nfallbacks = [\"c\"]\n\
         [models.c]\nprovider = \"p\"\n",
        base()
    ));
}

// proves: GW-2 (a key belongs to exactly one tenant; hashes are hex)
#[test]
fn duplicate_and_malformed_key_hashes_are_errors() {
    let h = to_hex(&hash_key("sk-t"));
    let other = format!("[tenants.u]\nkeys_sha256 = [\"{}\"]\n", h.to_uppercase());
    let e = fail_at(
        &with_model(&other),
        "tenants.u.keys_sha256[0]",
        "already listed at tenants.t.keys_sha256[0]",
    );
    assert!(!e.to_string().contains(&h), "hashes are never echoed: {e}");
    let twice = format!(
        "{}[models.m]\nprovider = \"p\"\n[tenants.v]\nkeys_sha256 = [\"{}\", \"{h}\"]\n",
        base(),
        to_hex(&hash_key("sk-v"))
    );
    fail_at(&twice, "tenants.v.keys_sha256[1]", "already listed");

    let pasted_key = "sk-proj-this-is-a-real-key";
    let bad = format!("[tenants.u]\nkeys_sha256 = [\"{pasted_key}\"]\n");
    let e = fail_at(
        &with_model(&bad),
        "tenants.u.keys_sha256[0]",
        "64 hexadecimal",
    );
    assert!(e.reason.contains("never the key itself"));
    assert!(
        !e.to_string().contains(pasted_key),
        "keys are never echoed: {e}"
    );
    let not_hex = format!("[tenants.u]\nkeys_sha256 = [\"{}z\"]\n", &h[..63]);
    fail_at(
        &with_model(&not_hex),
        "tenants.u.keys_sha256[0]",
        "character 64",
    );
    fail_at(
        &with_model("[tenants.u]\nkeys_sha256 = []\n"),
        "tenants.u.keys_sha256",
        "at least one",
    );
}

// proves: GW-9 (provider URLs and key variables are checked)
#[test]
fn bad_urls_and_env_names_are_errors() {
    let provider = |body: &str| {
        format!(
            "[providers.q]\n{body}\n[models.m]\nprovider = \"q\"\n[anonymous]\nenabled = true\n"
        )
    };
    fail_at(
        &provider("base_url = \"api.openai.com/v1\""),
        "providers.q.base_url",
        "http:// or https://",
    );
    let e = fail_at(
        &provider("base_url = \"https://user:secret@example.com/v1\""),
        "providers.q.base_url",
        "credentials",
    );
    assert!(!e.to_string().contains("secret"));
    let e = fail_at(
        &provider("base_url = \"https://x.test/v1\"\napi_key_env = \"sk-live-123\""),
        "providers.q.api_key_env",
        "name of an environment variable",
    );
    assert!(!e.to_string().contains("sk-live"));
    fail_at(
        &with_model("[server]\nadmin_key_env = \"my key\""),
        "server.admin_key_env",
        "environment variable",
    );
    fail_at(
        &with_model("[server]\nlisten = \"localhost:8080\""),
        "server.listen",
        "IP address",
    );
    let c = ok(&provider("base_url = \"http://[::1]:8000/v1/\""));
    assert_eq!(c.providers[0].base_url, "http://[::1]:8000/v1");
}

// proves: GW-17 (the body read timeout and the connection cap have
// documented defaults; zero is an error naming the field)
#[test]
fn body_read_timeout_and_connection_cap() {
    let c = ok(&with_model(""));
    assert_eq!(c.server.body_read_timeout, Duration::from_secs(10));
    assert_eq!(c.server.max_connections, 512);
    let c = ok(&with_model(
        "[server]\nbody_read_timeout = \"2500ms\"\nmax_connections = 3",
    ));
    assert_eq!(c.server.body_read_timeout, Duration::from_millis(2_500));
    assert_eq!(c.server.max_connections, 3);
    fail_at(
        &with_model("[server]\nbody_read_timeout = \"0s\""),
        "server.body_read_timeout",
        "longer than zero",
    );
    fail_at(
        &with_model("[server]\nbody_read_timeout = \"soon\""),
        "server.body_read_timeout",
        "is not a duration",
    );
    fail_at(
        &with_model("[server]\nmax_connections = 0"),
        "server.max_connections",
        "positive",
    );
    let e = fail(&with_model("[server]\nmax_connections = -1"));
    assert_eq!(e.field.as_deref(), Some("server.max_connections"));
}

// proves: GW-17, GW-7, CFG-1 (the per-client connection cap is unset by
// default; zero, or more than max_connections, is an error naming the
// field and its line)
#[test]
fn per_client_connection_cap() {
    assert_eq!(ok(&with_model("")).server.max_connections_per_client, None);
    let c = ok(&with_model(
        "[server]\nmax_connections = 8\nmax_connections_per_client = 8",
    ));
    assert_eq!(c.server.max_connections_per_client, Some(8));
    assert_eq!(
        crate::server::ServeOptions::from_config(&c.server).max_connections_per_client,
        Some(8)
    );
    let e = fail_at(
        &with_model("[server]\nmax_connections_per_client = 0"),
        "server.max_connections_per_client",
        "positive",
    );
    assert!(e.position().is_some(), "{e}");
    let e = fail_at(
        &with_model("[server]\nmax_connections = 8\nmax_connections_per_client = 9"),
        "server.max_connections_per_client",
        "more than server.max_connections (8)",
    );
    assert!(e.position().is_some(), "{e}");
    // Against the default cap of 512 too.
    fail_at(
        &with_model("[server]\nmax_connections_per_client = 513"),
        "server.max_connections_per_client",
        "more than server.max_connections (512)",
    );
    let e = fail(&with_model("[server]\nmax_connections_per_client = -1"));
    assert_eq!(
        e.field.as_deref(),
        Some("server.max_connections_per_client")
    );
}

// proves: GW-3 (the cap on x-request-timeout is at least the default)
#[test]
fn max_timeout_below_default_timeout_is_an_error() {
    fail_at(
        &with_model("[admission]\ndefault_timeout = \"2m\"\nmax_timeout = \"90s\""),
        "admission.max_timeout",
        "default_timeout",
    );
    // Also when only the default is raised past the implicit 300 s cap.
    let e = fail_at(
        &with_model("[admission]\ndefault_timeout = \"10m\""),
        "admission.max_timeout",
        "default_timeout",
    );
    assert_eq!(e.position(), None, "max_timeout is not written in the file");
}

// proves: Q-2 (burst belongs to token_bucket only)
#[test]
fn burst_with_another_algorithm_is_an_error() {
    let scope = |body: &str| with_model(&format!("scope = \"s\"\n[scopes.s]\nrpm = 5\n{body}\n"));
    fail_at(
        &scope("algorithm = \"fixed_window\"\nburst = \"5s\""),
        "scopes.s.burst",
        "only to algorithm = \"token_bucket\"",
    );
    fail_at(&scope("burst = \"5s\""), "scopes.s.burst", "sliding_window");
    let c = ok(&scope("algorithm = \"token_bucket\""));
    assert_eq!(
        c.scopes[0].algorithm,
        Algorithm::TokenBucket { burst: None }
    );
}

// proves: Q-1 (each limit is one dimension; no limit repeated)
#[test]
fn malformed_limit_entries_are_errors() {
    let scope = |body: &str| with_model(&format!("scope = \"s\"\n[scopes.s]\n{body}\n"));
    fail_at(
        &scope("limits = [{ requests = 1, tokens = 2, per = \"1m\" }]"),
        "scopes.s.limits[0]",
        "both requests and tokens",
    );
    fail_at(
        &scope("limits = [{ per = \"1m\" }]"),
        "scopes.s.limits[0]",
        "needs requests, tokens, input_tokens, output_tokens or usd",
    );
    fail_at(
        &scope("rpm = 10\nlimits = [{ requests = 20, per = \"60s\" }]"),
        "scopes.s.limits[0]",
        "already set at scopes.s.rpm",
    );
    fail_at(
        &with_model("[scopes.\"model:x\"]\nrpm = 1"),
        "scopes.\"model:x\"",
        "reserved",
    );
}

// proves: POOL-3 (waiting bounds belong to a pool)
#[test]
fn waiting_bounds_without_concurrency_are_errors() {
    fail_at(
        &with_model("max_waiting = 3"),
        "models.m.max_waiting",
        "without concurrency",
    );
    fail_at(
        &with_model("[anonymous]\nenabled = true\nmax_wait = \"1s\""),
        "anonymous.max_wait",
        "without concurrency",
    );
    // max_waiting = 0 means "never wait", not unlimited.
    let c = ok(&with_model("concurrency = 2\nmax_waiting = 0"));
    let m = &c.models[0];
    assert_eq!(
        m.deployment_pool_config(&m.deployments[0])
            .unwrap()
            .max_waiting,
        Some(0)
    );
}

// proves: POOL-5 (the set of pools is capped)
#[test]
fn more_than_1024_pools_is_an_error() {
    let mut text = base();
    for i in 0..1000 {
        text.push_str(&format!("[models.m{i}]\nprovider = \"p\"\n"));
    }
    for i in 0..24 {
        let h = to_hex(&hash_key(&format!("sk-{i}")));
        text.push_str(&format!("[tenants.u{i}]\nkeys_sha256 = [\"{h}\"]\n"));
    }
    // 1000 models of one deployment + 25 tenants = 1025.
    let e = fail_at(&text, "tenants", "more than the limit of 1024");
    assert!(e.reason.contains("1000 deployments + 25 tenants"), "{e}");
    // 1024 exactly is fine.
    let cut = text.rfind("[tenants.u23]").unwrap();
    assert_eq!(ok(&text[..cut]).tenants.len(), 24);
    assert_eq!(MAX_POOLS, 1024);
}

// proves: GW-9 (providers and models are required)
#[test]
fn empty_providers_or_models_are_errors() {
    let e = fail_at("", "providers", "at least one provider");
    assert_eq!(e.position(), None);
    fail_at("[providers]\n", "providers", "at least one provider");
    fail_at(&base(), "models", "at least one model");
    fail_at(
        "[providers.p]\nbase_url = \"http://h\"\n[models.m]\nprovider = \"p\"\n",
        "tenants",
        "no request could be served",
    );
    let anonymous_only = "[providers.p]\nbase_url = \"http://h\"\n[models.m]\nprovider = \"p\"\n\
                          [anonymous]\nenabled = true\n";
    assert!(ok(anonymous_only).anonymous.enabled);
    fail_at(
        &with_model(
            "[tenants.anonymous]\nkeys_sha256 = [\"00000000000000000000000000000000000000000000000000000000000000aa\"]",
        ),
        "tenants.anonymous",
        "reserved",
    );
}

// proves: GW-9 (a missing file is a clear error naming it)
#[test]
fn missing_file_is_an_error() {
    let path = Path::new("/nonexistent/tollgate-test/gw.toml");
    let e = GatewayConfig::load(path).unwrap_err();
    assert_eq!(e.kind, ConfigErrorKind::NotFound);
    assert_eq!(e.file, "/nonexistent/tollgate-test/gw.toml");
    assert_eq!(e.field, None);
    assert!(
        e.to_string()
            .starts_with("/nonexistent/tollgate-test/gw.toml: no such file")
    );
    // A directory is unreadable, not missing.
    let e = GatewayConfig::load(Path::new(env!("CARGO_MANIFEST_DIR"))).unwrap_err();
    assert_eq!(e.kind, ConfigErrorKind::Unreadable);
}

// proves: GW-9 (bad TOML reports its line and column)
// proves: CFG-3 (a typed error, before any provider work)
#[test]
fn bad_toml_reports_line_and_column() {
    let text = "[server]\nlisten = \"127.0.0.1:8080\"\nidle_timeout = 60s\n";
    let e = fail(text);
    assert_eq!(e.kind, ConfigErrorKind::Syntax);
    assert_eq!(e.field, None);
    assert_eq!(e.position(), Some((3, 16)));
    assert!(e.reason.starts_with("invalid TOML: "), "{e}");
    assert!(e.to_string().ends_with("(line 3, column 16)"), "{e}");

    let e = fail("[models.m]\nprovider = \"p\"\n[models.m]\n");
    assert_eq!(e.kind, ConfigErrorKind::Syntax);
    assert_eq!(e.position().map(|p| p.0), Some(3));
    assert!(e.reason.contains("duplicate key"), "{e}");
}

// proves: GW-9 (a misspelt setting is an error naming it, not ignored)
#[test]
fn unknown_fields_are_errors() {
    let e = fail(&with_model("fallback = [\"x\"]"));
    assert_eq!(e.kind, ConfigErrorKind::Schema);
    assert_eq!(e.field.as_deref(), Some("models.m.fallback"));
    assert!(e.reason.contains("unknown field `fallback`"), "{e}");
    assert!(
        e.reason.contains("`fallbacks`"),
        "lists the valid names: {e}"
    );
    assert_eq!(e.position(), Some((7, 1)));

    let e = fail(&with_model("[server]\nlisten_addr = \"0.0.0.0:1\""));
    assert_eq!(e.field.as_deref(), Some("server.listen_addr"));
    let e = fail(&with_model("[retyr]\nmax_attempts = 2"));
    assert_eq!(e.field.as_deref(), Some("retyr"));
    let e = fail(&with_model(
        "scope = \"s\"\n[scopes.s]\nlimits = [{ requests = 1, per = \"1m\", window = \"1m\" }]",
    ));
    assert_eq!(e.field.as_deref(), Some("scopes.s.limits[0].window"));
}

// proves: GW-9 (wrong types, negative numbers, bad enum values and missing
// required fields name the setting)
#[test]
fn schema_errors_name_the_setting() {
    let e = fail(&with_model("[server]\nmax_body_bytes = \"big\""));
    assert_eq!(e.kind, ConfigErrorKind::Schema);
    assert_eq!(e.field.as_deref(), Some("server.max_body_bytes"));
    assert!(e.reason.contains("expected a non-negative integer"), "{e}");
    assert_eq!(e.position(), Some((8, 18)));
    let e = fail(&with_model("concurrency = -3"));
    assert_eq!(e.field.as_deref(), Some("models.m.concurrency"));
    let e = fail(&with_model("kind = \"completion\""));
    assert_eq!(e.field.as_deref(), Some("models.m.kind"));
    assert!(e.reason.contains("embeddings"), "{e}");
    let e = fail(&with_model("[admission]\noverflow = \"drop\""));
    assert_eq!(e.field.as_deref(), Some("admission.overflow"));
    let e = fail(&format!("{}[models.m]\nupstream_model = \"x\"\n", base()));
    assert_eq!(e.kind, ConfigErrorKind::Schema);
    assert!(e.reason.contains("missing field `provider`"), "{e}");
    assert_eq!(e.field.as_deref(), Some("models.m"));
    let e = fail(&with_model("default_max_tokens = 5\nkind = \"embeddings\""));
    assert_eq!(e.field.as_deref(), Some("models.m.default_max_tokens"));
}

// proves: CFG-3 (configurations built in code are validated too, with file and field)
#[test]
fn validate_checks_configurations_built_in_code() {
    let mut c = GatewayConfig::embedded("http://127.0.0.1:1/v1", "k");
    c.models[0].fallbacks = vec!["sim-chat".into()];
    let e = c.validate().unwrap_err();
    assert_eq!(e.file, EMBEDDED_ORIGIN);
    assert_eq!(e.field.as_deref(), Some("models.sim-chat.fallbacks[0]"));
    let mut c = GatewayConfig::embedded("not a url", "k");
    assert_eq!(
        c.validate().unwrap_err().field.as_deref(),
        Some("providers.sim.base_url")
    );
    for p in &mut c.providers {
        p.base_url = "http://127.0.0.1:1".into();
    }
    c.tenants[0].keys_sha256.push(KeyHash::of("k"));
    assert_eq!(
        c.validate().unwrap_err().field.as_deref(),
        Some("tenants.demo.keys_sha256[1]")
    );
}

// proves: GW-2 (the upstream key is the gateway's own, read from the named
// variable), CFG-3 (a missing variable is an error naming the setting)
#[test]
fn secrets_come_from_the_named_environment_variables() {
    use std::env::VarError;
    let c = ok(&with_model(
        "[server]\nadmin_key_env = \"ADMIN\"\n[providers.p2]\nbase_url = \"http://h\"\napi_key_env = \"UP\"",
    ));
    let p = c.provider("p2").unwrap();
    let key = c
        .provider_api_key_with(p, |v| {
            if v == "UP" {
                Ok(" sk-up \n".into())
            } else {
                Err(VarError::NotPresent)
            }
        })
        .unwrap()
        .unwrap();
    assert_eq!(key.expose(), "sk-up");
    assert_eq!(
        c.provider_api_key_with(c.provider("p").unwrap(), |_| unreachable!()),
        Ok(None)
    );
    let e = c
        .provider_api_key_with(p, |_| Err(VarError::NotPresent))
        .unwrap_err();
    assert_eq!(e.field.as_deref(), Some("providers.p2.api_key_env"));
    assert_eq!(
        e.to_string(),
        "gw.toml: providers.p2.api_key_env: environment variable UP is not set"
    );
    let e = c.admin_key_with(|_| Ok("  ".into())).unwrap_err();
    assert_eq!(e.field.as_deref(), Some("server.admin_key_env"));
    assert!(e.reason.contains("empty"));
    assert_eq!(
        c.admin_key_with(|_| Ok("root".into()))
            .unwrap()
            .unwrap()
            .expose(),
        "root"
    );
}

/// A provider `p` with `extra` settings, a tenant and a model `m` on it.
fn with_provider(extra: &str, model_extra: &str) -> String {
    format!(
        "[providers.p]\nbase_url = \"http://127.0.0.1:9/v1\"\n{extra}\n\
         [tenants.t]\nkeys_sha256 = [\"{}\"]\n\
         [models.m]\nprovider = \"p\"\n{model_extra}\n",
        to_hex(&hash_key("sk-t"))
    )
}

// proves: Q-16 (the accounting profile, the refusal cost and reconciliation
// are set per provider, with the documented defaults)
// proves: Q-15 (the arrival floor is a provider setting, 500 ms by default)
#[test]
fn provider_accounting_settings() {
    let c = ok(&with_provider(
        "accounting = \"openai\"\nrefusals = \"free\"\nreconciles = false\narrival_floor = \"250ms\"",
        "",
    ));
    let p = c.provider("p").unwrap();
    assert_eq!(p.accounting, Profile::OpenAi);
    assert_eq!(
        p.engine_accounting(),
        tollgate::lifecycle::Accounting {
            refusal_cost: RefusalCost::Free,
            reconciles: false,
            arrival_floor: Duration::from_millis(250),
        }
    );
    let c = ok(&with_provider(
        "accounting = { chars_per_token = 3, output = \"none\" }\nrefusals = \"request\"",
        "",
    ));
    let p = c.provider("p").unwrap();
    assert_eq!(
        p.accounting,
        Profile::Chars {
            chars_per_token: 3,
            output: false
        }
    );
    assert_eq!(p.refusals, RefusalCost::Request);
    // output defaults to the output cap; refusals = "full" is the default.
    let c = ok(&with_provider(
        "accounting = { chars_per_token = 4 }\nrefusals = \"full\"",
        "",
    ));
    let p = c.provider("p").unwrap();
    assert_eq!(
        p.accounting,
        Profile::Chars {
            chars_per_token: 4,
            output: true
        }
    );
    assert_eq!(p.refusals, RefusalCost::Full);
}

// proves: Q-16 (a wrong accounting setting is an error naming it, with the
// accepted forms)
// proves: GW-9 (located errors)
#[test]
fn bad_accounting_settings_are_errors() {
    let e = fail_at(
        &with_provider("accounting = \"bytes\"", ""),
        "providers.p.accounting",
        "unknown accounting profile \"bytes\"",
    );
    assert!(e.reason.contains("\"openai\""), "{e}");
    assert_eq!(e.position().map(|p| p.0), Some(3));
    fail_at(
        &with_provider("accounting = 4", ""),
        "providers.p.accounting",
        "has the wrong type (integer)",
    );
    fail_at(
        &with_provider("accounting = { output = \"none\" }", ""),
        "providers.p.accounting",
        "needs chars_per_token",
    );
    fail_at(
        &with_provider("accounting = { chars_per_token = 0 }", ""),
        "providers.p.accounting.chars_per_token",
        "from 1 to",
    );
    fail_at(
        &with_provider("accounting = { chars_per_token = \"4\" }", ""),
        "providers.p.accounting.chars_per_token",
        "positive integer",
    );
    fail_at(
        &with_provider("accounting = { chars_per_token = 4, output = \"all\" }", ""),
        "providers.p.accounting.output",
        "\"max_tokens\"",
    );
    fail_at(
        &with_provider("accounting = { chars_per_token = 4, input = true }", ""),
        "providers.p.accounting.input",
        "unknown field \"input\"",
    );
    let e = fail(&with_provider("refusals = \"none\"", ""));
    assert_eq!(e.kind, ConfigErrorKind::Schema);
    assert_eq!(e.field.as_deref(), Some("providers.p.refusals"));
    assert!(e.reason.contains("free"), "{e}");
    let e = fail(&with_provider("reconciles = \"yes\"", ""));
    assert_eq!(e.field.as_deref(), Some("providers.p.reconciles"));
    fail_at(
        &with_provider("arrival_floor = \"half a second\"", ""),
        "providers.p.arrival_floor",
        "is not a duration",
    );
}

// proves: Q-14 (learn_limits adopts the limits a scope leaves out, over one
// minute or learn_window; on a model's private scope or a named scope)
#[test]
fn learn_limits_settings() {
    let c = ok(&with_provider("", "learn_limits = true"));
    let m = c.model("m").unwrap();
    assert_eq!(m.deployments[0].learn_limits, Some(MINUTE));
    let scopes = c.scope_configs();
    assert_eq!(scopes[0].name(), "model:m");
    assert_eq!(scopes[0].learns(), Some(MINUTE));
    assert_eq!(c.controller_config().validate(), Ok(()));

    let c = ok(&with_provider(
        "",
        "scope = \"s\"\n[scopes.s]\nrpm = 10\nlearn_limits = true\nlearn_window = \"2s\"",
    ));
    let s = c.scope("s").unwrap();
    assert_eq!(s.learn_limits, Some(Duration::from_secs(2)));
    assert_eq!(s.to_scope_config().learns(), Some(Duration::from_secs(2)));
    assert!(s.to_scope_config().has_token_limit());
    // learn_limits = false is the default.
    let c = ok(&with_provider("", "learn_limits = false"));
    assert_eq!(c.scope_configs()[0].learns(), None);
}

// proves: Q-14 (learn_limits where there is nothing to learn, or on a model
// that shares a scope, is an error naming the setting)
#[test]
fn bad_learn_limits_are_errors() {
    fail_at(
        &with_provider(
            "",
            "scope = \"s\"\n[scopes.s]\nrpm = 10\ntpm = 100\nlearn_limits = true",
        ),
        "scopes.s.learn_limits",
        "sets both a request and a token limit",
    );
    fail_at(
        &with_provider(
            "",
            "scope = \"s\"\nlearn_limits = true\n[scopes.s]\nrpm = 10",
        ),
        "models.m.learn_limits",
        "set learn_limits = true on [scopes.s]",
    );
    fail_at(
        &with_provider("", "learn_window = \"2s\""),
        "models.m.learn_window",
        "without learn_limits = true",
    );
    fail_at(
        &with_provider("", "learn_limits = true\nlearn_window = \"0s\""),
        "models.m.learn_window",
        "longer than zero",
    );
    fail_at(
        &with_provider(
            "",
            "scope = \"s\"\n[scopes.s]\nlearn_limits = true\nlearn_window = \"soon\"",
        ),
        "scopes.s.learn_window",
        "is not a duration",
    );
}

// proves: Q-12 (input and output token limits: the itpm/otpm shortcuts of
// scopes, tenants and per-model tables and { input_tokens = N, per } /
// { output_tokens = N, per } entries become per-dimension limits, and a
// scope with only those needs a token estimate)
#[test]
fn input_and_output_token_limits_parse() {
    let text = with_model(&format!(
        "scope = \"s\"\n[scopes.s]\nitpm = 400000\notpm = 80000\n\
         limits = [{{ input_tokens = 9000000, per = \"1d\" }}, \
         {{ output_tokens = 1000, per = \"1s\" }}]\n\
         [tenants.u]\nkeys_sha256 = [\"{}\"]\nitpm = 1000\n\
         [tenants.u.per_model.m]\notpm = 50\n",
        to_hex(&hash_key("sk-u"))
    ));
    let c = ok(&text);
    let s = c.scope("s").unwrap();
    assert_eq!((s.itpm, s.otpm), (Some(400_000), Some(80_000)));
    let limit = |dimension, amount, window| Limit::new(dimension, amount, window);
    assert_eq!(
        s.all_limits(),
        [
            limit(Dimension::InputTokens, 400_000, MINUTE),
            limit(Dimension::OutputTokens, 80_000, MINUTE),
            limit(Dimension::InputTokens, 9_000_000, DAY),
            limit(Dimension::OutputTokens, 1_000, Duration::from_secs(1)),
        ]
    );
    assert!(s.has_token_limit());
    assert!(s.to_scope_config().has_token_limit());
    let u = c.tenants.iter().find(|t| t.name == "u").unwrap();
    assert_eq!(
        u.all_limits(),
        [limit(Dimension::InputTokens, 1_000, MINUTE)]
    );
    assert_eq!(
        u.per_model[0].all_limits(),
        [limit(Dimension::OutputTokens, 50, MINUTE)]
    );
}

// proves: Q-12, CFG-1 (the new keys fail like the old ones, at their exact
// setting path: zero, two dimensions in one entry, a repeated limit)
#[test]
fn input_and_output_token_limit_errors_are_located() {
    let scope = |body: &str| with_model(&format!("scope = \"s\"\n[scopes.s]\n{body}\n"));
    fail_at(&scope("itpm = 0"), "scopes.s.itpm", "positive");
    fail_at(&scope("otpm = 0"), "scopes.s.otpm", "positive");
    fail_at(
        &scope("limits = [{ input_tokens = 0, per = \"1d\" }]"),
        "scopes.s.limits[0].input_tokens",
        "positive",
    );
    fail_at(
        &scope("limits = [{ input_tokens = 1, output_tokens = 2, per = \"1m\" }]"),
        "scopes.s.limits[0]",
        "both input_tokens and output_tokens",
    );
    fail_at(
        &scope("limits = [{ tokens = 1, input_tokens = 2, per = \"1m\" }]"),
        "scopes.s.limits[0]",
        "both tokens and input_tokens",
    );
    fail_at(
        &scope("otpm = 10\nlimits = [{ output_tokens = 20, per = \"60s\" }]"),
        "scopes.s.limits[0]",
        "repeats the output_tokens limit per 1m already set at scopes.s.otpm",
    );
    // Input, output and total limits of one window are distinct limits.
    ok(&scope("tpm = 10\nitpm = 10\notpm = 10"));
    let tenant = |body: &str| {
        with_model(&format!(
            "[tenants.u]\nkeys_sha256 = [\"{}\"]\n{body}\n",
            to_hex(&hash_key("sk-u"))
        ))
    };
    fail_at(&tenant("otpm = 0"), "tenants.u.otpm", "positive");
    fail_at(
        &tenant("[tenants.u.per_model.m]\nitpm = 0"),
        "tenants.u.per_model.m.itpm",
        "positive",
    );
    fail_at(&scope("iptm = 5"), "scopes.s.iptm", "unknown");
}

//! Configuration of provider flavours and model routes (SPEC WIRE-2,
//! WIRE-4): what parses, the defaults each flavour brings, and located
//! errors for what cannot work.

use tollgate::quota::RefusalCost;
use tollgate_openai::tokens::Profile;

use super::*;
use crate::auth::{hash_key, to_hex};

const FILE: &str = "gw.toml";

/// Provider `p` (`provider` lines), model `m` on it (`model` lines), a
/// tenant; `more` is appended.
fn file(provider: &str, model: &str, more: &str) -> String {
    format!(
        "[providers.p]\nbase_url = \"http://127.0.0.1:9/v1\"\n{provider}\n\
         [models.m]\nprovider = \"p\"\n{model}\n{more}\n\
         [tenants.t]\nkeys_sha256 = [\"{}\"]\n",
        to_hex(&hash_key("sk-t"))
    )
}

fn ok(text: &str) -> GatewayConfig {
    GatewayConfig::from_toml(text, FILE).unwrap_or_else(|e| panic!("{e}\n---\n{text}"))
}

fn fail_at(text: &str, field: &str, reason: &str) {
    let e = GatewayConfig::from_toml(text, FILE).expect_err("a configuration error");
    assert_eq!(e.field.as_deref(), Some(field), "{e}");
    assert!(e.reason.contains(reason), "{:?} lacks {reason:?}", e.reason);
}

fn routes(c: &GatewayConfig, model: &str) -> Vec<ApiRoute> {
    c.model_routes(c.model(model).expect("model"))
}

// proves: WIRE-2 (each flavour's URL shape and key header), WIRE-4 (the
// routes each serves by default)
#[test]
fn flavours_bring_their_url_key_header_and_routes() {
    let c = ok(&file("", "", ""));
    let p = &c.providers[0];
    assert_eq!(p.wire.flavor, Flavor::OpenAi);
    assert_eq!(p.wire.key_header().0, http::header::AUTHORIZATION);
    assert_eq!(p.wire.key_header().1, "Bearer ");
    assert_eq!(p.wire.base_url(&p.base_url, "x"), "http://127.0.0.1:9/v1");
    assert_eq!(routes(&c, "m"), [ApiRoute::Chat, ApiRoute::Responses]);

    let c = ok(&file(
        "flavor = \"azure\"\napi_version = \"2024-10-21\"",
        "upstream_model = \"gpt-4o-prod\"",
        "",
    ));
    let p = &c.providers[0];
    assert_eq!(p.wire.key_header().0.as_str(), "api-key");
    assert_eq!(p.wire.key_header().1, "");
    assert_eq!(
        p.wire.base_url(&p.base_url, "gpt-4o-prod"),
        "http://127.0.0.1:9/v1/openai/deployments/gpt-4o-prod?api-version=2024-10-21"
    );
    assert_eq!(routes(&c, "m"), [ApiRoute::Chat]);

    let c = ok(&file(
        "flavor = \"openai_compatible\"\nauth_header = \"X-Key\"\n\
         query = { b = \"2\", a = \"x y&z\" }\nheaders = { \"X-Team\" = \"t\" }",
        "",
        "",
    ));
    let p = &c.providers[0];
    assert_eq!(p.wire.key_header().0.as_str(), "x-key");
    assert_eq!(p.wire.key_header().1, "", "no Bearer outside Authorization");
    assert_eq!(
        p.wire.base_url(&p.base_url, "m"),
        "http://127.0.0.1:9/v1?a=x+y%26z&b=2"
    );
    assert_eq!(p.wire.header_map()["x-team"], "t");
    assert_eq!(routes(&c, "m"), [ApiRoute::Chat]);

    let c = ok(&file("flavor = \"anthropic\"", "", ""));
    let p = &c.providers[0];
    assert_eq!(p.wire.key_header().0.as_str(), "x-api-key");
    assert_eq!(p.wire.header_map()["anthropic-version"], ANTHROPIC_VERSION);
    assert_eq!(routes(&c, "m"), [ApiRoute::Messages]);
}

// proves: Q-16 (an anthropic provider counts with the anthropic profile and
// a refusal costs nothing there, unless set otherwise)
#[test]
fn anthropic_flavour_defaults_its_accounting() {
    let c = ok(&file("flavor = \"anthropic\"", "", ""));
    assert_eq!(c.providers[0].accounting, Profile::Anthropic);
    assert_eq!(c.providers[0].refusals, RefusalCost::Free);
    let c = ok(&file(
        "flavor = \"anthropic\"\naccounting = { chars_per_token = 4 }\nrefusals = \"full\"",
        "",
        "",
    ));
    assert_eq!(
        c.providers[0].accounting,
        Profile::Chars {
            chars_per_token: 4,
            output: true
        }
    );
    assert_eq!(c.providers[0].refusals, RefusalCost::Full);
    let c = ok(&file("accounting = \"anthropic\"", "", ""));
    assert_eq!(c.providers[0].accounting, Profile::Anthropic);
}

// proves: Q-16 (without `accounting` a provider counts as its flavour's
// limiter does: OpenAI and Azure by OpenAI's documented character rule,
// Anthropic by its profile, an OpenAI-compatible server by the tokenizer;
// an explicit setting wins)
#[test]
fn the_default_accounting_follows_the_flavour() {
    let accounting = |provider: &str| ok(&file(provider, "", "")).providers[0].accounting;
    assert_eq!(accounting(""), Profile::OpenAi);
    assert_eq!(accounting("flavor = \"openai\""), Profile::OpenAi);
    assert_eq!(
        accounting("flavor = \"azure\"\napi_version = \"2024-10-21\""),
        Profile::OpenAi
    );
    assert_eq!(
        accounting("flavor = \"openai_compatible\""),
        Profile::Tokenizer
    );
    assert_eq!(accounting("flavor = \"anthropic\""), Profile::Anthropic);
    assert_eq!(
        accounting("flavor = \"openai\"\naccounting = \"tokenizer\""),
        Profile::Tokenizer
    );
}

// proves: WIRE-2 (a flavour's settings are checked, located)
#[test]
fn flavour_settings_errors_are_located() {
    fail_at(
        &file("flavor = \"bedrock\"", "", ""),
        "providers.p.flavor",
        "unknown flavor",
    );
    fail_at(
        &file("flavor = \"azure\"", "", ""),
        "providers.p.api_version",
        "needs api_version",
    );
    fail_at(
        &file("api_version = \"1\"", "", ""),
        "providers.p.api_version",
        "only to flavor = \"azure\"",
    );
    fail_at(
        &file("auth_header = \"X-Key\"", "", ""),
        "providers.p.auth_header",
        "only to flavor = \"openai_compatible\"",
    );
    fail_at(
        &file(
            "flavor = \"openai_compatible\"\nauth_header = \"bad header\"",
            "",
            "",
        ),
        "providers.p.auth_header",
        "not a valid HTTP header name",
    );
    for reserved in [
        "X-Request-Id",
        "Content-Type",
        "Host",
        "Content-Length",
        "x-api-key",
    ] {
        fail_at(
            &file(
                &format!("flavor = \"openai_compatible\"\nauth_header = \"{reserved}\""),
                "",
                "",
            ),
            "providers.p.auth_header",
            "set by the gateway itself",
        );
    }
    fail_at(
        &file("headers = { \"Authorization\" = \"Bearer x\" }", "", ""),
        "providers.p.headers.Authorization",
        "keys come from api_key_env",
    );
    fail_at(
        &file("headers = { \"X-A\" = \"line\\nbreak\" }", "", ""),
        "providers.p.headers.X-A",
        "printable ASCII",
    );
    fail_at(
        &file(
            "flavor = \"azure\"\napi_version = \"1\"\nquery = { api-version = \"2\" }",
            "",
            "",
        ),
        "providers.p.query.api-version",
        "set api_version instead",
    );
    fail_at(
        &file(
            "flavor = \"azure\"\napi_version = \"1\"",
            "upstream_model = \"a/../b\"",
            "",
        ),
        "models.m.upstream_model",
        "not an Azure deployment name",
    );
}

// proves: WIRE-4 (a model declares its routes; a route its provider cannot
// serve, or a fallback serving none of them, is refused, located)
#[test]
fn routes_are_declared_and_checked() {
    let c = ok(&file(
        "flavor = \"openai_compatible\"",
        "routes = [\"chat\", \"responses\"]",
        "",
    ));
    assert_eq!(routes(&c, "m"), [ApiRoute::Chat, ApiRoute::Responses]);
    fail_at(
        &file("", "routes = [\"chat\", \"talk\"]", ""),
        "models.m.routes[1]",
        "unknown route \"talk\"",
    );
    fail_at(
        &file("", "routes = []", ""),
        "models.m.routes",
        "at least one route",
    );
    fail_at(
        &file("", "routes = [\"chat\", \"chat\"]", ""),
        "models.m.routes[1]",
        "listed twice",
    );
    fail_at(
        &file("", "routes = [\"messages\"]", ""),
        "models.m.routes[0]",
        "does not serve /v1/messages",
    );
    fail_at(
        &file(
            "flavor = \"azure\"\napi_version = \"1\"",
            "routes = [\"responses\"]",
            "",
        ),
        "models.m.routes[0]",
        "does not serve /v1/responses",
    );
    fail_at(
        &file("", "kind = \"embeddings\"\nroutes = [\"chat\"]", ""),
        "models.m.routes[0]",
        "embeddings models serve only",
    );
    fail_at(
        &file("flavor = \"anthropic\"", "kind = \"embeddings\"", ""),
        "models.m.kind",
        "does not serve /v1/embeddings",
    );
    // Deployments of an anthropic and an openai provider share no route.
    let mixed = "[providers.a]\nbase_url = \"http://127.0.0.1:9/v1\"\nflavor = \"anthropic\"\n\
                 [providers.o]\nbase_url = \"http://127.0.0.1:9/v1\"\n\
                 [models.x.deployments.one]\nprovider = \"a\"\n\
                 [models.x.deployments.two]\nprovider = \"o\"\n";
    fail_at(mixed, "models.x.routes", "share no route");
    // A fallback must serve a route of the model.
    fail_at(
        &file(
            "",
            "fallbacks = [\"claude\"]",
            "[providers.a]\nbase_url = \"http://127.0.0.1:9/v1\"\nflavor = \"anthropic\"\n\
             [models.claude]\nprovider = \"a\"\n",
        ),
        "models.m.fallbacks[0]",
        "serves none of the routes",
    );
}

//! The library's part of a configuration (`library_from_toml`): the same
//! syntax, rules and located errors as the gateway's, without requiring
//! providers, models or tenants.

use tollgate::config::MINUTE;
use tollgate::quota::Dimension;

use super::*;

// proves: CFG-1, CFG-3 (a scopes-only file is valid for the library, and a
// zero limit is refused with the setting and its place in the file)
#[test]
fn scopes_alone_are_a_library_configuration() {
    let text = "[scopes.openai]\nrpm = 500\ntpm = 200000\n\n[admission]\nqueue_capacity = 9\n";
    let config = GatewayConfig::library_from_toml(text, "lib.toml").expect("valid");
    let scope = config.scope("openai").expect("scope");
    assert_eq!(scope.rpm, Some(500));
    let limits = scope.to_scope_config();
    assert!(
        limits
            .limits()
            .iter()
            .any(|l| l.dimension == Dimension::Tokens && l.amount == 200_000 && l.window == MINUTE)
    );
    assert_eq!(config.admission.queue_capacity, 9);
    // The gateway itself still needs providers, models and tenants.
    assert!(GatewayConfig::from_toml(text, "gw.toml").is_err());

    let e = GatewayConfig::library_from_toml("[scopes.openai]\nrpm = 0\n", "lib.toml")
        .expect_err("zero limit");
    assert_eq!(e.kind, ConfigErrorKind::Invalid);
    assert_eq!(e.field.as_deref(), Some("scopes.openai.rpm"));
    assert_eq!(e.position(), Some((2, 7)), "{e}");
}

// proves: CFG-3 (gateway-only tables are refused where they would be
// ignored, at their place in the file; bad types and bad TOML are located)
#[test]
fn gateway_tables_and_bad_text_are_refused_with_their_place() {
    let e = GatewayConfig::library_from_toml(
        "[scopes.a]\nrpm = 1\n[models.m]\nprovider = \"p\"\n",
        "lib.toml",
    )
    .expect_err("models refused");
    assert_eq!(e.field.as_deref(), Some("models"));
    assert_eq!(e.position().map(|p| p.0), Some(3), "{e}");

    let e = GatewayConfig::library_from_toml("[scopes.a]\nrpm = \"many\"\n", "lib.toml")
        .expect_err("type");
    assert_eq!(e.kind, ConfigErrorKind::Schema);
    assert_eq!(e.field.as_deref(), Some("scopes.a.rpm"));

    let e =
        GatewayConfig::library_from_toml("[scopes.a\nrpm = 1\n", "lib.toml").expect_err("syntax");
    assert_eq!(e.kind, ConfigErrorKind::Syntax);
    assert_eq!(e.position().map(|p| p.0), Some(1), "{e}");

    let e = GatewayConfig::load_library(std::path::Path::new("/nonexistent/lib.toml"))
        .expect_err("missing");
    assert_eq!(e.kind, ConfigErrorKind::NotFound);
}

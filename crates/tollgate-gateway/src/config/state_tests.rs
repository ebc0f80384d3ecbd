//! `[server] state_dir`, `on_unreadable_state`, `state_save_interval`
//! (SPEC DQ-8): parsed, defaulted, and located when wrong.

use std::path::PathBuf;
use std::time::Duration;

use tollgate_state::OnUnreadable;

use super::*;

const FILE: &str = "gw.toml";

fn config(server: &str) -> String {
    format!(
        "[server]\n{server}\n\
         [providers.p]\nbase_url = \"http://127.0.0.1:9/v1\"\n\
         [models.m]\nprovider = \"p\"\n[anonymous]\nenabled = true\n"
    )
}

// proves: DQ-8 (the state settings parse, with their defaults: nothing
// kept, refuse an unreadable file, save every 200 ms)
#[test]
fn state_settings_parse_with_defaults() {
    let c = GatewayConfig::from_toml(&config(""), FILE).unwrap();
    assert_eq!(c.server.state_dir, None);
    assert_eq!(c.server.on_unreadable_state, OnUnreadable::Refuse);
    assert_eq!(c.server.state_save_interval, Duration::from_millis(200));
    let c = GatewayConfig::from_toml(
        &config(
            "state_dir = \"/var/lib/tollgate\"\non_unreadable_state = \"start_empty\"\n\
             state_save_interval = \"1s\"",
        ),
        FILE,
    )
    .unwrap();
    assert_eq!(c.server.state_dir, Some(PathBuf::from("/var/lib/tollgate")));
    assert_eq!(c.server.on_unreadable_state, OnUnreadable::StartEmpty);
    assert_eq!(c.server.state_save_interval, Duration::from_secs(1));
}

// proves: DQ-8, CFG-1 (an empty directory, a zero interval or an unknown
// mode is an error naming the field and the line)
#[test]
fn wrong_state_settings_are_located() {
    for (line, field, reason) in [
        ("state_dir = \"\"", "server.state_dir", "is empty"),
        (
            "state_save_interval = \"0s\"",
            "server.state_save_interval",
            "",
        ),
        (
            "on_unreadable_state = \"ignore\"",
            "server.on_unreadable_state",
            "ignore",
        ),
    ] {
        let e = GatewayConfig::from_toml(&config(line), FILE).expect_err(line);
        let text = e.to_string();
        assert!(
            text.contains(field) || e.field.as_deref() == Some(field),
            "{text}"
        );
        assert!(text.contains(reason), "{text}");
        assert!(e.line.is_some(), "located: {text}");
    }
}

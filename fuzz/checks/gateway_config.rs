//! The gateway's TOML configuration: arbitrary text through the whole
//! parse + validate path. Checks no panic, that every error names the file
//! it came from and carries a reason, and that an accepted configuration
//! builds its authenticator.

use tollgate_gateway::auth::Authenticator;
use tollgate_gateway::config::GatewayConfig;

const ORIGIN: &str = "fuzz.toml";

/// Checks one input; panics on a finding.
pub fn check(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    match GatewayConfig::from_toml(text, ORIGIN) {
        Ok(config) => {
            let auth = Authenticator::new(&config);
            assert!(auth.tenant_count() >= config.tenants.len());
        }
        Err(err) => {
            assert_eq!(err.file, ORIGIN);
            assert!(!err.reason.is_empty());
            assert!(err.to_string().contains(ORIGIN));
        }
    }
}

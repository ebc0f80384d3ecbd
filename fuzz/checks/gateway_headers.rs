//! Request headers the gateway reads from clients: `Authorization` (tenant
//! identity, SPEC GW-2) and `x-request-timeout` (the deadline, GW-3), as
//! arbitrary bytes. Checks no panic, that only the configured key is
//! accepted, and that a deadline never exceeds the configured maximum.

use std::time::Duration;

use http::{HeaderMap, HeaderValue};
use tollgate_gateway::auth::{Authenticator, hash_key, to_hex};
use tollgate_gateway::config::GatewayConfig;
use tollgate_gateway::deadline::{REQUEST_TIMEOUT_HEADER, request_deadline};

const KEY: &str = "sk-fuzz-tenant";
const DEFAULT: Duration = Duration::from_secs(30);
const MAX: Duration = Duration::from_secs(600);

fn authenticator(anonymous: bool) -> Authenticator {
    let text = format!(
        "[providers.p]\nbase_url = \"http://127.0.0.1:9/v1\"\n\
         [models.m]\nprovider = \"p\"\n\
         [tenants.t]\nkeys_sha256 = [\"{}\"]\n\
         [anonymous]\nenabled = {anonymous}\n",
        to_hex(&hash_key(KEY))
    );
    let config = GatewayConfig::from_toml(&text, "fuzz.toml").expect("valid configuration");
    Authenticator::new(&config)
}

/// Checks one input; panics on a finding.
pub fn check(data: &[u8]) {
    for anonymous in [false, true] {
        let auth = authenticator(anonymous);
        if let Ok(tenant) = auth.authenticate_bytes(Some(data)) {
            // A presented header identifies a tenant only with its key.
            assert!(!auth.is_anonymous(tenant));
            let text = std::str::from_utf8(data).expect("accepted headers are UTF-8");
            assert!(text.contains(KEY), "{text:?}");
        }
    }

    let now = tokio::time::Instant::now();
    let mut headers = HeaderMap::new();
    if let Ok(value) = HeaderValue::from_bytes(data) {
        headers.insert(REQUEST_TIMEOUT_HEADER, value);
    }
    let deadline = request_deadline(&headers, now, DEFAULT, MAX);
    let at = deadline.instant().expect("a request always has a deadline");
    assert!(at >= now && at <= now + MAX);
}

//! Client authentication: API key → tenant (SPEC GW-2, POOL-2).
//!
//! The configuration stores only the SHA-256 of each key
//! (`tenants.<name>.keys_sha256`). A presented key is hashed once and
//! compared with every stored hash in constant time, without stopping at the
//! first match, so neither the timing nor the order of the configured keys
//! tells an attacker anything beyond "accepted" or "refused".
//!
//! Tenant identity comes only from [`Authenticator::authenticate`]: never
//! from another header or the request body. Keys and hashes are never
//! logged: [`KeyHash`] and [`Secret`] print as redacted in `Debug`, and no
//! error message contains the presented key.

use std::fmt;

use sha2::{Digest, Sha256};
use subtle::{Choice, ConditionallySelectable, ConstantTimeEq};

use crate::config::GatewayConfig;

/// The name under which unauthenticated traffic appears in logs and metrics
/// (SPEC POOL-2). No configured tenant may use it.
pub const ANONYMOUS_TENANT: &str = "anonymous";

/// SHA-256 of `key` (its UTF-8 bytes, nothing trimmed).
pub fn hash_key(key: &str) -> [u8; 32] {
    Sha256::digest(key.as_bytes()).into()
}

/// Lower-case hexadecimal of `bytes`.
pub fn to_hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(bytes.len() * 2);
    for &b in bytes {
        out.push(char::from(DIGITS[usize::from(b >> 4)]));
        out.push(char::from(DIGITS[usize::from(b & 0x0f)]));
    }
    out
}

/// Why a string is not a SHA-256 written in hexadecimal.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum HexError {
    /// Not 64 characters long.
    #[error("must be 64 hexadecimal characters (a SHA-256), found {0} characters")]
    Length(usize),
    /// A character that is not `0-9`, `a-f` or `A-F` (1-based position).
    #[error("character {0} is not a hexadecimal digit (0-9, a-f)")]
    NotHex(usize),
}

/// Parses 64 hexadecimal characters (either case) into 32 bytes.
pub fn parse_hash_hex(text: &str) -> Result<[u8; 32], HexError> {
    fn nibble(c: u8) -> Option<u8> {
        match c {
            b'0'..=b'9' => Some(c - b'0'),
            b'a'..=b'f' => Some(c - b'a' + 10),
            b'A'..=b'F' => Some(c - b'A' + 10),
            _ => None,
        }
    }
    let chars = text.chars().count();
    if chars != 64 || text.len() != 64 {
        return Err(HexError::Length(chars));
    }
    let bytes = text.as_bytes();
    let mut out = [0u8; 32];
    for (i, slot) in out.iter_mut().enumerate() {
        let hi = nibble(bytes[2 * i]).ok_or(HexError::NotHex(2 * i + 1))?;
        let lo = nibble(bytes[2 * i + 1]).ok_or(HexError::NotHex(2 * i + 2))?;
        *slot = (hi << 4) | lo;
    }
    Ok(out)
}

/// Why a key cannot be used with `Authorization: Bearer <key>`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum KeyFormatError {
    /// Nothing left after removing the trailing line break.
    #[error("the key is empty")]
    Empty,
    /// Spaces, tabs or control characters cannot travel in a bearer token,
    /// so a hash of such a key could never match.
    #[error("the key contains whitespace or control characters; a bearer token cannot carry them")]
    Unusable,
}

/// The hash to paste into `keys_sha256` for `key`, as 64 lower-case hex
/// characters: what `tollgate hash-key` prints.
///
/// One trailing line break (`\n` or `\r\n`, as left by `read_line` or
/// `echo`) is removed first; any other whitespace is refused, because the
/// gateway never accepts it in a bearer token.
pub fn hash_key_for_config(key: &str) -> Result<String, KeyFormatError> {
    let key = key
        .strip_suffix('\n')
        .map_or(key, |k| k.strip_suffix('\r').unwrap_or(k));
    if key.is_empty() {
        return Err(KeyFormatError::Empty);
    }
    if key.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(KeyFormatError::Unusable);
    }
    Ok(to_hex(&hash_key(key)))
}

/// A stored SHA-256 of an API key. `Debug` never shows it.
///
/// `==` is an ordinary comparison, fit for checking the configuration for
/// duplicates; authentication compares in constant time instead.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct KeyHash([u8; 32]);

impl KeyHash {
    /// The hash of `key`.
    pub fn of(key: &str) -> Self {
        KeyHash(hash_key(key))
    }

    /// Wraps an already computed hash.
    pub const fn from_bytes(bytes: [u8; 32]) -> Self {
        KeyHash(bytes)
    }

    /// Parses 64 hexadecimal characters.
    pub fn from_hex(text: &str) -> Result<Self, HexError> {
        parse_hash_hex(text).map(KeyHash)
    }

    /// The hash as lower-case hex (for writing configuration files only;
    /// never log it).
    pub fn to_hex(&self) -> String {
        to_hex(&self.0)
    }

    /// The raw bytes.
    pub const fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }
}

impl fmt::Debug for KeyHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("KeyHash(<redacted>)")
    }
}

/// A secret read from the environment (an upstream or admin key). `Debug`
/// and `Display` never show it; use [`Secret::expose`] where it is sent.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    /// Wraps a secret value.
    pub fn new(value: impl Into<String>) -> Self {
        Secret(value.into())
    }

    /// The secret itself.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(<redacted>)")
    }
}

impl fmt::Display for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<redacted>")
    }
}

/// Which tenant a request belongs to: a small ordinal.
///
/// Configured tenants are numbered `0..n` in the order of
/// [`GatewayConfig::tenants`]; the anonymous tenant, when enabled, is `n`.
/// So `index()` can index a `Vec` of per-tenant state of length
/// [`Authenticator::tenant_count`]. Logs and metric labels use the
/// configured name ([`Authenticator::tenant_name`]), never key material.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TenantId(u32);

impl TenantId {
    /// The ordinal as an index.
    pub const fn index(self) -> usize {
        self.0 as usize
    }

    /// The id of ordinal `index` (crate-internal: ids come from the
    /// configuration, never from a request).
    pub(crate) fn from_index(index: usize) -> Option<Self> {
        u32::try_from(index).ok().map(TenantId)
    }
}

impl fmt::Display for TenantId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "tenant#{}", self.0)
    }
}

/// Why a request is not authenticated (HTTP 401, SPEC GW-2).
///
/// The messages never contain the presented key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum AuthError {
    /// No `Authorization` header.
    #[error("missing API key: send the header `Authorization: Bearer <key>`")]
    Missing,
    /// An `Authorization` header that is not `Bearer <key>`.
    #[error("malformed Authorization header: expected `Bearer <key>`")]
    Malformed,
    /// A well-formed key that matches no configured key.
    #[error("invalid API key")]
    InvalidKey,
}

impl AuthError {
    /// A stable code for error bodies and metrics: `missing_api_key`,
    /// `malformed_authorization` or `invalid_api_key`.
    pub const fn code(self) -> &'static str {
        match self {
            AuthError::Missing => "missing_api_key",
            AuthError::Malformed => "malformed_authorization",
            AuthError::InvalidKey => "invalid_api_key",
        }
    }
}

/// Extracts the token of `Bearer <token>`; the scheme is case-insensitive
/// (RFC 9110 §11.1) and the token may not contain whitespace.
fn bearer_token(header: &str) -> Result<&str, AuthError> {
    let header = header.trim_matches([' ', '\t']);
    let (scheme, token) = header.split_once([' ', '\t']).ok_or(AuthError::Malformed)?;
    if !scheme.eq_ignore_ascii_case("bearer") {
        return Err(AuthError::Malformed);
    }
    let token = token.trim_start_matches([' ', '\t']);
    if token.is_empty() || token.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(AuthError::Malformed);
    }
    Ok(token)
}

/// The password of an HTTP Basic `authorization` header (`Basic
/// base64(user:password)`), if it is one.
fn basic_password(header: &str) -> Option<String> {
    use base64::Engine as _;
    let (scheme, encoded) = header.trim().split_once(' ')?;
    if !scheme.eq_ignore_ascii_case("basic") {
        return None;
    }
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(encoded.trim())
        .ok()?;
    let text = String::from_utf8(decoded).ok()?;
    let (_user, password) = text.split_once(':')?;
    Some(password.to_owned())
}

/// Constant-time lookup of `presented` among `entries`: every entry is
/// compared, whatever matched before.
fn find(entries: &[(KeyHash, u32)], presented: &[u8; 32]) -> Option<u32> {
    let mut found = Choice::from(0);
    let mut ordinal = 0u32;
    for (hash, tenant) in entries {
        let same = hash.0[..].ct_eq(&presented[..]);
        ordinal.conditional_assign(tenant, same);
        found |= same;
    }
    bool::from(found).then_some(ordinal)
}

/// Maps `Authorization` headers to tenants (SPEC GW-2, POOL-2).
///
/// Built once from a validated [`GatewayConfig`]; cheap to share behind an
/// `Arc`.
#[derive(Clone)]
pub struct Authenticator {
    /// Every configured key hash with its tenant's ordinal.
    entries: Vec<(KeyHash, u32)>,
    /// Tenant names by ordinal; the anonymous tenant last when enabled.
    names: Vec<String>,
    /// The anonymous tenant, when unauthenticated traffic is allowed.
    anonymous: Option<TenantId>,
}

impl fmt::Debug for Authenticator {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Authenticator")
            .field("tenants", &self.names)
            .field("keys", &self.entries.len())
            .field("anonymous", &self.anonymous)
            .finish()
    }
}

impl Authenticator {
    /// The authenticator for `config`'s tenants and `[anonymous]` section.
    pub fn new(config: &GatewayConfig) -> Self {
        let mut entries = Vec::new();
        let mut names = Vec::with_capacity(config.tenants.len() + 1);
        for (ordinal, tenant) in (0u32..).zip(&config.tenants) {
            names.push(tenant.name.clone());
            entries.extend(tenant.keys_sha256.iter().map(|h| (*h, ordinal)));
        }
        let anonymous = if config.anonymous.enabled {
            names.push(ANONYMOUS_TENANT.to_owned());
            TenantId::from_index(names.len() - 1)
        } else {
            None
        };
        Authenticator {
            entries,
            names,
            anonymous,
        }
    }

    /// The tenant of a request, from its `Authorization` header value (if
    /// any). The presented key is hashed once and compared in constant time
    /// with every configured hash.
    ///
    /// A request without an `Authorization` header belongs to the
    /// anonymous tenant when anonymous access is enabled, and is
    /// [`AuthError::Missing`] otherwise. A presented key that is malformed
    /// or unknown is always an [`AuthError`] (SPEC GW-2): a client with a
    /// mistyped or revoked key is told so instead of being served quietly
    /// as anonymous, and guessing keys shows up as 401s.
    pub fn authenticate(&self, authorization: Option<&str>) -> Result<TenantId, AuthError> {
        match authorization {
            None => self.anonymous.ok_or(AuthError::Missing),
            Some(header) => bearer_token(header).and_then(|token| {
                find(&self.entries, &hash_key(token))
                    .map(TenantId)
                    .ok_or(AuthError::InvalidKey)
            }),
        }
    }

    /// The tenant of a request that presents its key as a bare header
    /// value, as Anthropic's clients do (`x-api-key: <key>`, SPEC WIRE-3).
    /// A value that is not UTF-8 or is empty is malformed; the key is
    /// compared as [`authenticate`](Self::authenticate) does.
    pub fn authenticate_api_key(&self, key: &[u8]) -> Result<TenantId, AuthError> {
        let key = std::str::from_utf8(key)
            .map_err(|_| AuthError::Malformed)?
            .trim();
        if key.is_empty() {
            return Err(AuthError::Malformed);
        }
        find(&self.entries, &hash_key(key))
            .map(TenantId)
            .ok_or(AuthError::InvalidKey)
    }

    /// [`authenticate`](Self::authenticate) for a raw header value (HTTP
    /// header values need not be UTF-8; such a value is malformed).
    pub fn authenticate_bytes(&self, authorization: Option<&[u8]>) -> Result<TenantId, AuthError> {
        match authorization.map(std::str::from_utf8) {
            None => self.authenticate(None),
            Some(Ok(header)) => self.authenticate(Some(header)),
            Some(Err(_)) => Err(AuthError::Malformed),
        }
    }

    /// The configured name of `tenant` (`anonymous` for the anonymous
    /// tenant); `None` for an id of another configuration.
    pub fn tenant_name(&self, tenant: TenantId) -> Option<&str> {
        self.names.get(tenant.index()).map(String::as_str)
    }

    /// The anonymous tenant, when enabled.
    pub fn anonymous(&self) -> Option<TenantId> {
        self.anonymous
    }

    /// Whether `tenant` is the anonymous tenant.
    pub fn is_anonymous(&self, tenant: TenantId) -> bool {
        self.anonymous == Some(tenant)
    }

    /// How many tenant ids exist (configured tenants plus the anonymous one
    /// when enabled); every id's `index()` is below this.
    pub fn tenant_count(&self) -> usize {
        self.names.len()
    }
}

/// Checks the admin key of `/admin/snapshot` (`server.admin_key_env`),
/// in constant time like tenant keys.
#[derive(Clone)]
pub struct AdminAuth {
    hash: KeyHash,
}

impl fmt::Debug for AdminAuth {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("AdminAuth(<redacted>)")
    }
}

impl AdminAuth {
    /// Accepts exactly `key`.
    pub fn new(key: &str) -> Self {
        AdminAuth {
            hash: KeyHash::of(key),
        }
    }

    /// The admin check configured by `server.admin_key_env`: `None` when the
    /// setting is absent (the admin endpoint stays closed); an error naming
    /// the setting when the variable is unset or empty.
    pub fn from_config(config: &GatewayConfig) -> Result<Option<Self>, crate::config::ConfigError> {
        Ok(config
            .admin_key()?
            .map(|secret| AdminAuth::new(secret.expose())))
    }

    /// Whether `authorization` is `Bearer <the admin key>` or, when
    /// `basic` is true, HTTP Basic with the admin key as the password (any
    /// user name): what a browser sends after its own login prompt (the
    /// status page, SPEC OBS-6).
    pub fn check_with_basic(&self, authorization: Option<&str>) -> Result<(), AuthError> {
        let header = authorization.ok_or(AuthError::Missing)?;
        match basic_password(header) {
            Some(password) => self.check(Some(&format!("Bearer {password}"))),
            None => self.check(Some(header)),
        }
    }

    /// Whether `authorization` is `Bearer <the admin key>`.
    pub fn check(&self, authorization: Option<&str>) -> Result<(), AuthError> {
        let token = bearer_token(authorization.ok_or(AuthError::Missing)?)?;
        let entries = [(self.hash, 0)];
        find(&entries, &hash_key(token))
            .map(|_| ())
            .ok_or(AuthError::InvalidKey)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ALICE: &str = "sk-alice-0123456789";
    const ALICE_2: &str = "sk-alice-second";
    const BOB: &str = "sk-bob-9876543210";

    fn config(anonymous: bool) -> GatewayConfig {
        let text = format!(
            r#"
[providers.p]
base_url = "http://127.0.0.1:9/v1"
[models.m]
provider = "p"
[tenants.alice]
keys_sha256 = ["{}", "{}"]
[tenants.bob]
keys_sha256 = ["{}"]
[anonymous]
enabled = {anonymous}
"#,
            to_hex(&hash_key(ALICE)),
            to_hex(&hash_key(ALICE_2)).to_uppercase(),
            to_hex(&hash_key(BOB)),
        );
        match GatewayConfig::from_toml(&text, "auth-test.toml") {
            Ok(c) => c,
            Err(e) => panic!("{e}"),
        }
    }

    fn name(auth: &Authenticator, header: &str) -> Option<String> {
        auth.authenticate(Some(header))
            .ok()
            .and_then(|t| auth.tenant_name(t).map(str::to_owned))
    }

    #[test]
    fn sha256_and_hex_helpers() {
        // SHA-256("abc"), FIPS 180-2 appendix B.1.
        let abc = "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad";
        assert_eq!(to_hex(&hash_key("abc")), abc);
        assert_eq!(parse_hash_hex(abc), Ok(hash_key("abc")));
        assert_eq!(parse_hash_hex(&abc.to_uppercase()), Ok(hash_key("abc")));
        assert_eq!(parse_hash_hex(&abc[1..]), Err(HexError::Length(63)));
        let bad = format!("{}g", &abc[..63]);
        assert_eq!(parse_hash_hex(&bad), Err(HexError::NotHex(64)));
        assert_eq!(hash_key_for_config("abc\n").as_deref(), Ok(abc));
        assert_eq!(hash_key_for_config("abc\r\n").as_deref(), Ok(abc));
        assert_eq!(hash_key_for_config("\n"), Err(KeyFormatError::Empty));
        assert_eq!(hash_key_for_config("a b"), Err(KeyFormatError::Unusable));
    }

    // proves: GW-2 (key → tenant; keys stored as hashes, several per tenant)
    #[test]
    fn right_key_gives_its_tenant() {
        let auth = Authenticator::new(&config(false));
        assert_eq!(
            name(&auth, &format!("Bearer {ALICE}")).as_deref(),
            Some("alice")
        );
        assert_eq!(
            name(&auth, &format!("Bearer {ALICE_2}")).as_deref(),
            Some("alice")
        );
        assert_eq!(
            name(&auth, &format!("Bearer {BOB}")).as_deref(),
            Some("bob")
        );
        // The scheme is case-insensitive; surrounding blanks are tolerated.
        assert_eq!(
            name(&auth, &format!("bearer {BOB}")).as_deref(),
            Some("bob")
        );
        assert_eq!(
            name(&auth, &format!("BEARER  {BOB} ")).as_deref(),
            Some("bob")
        );
        assert_eq!(auth.tenant_count(), 2);
        assert_eq!(auth.anonymous(), None);
    }

    // proves: GW-2 (two tenants' keys never cross)
    #[test]
    fn keys_of_two_tenants_map_to_distinct_ids() {
        let cfg = config(false);
        let auth = Authenticator::new(&cfg);
        let a = auth.authenticate(Some(&format!("Bearer {ALICE}")));
        let b = auth.authenticate(Some(&format!("Bearer {BOB}")));
        assert_eq!(a, Ok(cfg.tenant_id("alice").unwrap()));
        assert_eq!(b, Ok(cfg.tenant_id("bob").unwrap()));
        assert_ne!(a, b);
        assert_eq!(cfg.tenant_name(b.unwrap()), Some("bob"));
    }

    // proves: GW-2 (bad or missing key ⇒ 401 error, never a tenant)
    #[test]
    fn wrong_missing_or_malformed_headers_are_refused() {
        let auth = Authenticator::new(&config(false));
        assert_eq!(auth.authenticate(None), Err(AuthError::Missing));
        assert_eq!(
            auth.authenticate(Some("Bearer sk-nobody")),
            Err(AuthError::InvalidKey)
        );
        // The hash itself is not a key.
        let hash = to_hex(&hash_key(ALICE));
        assert_eq!(
            auth.authenticate(Some(&format!("Bearer {hash}"))),
            Err(AuthError::InvalidKey)
        );
        for bad in [
            "",
            "Bearer",
            "Bearer ",
            ALICE,
            &format!("Basic {ALICE}"),
            &format!("Bearer {ALICE} extra"),
            &format!("Token {ALICE}"),
        ] {
            assert_eq!(
                auth.authenticate(Some(bad)),
                Err(AuthError::Malformed),
                "{bad:?}"
            );
        }
        assert_eq!(
            auth.authenticate_bytes(Some(b"Bearer \xff\xfe")),
            Err(AuthError::Malformed)
        );
        // Messages never carry the presented key.
        for e in [
            AuthError::Missing,
            AuthError::Malformed,
            AuthError::InvalidKey,
        ] {
            assert!(!e.to_string().contains("sk-"));
        }
    }

    // proves: POOL-2 (unauthenticated traffic shares the one anonymous
    // tenant), GW-2 (a bad key is refused even then)
    #[test]
    fn anonymous_fallback_when_enabled() {
        let cfg = config(true);
        let auth = Authenticator::new(&cfg);
        let anon = auth.anonymous().unwrap();
        assert_eq!(anon.index(), 2);
        assert_eq!(auth.tenant_count(), 3);
        assert_eq!(auth.tenant_name(anon), Some(ANONYMOUS_TENANT));
        assert_eq!(cfg.anonymous_tenant(), Some(anon));
        assert_eq!(auth.authenticate(None), Ok(anon));
        assert_eq!(
            auth.authenticate(Some("Bearer sk-nobody")),
            Err(AuthError::InvalidKey)
        );
        assert!(auth.authenticate(Some("Basic xyz")).is_err());
        assert_eq!(
            auth.authenticate_bytes(Some(b"Bearer \xff")),
            Err(AuthError::Malformed)
        );
        assert!(auth.is_anonymous(anon));
        // A good key still identifies its own tenant.
        let alice = auth.authenticate(Some(&format!("Bearer {ALICE}"))).unwrap();
        assert!(!auth.is_anonymous(alice));
        assert_eq!(auth.tenant_name(alice), Some("alice"));
    }

    #[test]
    fn admin_key_is_checked_like_tenant_keys() {
        let admin = AdminAuth::new("root-key");
        assert_eq!(admin.check(Some("Bearer root-key")), Ok(()));
        assert_eq!(
            admin.check(Some("Bearer other")),
            Err(AuthError::InvalidKey)
        );
        assert_eq!(admin.check(None), Err(AuthError::Missing));
        assert_eq!(admin.check(Some("root-key")), Err(AuthError::Malformed));
        // The status page also takes the key as a Basic password.
        let basic = |s: &str| {
            use base64::Engine as _;
            format!(
                "Basic {}",
                base64::engine::general_purpose::STANDARD.encode(s)
            )
        };
        assert_eq!(
            admin.check_with_basic(Some(&basic("status:root-key"))),
            Ok(())
        );
        assert_eq!(admin.check_with_basic(Some(&basic(":root-key"))), Ok(()));
        assert_eq!(admin.check_with_basic(Some("Bearer root-key")), Ok(()));
        assert_eq!(
            admin.check_with_basic(Some(&basic("root-key:other"))),
            Err(AuthError::InvalidKey)
        );
        assert_eq!(
            admin.check_with_basic(Some("Basic !!!")),
            Err(AuthError::Malformed)
        );
        assert_eq!(
            admin.check(Some(&basic("status:root-key"))),
            Err(AuthError::Malformed)
        );
    }

    #[test]
    fn debug_output_never_shows_keys_or_hashes() {
        let cfg = config(true);
        let auth = Authenticator::new(&cfg);
        let hash = to_hex(&hash_key(ALICE));
        for text in [
            format!("{cfg:?}"),
            format!("{auth:?}"),
            format!("{:?}", AdminAuth::new(ALICE)),
            format!("{:?} {}", Secret::new(ALICE), Secret::new(ALICE)),
        ] {
            assert!(!text.contains(ALICE), "{text}");
            assert!(!text.contains(&hash), "{text}");
            assert!(!text.contains(&hash[..16]), "{text}");
        }
    }
}

//! `[quota_store]`: where the upstream scopes keep their quota (SPEC DQ-1..
//! DQ-5). `local` (the default) keeps it in this process; `redis` keeps it
//! in a Redis shared by every replica (and batch run) of the same account.

use std::env::VarError;
use std::time::Duration;

use serde::Deserialize;
use tollgate::quota::Unavailable;

use super::error::{ConfigError, FieldPath, Problem};
use super::raw::duration;
use super::types::GatewayConfig;

/// The default per-operation timeout.
pub const DEFAULT_STORE_TIMEOUT: Duration = Duration::from_millis(50);

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawQuotaStore {
    backend: Option<RawBackend>,
    url: Option<String>,
    url_env: Option<String>,
    prefix: Option<String>,
    timeout: Option<String>,
    on_unavailable: Option<RawOnUnavailable>,
    replicas: Option<u32>,
}

#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(rename_all = "snake_case")]
enum RawBackend {
    Local,
    Redis,
}

#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(rename_all = "snake_case")]
enum RawOnUnavailable {
    FailClosed,
    FailOpenLocal,
}

/// `[quota_store]`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum QuotaStoreConfig {
    /// In this process (the default).
    #[default]
    Local,
    /// In Redis, shared with every replica.
    Redis(RedisStoreConfig),
}

/// `[quota_store] backend = "redis"`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RedisStoreConfig {
    /// `url`: `redis://host:port[/db]` (may carry a password: prefer
    /// `url_env`).
    pub url: Option<String>,
    /// `url_env`: the environment variable holding the URL.
    pub url_env: Option<String>,
    /// `prefix` of every key (default `tollgate`).
    pub prefix: String,
    /// `timeout` of one operation (default 50 ms), clipped by each call's
    /// deadline.
    pub timeout: Duration,
    /// `on_unavailable` (+ `replicas`): `fail_closed` (default, 503 at
    /// once) or `fail_open_local` (each replica admits `limit / replicas`).
    pub on_unavailable: Unavailable,
}

impl RawQuotaStore {
    pub(super) fn convert(self) -> Result<QuotaStoreConfig, Problem> {
        let at = FieldPath::top("quota_store");
        let redis_only = [
            ("url", self.url.is_some()),
            ("url_env", self.url_env.is_some()),
            ("prefix", self.prefix.is_some()),
            ("timeout", self.timeout.is_some()),
            ("on_unavailable", self.on_unavailable.is_some()),
            ("replicas", self.replicas.is_some()),
        ];
        if matches!(self.backend, None | Some(RawBackend::Local)) {
            if let Some((field, _)) = redis_only.iter().find(|(_, set)| *set) {
                return Err(Problem::invalid(
                    &at.key(field),
                    "only applies to backend = \"redis\"",
                ));
            }
            return Ok(QuotaStoreConfig::Local);
        }
        let url = match (self.url, self.url_env) {
            (Some(_), Some(_)) => {
                return Err(Problem::invalid(
                    &at.key("url_env"),
                    "set either url or url_env, not both",
                ));
            }
            (None, None) => {
                return Err(Problem::invalid(
                    &at.key("url"),
                    "backend = \"redis\" needs url (e.g. \"redis://127.0.0.1:6379\") or url_env",
                ));
            }
            (url, url_env) => (url, url_env),
        };
        if let Some(url) = &url.0
            && !(url.starts_with("redis://")
                || url.starts_with("rediss://")
                || url.starts_with("unix://")
                || url.starts_with("redis+unix://"))
        {
            return Err(Problem::invalid(
                &at.key("url"),
                format!("{url:?} is not a Redis URL (redis://host:port[/db])"),
            ));
        }
        let prefix = self.prefix.unwrap_or_else(|| "tollgate".into());
        if prefix.trim().is_empty() || prefix.contains([':', '{', '}']) {
            return Err(Problem::invalid(
                &at.key("prefix"),
                "must be non-empty and free of `:`, `{` and `}` (keys are `{prefix:scope}:...`, \
                 one Redis Cluster hash tag per scope)",
            ));
        }
        let timeout = match &self.timeout {
            None => DEFAULT_STORE_TIMEOUT,
            Some(t) => duration(&at.key("timeout"), t)?,
        };
        if timeout.is_zero() {
            return Err(Problem::invalid(
                &at.key("timeout"),
                "must be longer than zero",
            ));
        }
        let on_unavailable = match (self.on_unavailable, self.replicas) {
            (None | Some(RawOnUnavailable::FailClosed), None) => Unavailable::FailClosed,
            (None | Some(RawOnUnavailable::FailClosed), Some(_)) => {
                return Err(Problem::invalid(
                    &at.key("replicas"),
                    "only applies to on_unavailable = \"fail_open_local\"",
                ));
            }
            (Some(RawOnUnavailable::FailOpenLocal), None) => {
                return Err(Problem::invalid(
                    &at.key("replicas"),
                    "on_unavailable = \"fail_open_local\" needs replicas, the number of \
                     processes sharing the budget (each then admits limit / replicas)",
                ));
            }
            (Some(RawOnUnavailable::FailOpenLocal), Some(0)) => {
                return Err(Problem::invalid(&at.key("replicas"), "must be at least 1"));
            }
            (Some(RawOnUnavailable::FailOpenLocal), Some(replicas)) => {
                Unavailable::FailOpenLocal { replicas }
            }
        };
        Ok(QuotaStoreConfig::Redis(RedisStoreConfig {
            url: url.0,
            url_env: url.1,
            prefix,
            timeout,
            on_unavailable,
        }))
    }
}

impl GatewayConfig {
    /// The Redis URL of `[quota_store]` (from `url`, or the variable
    /// `url_env` names), `None` for the local store.
    pub fn quota_store_url(&self) -> Result<Option<String>, ConfigError> {
        self.quota_store_url_with(|v| std::env::var(v))
    }

    pub(crate) fn quota_store_url_with(
        &self,
        lookup: impl Fn(&str) -> Result<String, VarError>,
    ) -> Result<Option<String>, ConfigError> {
        let QuotaStoreConfig::Redis(redis) = &self.quota_store else {
            return Ok(None);
        };
        if let Some(url) = &redis.url {
            return Ok(Some(url.clone()));
        }
        let Some(var) = &redis.url_env else {
            return Ok(None);
        };
        let problem = |why: &str| {
            Problem::invalid(
                &FieldPath::top("quota_store").key("url_env"),
                format!("environment variable {var} {why}"),
            )
            .into_error(&self.origin)
        };
        match lookup(var) {
            Ok(v) if v.trim().is_empty() => Err(problem("is empty")),
            Ok(v) => Ok(Some(v.trim().to_owned())),
            Err(VarError::NotPresent) => Err(problem("is not set")),
            Err(VarError::NotUnicode(_)) => Err(problem("is not valid UTF-8")),
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::config::GatewayConfig;

    const BASE: &str = r#"
[providers.p]
base_url = "http://127.0.0.1:9"
[models.m]
provider = "p"
[anonymous]
enabled = true
"#;

    fn load(extra: &str) -> Result<GatewayConfig, crate::config::ConfigError> {
        GatewayConfig::from_toml(&format!("{BASE}{extra}"), "t.toml")
    }

    // proves: DQ-3, CFG-2 (the shared store's settings are checked with
    // errors naming the field; a bad one never silently means "local")
    #[test]
    fn quota_store_settings_are_located() {
        let ok = load(
            "[quota_store]\nbackend = \"redis\"\nurl = \"redis://127.0.0.1:6379\"\n\
             on_unavailable = \"fail_open_local\"\nreplicas = 3\ntimeout = \"20ms\"\n",
        )
        .expect("valid");
        assert_eq!(
            ok.quota_store_url().unwrap().as_deref(),
            Some("redis://127.0.0.1:6379")
        );
        for (extra, field) in [
            ("[quota_store]\nbackend = \"redis\"\n", "quota_store.url"),
            ("[quota_store]\nurl = \"redis://x:1\"\n", "quota_store.url"),
            (
                "[quota_store]\nbackend = \"redis\"\nurl = \"http://x\"\n",
                "quota_store.url",
            ),
            (
                "[quota_store]\nbackend = \"redis\"\nurl = \"redis://x:1\"\non_unavailable = \"fail_open_local\"\n",
                "quota_store.replicas",
            ),
            (
                "[quota_store]\nbackend = \"redis\"\nurl = \"redis://x:1\"\ntimeout = \"0s\"\n",
                "quota_store.timeout",
            ),
            (
                "[quota_store]\nbackend = \"redis\"\nurl = \"redis://x:1\"\nprefix = \"a{b\"\n",
                "quota_store.prefix",
            ),
            (
                "[quota_store]\nbackend = \"redis\"\nurl = \"redis://x:1\"\nprefix = \"a:b\"\n",
                "quota_store.prefix",
            ),
            ("[quota_store]\nbackend = \"etcd\"\n", "quota_store.backend"),
        ] {
            let e = load(extra).expect_err(extra);
            assert_eq!(e.field(), Some(field), "{extra}: {e}");
            assert_eq!(e.file(), "t.toml");
        }
        let missing = load("[quota_store]\nbackend = \"redis\"\nurl_env = \"TG_NO_SUCH_VAR\"\n")
            .expect("valid")
            .quota_store_url_with(|_| Err(std::env::VarError::NotPresent))
            .expect_err("unset variable");
        assert_eq!(missing.field(), Some("quota_store.url_env"));
    }

    // proves: GW-9, DQ-1 (the shipped replicas example is a valid file)
    #[test]
    fn the_redis_example_loads() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../examples/tollgate-redis.toml");
        let c = GatewayConfig::load(&path).expect("examples/tollgate-redis.toml");
        let url = c
            .quota_store_url_with(|_| Ok("redis://127.0.0.1:6379".into()))
            .expect("url");
        assert_eq!(url.as_deref(), Some("redis://127.0.0.1:6379"));
    }
}

//! `[quota_store]`: where the upstream scopes keep their quota (SPEC DQ-1..
//! DQ-7). `local` (the default) keeps it in this process; `redis` keeps it
//! in a Redis shared by every replica (and batch run) of the same account:
//! a single node, or a Redis Cluster (`cluster = true`, `url` its seeds,
//! comma-separated), over TCP or TLS (`rediss://`, `ca_file`).

use std::env::VarError;
use std::path::PathBuf;
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
    cluster: Option<bool>,
    ca_file: Option<String>,
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
    /// `url`: `redis://host:port[/db]` or `rediss://` (TLS); with
    /// `cluster`, one or more seed nodes, comma-separated (may carry a
    /// password: prefer `url_env`).
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
    /// `cluster`: the URL names seed nodes of a Redis Cluster (default
    /// false: a single node).
    pub cluster: bool,
    /// `ca_file`: the PEM file of the certificate authorities a
    /// `rediss://` server's certificate is checked against (default: the
    /// system's roots); relative to the working directory.
    pub ca_file: Option<PathBuf>,
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
            ("cluster", self.cluster.is_some()),
            ("ca_file", self.ca_file.is_some()),
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
        let cluster = self.cluster.unwrap_or(false);
        if let Some(urls) = &url.0 {
            check_urls(urls, cluster).map_err(|why| Problem::invalid(&at.key("url"), why))?;
        }
        let ca_file = match self.ca_file {
            Some(f) if f.trim().is_empty() => {
                return Err(Problem::invalid(&at.key("ca_file"), "must not be empty"));
            }
            Some(f) if url.0.as_ref().is_some_and(|u| !u.contains("rediss://")) => {
                return Err(Problem::invalid(
                    &at.key("ca_file"),
                    format!("{f:?} applies to TLS only: the URL must be rediss://"),
                ));
            }
            f => f.map(PathBuf::from),
        };
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
            cluster,
            ca_file,
        }))
    }
}

/// Checks `url` (a cluster's seeds when `cluster`): every URL a Redis URL,
/// all over TLS or none, several only for a cluster.
fn check_urls(url: &str, cluster: bool) -> Result<(), String> {
    let urls: Vec<&str> = url.split(',').map(str::trim).collect();
    if urls.len() > 1 && !cluster {
        return Err(format!(
            "{url:?} lists several URLs: that is a cluster's seeds, set cluster = true"
        ));
    }
    for u in &urls {
        let scheme_ok = u.starts_with("redis://")
            || u.starts_with("rediss://")
            || (!cluster && (u.starts_with("unix://") || u.starts_with("redis+unix://")));
        if !scheme_ok {
            return Err(format!(
                "{u:?} is not a Redis URL (redis://host:port[/db], rediss:// for TLS{})",
                if cluster {
                    "; a cluster is reached over TCP"
                } else {
                    ""
                }
            ));
        }
    }
    let tls = urls.iter().filter(|u| u.starts_with("rediss://")).count();
    if tls != 0 && tls != urls.len() {
        return Err(format!("{url:?} mixes rediss:// and redis://"));
    }
    Ok(())
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

    // proves: DQ-3, DQ-7, CFG-2 (the shared store's settings are checked
    // with errors naming the field, a cluster's seeds and a CA file
    // included; a bad one never silently means "local")
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
            (
                "[quota_store]\nbackend = \"redis\"\nurl = \"redis://a:1,redis://b:1\"\n",
                "quota_store.url",
            ),
            (
                "[quota_store]\nbackend = \"redis\"\nurl = \"rediss://a:1,redis://b:1\"\ncluster = true\n",
                "quota_store.url",
            ),
            (
                "[quota_store]\nbackend = \"redis\"\nurl = \"redis://a:1\"\nca_file = \"ca.pem\"\n",
                "quota_store.ca_file",
            ),
            ("[quota_store]\ncluster = true\n", "quota_store.cluster"),
        ] {
            let e = load(extra).expect_err(extra);
            assert_eq!(e.field(), Some(field), "{extra}: {e}");
            assert_eq!(e.file(), "t.toml");
        }
        let cluster = load(
            "[quota_store]\nbackend = \"redis\"\nurl = \"rediss://a:1, rediss://b:1\"\n\
             cluster = true\nca_file = \"/etc/redis-ca.pem\"\n",
        )
        .expect("a TLS cluster");
        let crate::config::QuotaStoreConfig::Redis(redis) = &cluster.quota_store else {
            panic!("redis");
        };
        assert!(redis.cluster);
        assert_eq!(
            redis.ca_file.as_deref(),
            Some(std::path::Path::new("/etc/redis-ca.pem"))
        );
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

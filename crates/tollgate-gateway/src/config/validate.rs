//! The rules a configuration must follow (SPEC CFG-1, CFG-2, GW-9, POOL-5,
//! Q-10), checked on the typed values so that a file and a configuration
//! built in code meet the same checks. The first broken rule is reported.

use std::collections::{BTreeSet, HashMap};
use std::time::Duration;

use tollgate::config::{Algorithm, Limit};
use tollgate::quota::Dimension;

use super::deployment::DeploymentConfig;
use super::error::{FieldPath, Problem};
use super::flavor::{Flavor, is_azure_deployment};
use super::types::{
    AnonymousConfig, GatewayConfig, MODEL_PREFIX, ModelConfig, ProviderConfig, QuotaScope,
    SHORTCUTS, TENANT_PREFIX, TenantConfig,
};
use crate::auth::{ANONYMOUS_TENANT, KeyHash};

/// Most concurrency pools a gateway may hold: every model and tenant, plus
/// the anonymous pool when enabled, counts (SPEC POOL-5, GW-7).
pub const MAX_POOLS: usize = 1024;

/// Most `server.connection_threads`: each is a thread and a runtime (a few
/// file descriptors); one per core is what they are for.
pub const MAX_CONNECTION_THREADS: usize = 256;

pub(super) type Check = Result<(), Problem>;

/// A limit-like count: unset = unlimited, zero is an error (CFG-1).
fn positive(path: &FieldPath, value: Option<u64>) -> Check {
    match value {
        Some(0) => Err(Problem::invalid(
            path,
            "must be a positive integer; 0 does not mean unlimited (leave it unset for unlimited)",
        )),
        _ => Ok(()),
    }
}

/// A count that must be at least 1 (CFG-2).
fn at_least_one(path: &FieldPath, value: u64) -> Check {
    if value == 0 {
        Err(Problem::invalid(path, "must be at least 1"))
    } else {
        Ok(())
    }
}

/// A duration where zero makes no sense (CFG-2).
fn non_zero(path: &FieldPath, value: Duration) -> Check {
    if value.is_zero() {
        Err(Problem::invalid(
            path,
            "must be longer than zero, e.g. \"500ms\" or \"10s\"",
        ))
    } else {
        Ok(())
    }
}

fn non_zero_opt(path: &FieldPath, value: Option<Duration>) -> Check {
    value.map_or(Ok(()), |v| non_zero(path, v))
}

/// A finite factor of at least 1.
fn factor(path: &FieldPath, value: f64) -> Check {
    if value.is_finite() && value >= 1.0 {
        Ok(())
    } else {
        Err(Problem::invalid(path, "must be a number >= 1"))
    }
}

/// A table key: non-empty, no surrounding blanks, no control characters.
fn name(path: &FieldPath, name: &str) -> Check {
    if name.trim().is_empty() {
        return Err(Problem::invalid(path, "the name must not be empty"));
    }
    if name.trim() != name || name.chars().any(char::is_control) {
        return Err(Problem::invalid(
            path,
            "the name must not start or end with blanks or contain control characters",
        ));
    }
    Ok(())
}

/// An environment variable *name* (`[A-Za-z_][A-Za-z0-9_]*`). The value is
/// never echoed: a user may have pasted the key itself.
fn env_name(path: &FieldPath, value: Option<&str>) -> Check {
    let Some(value) = value else { return Ok(()) };
    let mut chars = value.chars();
    let valid = chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_');
    if valid {
        Ok(())
    } else {
        Err(Problem::invalid(
            path,
            "must be the name of an environment variable (letters, digits and _, not starting \
             with a digit), such as \"OPENAI_API_KEY\"; the key itself never goes in the file",
        ))
    }
}

/// An `http://` or `https://` URL with a host, without credentials, query
/// or fragment. The value is not echoed (it might carry credentials).
fn base_url(path: &FieldPath, url: &str) -> Check {
    let bad = |why: &str| Err(Problem::invalid(path, why));
    let lower = url.to_ascii_lowercase();
    let Some(rest) = lower
        .strip_prefix("https://")
        .or_else(|| lower.strip_prefix("http://"))
    else {
        return bad("must be an http:// or https:// URL, such as \"https://api.openai.com/v1\"");
    };
    if url.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return bad("must not contain spaces or control characters");
    }
    let authority = rest.split('/').next().unwrap_or_default();
    if authority.contains('@') {
        return bad("must not contain credentials; name the key's variable in api_key_env");
    }
    if rest.contains(['?', '#']) {
        return bad("must not contain a query (?) or fragment (#)");
    }
    let host = match authority.strip_prefix('[') {
        // [IPv6]:port
        Some(v6) => match v6.split_once(']') {
            Some((host, port)) => {
                if !(port.is_empty() || port.strip_prefix(':').is_some_and(is_port)) {
                    return bad("has an invalid port");
                }
                host
            }
            None => return bad("has an unclosed [ in its host"),
        },
        None => match authority.rsplit_once(':') {
            Some((host, port)) => {
                if !is_port(port) {
                    return bad("has an invalid port");
                }
                host
            }
            None => authority,
        },
    };
    if host.is_empty() {
        return bad("has no host name");
    }
    Ok(())
}

fn is_port(text: &str) -> bool {
    !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit()) && text.parse::<u16>().is_ok()
}

/// `max_waiting` / `max_wait` only make sense with `concurrency`.
fn pool_bounds(
    at: &FieldPath,
    concurrency: Option<u64>,
    max_waiting: Option<usize>,
    max_wait: Option<Duration>,
) -> Check {
    positive(&at.key("concurrency"), concurrency)?;
    non_zero_opt(&at.key("max_wait"), max_wait)?;
    if concurrency.is_none() {
        for (field, set) in [
            ("max_waiting", max_waiting.is_some()),
            ("max_wait", max_wait.is_some()),
        ] {
            if set {
                return Err(Problem::invalid(
                    &at.key(field),
                    "has no effect without concurrency (no pool, so nothing waits); \
                     set concurrency or remove it",
                ));
            }
        }
    }
    Ok(())
}

/// Names listed for an "unknown reference" message (at most ten).
fn known<'a>(names: impl Iterator<Item = &'a str>) -> String {
    let names: Vec<&str> = names.collect();
    if names.is_empty() {
        return "none is defined".to_owned();
    }
    let mut list = names
        .iter()
        .take(10)
        .map(|n| format!("{n:?}"))
        .collect::<Vec<_>>()
        .join(", ");
    if names.len() > 10 {
        list.push_str(", ...");
    }
    format!("defined: {list}")
}

impl GatewayConfig {
    /// Checks every rule; the first one broken is returned with its dotted
    /// field path.
    pub(crate) fn check(&self) -> Check {
        self.check_server()?;
        self.check_admission()?;
        self.check_retry()?;
        self.check_cooldown()?;
        if self.providers.is_empty() {
            return Err(Problem::invalid(
                &FieldPath::top("providers"),
                "at least one provider is required, e.g. [providers.openai] with a base_url",
            ));
        }
        for provider in &self.providers {
            check_provider(provider)?;
        }
        for scope in &self.scopes {
            check_scope(scope)?;
        }
        if self.models.is_empty() {
            return Err(Problem::invalid(
                &FieldPath::top("models"),
                "at least one model is required, e.g. [models.gpt-4o-mini] with a provider",
            ));
        }
        for model in &self.models {
            self.check_model(model)?;
        }
        self.check_fallback_cycles()?;
        self.check_tenants()?;
        self.check_budgets()?;
        check_anonymous(&self.anonymous)?;
        if self.tenants.is_empty() && !self.anonymous.enabled {
            return Err(Problem::invalid(
                &FieldPath::top("tenants"),
                "no tenant is configured and [anonymous] is not enabled, so no request could \
                 be served; add [tenants.<name>] with keys_sha256 or set anonymous.enabled = true",
            ));
        }
        self.check_pool_count()
    }

    /// The checks of a library configuration
    /// ([`GatewayConfig::library_from_toml`]): the gateway's rules for
    /// admission, retry, cooldown, providers and scopes, without requiring
    /// any provider, model or tenant.
    pub(crate) fn check_library(&self) -> Check {
        self.check_admission()?;
        self.check_retry()?;
        self.check_cooldown()?;
        for provider in &self.providers {
            check_provider(provider)?;
        }
        for scope in &self.scopes {
            check_scope(scope)?;
        }
        Ok(())
    }

    fn check_server(&self) -> Check {
        let at = FieldPath::top("server");
        let s = &self.server;
        positive(&at.key("max_body_bytes"), Some(s.max_body_bytes as u64))?;
        positive(&at.key("max_header_bytes"), Some(s.max_header_bytes as u64))?;
        non_zero(&at.key("header_read_timeout"), s.header_read_timeout)?;
        non_zero(&at.key("body_read_timeout"), s.body_read_timeout)?;
        non_zero(&at.key("idle_timeout"), s.idle_timeout)?;
        non_zero(&at.key("state_save_interval"), s.state_save_interval)?;
        if s.state_dir
            .as_ref()
            .is_some_and(|d| d.as_os_str().is_empty())
        {
            return Err(Problem::invalid(
                &at.key("state_dir"),
                "is empty; give a directory, or leave it unset to keep no state",
            ));
        }
        positive(&at.key("max_connections"), Some(s.max_connections as u64))?;
        positive(
            &at.key("max_connections_per_client"),
            s.max_connections_per_client.map(|n| n as u64),
        )?;
        if let Some(per_client) = s
            .max_connections_per_client
            .filter(|&n| n > s.max_connections)
        {
            return Err(Problem::invalid(
                &at.key("max_connections_per_client"),
                format!(
                    "is {per_client}, more than server.max_connections ({}); one client \
                     can never hold more than every connection (leave it unset for no \
                     per-client cap)",
                    s.max_connections
                ),
            ));
        }
        positive(
            &at.key("connection_threads"),
            s.connection_threads.map(|n| n as u64),
        )?;
        if s.connection_threads
            .is_some_and(|n| n > MAX_CONNECTION_THREADS)
        {
            return Err(Problem::invalid(
                &at.key("connection_threads"),
                format!("must be at most {MAX_CONNECTION_THREADS} (one per core is the point)"),
            ));
        }
        if s.metrics_listen == Some(s.listen) {
            return Err(Problem::invalid(
                &at.key("metrics_listen"),
                "is the same address as server.listen; leave it unset to serve /metrics \
                 there, or give another port",
            ));
        }
        env_name(&at.key("admin_key_env"), s.admin_key_env.as_deref())
    }

    fn check_admission(&self) -> Check {
        let at = FieldPath::top("admission");
        let a = &self.admission;
        at_least_one(&at.key("queue_capacity"), a.queue_capacity as u64)?;
        non_zero(&at.key("default_timeout"), a.default_timeout)?;
        non_zero(&at.key("max_timeout"), a.max_timeout)?;
        if a.max_timeout < a.default_timeout {
            return Err(Problem::invalid(
                &at.key("max_timeout"),
                format!(
                    "is {}, shorter than admission.default_timeout ({}); the cap on \
                     x-request-timeout must be at least the default (max_timeout defaults \
                     to 300s)",
                    humantime::format_duration(a.max_timeout),
                    humantime::format_duration(a.default_timeout),
                ),
            ));
        }
        non_zero_opt(&at.key("max_wait"), a.max_wait)
    }

    fn check_retry(&self) -> Check {
        let at = FieldPath::top("retry");
        let r = &self.retry;
        at_least_one(&at.key("max_attempts"), u64::from(r.max_attempts))?;
        factor(&at.key("factor"), r.factor)?;
        if !(r.jitter.is_finite() && (0.0..=1.0).contains(&r.jitter)) {
            return Err(Problem::invalid(
                &at.key("jitter"),
                "must be between 0 and 1 (a fraction of the delay)",
            ));
        }
        if r.max_delay < r.base_delay {
            return Err(Problem::invalid(
                &at.key("max_delay"),
                "must be at least retry.base_delay",
            ));
        }
        Ok(())
    }

    fn check_cooldown(&self) -> Check {
        let at = FieldPath::top("cooldown");
        let c = &self.cooldown;
        non_zero(&at.key("base"), c.base)?;
        factor(&at.key("factor"), c.factor)?;
        non_zero(&at.key("max"), c.max)?;
        if c.max < c.base {
            return Err(Problem::invalid(
                &at.key("max"),
                "must be at least cooldown.base",
            ));
        }
        Ok(())
    }

    fn check_model(&self, m: &ModelConfig) -> Check {
        let at = FieldPath::top("models").key(&m.name);
        name(&at, &m.name)?;
        if m.deployments.is_empty() {
            return Err(Problem::invalid(
                &at,
                "needs a provider, or at least one deployment",
            ));
        }
        for d in &m.deployments {
            let path = if m.listed {
                let path = at.key("deployments").key(&d.name);
                name(&path, &d.name)?;
                path
            } else {
                at.clone()
            };
            self.check_deployment(&path, d)?;
            if let Some(p) = self.provider(&d.provider)
                && p.wire.flavor == Flavor::Azure
                && !is_azure_deployment(&d.upstream_model)
            {
                return Err(Problem::invalid(
                    &path.key("upstream_model"),
                    format!(
                        "{:?} is not an Azure deployment name (letters, digits, '-', '_', '.')",
                        d.upstream_model
                    ),
                ));
            }
        }
        self.check_routes(&at, m)?;
        positive(&at.key("default_max_tokens"), Some(m.default_max_tokens))?;
        if m.default_max_tokens > crate::error::MAX_CALL_TOKENS {
            return Err(Problem::invalid(
                &at.key("default_max_tokens"),
                format!(
                    "{} is more than one call may ask for ({})",
                    m.default_max_tokens,
                    crate::error::MAX_CALL_TOKENS
                ),
            ));
        }
        let mut seen = BTreeSet::new();
        for (i, fallback) in m.fallbacks.iter().enumerate() {
            let path = at.key("fallbacks").index(i);
            if *fallback == m.name {
                return Err(Problem::invalid(
                    &path,
                    "a model cannot be its own fallback",
                ));
            }
            let Some(target) = self.model(fallback) else {
                return Err(Problem::invalid(
                    &path,
                    format!(
                        "unknown model {fallback:?} ({})",
                        known(self.models.iter().map(|m| m.name.as_str()))
                    ),
                ));
            };
            if !seen.insert(fallback.as_str()) {
                return Err(Problem::invalid(
                    &path,
                    format!("{fallback:?} is listed twice"),
                ));
            }
            let routes = self.model_routes(m);
            if !self.model_routes(target).iter().any(|r| routes.contains(r)) {
                return Err(Problem::invalid(
                    &path,
                    format!(
                        "{fallback:?} serves none of the routes {:?} serves; a fallback must \
                         serve the same route",
                        m.name
                    ),
                ));
            }
            if target.kind != m.kind {
                return Err(Problem::invalid(
                    &path,
                    format!(
                        "{fallback:?} is a {} model but {:?} is a {} model; a fallback must \
                         serve the same route",
                        target.kind.as_str(),
                        m.name,
                        m.kind.as_str()
                    ),
                ));
            }
        }
        Ok(())
    }

    /// One deployment of a model (SPEC GW-11); `at` is the model's table
    /// for a model without `deployments`.
    fn check_deployment(&self, at: &FieldPath, d: &DeploymentConfig) -> Check {
        if self.provider(&d.provider).is_none() {
            return Err(Problem::invalid(
                &at.key("provider"),
                format!(
                    "unknown provider {:?} ({})",
                    d.provider,
                    known(self.providers.iter().map(|p| p.name.as_str()))
                ),
            ));
        }
        if d.upstream_model.trim().is_empty() {
            return Err(Problem::invalid(
                &at.key("upstream_model"),
                "must not be empty (leave it unset to send the model's own name)",
            ));
        }
        if let Some(scope) = &d.scope
            && self.scope(scope).is_none()
        {
            return Err(Problem::invalid(
                &at.key("scope"),
                format!(
                    "unknown scope {scope:?} ({}); define [scopes.{scope}] or remove the \
                     setting for a private unlimited scope",
                    known(self.scopes.iter().map(|s| s.name.as_str()))
                ),
            ));
        }
        if let Some(window) = d.learn_limits {
            if let Some(scope) = &d.scope {
                return Err(Problem::invalid(
                    &at.key("learn_limits"),
                    format!(
                        "this deployment spends scope {scope:?}, whose limits it shares; set \
                             learn_limits = true on [scopes.{scope}] instead"
                    ),
                ));
            }
            non_zero(&at.key("learn_window"), window)?;
        }
        pool_bounds(at, d.concurrency, d.max_waiting, d.max_wait)?;
        at_least_one(&at.key("weight"), u64::from(d.weight))
    }

    /// Fallbacks may chain (a → b → c) but never loop (SPEC GW-10).
    fn check_fallback_cycles(&self) -> Check {
        #[derive(Clone, Copy, PartialEq)]
        enum Mark {
            New,
            OnPath,
            Done,
        }
        let index: HashMap<&str, usize> = self
            .models
            .iter()
            .enumerate()
            .map(|(i, m)| (m.name.as_str(), i))
            .collect();
        let mut marks = vec![Mark::New; self.models.len()];
        for start in 0..self.models.len() {
            if marks[start] != Mark::New {
                continue;
            }
            // Iterative depth-first search; `stack` holds (model, next
            // fallback to visit) along the current path.
            let mut stack = vec![(start, 0usize)];
            marks[start] = Mark::OnPath;
            while let Some(top) = stack.last_mut() {
                let (node, edge) = *top;
                let fallbacks = &self.models[node].fallbacks;
                if edge == fallbacks.len() {
                    marks[node] = Mark::Done;
                    stack.pop();
                    continue;
                }
                top.1 += 1;
                let Some(&target) = index.get(fallbacks[edge].as_str()) else {
                    continue;
                };
                match marks[target] {
                    Mark::Done => {}
                    Mark::New => {
                        marks[target] = Mark::OnPath;
                        stack.push((target, 0));
                    }
                    Mark::OnPath => {
                        let from = stack.iter().position(|&(n, _)| n == target).unwrap_or(0);
                        let cycle: Vec<&str> = stack[from..]
                            .iter()
                            .map(|&(n, _)| self.models[n].name.as_str())
                            .chain([self.models[target].name.as_str()])
                            .collect();
                        return Err(Problem::invalid(
                            &FieldPath::top("models")
                                .key(&self.models[node].name)
                                .key("fallbacks")
                                .index(edge),
                            format!("fallbacks form a cycle: {}", cycle.join(" -> ")),
                        ));
                    }
                }
            }
        }
        Ok(())
    }

    fn check_tenants(&self) -> Check {
        let mut owners: HashMap<KeyHash, FieldPath> = HashMap::new();
        for t in &self.tenants {
            let at = FieldPath::top("tenants").key(&t.name);
            check_tenant(&at, t)?;
            self.check_tenant_models(&at, t)?;
            for (i, hash) in t.keys_sha256.iter().enumerate() {
                let path = at.key("keys_sha256").index(i);
                if let Some(first) = owners.get(hash) {
                    return Err(Problem::invalid(
                        &path,
                        format!(
                            "the same key hash is already listed at {first}; each key must \
                             belong to exactly one tenant"
                        ),
                    ));
                }
                owners.insert(*hash, path);
            }
        }
        Ok(())
    }

    /// A tenant's `models` and `per_model` name configured models (SPEC
    /// GW-12).
    fn check_tenant_models(&self, at: &FieldPath, t: &TenantConfig) -> Check {
        let unknown = |path: &FieldPath, model: &str| {
            Problem::invalid(
                path,
                format!(
                    "unknown model {model:?} ({})",
                    known(self.models.iter().map(|m| m.name.as_str()))
                ),
            )
        };
        for (i, model) in t.models.iter().flatten().enumerate() {
            if self.model(model).is_none() {
                return Err(unknown(&at.key("models").index(i), model));
            }
        }
        for m in &t.per_model {
            let path = at.key("per_model").key(&m.model);
            if self.model(&m.model).is_none() {
                return Err(unknown(&path, &m.model));
            }
            if !t.allows(&m.model) {
                return Err(Problem::invalid(
                    &path,
                    format!(
                        "the tenant may not call {:?} (it is not in tenants.{}.models)",
                        m.model, t.name
                    ),
                ));
            }
        }
        Ok(())
    }

    fn check_pool_count(&self) -> Check {
        let anonymous = usize::from(self.anonymous.enabled);
        let deployments: usize = self.models.iter().map(|m| m.deployments.len()).sum();
        let total = deployments + self.tenants.len() + anonymous;
        if total > MAX_POOLS {
            let table = if deployments > MAX_POOLS {
                "models"
            } else {
                "tenants"
            };
            return Err(Problem::invalid(
                &FieldPath::top(table),
                format!(
                    "too many pools: {} deployments + {} tenants{} = {total}, more than the \
                     limit of {MAX_POOLS} (SPEC POOL-5)",
                    deployments,
                    self.tenants.len(),
                    if anonymous == 1 { " + anonymous" } else { "" },
                ),
            ));
        }
        Ok(())
    }
}

fn check_provider(p: &ProviderConfig) -> Check {
    let at = FieldPath::top("providers").key(&p.name);
    name(&at, &p.name)?;
    base_url(&at.key("base_url"), &p.base_url)?;
    env_name(&at.key("api_key_env"), p.api_key_env.as_deref())?;
    p.wire.check(&at)?;
    non_zero(&at.key("connect_timeout"), p.connect_timeout)?;
    non_zero(&at.key("attempt_timeout"), p.attempt_timeout)?;
    positive(
        &at.key("max_response_bytes"),
        Some(p.max_response_bytes as u64),
    )?;
    let circuit = at.key("circuit");
    at_least_one(
        &circuit.key("failure_threshold"),
        u64::from(p.circuit.failure_threshold),
    )?;
    non_zero(&circuit.key("recovery_time"), p.circuit.recovery_time)?;
    at_least_one(
        &circuit.key("half_open_calls"),
        u64::from(p.circuit.half_open_calls),
    )
}

fn check_scope(s: &QuotaScope) -> Check {
    let at = FieldPath::top("scopes").key(&s.name);
    name(&at, &s.name)?;
    for prefix in [MODEL_PREFIX, TENANT_PREFIX] {
        if s.name.starts_with(prefix) {
            return Err(Problem::invalid(
                &at,
                format!("scope names starting with {prefix:?} are reserved for the gateway"),
            ));
        }
    }
    if let Algorithm::TokenBucket { burst } = s.algorithm {
        non_zero_opt(&at.key("burst"), burst)?;
    }
    let seen = check_limits(&at, [s.rpm, s.tpm, s.itpm, s.otpm], &s.limits)?;
    if let Some(window) = s.learn_limits {
        non_zero(&at.key("learn_window"), window)?;
        let requests = seen.iter().any(|(d, _, _)| *d == Dimension::Requests);
        let tokens = seen.iter().any(|(d, _, _)| *d == Dimension::Tokens);
        if requests && tokens {
            return Err(Problem::invalid(
                &at.key("learn_limits"),
                "learns only the limits the scope leaves out, but this scope sets both a \
                 request and a token limit; remove learn_limits, or the limits to learn",
            ));
        }
    }
    if s.queue_capacity == Some(0) {
        return Err(Problem::invalid(
            &at.key("queue_capacity"),
            "must be at least 1 (leave it unset to use admission.queue_capacity)",
        ));
    }
    Ok(())
}

/// The `rpm` / `tpm` / `itpm` / `otpm` shortcuts (in that order) and a
/// `limits` array (a scope's, a tenant's): positive amounts, windows longer
/// than zero, no (dimension, window) twice. Returns every limit's
/// dimension, window and path.
fn check_limits(
    at: &FieldPath,
    shortcuts: [Option<u64>; 4],
    limits: &[Limit],
) -> Result<Vec<(Dimension, Duration, FieldPath)>, Problem> {
    // (dimension, window) → where it was first set, to catch repeats; a
    // calendar window differs from a rolling one of its nominal length.
    let mut seen: Vec<(Limit, FieldPath)> = Vec::new();
    let minute = Duration::from_secs(60);
    for ((key, dimension), amount) in SHORTCUTS.into_iter().zip(shortcuts) {
        positive(&at.key(key), amount)?;
        if let Some(amount) = amount {
            seen.push((Limit::new(dimension, amount, minute), at.key(key)));
        }
    }
    for (i, limit) in limits.iter().enumerate() {
        let entry = at.key("limits").index(i);
        positive(
            &entry.key(super::prices::limit_key(limit.dimension)),
            Some(limit.amount),
        )?;
        non_zero(&entry.key("per"), limit.window)?;
        if let Some((_, first)) = seen.iter().find(|(l, _)| {
            l.dimension == limit.dimension
                && l.window == limit.window
                && l.calendar == limit.calendar
        }) {
            return Err(Problem::invalid(
                &entry,
                format!(
                    "repeats the {} limit per {} already set at {first}; keep one",
                    super::prices::limit_key(limit.dimension),
                    limit.window_label(),
                ),
            ));
        }
        seen.push((*limit, entry));
    }
    Ok(seen
        .into_iter()
        .map(|(l, path)| (l.dimension, l.window, path))
        .collect())
}

fn check_tenant(at: &FieldPath, t: &TenantConfig) -> Check {
    name(at, &t.name)?;
    if t.name == ANONYMOUS_TENANT {
        return Err(Problem::invalid(
            at,
            "the tenant name \"anonymous\" is reserved for unauthenticated traffic; \
             configure it under [anonymous]",
        ));
    }
    if t.keys_sha256.is_empty() {
        return Err(Problem::invalid(
            &at.key("keys_sha256"),
            "must list at least one key hash (print one with `tollgate hash-key`)",
        ));
    }
    pool_bounds(at, t.concurrency, t.max_waiting, t.max_wait)?;
    check_limits(at, [t.rpm, t.tpm, t.itpm, t.otpm], &t.limits)?;
    for m in &t.per_model {
        check_limits(
            &at.key("per_model").key(&m.model),
            [m.rpm, m.tpm, m.itpm, m.otpm],
            &m.limits,
        )?;
    }
    Ok(())
}

fn check_anonymous(a: &AnonymousConfig) -> Check {
    pool_bounds(
        &FieldPath::top("anonymous"),
        a.concurrency,
        a.max_waiting,
        a.max_wait,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base_urls() {
        let p = FieldPath::top("u");
        for ok in [
            "http://127.0.0.1:8080/v1",
            "https://api.openai.com/v1",
            "HTTPS://example.com",
            "http://[::1]:9000/v1",
            "http://localhost",
        ] {
            assert_eq!(base_url(&p, ok), Ok(()), "{ok}");
        }
        for bad in [
            "api.openai.com/v1",
            "ftp://example.com",
            "http://",
            "http:///v1",
            "http://host:port/v1",
            "http://host:99999",
            "https://user:pw@example.com/v1",
            "http://example.com/v1?x=1",
            "http://exa mple.com",
            "http://[::1/v1",
        ] {
            assert!(base_url(&p, bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn env_var_names() {
        let p = FieldPath::top("e");
        assert_eq!(env_name(&p, Some("OPENAI_API_KEY")), Ok(()));
        assert_eq!(env_name(&p, Some("_x1")), Ok(()));
        let e = env_name(&p, Some("sk-proj-abc123")).unwrap_err();
        assert!(!e.reason.contains("sk-proj"));
        assert!(env_name(&p, Some("")).is_err());
        assert!(env_name(&p, Some("1ABC")).is_err());
    }
}

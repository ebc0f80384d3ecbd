//! Reading, parsing and validating a configuration file (SPEC GW-9, CFG-3).

use std::env::VarError;
use std::ops::Range;
use std::path::Path;

use toml::de::DeTable;

use super::error::{ConfigError, ConfigErrorKind, FieldPath, Problem, line_column};
use super::locate::{path_at, span_of};
use super::raw::RawConfig;
use super::types::{GatewayConfig, ProviderConfig};
use crate::auth::Secret;

/// The gateway-only tables a library configuration may not hold.
const LIBRARY_REFUSED: [&str; 4] = ["server", "models", "tenants", "anonymous"];

/// Reads `path` as UTF-8 text; returns it with the origin errors name.
fn read_text(path: &Path) -> Result<(String, String), ConfigError> {
    let origin = path.display().to_string();
    let fail = |kind, reason: String| ConfigError {
        kind,
        file: origin.clone(),
        field: None,
        reason,
        line: None,
        column: None,
    };
    let bytes = std::fs::read(path).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => fail(
            ConfigErrorKind::NotFound,
            "no such file (check the path given to --config)".to_owned(),
        ),
        _ => fail(
            ConfigErrorKind::Unreadable,
            format!("cannot read the file: {e}"),
        ),
    })?;
    let text = String::from_utf8(bytes).map_err(|e| {
        let at = e.utf8_error().valid_up_to();
        fail(
            ConfigErrorKind::Unreadable,
            format!("is not UTF-8 text (invalid byte at offset {at})"),
        )
    })?;
    Ok((text, origin))
}

impl GatewayConfig {
    /// Reads, parses and validates the TOML file at `path`. Errors name the
    /// file as given, the setting and the reason; a missing file, an
    /// unreadable one and bad TOML have their own [`ConfigErrorKind`].
    pub fn load(path: &Path) -> Result<GatewayConfig, ConfigError> {
        let (text, origin) = read_text(path)?;
        Self::from_toml(&text, &origin)
    }

    /// Reads and validates the library's part of a configuration file at
    /// `path`: see [`library_from_toml`](Self::library_from_toml).
    pub fn load_library(path: &Path) -> Result<GatewayConfig, ConfigError> {
        let (text, origin) = read_text(path)?;
        Self::library_from_toml(&text, &origin)
    }

    /// Parses TOML `text` as the gateway does, with the same syntax and
    /// located errors, for a program that embeds the engine (the Python
    /// package): `[scopes.*]`, `[admission]`, `[retry]`, `[cooldown]`,
    /// `[providers.*]` and `[quota_store]` are checked by the gateway's
    /// rules, but no provider, model or tenant is required, and the
    /// gateway-only tables (`[server]`, `[models.*]`, `[tenants.*]`,
    /// `[anonymous]`) are refused, so a gateway file is not mistaken for
    /// one whose routes would apply.
    pub fn library_from_toml(text: &str, origin: &str) -> Result<GatewayConfig, ConfigError> {
        Self::parse(text, origin, &LIBRARY_REFUSED, GatewayConfig::check_library)
    }

    /// Parses and validates TOML `text`; `origin` stands for the file in
    /// errors (e.g. `<stdin>`).
    pub fn from_toml(text: &str, origin: &str) -> Result<GatewayConfig, ConfigError> {
        Self::parse(text, origin, &[], GatewayConfig::check)
    }

    /// Parses `text`, refuses the top-level tables in `refused`, converts
    /// and runs `check`; every error located in the text.
    fn parse(
        text: &str,
        origin: &str,
        refused: &[&str],
        check: fn(&GatewayConfig) -> super::validate::Check,
    ) -> Result<GatewayConfig, ConfigError> {
        // The untyped parse catches grammar errors (with their position) and
        // keeps every key's and value's span for locating later errors.
        let document = DeTable::parse(text).map_err(|e| {
            let reason = format!("invalid TOML: {}", e.message().trim());
            locate_span(
                origin,
                text,
                ConfigErrorKind::Syntax,
                None,
                reason,
                e.span(),
            )
        })?;
        let root = document.get_ref();
        if let Some(table) = refused.iter().find(|t| root.contains_key(**t)) {
            let problem = Problem::invalid(
                &FieldPath::top(table),
                "belongs to the gateway's configuration and does not apply here",
            );
            return Err(locate_problem(origin, text, root, problem));
        }
        let raw: RawConfig = toml::from_str(text).map_err(|e| {
            let path = e.span().and_then(|s| path_at(root, s.start));
            let reason = plain_types(e.message().trim());
            locate_span(
                origin,
                text,
                ConfigErrorKind::Schema,
                path,
                reason,
                e.span(),
            )
        })?;
        let locate = |p: Problem| locate_problem(origin, text, root, p);
        let config = raw.into_config(origin).map_err(locate)?;
        check(&config).map_err(locate)?;
        Ok(config)
    }

    /// Checks every rule on this configuration, e.g. after changing it in
    /// code. Errors name [`origin`](Self::origin) as the file, without a
    /// position.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.check().map_err(|p| p.into_error(&self.origin))
    }

    /// The upstream key of `provider`, read from the environment variable
    /// its `api_key_env` names: `None` without that setting; an error naming
    /// the setting when the variable is unset, empty or not UTF-8.
    pub fn provider_api_key(
        &self,
        provider: &ProviderConfig,
    ) -> Result<Option<Secret>, ConfigError> {
        self.provider_api_key_with(provider, |v| std::env::var(v))
    }

    /// The admin key of `/admin/snapshot`, from the variable
    /// `server.admin_key_env` names (`None` without that setting).
    pub fn admin_key(&self) -> Result<Option<Secret>, ConfigError> {
        self.admin_key_with(|v| std::env::var(v))
    }

    pub(crate) fn provider_api_key_with(
        &self,
        provider: &ProviderConfig,
        lookup: impl Fn(&str) -> Result<String, VarError>,
    ) -> Result<Option<Secret>, ConfigError> {
        let path = FieldPath::top("providers")
            .key(&provider.name)
            .key("api_key_env");
        self.env_secret(path, provider.api_key_env.as_deref(), lookup)
    }

    pub(crate) fn admin_key_with(
        &self,
        lookup: impl Fn(&str) -> Result<String, VarError>,
    ) -> Result<Option<Secret>, ConfigError> {
        let path = FieldPath::top("server").key("admin_key_env");
        self.env_secret(path, self.server.admin_key_env.as_deref(), lookup)
    }

    fn env_secret(
        &self,
        path: FieldPath,
        var: Option<&str>,
        lookup: impl Fn(&str) -> Result<String, VarError>,
    ) -> Result<Option<Secret>, ConfigError> {
        let Some(var) = var else { return Ok(None) };
        let problem = |why: &str| {
            Problem::invalid(&path, format!("environment variable {var} {why}"))
                .into_error(&self.origin)
        };
        match lookup(var) {
            Ok(value) if value.trim().is_empty() => Err(problem("is empty")),
            Ok(value) => Ok(Some(Secret::new(value.trim()))),
            Err(VarError::NotPresent) => Err(problem("is not set")),
            Err(VarError::NotUnicode(_)) => Err(problem("is not valid UTF-8")),
        }
    }
}

/// serde's messages name Rust types; say what to write instead.
fn plain_types(message: &str) -> String {
    let mut out = message.to_owned();
    for (rust, plain) in [
        ("expected usize", "expected a non-negative integer"),
        ("expected u64", "expected a non-negative integer"),
        ("expected u32", "expected an integer from 0 to 4294967295"),
        ("expected f64", "expected a number"),
    ] {
        out = out.replace(rust, plain);
    }
    out
}

/// An error at byte range `span` of `text` (if known).
fn locate_span(
    origin: &str,
    text: &str,
    kind: ConfigErrorKind,
    path: Option<FieldPath>,
    reason: String,
    span: Option<Range<usize>>,
) -> ConfigError {
    let problem = Problem {
        kind,
        path,
        reason,
        span,
    };
    with_position(problem.span.clone(), text, problem.into_error(origin))
}

/// A rule broken at a setting, placed where the setting is written.
fn locate_problem(origin: &str, text: &str, root: &DeTable<'_>, problem: Problem) -> ConfigError {
    let span = problem
        .span
        .clone()
        .or_else(|| problem.path.as_ref().and_then(|p| span_of(root, p)));
    with_position(span, text, problem.into_error(origin))
}

fn with_position(span: Option<Range<usize>>, text: &str, mut error: ConfigError) -> ConfigError {
    if let Some(span) = span {
        let (line, column) = line_column(text, span.start);
        error.line = Some(line);
        error.column = Some(column);
    }
    error
}

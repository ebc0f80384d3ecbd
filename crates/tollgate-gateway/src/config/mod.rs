//! The gateway's configuration: one TOML file, validated at start with
//! errors naming the file, the setting and the reason (SPEC GW-9, CFG-1..3).
//!
//! [`GatewayConfig::load`] reads a file, [`GatewayConfig::from_toml`] a
//! string, [`GatewayConfig::embedded`] builds the built-in default. The
//! result holds typed values (durations, addresses, enums, key hashes) and
//! converts into the engine's own settings ([`QuotaScope::to_scope_config`],
//! [`GatewayConfig::controller_config`], [`ModelConfig::pool_config`], ...),
//! so nothing is parsed twice. `examples/tollgate.toml` at the repository
//! root documents every option.
//!
//! Every table denies unknown fields, so a misspelt setting is an error, not
//! a silently ignored line. A limit is unset (unlimited) or positive; zero is
//! an error, never "unlimited" (CFG-1).

mod deployment;
mod embedded;
mod error;
mod flavor;
mod load;
mod locate;
mod prices;
mod quota_store;
mod raw;
mod telemetry;
mod types;
mod validate;

#[cfg(test)]
mod calendar_tests;
#[cfg(test)]
mod flavor_tests;
#[cfg(test)]
mod library_tests;
#[cfg(test)]
mod policy_tests;
#[cfg(test)]
mod prices_tests;
#[cfg(test)]
mod state_tests;
#[cfg(test)]
mod telemetry_tests;
#[cfg(test)]
mod tests;

pub use deployment::DeploymentConfig;
pub use embedded::EMBEDDED_ORIGIN;
pub use error::{ConfigError, ConfigErrorKind};
pub use flavor::{ANTHROPIC_VERSION, ApiRoute, Flavor, ProviderWire};
pub use prices::{MAX_BUDGET_USD, PriceOverride};
pub use quota_store::{DEFAULT_STORE_TIMEOUT, QuotaStoreConfig, RedisStoreConfig};
pub use telemetry::{
    DEFAULT_BATCH_SIZE, DEFAULT_EXPORT_TIMEOUT, DEFAULT_QUEUE_SIZE, DEFAULT_SCHEDULE_DELAY,
    OtlpProtocol, TelemetryConfig, check_endpoint,
};
pub use types::{
    AdmissionConfig, AnonymousConfig, DEFAULT_MAX_TOKENS, GatewayConfig, LogFormat, MAX_WEIGHT,
    MODEL_PREFIX, ModelConfig, ModelKind, ProviderConfig, QuotaScope, ServerConfig, TENANT_PREFIX,
    TenantConfig, TenantModelLimits,
};
pub use validate::MAX_POOLS;

//! The simulator's configuration and its validation (CFG-1, CFG-2).

use std::time::Duration;

use crate::accounting::{ChargeMode, IngressDelay, MAX_INGRESS_DELAY, RefusalCharge};

/// Everything the simulated provider can be told.
///
/// Limits are `None` (unlimited) or a positive number; zero is a
/// configuration error, never "unlimited" (CFG-1). Build one with
/// [`SimConfig::default`] and the struct-update syntax, then hand it to
/// [`crate::Simulator::new`], which validates it.
#[derive(Debug, Clone, PartialEq)]
pub struct SimConfig {
    /// Requests admitted per `window` (the "RPM" limit when the window is a
    /// minute). `None` = unlimited.
    pub rpm: Option<u64>,
    /// Tokens (prompt + completion) charged per `window`. `None` = unlimited.
    pub tpm: Option<u64>,
    /// Requests in progress at once (a stream counts until it ends).
    /// `None` = unlimited.
    pub max_concurrency: Option<u64>,
    /// Length of the sliding window both limits are enforced over. Must be
    /// greater than zero.
    pub window: Duration,
    /// Delay before the first stream chunk, or before a one-shot body.
    pub ttft: Duration,
    /// Delay before each content chunk of a stream; added once per
    /// completion token to a one-shot response.
    pub per_token: Duration,
    /// Completion length the simulator generates when the request allows it;
    /// the actual length is `min(max_completion_tokens or max_tokens, this)`.
    /// Must be at least 1.
    pub completion_tokens: u32,
    /// Length of the embedding vectors when the request does not ask for
    /// `dimensions`. Must be at least 1.
    pub embedding_dim: u32,
    /// Seed of the fault generator; the same seed and the same sequence of
    /// requests give the same faults.
    pub seed: u64,
    /// Probability in `[0, 1]` that an admitted request fails with 500/503.
    pub error_rate: f64,
    /// Probability in `[0, 1]` that a stream is cut mid-way without `[DONE]`.
    pub disconnect_rate: f64,
    /// Probability in `[0, 1]` that response headers are delayed by
    /// `slow_headers_delay`.
    pub slow_headers_rate: f64,
    /// How long a "slow headers" fault holds the headers back.
    pub slow_headers_delay: Duration,
    /// When set, `/v1/*` routes demand `Authorization: Bearer <key>` and answer
    /// 401 otherwise.
    pub require_key: Option<String>,
    /// Model ids listed by `GET /v1/models` (requests may name any model).
    pub models: Vec<String>,
    /// Delay between receiving an API request and counting it against the
    /// windows, drawn per request (seeded by `seed` and the sequence
    /// number). Zero by default: counted on receipt.
    pub ingress_delay: IngressDelay,
    /// What the token window charges a request at its counting instant.
    pub charge: ChargeMode,
    /// When set, the token charge of an admitted request is replaced, in the
    /// same window entry, by its billing usage once its response completes.
    pub reconcile: bool,
    /// What a request refused with 429 still costs in the windows.
    pub charge_refusals: RefusalCharge,
    /// Requests per window spent by a background consumer of the same
    /// account (another client tollgate cannot see). `None` = no consumer.
    pub background_rpm: Option<u64>,
    /// Tokens per window spent by the background consumer, spread over its
    /// `background_rpm` requests. Requires `background_rpm`.
    pub background_tpm: Option<u64>,
    /// When set, the Azure routes (`/openai/deployments/{deployment}/...`)
    /// demand this key in the `api-key` header and refuse any request that
    /// carries an `Authorization` header, with Azure's 401 body.
    pub azure_key: Option<String>,
    /// When set, `POST /v1/messages` demands this key in the `x-api-key`
    /// header, with Anthropic's 401 body otherwise.
    pub anthropic_key: Option<String>,
    /// Requests per `window` on `POST /v1/messages`, as a continuously
    /// replenished bucket (Anthropic's model). `None` = unlimited.
    pub anthropic_rpm: Option<u64>,
    /// Input tokens per `window` on `POST /v1/messages` (ITPM), a
    /// continuously replenished bucket. `None` = unlimited.
    pub itpm: Option<u64>,
    /// Output tokens per `window` on `POST /v1/messages` (OTPM), a
    /// continuously replenished bucket: admission takes `max_tokens`, the
    /// unused part is given back when the response ends. `None` = unlimited.
    pub otpm: Option<u64>,
}

impl Default for SimConfig {
    fn default() -> Self {
        Self {
            rpm: None,
            tpm: None,
            max_concurrency: None,
            window: Duration::from_secs(60),
            ttft: Duration::ZERO,
            per_token: Duration::ZERO,
            completion_tokens: 16,
            embedding_dim: 8,
            seed: 0,
            error_rate: 0.0,
            disconnect_rate: 0.0,
            slow_headers_rate: 0.0,
            slow_headers_delay: Duration::from_secs(5),
            require_key: None,
            models: default_models(),
            ingress_delay: IngressDelay::default(),
            charge: ChargeMode::default(),
            reconcile: false,
            charge_refusals: RefusalCharge::default(),
            background_rpm: None,
            background_tpm: None,
            azure_key: None,
            anthropic_key: None,
            anthropic_rpm: None,
            itpm: None,
            otpm: None,
        }
    }
}

/// The longest window accepted (366 days).
pub const MAX_WINDOW: Duration = Duration::from_secs(366 * 24 * 3600);

/// The model ids `GET /v1/models` lists by default.
pub fn default_models() -> Vec<String> {
    vec!["sim-chat".to_owned(), "sim-embedding".to_owned()]
}

/// A configuration value the simulator refuses, with the field it belongs to.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ConfigError {
    /// A limit was set to zero; leave it unset for "unlimited".
    #[error("simulator config: `{field}` must be a positive number or unset (unlimited), got 0")]
    ZeroLimit {
        /// The offending field.
        field: &'static str,
    },
    /// A duration or size that must be positive was zero.
    #[error("simulator config: `{field}` must be greater than zero")]
    MustBePositive {
        /// The offending field.
        field: &'static str,
    },
    /// A probability outside `[0, 1]` (or NaN).
    #[error("simulator config: `{field}` must be a probability in [0, 1], got {value}")]
    NotAProbability {
        /// The offending field.
        field: &'static str,
        /// The value given.
        value: f64,
    },
    /// A window longer than a year.
    #[error("simulator config: `{field}` must be at most 366 days")]
    TooLong {
        /// The offending field.
        field: &'static str,
    },
    /// A value that is invalid for the reason given.
    #[error("simulator config: `{field}` {reason}")]
    Invalid {
        /// The offending field.
        field: &'static str,
        /// Why it is refused.
        reason: &'static str,
    },
    /// `require_key` was set to an empty or non-printable string.
    #[error("simulator config: `require_key` must be a non-empty printable ASCII string")]
    BadKey,
}

impl SimConfig {
    /// Checks every field; the first invalid one is reported with its name.
    pub fn validate(&self) -> Result<(), ConfigError> {
        for (field, limit) in [
            ("rpm", self.rpm),
            ("tpm", self.tpm),
            ("max_concurrency", self.max_concurrency),
            ("background_rpm", self.background_rpm),
            ("background_tpm", self.background_tpm),
            ("anthropic_rpm", self.anthropic_rpm),
            ("itpm", self.itpm),
            ("otpm", self.otpm),
        ] {
            if limit == Some(0) {
                return Err(ConfigError::ZeroLimit { field });
            }
        }
        if self.window.is_zero() {
            return Err(ConfigError::MustBePositive { field: "window" });
        }
        if self.window > MAX_WINDOW {
            return Err(ConfigError::TooLong { field: "window" });
        }
        if self.completion_tokens == 0 {
            return Err(ConfigError::MustBePositive {
                field: "completion_tokens",
            });
        }
        if self.embedding_dim == 0 {
            return Err(ConfigError::MustBePositive {
                field: "embedding_dim",
            });
        }
        for (field, value) in [
            ("error_rate", self.error_rate),
            ("disconnect_rate", self.disconnect_rate),
            ("slow_headers_rate", self.slow_headers_rate),
        ] {
            // Written so that NaN fails too.
            if !(0.0..=1.0).contains(&value) {
                return Err(ConfigError::NotAProbability { field, value });
            }
        }
        if let Some(key) = &self.require_key
            && (key.is_empty() || !key.bytes().all(|b| b.is_ascii_graphic()))
        {
            return Err(ConfigError::BadKey);
        }
        for (field, key) in [
            ("azure_key", &self.azure_key),
            ("anthropic_key", &self.anthropic_key),
        ] {
            if let Some(key) = key
                && (key.is_empty() || !key.bytes().all(|b| b.is_ascii_graphic()))
            {
                return Err(ConfigError::Invalid {
                    field,
                    reason: "must be a non-empty printable ASCII string",
                });
            }
        }
        self.validate_accounting()
    }

    /// The ingress delay, charge mode and background consumer (CFG-1/2).
    fn validate_accounting(&self) -> Result<(), ConfigError> {
        let invalid = |field, reason| Err(ConfigError::Invalid { field, reason });
        if self.ingress_delay.min > self.ingress_delay.max {
            return invalid("ingress_delay", "must be MIN..MAX with MIN <= MAX");
        }
        if self.ingress_delay.max > MAX_INGRESS_DELAY {
            return invalid("ingress_delay", "must be at most 1h");
        }
        if let ChargeMode::Chars {
            chars_per_token: 0, ..
        } = self.charge
        {
            return invalid(
                "charge",
                "must count at least 1 character per token (chars:N, N >= 1)",
            );
        }
        if self.background_tpm.is_some() && self.background_rpm.is_none() {
            return invalid(
                "background_tpm",
                "needs `background_rpm` (the consumer spends its tokens over its requests)",
            );
        }
        if let (Some(spent), Some(limit)) = (self.background_rpm, self.rpm)
            && spent > limit
        {
            return invalid("background_rpm", "must be at most `rpm`");
        }
        if let (Some(spent), Some(limit)) = (self.background_tpm, self.tpm)
            && spent > limit
        {
            return invalid("background_tpm", "must be at most `tpm`");
        }
        if let Some(n) = self.background_rpm
            && self.window.as_nanos() / u128::from(n) < 1_000_000
        {
            return invalid(
                "background_rpm",
                "must leave at least 1ms between the consumer's requests (window / background_rpm)",
            );
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // proves: CFG-1
    #[test]
    fn zero_limits_are_errors_naming_the_field() {
        for (field, cfg) in [
            (
                "rpm",
                SimConfig {
                    rpm: Some(0),
                    ..SimConfig::default()
                },
            ),
            (
                "tpm",
                SimConfig {
                    tpm: Some(0),
                    ..SimConfig::default()
                },
            ),
            (
                "max_concurrency",
                SimConfig {
                    max_concurrency: Some(0),
                    ..SimConfig::default()
                },
            ),
        ] {
            let err = cfg.validate().expect_err(field);
            assert_eq!(err, ConfigError::ZeroLimit { field });
            assert!(err.to_string().contains(field));
        }
        assert_eq!(SimConfig::default().validate(), Ok(()));
    }

    // proves: CFG-2
    #[test]
    fn zero_window_and_bad_rates_are_errors() {
        let cfg = SimConfig {
            window: Duration::ZERO,
            ..SimConfig::default()
        };
        assert_eq!(
            cfg.validate(),
            Err(ConfigError::MustBePositive { field: "window" })
        );
        for value in [-0.1, 1.5, f64::NAN] {
            let cfg = SimConfig {
                disconnect_rate: value,
                ..SimConfig::default()
            };
            assert!(matches!(
                cfg.validate(),
                Err(ConfigError::NotAProbability {
                    field: "disconnect_rate",
                    ..
                })
            ));
        }
        let cfg = SimConfig {
            require_key: Some("has space".into()),
            ..SimConfig::default()
        };
        assert_eq!(cfg.validate(), Err(ConfigError::BadKey));
        for (field, cfg) in [
            (
                "azure_key",
                SimConfig {
                    azure_key: Some(String::new()),
                    ..SimConfig::default()
                },
            ),
            (
                "anthropic_key",
                SimConfig {
                    anthropic_key: Some("a b".into()),
                    ..SimConfig::default()
                },
            ),
        ] {
            assert!(
                matches!(cfg.validate(), Err(ConfigError::Invalid { field: f, .. }) if f == field),
                "{field}"
            );
        }
    }

    // proves: CFG-1 (the Anthropic limits refuse zero like the others)
    #[test]
    fn zero_anthropic_limits_are_errors() {
        for (field, cfg) in [
            (
                "anthropic_rpm",
                SimConfig {
                    anthropic_rpm: Some(0),
                    ..SimConfig::default()
                },
            ),
            (
                "itpm",
                SimConfig {
                    itpm: Some(0),
                    ..SimConfig::default()
                },
            ),
            (
                "otpm",
                SimConfig {
                    otpm: Some(0),
                    ..SimConfig::default()
                },
            ),
        ] {
            assert_eq!(cfg.validate(), Err(ConfigError::ZeroLimit { field }));
        }
    }

    // proves: CFG-1, CFG-2 (accounting knobs: each bad value names its field)
    #[test]
    fn bad_accounting_knobs_name_their_field() {
        let field = |cfg: SimConfig| match cfg.validate() {
            Err(ConfigError::Invalid { field, .. } | ConfigError::ZeroLimit { field }) => field,
            other => panic!("unexpected {other:?}"),
        };
        let ms = Duration::from_millis;
        let base = SimConfig {
            rpm: Some(60),
            tpm: Some(1_000),
            ..SimConfig::default()
        };
        let cases = [
            (
                SimConfig {
                    ingress_delay: IngressDelay::range(ms(300), ms(20)),
                    ..base.clone()
                },
                "ingress_delay",
            ),
            (
                SimConfig {
                    ingress_delay: IngressDelay::fixed(Duration::from_secs(3601)),
                    ..base.clone()
                },
                "ingress_delay",
            ),
            (
                SimConfig {
                    charge: ChargeMode::Chars {
                        chars_per_token: 0,
                        output: true,
                    },
                    ..base.clone()
                },
                "charge",
            ),
            (
                SimConfig {
                    background_rpm: Some(0),
                    ..base.clone()
                },
                "background_rpm",
            ),
            (
                SimConfig {
                    background_rpm: Some(61),
                    ..base.clone()
                },
                "background_rpm",
            ),
            (
                SimConfig {
                    background_rpm: Some(10),
                    background_tpm: Some(1_001),
                    ..base.clone()
                },
                "background_tpm",
            ),
            (
                SimConfig {
                    background_tpm: Some(10),
                    ..base.clone()
                },
                "background_tpm",
            ),
            (
                SimConfig {
                    rpm: None,
                    window: ms(100),
                    background_rpm: Some(101),
                    ..base.clone()
                },
                "background_rpm",
            ),
        ];
        for (cfg, want) in cases {
            assert_eq!(field(cfg), want);
        }
        let fine = SimConfig {
            ingress_delay: IngressDelay::range(ms(20), ms(300)),
            background_rpm: Some(60),
            background_tpm: Some(1_000),
            reconcile: true,
            charge_refusals: RefusalCharge::All,
            ..base
        };
        assert_eq!(fine.validate(), Ok(()));
    }
}

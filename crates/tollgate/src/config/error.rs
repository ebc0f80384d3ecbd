//! Configuration errors (SPEC CFG-1..CFG-3).

use std::fmt;

/// An invalid setting, found before any provider work (SPEC CFG-3).
///
/// `field` is the dotted path of the offending setting, e.g.
/// `scopes.openai.limits[1].amount`; front ends that load a file prefix it
/// with the file name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid configuration: {field}: {reason}")]
pub struct ConfigError {
    /// The offending setting.
    pub field: String,
    /// Why it is invalid.
    pub reason: String,
}

impl ConfigError {
    /// A new error for `field`.
    pub fn new(field: impl fmt::Display, reason: impl fmt::Display) -> Self {
        ConfigError {
            field: field.to_string(),
            reason: reason.to_string(),
        }
    }

    /// Prefixes the field path, e.g. with the section it was found in.
    pub fn within(mut self, prefix: impl fmt::Display) -> Self {
        self.field = format!("{prefix}.{}", self.field);
        self
    }
}

/// Checks a limit that must be positive when set (SPEC CFG-1).
pub(crate) fn positive(field: &str, value: u64) -> Result<u64, ConfigError> {
    if value == 0 {
        Err(ConfigError::new(
            field,
            "must be a positive integer (leave it unset for unlimited)",
        ))
    } else {
        Ok(value)
    }
}

/// Checks a duration that must be longer than zero (SPEC CFG-2).
pub(crate) fn non_zero(field: &str, value: std::time::Duration) -> Result<(), ConfigError> {
    if value.is_zero() {
        Err(ConfigError::new(field, "must be longer than zero"))
    } else {
        Ok(())
    }
}

//! Admission controller settings (SPEC ADM-5, ADM-7, Q-11).

use std::collections::HashSet;
use std::time::Duration;

use super::error::{ConfigError, non_zero, positive};
use super::quota::ScopeConfig;

/// What a producer meets when its scope's waiting queue is full (SPEC ADM-5).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Overflow {
    /// Wait for a queue slot, under the call's deadline (library and batch
    /// runner default).
    #[default]
    Wait,
    /// Fail at once with `QueueFull` (gateway default, surfaced as HTTP 429).
    Reject,
}

impl Overflow {
    /// `wait` or `reject`.
    pub const fn as_str(self) -> &'static str {
        match self {
            Overflow::Wait => "wait",
            Overflow::Reject => "reject",
        }
    }
}

/// Everything an [`AdmissionController`](crate::AdmissionController) needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ControllerConfig {
    /// Quota scopes; an empty list means one unlimited scope named `default`.
    pub scopes: Vec<ScopeConfig>,
    /// Waiting calls per scope (ADM-5); at least 1.
    pub queue_capacity: usize,
    /// Full-queue behaviour.
    pub overflow: Overflow,
    /// Active calls per controller (ADM-7); `None` = unlimited.
    pub concurrency: Option<u64>,
    /// Longest quota wait accepted before failing early with
    /// `QuotaWaitTooLong`; `None` = only the deadline bounds it.
    pub max_wait: Option<Duration>,
}

impl Default for ControllerConfig {
    fn default() -> Self {
        ControllerConfig {
            scopes: Vec::new(),
            queue_capacity: 1024,
            overflow: Overflow::Wait,
            concurrency: None,
            max_wait: None,
        }
    }
}

impl ControllerConfig {
    /// Checks every field (SPEC CFG-1..CFG-3).
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.queue_capacity == 0 {
            return Err(ConfigError::new("queue_capacity", "must be at least 1"));
        }
        if let Some(c) = self.concurrency {
            positive("concurrency", c)?;
        }
        if let Some(w) = self.max_wait {
            non_zero("max_wait", w)?;
        }
        let mut names = HashSet::new();
        for scope in &self.scopes {
            scope.validate()?;
            if !names.insert(scope.name.as_str()) {
                return Err(ConfigError::new(
                    format!("scopes.{}", scope.name),
                    "is defined twice",
                ));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{Algorithm, MINUTE};

    fn err(c: &ControllerConfig) -> ConfigError {
        match c.validate() {
            Err(e) => e,
            Ok(()) => panic!("expected a configuration error for {c:?}"),
        }
    }

    // proves: CFG-1
    #[test]
    fn zero_limits_are_errors_naming_the_field() {
        let mut c = ControllerConfig {
            scopes: vec![ScopeConfig::new("main").requests(0, MINUTE)],
            ..Default::default()
        };
        assert_eq!(err(&c).field, "scopes.main.limits[0].amount");
        c.scopes = vec![
            ScopeConfig::new("main")
                .requests(5, MINUTE)
                .tokens(0, MINUTE),
        ];
        assert_eq!(err(&c).field, "scopes.main.limits[1].amount");
        c.scopes.clear();
        c.concurrency = Some(0);
        assert_eq!(err(&c).field, "concurrency");
        assert!(err(&c).to_string().contains("unset for unlimited"));
    }

    // proves: CFG-2
    #[test]
    fn zero_windows_and_capacities_are_errors() {
        let mut c = ControllerConfig {
            scopes: vec![ScopeConfig::new("main").tokens(5, Duration::ZERO)],
            ..Default::default()
        };
        assert_eq!(err(&c).field, "scopes.main.limits[0].window");
        c.scopes =
            vec![
                ScopeConfig::new("main")
                    .tokens(5, MINUTE)
                    .algorithm(Algorithm::TokenBucket {
                        burst: Some(Duration::ZERO),
                    }),
            ];
        assert_eq!(err(&c).field, "scopes.main.burst");
        c.scopes = vec![ScopeConfig::new("main").queue_capacity(0)];
        assert_eq!(err(&c).field, "scopes.main.queue_capacity");
        c.scopes.clear();
        c.queue_capacity = 0;
        assert_eq!(err(&c).field, "queue_capacity");
        c.queue_capacity = 1;
        c.max_wait = Some(Duration::ZERO);
        assert_eq!(err(&c).field, "max_wait");
    }

    // proves: Q-10 (scopes are explicit, named once)
    #[test]
    fn duplicate_scope_names_are_errors() {
        let c = ControllerConfig {
            scopes: vec![ScopeConfig::new("a"), ScopeConfig::new("a")],
            ..Default::default()
        };
        assert_eq!(err(&c).field, "scopes.a");
        let c = ControllerConfig {
            scopes: vec![ScopeConfig::new(" ")],
            ..Default::default()
        };
        assert_eq!(err(&c).field, "scopes[].name");
    }

    #[test]
    fn defaults_are_valid() {
        assert_eq!(ControllerConfig::default().validate(), Ok(()));
    }
}

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

/// Coordinated cooldown after a provider 429 (SPEC CD-1).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CooldownConfig {
    /// First cooldown when the 429 carries no hint (default 1 s).
    pub base: Duration,
    /// Growth of consecutive hintless cooldowns (default 2, at least 1).
    pub factor: f64,
    /// Cap on any cooldown, hinted or not (default 60 s).
    pub max: Duration,
}

impl Default for CooldownConfig {
    fn default() -> Self {
        CooldownConfig {
            base: Duration::from_secs(1),
            factor: 2.0,
            max: Duration::from_secs(60),
        }
    }
}

impl CooldownConfig {
    /// Checks every field (SPEC CFG-2).
    pub fn validate(&self) -> Result<(), ConfigError> {
        non_zero("cooldown.base", self.base)?;
        non_zero("cooldown.max", self.max)?;
        if !(self.factor.is_finite() && self.factor >= 1.0) {
            return Err(ConfigError::new("cooldown.factor", "must be a number >= 1"));
        }
        if self.max < self.base {
            return Err(ConfigError::new(
                "cooldown.max",
                "must be at least cooldown.base",
            ));
        }
        Ok(())
    }

    /// The length of a cooldown: the server's hint capped by `max`, or
    /// without a hint `base * factor^strikes` capped by `max`.
    pub fn length(&self, hint: Option<Duration>, strikes: u32) -> Duration {
        match hint {
            Some(h) => h.min(self.max),
            None => {
                let exp = i32::try_from(strikes).unwrap_or(i32::MAX);
                let secs = self.base.as_secs_f64() * self.factor.powi(exp);
                Duration::try_from_secs_f64(secs)
                    .unwrap_or(self.max)
                    .min(self.max)
            }
        }
    }
}

/// A named concurrency pool (SPEC POOL-1, POOL-3).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolConfig {
    /// The pool's name (e.g. the model it guards).
    pub name: String,
    /// Permits; must be positive.
    pub limit: u64,
    /// Calls that may wait for a permit; more are refused at once.
    /// `None` = no bound beyond the scopes' queues.
    pub max_waiting: Option<usize>,
    /// Longest wait for a permit; the effective wait is the smaller of this
    /// and the call's remaining deadline.
    pub max_wait: Option<Duration>,
}

impl PoolConfig {
    /// A pool of `limit` permits without bounds on waiting.
    pub fn new(name: impl Into<String>, limit: u64) -> Self {
        PoolConfig {
            name: name.into(),
            limit,
            max_waiting: None,
            max_wait: None,
        }
    }

    /// Bounds how many calls may wait.
    pub fn max_waiting(mut self, n: usize) -> Self {
        self.max_waiting = Some(n);
        self
    }

    /// Bounds how long a call may wait.
    pub fn max_wait(mut self, d: Duration) -> Self {
        self.max_wait = Some(d);
        self
    }

    /// Checks every field (SPEC CFG-1, CFG-2).
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.name.trim().is_empty() {
            return Err(ConfigError::new("pools[].name", "must not be empty"));
        }
        positive(&format!("pools.{}.limit", self.name), self.limit)?;
        if let Some(w) = self.max_wait {
            non_zero(&format!("pools.{}.max_wait", self.name), w)?;
        }
        Ok(())
    }
}

/// Everything an [`AdmissionController`](crate::AdmissionController) needs.
#[derive(Debug, Clone, PartialEq)]
pub struct ControllerConfig {
    /// Quota scopes; an empty list means one unlimited scope named `default`.
    pub scopes: Vec<ScopeConfig>,
    /// Waiting calls per scope (ADM-5); at least 1.
    pub queue_capacity: usize,
    /// Full-queue behaviour.
    pub overflow: Overflow,
    /// Active calls of the default pool (ADM-7), used by calls that name
    /// no pool; `None` = unlimited.
    pub concurrency: Option<u64>,
    /// Named pools calls may choose instead.
    pub pools: Vec<PoolConfig>,
    /// Longest quota wait accepted before failing early with
    /// `QuotaWaitTooLong`; `None` = only the deadline bounds it.
    pub max_wait: Option<Duration>,
    /// Cooldown after provider 429s.
    pub cooldown: CooldownConfig,
}

impl Default for ControllerConfig {
    fn default() -> Self {
        ControllerConfig {
            scopes: Vec::new(),
            queue_capacity: 1024,
            overflow: Overflow::Wait,
            concurrency: None,
            pools: Vec::new(),
            max_wait: None,
            cooldown: CooldownConfig::default(),
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
        self.cooldown.validate()?;
        let mut pool_names = HashSet::new();
        for pool in &self.pools {
            pool.validate()?;
            if pool.name == "default" && self.concurrency.is_some()
                || !pool_names.insert(pool.name.as_str())
            {
                return Err(ConfigError::new(
                    format!("pools.{}", pool.name),
                    "is defined twice",
                ));
            }
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

    // proves: CD-1 (hint capped by config; without a hint a short exponential
    // backoff from 1 s, never a long fixed default)
    #[test]
    fn cooldown_lengths() {
        let c = CooldownConfig::default();
        assert_eq!(c.length(None, 0), Duration::from_secs(1));
        assert_eq!(c.length(None, 1), Duration::from_secs(2));
        assert_eq!(c.length(None, 3), Duration::from_secs(8));
        assert_eq!(c.length(None, 40), Duration::from_secs(60));
        assert_eq!(
            c.length(Some(Duration::from_secs(7)), 5),
            Duration::from_secs(7)
        );
        assert_eq!(
            c.length(Some(Duration::from_secs(3600)), 0),
            Duration::from_secs(60)
        );
        let bad = CooldownConfig {
            factor: 0.5,
            ..CooldownConfig::default()
        };
        assert_eq!(bad.validate().unwrap_err().field, "cooldown.factor");
    }

    #[test]
    fn defaults_are_valid() {
        assert_eq!(ControllerConfig::default().validate(), Ok(()));
    }
}

//! Deployments of a model (SPEC GW-11): each a provider, an upstream model
//! name, its own quota scope and pool, and a routing weight.
//!
//! A model written the classic way (`provider`, `scope`, `concurrency` on
//! the model) has exactly one deployment, named after the model, whose
//! scope and pool keep the names they always had (`model:<name>`), so
//! existing configurations, metrics and dashboards do not change.

use std::time::Duration;

use tollgate::config::{PoolConfig, ScopeConfig};

use super::types::{MODEL_PREFIX, ModelConfig, pool};

/// `[models.<model>.deployments.<name>]`: one place a model is served (or
/// the one deployment of a model written the classic way).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeploymentConfig {
    /// The table key (the model's name for a model without `deployments`);
    /// a metric label.
    pub name: String,
    /// The provider serving it.
    pub provider: String,
    /// The model name sent upstream (default: the model's name).
    pub upstream_model: String,
    /// The configured quota scope; `None` = a private scope (see
    /// [`ModelConfig::deployment_scope`]).
    pub scope: Option<String>,
    /// Pool permits of this deployment (POOL-1); `None` = unlimited.
    pub concurrency: Option<u64>,
    /// Calls that may wait for a permit (POOL-3).
    pub max_waiting: Option<usize>,
    /// Longest wait for a permit.
    pub max_wait: Option<Duration>,
    /// Adopt the provider's advertised limits in the private scope over
    /// this window (SPEC Q-14); only without `scope`.
    pub learn_limits: Option<Duration>,
    /// Routing weight, the last tie-break (default 1; higher wins).
    pub weight: u32,
}

impl ModelConfig {
    /// The private name of deployment `d`: `model:<model>` for the one
    /// deployment of a classic model, `model:<model>/<deployment>` else.
    fn private_name(&self, d: &DeploymentConfig) -> String {
        if !self.listed {
            format!("{MODEL_PREFIX}{}", self.name)
        } else {
            format!("{MODEL_PREFIX}{}/{}", self.name, d.name)
        }
    }

    /// The quota scope deployment `d` spends: its configured scope, or its
    /// private one.
    pub fn deployment_scope(&self, d: &DeploymentConfig) -> String {
        d.scope.clone().unwrap_or_else(|| self.private_name(d))
    }

    /// The pool name of deployment `d`.
    pub fn deployment_pool(&self, d: &DeploymentConfig) -> String {
        self.private_name(d)
    }

    /// The private scope of deployment `d` when it names no scope:
    /// unlimited, or learning the provider's limits.
    pub fn deployment_private_scope(&self, d: &DeploymentConfig) -> Option<ScopeConfig> {
        if d.scope.is_some() {
            return None;
        }
        let scope = ScopeConfig::new(self.private_name(d));
        Some(match d.learn_limits {
            Some(window) => scope.learn_limits(window),
            None => scope,
        })
    }

    /// The engine pool of deployment `d`, when it has a `concurrency`.
    pub fn deployment_pool_config(&self, d: &DeploymentConfig) -> Option<PoolConfig> {
        pool(
            self.deployment_pool(d),
            d.concurrency,
            d.max_waiting,
            d.max_wait,
        )
    }
}

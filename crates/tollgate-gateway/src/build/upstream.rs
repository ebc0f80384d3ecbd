//! The upstream side: one admission controller per quota scope, holding the
//! pools of the deployments that spend it (SPEC Q-10, POOL-1).
//!
//! One controller per scope lets a reload keep the quota state of every
//! scope whose settings did not change (SPEC GW-15): the scope's limits,
//! the pools of its deployments and the `[admission]` and `[cooldown]`
//! settings. A scope whose settings changed starts afresh.

use std::sync::Arc;

use tollgate::AdmissionController;
use tollgate::config::{ConfigError as EngineConfigError, ControllerConfig, ScopeConfig};
use tollgate::quota::SharedRemote;

use crate::config::{GatewayConfig, QuotaStoreConfig};

/// One upstream quota scope and its controller.
#[derive(Debug)]
pub struct ScopeRuntime {
    /// The scope's name (configured, or `model:<model>[/<deployment>]`).
    pub name: Arc<str>,
    /// What built `controller`; equal settings on reload keep it.
    pub settings: ControllerConfig,
    /// Where its quota lives; a change on reload starts it afresh.
    pub store: QuotaStoreConfig,
    /// Its controller (the scope and its deployments' pools).
    pub controller: AdmissionController,
}

/// The controller settings of every upstream scope of `config`.
fn settings(config: &GatewayConfig) -> Vec<(String, ControllerConfig)> {
    config
        .scope_configs()
        .into_iter()
        .map(|scope: ScopeConfig| {
            let name = scope.name().to_owned();
            let pools = config
                .models
                .iter()
                .flat_map(|m| {
                    m.deployments
                        .iter()
                        .filter(|d| m.deployment_scope(d) == name)
                        .filter_map(|d| m.deployment_pool_config(d))
                        .collect::<Vec<_>>()
                })
                .collect();
            let settings = ControllerConfig {
                scopes: vec![scope],
                queue_capacity: config.admission.queue_capacity,
                overflow: config.admission.overflow,
                concurrency: None,
                pools,
                max_wait: config.admission.max_wait,
                cooldown: config.cooldown,
            };
            (name, settings)
        })
        .collect()
}

/// The scopes of `config`, reusing the controllers of `previous` whose
/// settings (and store) are unchanged. With a shared store every upstream
/// scope keeps its quota there (SPEC DQ-1); tenant scopes stay in the
/// process.
pub fn scopes(
    config: &GatewayConfig,
    previous: &[ScopeRuntime],
    shared: Option<&SharedRemote>,
) -> Result<Vec<ScopeRuntime>, EngineConfigError> {
    settings(config)
        .into_iter()
        .map(|(name, settings)| {
            let kept = previous.iter().find(|p| {
                *p.name == *name && p.settings == settings && p.store == config.quota_store
            });
            let controller = match (kept, shared) {
                (Some(p), _) => p.controller.clone(),
                (None, None) => AdmissionController::new(settings.clone())?,
                (None, Some(store)) => AdmissionController::builder()
                    .config(settings.clone())
                    .shared_store(Arc::clone(store))
                    .build()?,
            };
            Ok(ScopeRuntime {
                name: Arc::from(name),
                settings,
                store: config.quota_store.clone(),
                controller,
            })
        })
        .collect()
}

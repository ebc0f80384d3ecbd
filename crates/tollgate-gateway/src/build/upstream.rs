//! The upstream side: one admission controller per quota scope, holding the
//! pools of the deployments that spend it (SPEC Q-10, POOL-1).
//!
//! A reload keeps each scope's controller and reconfigures it in place
//! (SPEC GW-15): its window, cooldown, queue and calls in flight carry into
//! the new limits, pools and `[admission]` and `[cooldown]` settings. Only
//! a scope moved to another quota store starts afresh (the new store has
//! its own count).

use std::sync::Arc;

use tollgate::config::{ConfigError as EngineConfigError, ControllerConfig, ScopeConfig};
use tollgate::quota::SharedRemote;
use tollgate::{AdmissionController, Reconfiguration};

use crate::config::{GatewayConfig, QuotaStoreConfig};

/// One upstream quota scope and its controller.
#[derive(Debug)]
pub struct ScopeRuntime {
    /// The scope's name (configured, or `model:<model>[/<deployment>]`).
    pub name: Arc<str>,
    /// What `controller` was last configured with.
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

/// The scopes of `config`: the running controller of `previous` for every
/// scope it has in the same store, with the reconfiguration that brings it
/// to `config` (applied by the caller once the whole state is built), and
/// a new controller for the others. With a shared store every upstream
/// scope keeps its quota there (SPEC DQ-1); tenant scopes stay in the
/// process.
pub fn scopes(
    config: &GatewayConfig,
    previous: &[ScopeRuntime],
    shared: Option<&SharedRemote>,
    plans: &mut Vec<Reconfiguration>,
) -> Result<Vec<ScopeRuntime>, EngineConfigError> {
    settings(config)
        .into_iter()
        .map(|(name, settings)| {
            let running = previous
                .iter()
                .find(|p| *p.name == *name && p.store == config.quota_store);
            let controller = match (running, shared) {
                (Some(p), _) => {
                    if p.settings != settings {
                        plans.push(p.controller.prepare(settings.clone())?);
                    }
                    p.controller.clone()
                }
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

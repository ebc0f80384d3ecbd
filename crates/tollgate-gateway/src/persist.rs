//! `server.state_dir`: the quota state of long windows kept across
//! restarts (SPEC DQ-8).
//!
//! At start the state file is opened (an unreadable one refuses the start
//! unless `on_unreadable_state = "start_empty"`) and what it holds is
//! counted in the new controllers before any request is served. Then every
//! `state_save_interval` the scopes whose count changed are written, in one
//! transaction, off the request path (a blocking thread); a reload counts
//! in the controllers it makes afresh what the file holds for them
//! ([`restore_new`]) and makes the next save rewrite the whole file; a
//! graceful shutdown saves once more. Owners: `upstream` for the upstream scopes (their names are
//! unique), `tenant:<name>` for each tenant's scopes. Scopes kept in Redis
//! are never written (Redis holds them); tenant scopes, which stay per
//! replica, are.

use std::sync::Arc;
use std::time::Duration;

use tollgate::AdmissionController;
use tollgate::config::ControllerConfig;
use tollgate_state::{StateError, StateFile};

use crate::config::GatewayConfig;
use crate::live::Live;
use crate::state::AppState;

/// Opens the state file of `config`, if it has a `state_dir`.
pub fn open(config: &GatewayConfig) -> Result<Option<Arc<StateFile>>, StateError> {
    let Some(dir) = &config.server.state_dir else {
        return Ok(None);
    };
    StateFile::open(dir, config.server.on_unreadable_state).map(|f| Some(Arc::new(f)))
}

/// Every controller of `app` with its owner's name and its configuration.
fn owners(app: &AppState) -> Vec<(String, &AdmissionController, &ControllerConfig)> {
    app.upstream
        .iter()
        .map(|s| ("upstream".to_owned(), &s.controller, &s.settings))
        .chain(
            app.tenant_slots
                .iter()
                .map(|t| (format!("tenant:{}", t.name), &t.controller, &t.settings)),
        )
        .collect()
}

/// Counts in `app`'s controllers what `file` held; returns how many scopes
/// took something.
pub fn restore(file: &StateFile, app: &AppState) -> usize {
    owners(app)
        .iter()
        .map(|(owner, controller, _)| file.restore(owner, controller))
        .sum()
}

/// Counts in the scopes of `new` (a reloaded state) that `old` did not
/// have what `file` holds for them now: a tenant or an upstream scope the
/// reload added (or moved to another store), and a scope it added to a
/// controller it keeps (a tenant's limits on a model) that the controller
/// never had. One left out of a deploy and added back by a reload finds
/// its windows as the file kept them (SPEC DQ-8), not fresh ones. Scopes
/// the reload keeps count as they did, and so does a scope a controller
/// retired at an earlier reload and takes back now (the engine kept its
/// counts). Returns how many scopes took something.
pub fn restore_new(file: &StateFile, old: &AppState, new: &AppState) -> usize {
    let running = owners(old);
    owners(new)
        .iter()
        .map(|(owner, controller, settings)| {
            match running.iter().find(|(_, r, _)| r.same(controller)) {
                None => file.restore(owner, controller),
                Some((_, _, before)) => {
                    let had = |scope: &str| before.scopes.iter().any(|s| s.name() == scope);
                    let added = |scope: &str| !had(scope) && controller.quota_untouched(scope);
                    if settings.scopes.iter().any(|s| added(s.name())) {
                        file.restore_where(owner, controller, added)
                    } else {
                        0
                    }
                }
            }
        })
        .sum()
}

/// Writes what changed in `app` (blocking: file I/O).
pub fn save(file: &StateFile, app: &AppState) -> Result<usize, StateError> {
    let owners = owners(app);
    let refs: Vec<(&str, &AdmissionController)> =
        owners.iter().map(|(o, c, _)| (o.as_str(), *c)).collect();
    file.save(&refs)
}

/// Saves `live`'s current state every `interval` until aborted. A failed
/// save is logged and retried (whole) at the next tick: serving goes on.
pub async fn save_every(file: Arc<StateFile>, live: Arc<Live>, interval: Duration) {
    let mut ticks = tokio::time::interval(interval);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut last: Option<Arc<AppState>> = None;
    loop {
        ticks.tick().await;
        let app = live.current();
        if last.as_ref().is_some_and(|l| !Arc::ptr_eq(l, &app)) {
            // Reloaded: scopes may have gone, controllers may be new.
            file.rewrite_all();
        }
        last = Some(Arc::clone(&app));
        let f = Arc::clone(&file);
        match tokio::task::spawn_blocking(move || save(&f, &app)).await {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => tracing::error!(error = %e, "quota state not saved; retrying"),
            Err(e) => tracing::error!(error = %e, "quota state saver failed; retrying"),
        }
    }
}

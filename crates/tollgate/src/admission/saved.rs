//! Saving and restoring the quota state of a controller's scopes across a
//! restart (SPEC DQ-8). The controller only hands the state out and takes
//! it back (see `quota/saved.rs`); where it is kept is the front end's
//! business.

use super::controller::AdmissionController;
use super::scope::Scope;
use crate::config::Limit;
use crate::quota::SavedScope;

/// One scope's saved state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SavedQuota {
    /// The scope's name.
    pub scope: String,
    /// Its store's version when saved (see [`AdmissionController::save_quota`]).
    pub version: u64,
    /// What its limits counted.
    pub state: SavedScope,
}

impl AdmissionController {
    /// The counted state, in UTC, of every in-process scope that has a
    /// limit `keep` selects, except the scopes for which `unchanged(name,
    /// version)` says that version was already saved. A scope kept in a
    /// shared store gives nothing: the store keeps it (SPEC DQ-8).
    ///
    /// Each scope is locked only while its state is copied (a few
    /// microseconds for a full sliding window), one at a time.
    pub fn save_quota(
        &self,
        keep: fn(&Limit) -> bool,
        unchanged: &dyn Fn(&str, u64) -> bool,
    ) -> Vec<SavedQuota> {
        let now = self.inner.clock.now();
        let mut out = Vec::new();
        for (_, scope) in self.inner.scopes.iter() {
            if scope.is_retired() || scope.shared.is_some() {
                continue;
            }
            let mut st = scope.state.lock();
            let Some(version) = st.store.version() else {
                continue;
            };
            if unchanged(&scope.name, version) {
                continue;
            }
            let Some(state) = st.store.save(now, keep) else {
                continue;
            };
            drop(st);
            if state.limits.is_empty() {
                continue;
            }
            out.push(SavedQuota {
                scope: scope.name.to_string(),
                version,
                state,
            });
        }
        out
    }

    /// Whether the in-process scope `scope` has counted nothing since it
    /// was made: no admission, no settlement, no restore. A scope a
    /// reconfiguration appended is; one it brought back after retiring it
    /// keeps its counts and is not. `false` for an unknown scope or one
    /// kept in a shared store.
    pub fn quota_untouched(&self, scope: &str) -> bool {
        self.in_process(scope)
            .is_some_and(|s| s.state.lock().store.version() == Some(0))
    }

    /// The running scope named `name` whose quota is counted in process.
    fn in_process(&self, name: &str) -> Option<&Scope> {
        self.inner
            .scopes
            .iter()
            .map(|(_, s)| s)
            .find(|s| &*s.name == name && !s.is_retired() && s.shared.is_none())
    }

    /// Counts in scope `scope` what a save before a restart still counts
    /// (see [`SavedScope`]): call it before the scope takes traffic, or
    /// any time later (what is restored next to counted amounts is counted
    /// as admitted now, which is longer). Returns whether anything was
    /// counted; `false` for an unknown scope or one kept in a shared
    /// store.
    pub fn restore_quota(&self, scope: &str, saved: &SavedScope) -> bool {
        let now = self.inner.clock.now();
        let Some(s) = self.in_process(scope) else {
            return false;
        };
        let mut st = s.state.lock();
        let restored = st.store.restore(saved, now);
        if restored {
            // A queued call's projection counted without it.
            st.invalidate_projection();
        }
        restored
    }
}

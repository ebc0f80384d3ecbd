//! Coordinated cooldown of a scope after provider 429s (SPEC CD-1..CD-4).

use std::time::Duration;

use super::controller::{AdmissionController, Inner};
use crate::call::ScopeId;
use crate::clock::Instant;
use crate::deadline::far_future;

/// What a reported 429 did to its scope's cooldown.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CooldownOutcome {
    /// A new cooldown started (generation bumped).
    Started {
        /// The new generation.
        generation: u64,
        /// When it ends.
        until: Instant,
    },
    /// A running cooldown already lasts at least as long (or, `until`
    /// being now, the hint asked for no pause at all).
    Running {
        /// When it ends.
        until: Instant,
    },
    /// The attempt started before the running cooldown: ignored (CD-2).
    Stale,
}

impl CooldownOutcome {
    /// When the scope's cooldown ends, if one runs.
    pub fn until(&self) -> Option<Instant> {
        match self {
            CooldownOutcome::Started { until, .. } | CooldownOutcome::Running { until } => {
                Some(*until)
            }
            CooldownOutcome::Stale => None,
        }
    }
}

impl AdmissionController {
    /// Reports a provider 429 to `scope`, seen by an attempt that started
    /// under cooldown `generation` ([`Lease::generation`](crate::Lease::generation)), with the
    /// server's hint if any (SPEC CD-1, CD-2).
    ///
    /// A 429 from an attempt older than the running cooldown is stale: it
    /// neither starts nor extends one. Otherwise a cooldown of the hinted
    /// length (capped by the configuration), or of a short exponential
    /// backoff from 1 s without a hint, pauses the whole scope: waiting
    /// calls start no provider work until it ends, and calls granted but
    /// not yet started are preempted (CD-3).
    pub fn rate_limited(
        &self,
        scope: ScopeId,
        generation: u64,
        hint: Option<Duration>,
    ) -> CooldownOutcome {
        self.inner.rate_limited(scope, generation, hint)
    }

    /// An attempt of `scope` succeeded: the next hintless 429 starts again
    /// from the base cooldown.
    pub fn clear_backoff(&self, scope: ScopeId) {
        if let Some(scope) = self.inner.scopes.get(scope.index()) {
            scope.state.lock().cooldown.strikes = 0;
        }
    }

    /// Starts a cooldown of `scope` lasting `duration` unless one already
    /// runs longer, whatever the generation (an operator's pause).
    pub fn start_cooldown(&self, scope: ScopeId, duration: Duration) -> Option<u64> {
        let inner = &*self.inner;
        let scope = inner.scopes.get(scope.index())?;
        let now = inner.clock.now();
        let mut st = scope.state.lock();
        let until = now.checked_add(duration).unwrap_or_else(|| far_future(now));
        if st.cooldown.active(now).is_some_and(|u| u >= until) {
            return Some(st.cooldown.generation);
        }
        st.cooldown.until = Some(until);
        st.cooldown.generation += 1;
        let generation = st.cooldown.generation;
        st.mark_cooldown();
        st.drain(now);
        Some(generation)
    }

    /// The scope's cooldown generation and the end of the running cooldown.
    pub fn cooldown(&self, scope: ScopeId) -> Option<(u64, Option<Instant>)> {
        let inner = &*self.inner;
        let scope = inner.scopes.get(scope.index())?;
        let now = inner.clock.now();
        let st = scope.state.lock();
        Some((st.cooldown.generation, st.cooldown.active(now)))
    }
}

impl Inner {
    /// See [`AdmissionController::rate_limited`].
    pub(crate) fn rate_limited(
        &self,
        scope: ScopeId,
        generation: u64,
        hint: Option<Duration>,
    ) -> CooldownOutcome {
        let inner = self;
        let Some(scope) = inner.scopes.get(scope.index()) else {
            return CooldownOutcome::Stale;
        };
        let now = inner.clock.now();
        let mut st = scope.state.lock();
        if generation < st.cooldown.generation {
            st.counters.stale_rate_limits += 1;
            return CooldownOutcome::Stale;
        }
        let length = inner.settings.cooldown().length(hint, st.cooldown.strikes);
        if hint.is_none() {
            st.cooldown.strikes = st.cooldown.strikes.saturating_add(1);
        }
        let until = now.checked_add(length).unwrap_or_else(|| far_future(now));
        if let Some(running) = st.cooldown.active(now)
            && running >= until
        {
            return CooldownOutcome::Running { until: running };
        }
        if until <= now {
            // A hint of zero (`retry-after: 0`, a date past) pauses nothing;
            // a new generation would only make the 429s of attempts in
            // flight stale, and so start no cooldown for a real hint (CD-2).
            return CooldownOutcome::Running { until: now };
        }
        st.cooldown.until = Some(until);
        st.cooldown.generation += 1;
        st.counters.cooldowns += 1;
        let generation = st.cooldown.generation;
        st.mark_cooldown();
        st.drain(now);
        tracing::debug!(scope = %scope.id, generation, cooldown_ms = length.as_millis() as u64, "cooldown started");
        CooldownOutcome::Started { generation, until }
    }
}

//! After an attempt: settlement with the reported usage (SPEC Q-5) and
//! what the provider's answer says about its own counting (Q-14..Q-16).

use std::sync::atomic::Ordering;

use super::controller::{AdmissionController, Inner};
use super::fair::Charged;
use super::lease::Lease;
use crate::AdmissionError;
use crate::call::ScopeId;
use crate::clock::Instant;
use crate::flow::Flow;
use crate::quota::{Actual, BudgetReport, Demand, Dimension, Hold, Observed, Reservation};
use crate::usage::{Settlement, Usage};

impl AdmissionController {
    /// Takes in what a provider's response, begun at `at`, said about its
    /// budget for `scope` (SPEC Q-14): a limit the configuration left out
    /// follows the advertised amount (see
    /// [`ScopeConfig::learn_limits`](crate::config::ScopeConfig::learn_limits)),
    /// and when the provider has less left than tollgate's own view at
    /// `at` (another client of the account, another accounting), the
    /// difference is counted in the scope's window until the provider's
    /// reset, so later admissions wait instead of drawing 429s. A report
    /// never raises availability above tollgate's own accounting.
    pub fn observe(&self, scope: ScopeId, report: &BudgetReport, at: Instant) -> Observed {
        self.inner.observe(scope, [report], None, at)
    }

    /// [`observe`](Self::observe) for the answer to `lease`'s attempt,
    /// after its [`counted_by`](Lease::counted_by): the provider's
    /// remaining budget is compared with what it certainly counted of
    /// tollgate's traffic when it counted this attempt, so attempts still
    /// in flight do not hide another client's spending (SPEC Q-14).
    pub fn observe_answer(&self, lease: &Lease, report: &BudgetReport, at: Instant) -> Observed {
        self.inner
            .observe(lease.scope(), [report], Some(lease.reservation()), at)
    }

    /// The provider answered an attempt of `scope` (a response began),
    /// after its budget reports went to [`observe`](Self::observe): a scope
    /// still learning its limits drops the stand-in for a limit the
    /// provider did not advertise (SPEC Q-14). Cheap once learned.
    pub fn provider_answered(&self, scope: ScopeId) {
        let Some(scope) = self.inner.scopes.get(scope.index()) else {
            return;
        };
        // A plain load first: once learned, answers write nothing shared.
        if !scope.learning.load(Ordering::Acquire) || !scope.learning.swap(false, Ordering::AcqRel)
        {
            return;
        }
        let now = self.inner.clock.now();
        let mut st = scope.state.lock();
        if st.store.answered() {
            st.invalidate_projection();
            if !st.queue.is_empty() {
                st.drain(now);
            }
        }
    }
}

impl Inner {
    /// See [`Lease::top_up`]: `cost` more micro-dollars from `scope`'s
    /// cost limits at once, all or none, or the refusal.
    pub(crate) fn top_up(&self, scope: ScopeId, cost: u64) -> Result<Reservation, AdmissionError> {
        let found = self
            .scopes
            .get(scope.index())
            .ok_or(AdmissionError::UnknownScope(scope))?;
        if found.shared.is_some() {
            // A shared store answers in a round trip, not now.
            return Err(AdmissionError::QuotaStoreUnavailable { scope });
        }
        if self.closed.load(Ordering::Acquire) {
            return Err(AdmissionError::Closed);
        }
        let demand = Demand {
            requests: 0,
            input: 0,
            output: 0,
            cost,
        };
        let now = self.clock.now();
        let mut st = found.state.lock();
        if st.closed {
            return Err(AdmissionError::Closed);
        }
        st.store.check(&demand)?;
        match st.store.try_reserve(&demand, now, Hold::Leased) {
            Some(tick) => {
                st.counters.cost_reserved = st.counters.cost_reserved.saturating_add(cost);
                // Less room: earlier projections are too early now.
                st.invalidate_projection();
                Ok(Reservation {
                    stamp: now,
                    tick,
                    demand,
                    hold: Hold::Leased,
                    seq: 0,
                })
            }
            None => Err(AdmissionError::BudgetExceeded {
                scope,
                retry_at: st.store.not_until(&demand, now).at,
            }),
        }
    }

    /// See [`Lease::counted_by`].
    pub(crate) fn recount(&self, scope: ScopeId, reservation: &mut Reservation, at: Instant) {
        let Some(scope) = self.scopes.get(scope.index()) else {
            return;
        };
        let now = self.clock.now();
        let mut st = scope.state.lock();
        st.store.recount(reservation, at, now);
        // Counted longer: earlier projections are too early now.
        st.invalidate_projection();
    }

    /// See [`Lease::refused`]: `requests` and `tokens` say what the
    /// provider's limiter did not charge; the cost always goes back (no
    /// provider bills a refused request, SPEC BUD-5).
    pub(crate) fn release_refused(
        &self,
        scope: ScopeId,
        reservation: &Reservation,
        requests: bool,
        tokens: bool,
    ) {
        let Some(scope) = self.scopes.get(scope.index()) else {
            return;
        };
        let now = self.clock.now();
        let mut st = scope.state.lock();
        let cost = reservation.demand.cost > 0;
        st.store.release(reservation, requests, tokens, cost);
        st.counters.refused(&reservation.demand, requests || tokens);
        st.invalidate_projection();
        if !st.queue.is_empty() {
            st.drain(now);
        }
    }

    /// Corrects the counter of `flow` charged for `reservation` to what it
    /// really cost (SPEC FAIR-3), outside a settlement (a refusal).
    pub(crate) fn correct_flow(
        &self,
        scope: ScopeId,
        flow: Flow,
        charged: Charged,
        reservation: &Reservation,
        actual: &Actual,
    ) {
        if let Some(scope) = self.scopes.get(scope.index()) {
            let mut st = scope.state.lock();
            st.correct(flow.key(), charged, &reservation.demand, Some(actual));
        }
    }

    /// [`correct_flow`](Self::correct_flow) on a shared scope's turn.
    pub(crate) fn refused_charge_shared(
        &self,
        scope: ScopeId,
        flow: Flow,
        charged: Charged,
        reservation: &Reservation,
    ) {
        if let Some(shared) = self
            .scopes
            .get(scope.index())
            .and_then(|s| s.shared.as_ref())
        {
            let zero = Actual::total(0);
            shared
                .turn
                .correct(flow.key(), charged, &reservation.demand, Some(&zero));
        }
    }

    /// See [`AdmissionController::observe`]: every report of one answer
    /// under one lock. Returns the gaps taken, summed, and the last limit
    /// adopted.
    pub(crate) fn observe<'a>(
        &self,
        scope: ScopeId,
        reports: impl IntoIterator<Item = &'a BudgetReport>,
        answered: Option<&Reservation>,
        at: Instant,
    ) -> Observed {
        let Some(scope) = self.scopes.get(scope.index()) else {
            return Observed::default();
        };
        let now = self.clock.now();
        let mut st = scope.state.lock();
        let mut total = Observed::default();
        for report in reports {
            let observed = st.store.observe(report, answered, at, now);
            match report.dimension {
                Dimension::Requests => {
                    st.counters.gap_requests =
                        st.counters.gap_requests.saturating_add(observed.gap);
                }
                Dimension::Tokens | Dimension::InputTokens | Dimension::OutputTokens => {
                    st.counters.gap_tokens = st.counters.gap_tokens.saturating_add(observed.gap);
                }
                // No provider reports money: the store ignores it.
                Dimension::Cost => {}
            }
            if observed.adopted.is_some() {
                st.counters.limits_adopted += 1;
                total.adopted = observed.adopted;
            }
            if observed.confirmed.is_some() {
                total.confirmed = observed.confirmed;
            }
            total.gap = total.gap.saturating_add(observed.gap);
            total.freed = total.freed.saturating_add(observed.freed);
        }
        let room = total.adopted.is_some() || total.freed > 0;
        if room || total.gap > 0 || total.confirmed.is_some() {
            st.invalidate_projection();
        }
        if st.queue.is_empty() {
            return total;
        }
        if total.confirmed.is_some() {
            // A confirmed limit refuses larger demands: queued ones too.
            st.fail_unfit(now);
        } else if room {
            st.drain(now);
        }
        total
    }

    /// Settles a started attempt's tokens (SPEC Q-5) and cost (BUD-2;
    /// `usage` is priced already, if the attempt has a price).
    pub(crate) fn reconcile(
        &self,
        scope: ScopeId,
        reservation: &Reservation,
        usage: Usage,
        charged: Option<(Flow, Charged)>,
    ) -> Settlement {
        let settlement = Settlement::new(&reservation.demand, usage);
        let Some(scope) = self.scopes.get(scope.index()) else {
            return settlement;
        };
        let mut st = scope.state.lock();
        st.counters.settle(&settlement);
        let Some(actual) = Actual::settling(&usage, &reservation.demand) else {
            // Unknown usage keeps the estimate: nothing changes.
            return settlement;
        };
        st.store.reconcile(reservation, &actual);
        if let Some((flow, charged)) = charged {
            st.correct(flow.key(), charged, &reservation.demand, Some(&actual));
        }
        // Room given back may admit the head right now; debt only moves the
        // head's instant later, which its timer finds out by itself.
        if actual.refunds(&reservation.demand) {
            st.invalidate_projection();
            if !st.queue.is_empty() {
                let now = self.clock.now();
                st.drain(now);
            }
        }
        settlement
    }
}

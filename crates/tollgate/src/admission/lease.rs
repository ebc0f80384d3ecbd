//! The proof of admission: owns every capacity a call holds (SPEC STYLE 2).

use std::sync::Arc;
use std::time::Duration;

use super::controller::Inner;
use super::cooldown::CooldownOutcome;
use super::fair::Charged;
use super::shared::RemoteLease;
use crate::call::{CallId, PoolId, ScopeId};
use crate::clock::Instant;
use crate::error::AdmissionError;
use crate::flow::Flow;
use crate::quota::{BudgetReport, LimitedBy, Observed, RefusalCost, Reservation};
use crate::usage::{AlreadySettled, Settlement, Usage};

/// What an admission waited for and which limit bound the wait (SPEC OBS-4).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Admission {
    /// From arrival until the quota reservation (queue, cooldown and
    /// rate waits together).
    pub quota_wait: Duration,
    /// From the reservation until the concurrency permit.
    pub concurrency_wait: Duration,
    /// The request/token limits that kept it waiting, if any.
    pub limited_by: LimitedBy,
    /// Whether it waited for a coordinated cooldown.
    pub cooldown: bool,
    /// Whether it waited for a concurrency permit.
    pub concurrency: bool,
    /// How often a cooldown preempted it before it started (SPEC CD-3).
    pub preemptions: u32,
    /// Its place in its scope's arrival order (the last entry, after a
    /// preemption).
    pub ticket: u64,
    /// Its place in its scope's order of quota grants. FIFO (SPEC ADM-4)
    /// means grant order follows ticket order.
    pub grant_order: u64,
}

impl Admission {
    /// Total time spent being admitted.
    pub fn total_wait(&self) -> Duration {
        self.quota_wait + self.concurrency_wait
    }

    /// The error of a grant or permit collected after the deadline (SPEC
    /// DL-5, DL-6): in the phase the call last waited in.
    pub(crate) fn collected_late(&self) -> crate::error::AdmissionError {
        let phase = if self.concurrency {
            crate::deadline::Phase::Concurrency
        } else {
            crate::deadline::Phase::Rate
        };
        crate::error::AdmissionError::DeadlineExceeded {
            phase,
            retry_at: None,
        }
    }
}

/// An admitted attempt.
///
/// The lease holds the call's concurrency permit and its quota reservation.
/// Dropping it, or calling [`release`](Lease::release), returns the permit;
/// the request unit stays spent (SPEC Q-9) and the reserved tokens stay
/// counted until [`reconcile`](Lease::reconcile) settles them
/// with the provider's reported usage (SPEC Q-5).
#[must_use = "dropping the lease releases the admission at once"]
pub struct Lease {
    pub(crate) inner: Arc<Inner>,
    pub(crate) scope: ScopeId,
    pub(crate) reservation: Reservation,
    pub(crate) generation: u64,
    pub(crate) admission: Admission,
    pub(crate) id: Option<CallId>,
    pub(crate) pool: Option<u32>,
    /// The call's flow (its permit's holder, SPEC FAIR-6).
    pub(crate) flow: Flow,
    /// The cost model the grant was charged to the flow's counter under,
    /// if it was, so settlement corrects it (FAIR-3).
    pub(crate) charged: Option<Charged>,
    pub(crate) released: bool,
    pub(crate) reconciled: bool,
    /// Settlements of a reservation kept in a shared store (`None`: it is
    /// in this process, in the scope's own or fallback store).
    pub(crate) remote: Option<RemoteLease>,
}

impl std::fmt::Debug for Lease {
    /// The lease's own state only: never the controller behind it.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lease")
            .field("scope", &self.scope)
            .field("id", &self.id)
            .field("pool", &self.pool())
            .field("hold", &self.reservation.hold)
            .field("generation", &self.generation)
            .field("tokens_reserved", &self.reservation.demand.tokens())
            .field("released", &self.released)
            .field("reconciled", &self.reconciled)
            .field("shared", &self.remote.is_some())
            .finish_non_exhaustive()
    }
}

impl Lease {
    /// The scope whose quota this attempt spends.
    pub fn scope(&self) -> ScopeId {
        self.scope
    }

    /// The pool whose permit it holds, if any.
    pub fn pool(&self) -> Option<PoolId> {
        self.pool.map(PoolId)
    }

    /// The call's id, if it has one.
    pub fn id(&self) -> Option<CallId> {
        self.id
    }

    /// The flow the call was admitted in (SPEC FAIR-1).
    pub fn flow(&self) -> Flow {
        self.flow
    }

    /// The quota taken (stamped with the lease instant).
    pub fn reservation(&self) -> &Reservation {
        &self.reservation
    }

    /// The scope's cooldown generation when the attempt started (SPEC CD-2).
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// What the admission waited for.
    pub fn admission(&self) -> &Admission {
        &self.admission
    }

    /// Whether the lease was released.
    pub fn is_released(&self) -> bool {
        self.released
    }

    /// Settles the reserved tokens with what the provider reported
    /// (SPEC Q-5): known usage below the estimate refunds the difference,
    /// above it records debt, known zero refunds every token (the request
    /// unit stays spent), unknown usage keeps the estimate. The change lands
    /// where the estimate was counted, and a call waiting for room is
    /// admitted at once if it now fits.
    ///
    /// The cost is settled the same way (SPEC BUD-2) from the usage's
    /// [`cost`](Usage::cost): price it first with
    /// [`Usage::priced`] at the model that answered (the supervisor does
    /// it for its provider's price). A usage without a cost keeps the
    /// reserved worst case.
    ///
    /// Each attempt settles once: a second call changes nothing and returns
    /// [`AlreadySettled`]. Settling does not release the lease.
    pub fn reconcile(&mut self, usage: Usage) -> Result<Settlement, AlreadySettled> {
        if std::mem::replace(&mut self.reconciled, true) {
            return Err(AlreadySettled);
        }
        if let Some(remote) = &mut self.remote {
            let inner = &self.inner;
            let charge = self.charged.map(|c| (self.flow, c));
            return Ok(inner.reconcile_shared(
                self.scope,
                &self.reservation,
                usage,
                charge,
                remote,
            ));
        }
        let charge = self.charged.map(|c| (self.flow, c));
        Ok(self
            .inner
            .reconcile(self.scope, &self.reservation, usage, charge))
    }

    /// Reports a provider 429 answered to this attempt, with the server's
    /// hint if any (SPEC CD-1, CD-2): see
    /// [`AdmissionController::rate_limited`](crate::AdmissionController::rate_limited).
    ///
    /// On a scope kept in a shared store, a cooldown this starts is kept
    /// in the store too, so every process pauses (SPEC DQ-9).
    pub fn rate_limited(&self, hint: Option<Duration>) -> CooldownOutcome {
        let outcome = self.inner.rate_limited(self.scope, self.generation, hint);
        if let (Some(_), CooldownOutcome::Started { until, generation }) = (&self.remote, outcome) {
            let length = until.saturating_duration_since(self.inner.clock.now());
            let started = (generation, length);
            super::shared::cool_down(&self.inner, self.scope, &self.reservation, started);
        }
        outcome
    }

    /// Takes in a provider's budget reports in the answer to this
    /// attempt, begun at `at` (SPEC Q-14): see
    /// [`observe_answer`](crate::AdmissionController::observe_answer). On a
    /// scope kept in a shared store they go to the store (after this
    /// attempt's recount), which takes them out of every process's window
    /// (SPEC DQ-9); what that took is counted when the store answers, so
    /// this returns nothing then.
    pub(crate) fn observe<'a>(
        &mut self,
        reports: impl IntoIterator<Item = &'a BudgetReport>,
        at: Instant,
    ) -> Observed {
        if let Some(remote) = &mut self.remote {
            let reports: Vec<BudgetReport> = reports.into_iter().copied().collect();
            let inner = &self.inner;
            inner.observe_shared(self.scope, reports, &self.reservation, at, remote);
            return Observed::default();
        }
        self.inner
            .observe(self.scope, reports, Some(&self.reservation), at)
    }

    /// Tells the controller that the provider counted this attempt no later
    /// than `at` (SPEC Q-15): its request unit and tokens stay counted
    /// until one window after `at` rather than after the lease. Call it
    /// with the instant the response began (status line and headers, a
    /// refusal, a stream's first bytes), or, for an answer still being
    /// generated, with the instant the request was sent plus the largest
    /// arrival delay seen on that provider. The in-process store also
    /// records when the attempt was sent and counted, to compare the
    /// provider's remaining budget with (SPEC Q-14, see
    /// [`observe_answer`](crate::AdmissionController::observe_answer)). An instant before the
    /// lease, or after a settlement, changes nothing. On a shared scope an
    /// instant still ahead reaches the store when it comes (the store
    /// counts from its own now), and this lease's later settlements wait
    /// behind it: keep `at` near now, as the
    /// [`Supervisor`](crate::lifecycle::Supervisor) does (at most
    /// [`ARRIVAL_CAP`](crate::lifecycle::ARRIVAL_CAP) ahead).
    pub fn counted_by(&mut self, at: Instant) {
        if self.reconciled || at < self.reservation.stamp {
            return;
        }
        if let Some(remote) = &mut self.remote {
            // Nothing to move for an instant not after where it is counted.
            if at == self.reservation.stamp {
                return;
            }
            let inner = &self.inner;
            inner.recount_shared(self.scope, &self.reservation, at, remote);
            return;
        }
        self.inner.recount(self.scope, &mut self.reservation, at);
    }

    /// Settles an attempt the provider refused with a 429, charging the
    /// window exactly what the provider charged for it (SPEC Q-16): `Full`
    /// keeps the request unit and the estimate, `Request` gives the tokens
    /// back, `Free` gives both back. The reserved cost always goes back:
    /// no provider bills a refused request (SPEC BUD-5). Counts as the
    /// attempt's settlement: a second settlement returns [`AlreadySettled`].
    pub fn refused(&mut self, cost: RefusalCost) -> Result<(), AlreadySettled> {
        if std::mem::replace(&mut self.reconciled, true) {
            return Err(AlreadySettled);
        }
        let (requests, tokens) = match cost {
            RefusalCost::Full => (false, false),
            RefusalCost::Request => (false, true),
            RefusalCost::Free => (true, true),
        };
        if !requests && !tokens && self.reservation.demand.cost == 0 {
            return Ok(());
        }
        if let Some(remote) = &mut self.remote {
            let (inner, reservation) = (&self.inner, &self.reservation);
            let charge = self.charged.filter(|_| tokens);
            inner.release_refused_shared(self.scope, reservation, requests, tokens, remote);
            if let Some(charged) = charge {
                inner.refused_charge_shared(self.scope, self.flow, charged, reservation);
            }
            return Ok(());
        }
        self.inner
            .release_refused(self.scope, &self.reservation, requests, tokens);
        if let Some(charged) = self.charged.filter(|_| tokens) {
            // The tokens cost nothing: the flow is charged its request only.
            let zero = crate::quota::Actual::total(0);
            self.inner
                .correct_flow(self.scope, self.flow, charged, &self.reservation, &zero);
        }
        Ok(())
    }

    /// Takes `cost` more micro-dollars for this lease's call from the cost
    /// limits of its scope (SPEC BUD-2): for a call whose later attempts
    /// may cost more than its admission reserved (a retry after an attempt
    /// the provider may have billed). Now or never: nothing else is taken
    /// (no request unit, no tokens, no permit), the queue is not waited in
    /// (the call was admitted already) and a refusal comes at once,
    /// [`BudgetExceeded`](AdmissionError::BudgetExceeded) with when the
    /// budget frees the room. A scope kept in a shared store cannot answer
    /// now: refused with
    /// [`QuotaStoreUnavailable`](AdmissionError::QuotaStoreUnavailable).
    ///
    /// The top-up is a lease of its own, in the same flow: settle it with
    /// [`reconcile`](Lease::reconcile) (a known zero usage and its share
    /// of the call's cost) or give it back whole with
    /// [`refused`](Lease::refused). Until it is dropped it counts among
    /// the controller's active leases.
    pub fn top_up(&self, cost: u64) -> Result<Lease, AdmissionError> {
        if self.remote.is_some() {
            return Err(AdmissionError::QuotaStoreUnavailable { scope: self.scope });
        }
        let reservation = self.inner.top_up(self.scope, cost)?;
        self.inner.pools.hold_unpooled();
        Ok(Lease {
            inner: Arc::clone(&self.inner),
            scope: self.scope,
            reservation,
            generation: self.generation,
            admission: Admission::default(),
            id: None,
            pool: None,
            flow: self.flow,
            charged: None,
            released: false,
            reconciled: false,
            remote: None,
        })
    }

    /// Whether the usage was settled.
    pub fn is_reconciled(&self) -> bool {
        self.reconciled
    }

    /// Returns the concurrency permit. Idempotent; also done on drop.
    pub fn release(&mut self) {
        if std::mem::replace(&mut self.released, true) {
            return;
        }
        self.inner.release(self.pool, self.id, self.flow);
    }

    /// Resolves when the controller is closing, so the holder can stop its
    /// work and drop the lease (SPEC LC-7).
    pub async fn closing(&self) {
        self.inner.shutdown.cancelled().await;
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        self.release();
    }
}

//! A read-only look at when a demand could start on a scope (SPEC Q-11,
//! GW-11): the projection the early verdict uses, without queueing anything.
//!
//! A router choosing between deployments asks each one's scope
//! [`AdmissionController::forecast`] and sends the attempt to the soonest.
//! With nothing queued and no cooldown the store answers for the present
//! instant directly (`QuotaStore::not_until`, which only brings its windows
//! up to now). Otherwise the answer is computed on a detached copy of the
//! scope's store (`QuotaStore::project`) with every queued demand committed
//! ahead of this one, so reservations queued ahead count and nothing in the
//! scope changes.

use super::controller::AdmissionController;
use super::scope::{REBUILD_LIMIT, schedule};
use crate::call::{Call, ScopeId, TokenEstimate};
use crate::clock::Instant;
use crate::flow::Flow;
use crate::quota::Demand;

/// When a demand could start on a scope, as the controller sees it now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Forecast {
    /// The earliest instant the demand could be admitted behind the
    /// queue as it stands (the instant of the read when it could start at
    /// once); `None` when it cannot be told (a store without projections,
    /// or, with nothing queued, room that only a pending lease can free;
    /// behind a queue a pending reservation is projected as leased now).
    pub ready_at: Option<Instant>,
    /// The end of a running cooldown (SPEC CD-1), if the scope is in one.
    pub cooling_until: Option<Instant>,
    /// Calls queued on the scope.
    pub queued: usize,
}

impl AdmissionController {
    /// When a demand of one request and `estimate`'s tokens could start on
    /// `scope` (SPEC Q-11): `None` for an unknown or closed scope, or a
    /// demand larger than a whole limit (it never fits). Nothing is
    /// reserved or queued; the scope's state is not changed. The demand is
    /// taken to be of the default flow: see
    /// [`forecast_for`](Self::forecast_for).
    pub fn forecast(&self, scope: ScopeId, estimate: Option<TokenEstimate>) -> Option<Forecast> {
        let mut call = Call::new(scope);
        call.estimate = estimate;
        self.forecast_call(&call)
    }

    /// [`forecast`](Self::forecast) for a call of `flow`: the calls that
    /// certainly go before it are replayed ahead of it (the head unless of
    /// a lower class, the call chosen in its class, its own flow's line;
    /// SPEC FAIR-4), as the early verdict does.
    pub fn forecast_for(
        &self,
        scope: ScopeId,
        estimate: Option<TokenEstimate>,
        flow: Flow,
    ) -> Option<Forecast> {
        let mut call = Call::new(scope);
        call.estimate = estimate;
        call.flow = flow;
        self.forecast_call(&call)
    }

    /// [`forecast_for`](Self::forecast_for) of `call`'s demand, its
    /// worst-case cost included when it has a price (SPEC BUD-2), on its
    /// scope, for its flow.
    pub fn forecast_call(&self, call: &Call) -> Option<Forecast> {
        let scope = self.inner.scopes.get(call.scope.index())?;
        let demand: Demand = call.demand();
        let flow = call.flow;
        let now = self.inner.clock.now();
        let mut st = scope.state.lock();
        if st.closed || st.store.check(&demand).is_err() {
            return None;
        }
        let cooling_until = st.cooldown.active(now);
        if st.queue.is_empty() && cooling_until.is_none() {
            // Nothing ahead and no cooldown: the store's own answer for
            // `now`, without copying it (the common case of a router's
            // question).
            let n = st.store.not_until(&demand, now);
            let fits = n.limited_by.is_none();
            return Some(Forecast {
                ready_at: if fits { Some(now) } else { n.at },
                cooling_until,
                queued: 0,
            });
        }
        let start = cooling_until.unwrap_or(now);
        let ready_at = st.store.project().and_then(|mut shadow| {
            let mut from = start;
            if let Some(ahead) = st.queue.ahead_of(flow.key(), REBUILD_LIMIT) {
                for key in ahead {
                    from = schedule(shadow.as_mut(), &st.queue.get(key)?.demand(), from)?;
                }
            }
            schedule(shadow.as_mut(), &demand, from)
        });
        Some(Forecast {
            ready_at,
            cooling_until,
            queued: st.queued(scope.capacity()),
        })
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::config::{MINUTE, ScopeConfig};
    use crate::deadline::Deadline;

    fn controller() -> AdmissionController {
        AdmissionController::builder()
            .scope(ScopeConfig::new("a").requests(2, MINUTE))
            .build()
            .unwrap()
    }

    // proves: Q-11 (the forecast is the early verdict's projection: free
    // room now, then the refill instant, queued reservations included,
    // and it changes nothing in the scope)
    #[tokio::test(start_paused = true)]
    async fn forecast_follows_refill_and_the_queue_ahead() {
        let c = controller();
        let t0 = tokio::time::Instant::now();
        let at = |c: &AdmissionController| c.forecast(ScopeId::FIRST, None).unwrap();
        assert_eq!(at(&c).ready_at, Some(t0));
        let _a = c.acquire(&Call::new(ScopeId::FIRST), Deadline::NONE).await;
        tokio::time::advance(Duration::from_secs(10)).await;
        let _b = c.acquire(&Call::new(ScopeId::FIRST), Deadline::NONE).await;
        // Full: the first unit comes back one window after the first lease.
        assert_eq!(at(&c).ready_at, Some(t0 + MINUTE));
        assert_eq!(at(&c).ready_at, Some(t0 + MINUTE), "read-only");
        // A queued call takes that instant; the next one is behind it.
        let c2 = c.clone();
        let queued = tokio::spawn(async move {
            c2.acquire(&Call::new(ScopeId::FIRST), Deadline::NONE)
                .await
                .map(drop)
        });
        tokio::task::yield_now().await;
        let f = at(&c);
        assert_eq!(f.queued, 1);
        assert_eq!(f.ready_at, Some(t0 + MINUTE + Duration::from_secs(10)));
        assert_eq!(f.cooling_until, None);
        queued.abort();
        // A demand that never fits has no forecast.
        let big = AdmissionController::builder()
            .scope(ScopeConfig::new("t").tokens(10, MINUTE))
            .build()
            .unwrap();
        assert_eq!(
            big.forecast(ScopeId::FIRST, Some(TokenEstimate::new(20, 0))),
            None
        );
    }
}

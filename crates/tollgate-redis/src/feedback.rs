//! Provider feedback and cooldowns kept in the store (SPEC DQ-9): what one
//! replica learns from a provider's answer is counted in the shared
//! window, and a provider 429 pauses every replica (`observe.lua`,
//! `cool.lua`).

use std::time::Duration;

use tollgate::quota::{BudgetReport, Observed, OpId, Reservation, StoreError};

use crate::limits::{dimension_code, micros_down, micros_up};
use crate::quota::{RedisQuota, num};
use crate::reply;
use crate::scripts::Op;

impl RedisQuota {
    /// See [`RemoteQuota::observe`](tollgate::quota::RemoteQuota::observe).
    pub(crate) async fn observe_now(
        &self,
        reports: Vec<BudgetReport>,
        (leased, recounted): (Reservation, Reservation),
        (ago, lead): (Duration, Duration),
        op: OpId,
        budget: Duration,
    ) -> Result<Vec<Observed>, StoreError> {
        if reports.iter().all(|r| r.remaining.is_none()) {
            return Ok(vec![Observed::default(); reports.len()]);
        }
        // Rounded down: the response began no earlier than the store says.
        let mut extra = vec![
            num(leased.tick),
            num(recounted.tick),
            num(micros_down(ago)),
            // From the lease's answer to the response: the response's
            // instant by the lease's (early by the answer's trip back).
            num(micros_down(lead)),
            leased.seq.to_string(),
            reports.len().to_string(),
        ];
        for r in &reports {
            extra.push(dimension_code(r.dimension).to_owned());
            // -1: no remaining budget reported, nothing to compare.
            extra.push(r.remaining.map_or_else(|| "-1".to_owned(), num));
            extra.push(num(r.reset.map_or(0, micros_up)));
        }
        let demand = leased.demand;
        let answer: Vec<i64> = self
            .run(Op::Observe, |d| demand.amount(d), &extra, Some(op), budget)
            .await?;
        reply::observed(&answer, reports.len())
    }

    /// See [`RemoteQuota::cool_down`](tollgate::quota::RemoteQuota::cool_down).
    pub(crate) async fn cool_down_now(
        &self,
        answered: Reservation,
        length: Duration,
        op: OpId,
        budget: Duration,
    ) -> Result<Option<Duration>, StoreError> {
        let extra = [
            num(answered.tick),
            num(micros_up(length)),
            answered.seq.to_string(),
        ];
        let left: i64 = self.run(Op::Cool, |_| 0, &extra, Some(op), budget).await?;
        if left < 0 {
            return Ok(None);
        }
        Ok(Some(Duration::from_micros(reply::instant(left)?)))
    }
}

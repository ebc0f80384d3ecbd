//! The attempt loop of a model with several deployments (SPEC GW-11,
//! RT-1..RT-6): pick, attempt, and on a retryable failure either move to
//! another deployment at once or wait out the model's backoff.

use std::future::Future;

use tollgate::clock::Instant;
use tollgate::lifecycle::{CallError, CallOptions, CircuitState, Decision, GiveUp};
use tollgate::{Deadline, Phase};
use tollgate::{Flow, TokenEstimate};

use super::in_flight::InFlightGuard;
use super::pick::{Candidate, pick};
use crate::state::{Deployment, Model};

/// A call that one of a model's deployments served.
#[derive(Debug)]
pub struct Routed<T> {
    /// What the supervisor returned (a completed call, or a stream).
    pub value: T,
    /// The index of the deployment in [`Model::deployments`].
    pub deployment: usize,
    /// Counts the attempt in flight on that deployment until dropped; a
    /// stream keeps it for its whole life.
    pub in_flight: InFlightGuard,
}

/// A routed call that failed: the error and the deployment of its last
/// attempt, if one was chosen.
#[derive(Debug)]
pub struct Unrouted {
    /// Why the call failed.
    pub error: CallError,
    /// The deployment of the last attempt.
    pub deployment: Option<usize>,
}

/// What this call learned about each deployment.
#[derive(Debug, Clone, Copy, Default)]
struct Seen {
    /// An attempt failed there.
    failed: bool,
    /// Its circuit refused the call (open, or half-open with its probes
    /// taken): skipped for the rest of the call.
    refused: bool,
}

/// What each deployment says now, for [`pick`].
fn candidates(
    model: &Model,
    estimate: &(dyn Fn(&Deployment) -> TokenEstimate + Sync),
    flow: Flow,
    seen: &[Seen],
) -> Vec<Candidate> {
    let forecasts: Vec<_> = model
        .deployments
        .iter()
        .map(|d| {
            // With its price: a deployment whose account budget is spent
            // is not the soonest (SPEC BUD-2).
            let mut call = tollgate::Call::new(d.scope);
            call.estimate = Some(estimate(d));
            call.price = d.price.map(|p| p.reserve_price());
            call.flow = flow;
            d.supervisor.controller().forecast_call(&call)
        })
        .collect();
    // Read after every forecast: a deployment that can start at once has a
    // `ready_at` at or before this instant, so its wait is exactly zero.
    let now = Instant::now();
    model
        .deployments
        .iter()
        .zip(forecasts)
        .zip(seen)
        .map(|((d, f), seen)| Candidate {
            wait: f
                .and_then(|f| f.ready_at)
                .map(|t| t.saturating_duration_since(now)),
            cooling: f.is_some_and(|f| f.cooling_until.is_some_and(|u| u > now)),
            open: seen.refused || d.breaker.state() == CircuitState::Open,
            failed: seen.failed,
            in_flight: d.in_flight.get(),
            weight: d.weight,
        })
        .collect()
}

/// Runs `attempt` on the deployments of `model` until one succeeds or the
/// call gives up (SPEC GW-11). `estimate` gives a deployment's token
/// estimate of the request and `flow` the call's flow (for the projection:
/// what certainly goes before a call of that flow, SPEC FAIR-4).
///
/// With one deployment, `attempt` runs once: that deployment's supervisor
/// retries as configured. With several, each supervisor makes one attempt
/// and this loop applies the model's policy: a retryable failure moves to
/// the best deployment that has not failed yet at once, or, when none is
/// left, sleeps the policy's delay (never past the deadline) and picks
/// again. A deployment whose circuit opened meanwhile costs no attempt.
///
/// # Cancel safety
///
/// Dropping the future drops the attempt in flight, which cancels it and
/// returns its permits (the supervisor's guarantee).
pub async fn route<T, F, Fut>(
    model: &Model,
    estimate: &(dyn Fn(&Deployment) -> TokenEstimate + Sync),
    options: CallOptions,
    flow: Flow,
    mut attempt: F,
) -> Result<Routed<T>, Unrouted>
where
    F: FnMut(&Deployment) -> Fut,
    Fut: Future<Output = Result<T, CallError>>,
{
    if let [only] = model.deployments.as_slice() {
        let in_flight = only.in_flight.enter();
        return match attempt(only).await {
            Ok(value) => Ok(Routed {
                value,
                deployment: 0,
                in_flight,
            }),
            Err(error) => Err(Unrouted {
                error,
                deployment: Some(0),
            }),
        };
    }
    let mut seen = vec![Seen::default(); model.deployments.len()];
    let mut attempts = 0u32;
    let mut last: Option<Unrouted> = None;
    loop {
        let Some(i) = pick(&candidates(model, estimate, flow, &seen)) else {
            return Err(last.unwrap_or_else(|| Unrouted {
                error: every_circuit_open(),
                deployment: None,
            }));
        };
        let d = &model.deployments[i];
        let in_flight = d.in_flight.enter();
        let error = match attempt(d).await {
            Ok(value) => {
                return Ok(Routed {
                    value,
                    deployment: i,
                    in_flight,
                });
            }
            Err(e) => e,
        };
        drop(in_flight);
        let unrouted = |error| Unrouted {
            error,
            deployment: Some(i),
        };
        let error = match error {
            // Its circuit refused the call (opened since the choice, or
            // half-open with its probes taken): no attempt was made.
            CallError::CircuitOpen(_) => {
                seen[i].refused = true;
                last = Some(unrouted(error));
                continue;
            }
            CallError::Provider { error, .. } => error,
            other => return Err(unrouted(other)),
        };
        attempts += 1;
        seen[i].failed = true;
        let now = Instant::now();
        let decision = model.policy.decide(
            attempts,
            &error,
            options.idempotent,
            now,
            options.deadline,
            model.jitter.sample(),
        );
        let give_up = |gave_up| {
            unrouted(CallError::Provider {
                error: error.clone(),
                attempts,
                gave_up,
            })
        };
        // A delay too long for `max_wait` or the deadline only stops the
        // call when no other deployment can take the next attempt at once.
        let delay = match decision {
            Decision::GiveUp(
                g @ (GiveUp::NotRetryable | GiveUp::NotIdempotent | GiveUp::Exhausted),
            ) => return Err(give_up(g)),
            Decision::GiveUp(g @ (GiveUp::WaitTooLong | GiveUp::Deadline)) => Err(g),
            Decision::Retry(delay) => Ok(delay),
        };
        let fresh = candidates(model, estimate, flow, &seen)
            .iter()
            .any(|c| !c.open && !c.cooling && !c.failed);
        if !fresh {
            // Every deployment was tried: back off as one upstream would.
            let delay = delay.map_err(give_up)?;
            sleep(now, delay, options.deadline)
                .await
                .map_err(unrouted)?;
            for s in &mut seen {
                s.failed = false;
            }
        }
        last = Some(unrouted(CallError::Provider {
            error,
            attempts,
            gave_up: GiveUp::Exhausted,
        }));
    }
}

/// Sleeps `delay` from `now`, never past the deadline (SPEC RT-6).
async fn sleep(
    now: Instant,
    delay: std::time::Duration,
    deadline: Deadline,
) -> Result<(), CallError> {
    let wake = now.checked_add(delay).unwrap_or(now);
    let until = deadline.instant().map_or(wake, |d| d.min(wake));
    tokio::time::sleep_until(until).await;
    deadline.check(Instant::now(), Phase::RetryDelay)?;
    Ok(())
}

/// `CircuitOpen` for a model whose every deployment's circuit is open.
fn every_circuit_open() -> CallError {
    CallError::CircuitOpen(tollgate::lifecycle::CircuitOpen { retry_at: None })
}

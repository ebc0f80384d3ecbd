//! Property tests of settlement and refunds against the controller's
//! observable availability, for every algorithm (SPEC, CD-3): the
//! snapshot must move by exactly what each step gives back or takes.

mod common;

use std::time::Duration;

use common::settle;
use proptest::prelude::*;
use tollgate::config::{Algorithm, ScopeConfig};
use tollgate::quota::Dimension;
use tollgate::{
    AdmissionController, Call, Deadline, Lease, ScopeId, Snapshot, TokenEstimate, Usage,
};

const W: Duration = Duration::from_secs(60);
const REQUESTS: u64 = 20;
/// Enough for every holder and waiter of the preemption test at once.
const TOKENS: u64 = 200;

/// What the provider reports for one attempt.
#[derive(Debug, Clone, Copy)]
enum Reported {
    Unknown,
    Zero,
    /// `percent`% of the estimate (rounded down), at most the estimate.
    Below {
        percent: u64,
    },
    Exact,
    /// The estimate plus `extra` tokens.
    Above {
        extra: u64,
    },
}

#[derive(Debug, Clone)]
enum Op {
    Acquire { tokens: u64 },
    Settle { idx: usize, reported: Reported },
    Release { idx: usize },
    RateLimited { idx: usize, hint_ms: Option<u64> },
    Advance { ms: u64 },
}

fn reported() -> impl Strategy<Value = Reported> {
    prop_oneof![
        Just(Reported::Unknown),
        Just(Reported::Zero),
        (0u64..100).prop_map(|percent| Reported::Below { percent }),
        Just(Reported::Exact),
        (1u64..30).prop_map(|extra| Reported::Above { extra }),
    ]
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (1u64..80).prop_map(|tokens| Op::Acquire { tokens }),
        4 => (0usize..8, reported()).prop_map(|(idx, reported)| Op::Settle { idx, reported }),
        2 => (0usize..8).prop_map(|idx| Op::Release { idx }),
        1 => (0usize..8, prop::option::of(0u64..4_000)).prop_map(|(idx, hint_ms)| Op::RateLimited { idx, hint_ms }),
        2 => (0u64..500).prop_map(|ms| Op::Advance { ms }),
    ]
}

fn controller(algorithm: Algorithm, concurrency: Option<u64>) -> AdmissionController {
    let mut b = AdmissionController::builder().scope(
        ScopeConfig::new("p")
            .requests(REQUESTS, W)
            .tokens(TOKENS, W)
            .algorithm(algorithm),
    );
    if let Some(c) = concurrency {
        b = b.concurrency(c);
    }
    b.build().unwrap()
}

fn call(tokens: u64) -> Call {
    Call::new(ScopeId::FIRST).with_estimate(TokenEstimate::new(tokens, 0))
}

/// (available requests, available tokens, token capacity) of the scope.
fn avail(s: &Snapshot) -> (i64, i64, i64) {
    let limit = |d: Dimension| {
        s.scopes[0]
            .limits
            .iter()
            .find(|l| l.dimension == d)
            .copied()
            .unwrap()
    };
    let tokens = limit(Dimension::Tokens);
    (
        limit(Dimension::Requests).available,
        tokens.available,
        tokens.capacity as i64,
    )
}

struct Held {
    lease: Lease,
    estimate: u64,
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    // proves: Q-5 (settling moves the controller's available tokens by
    // exactly the refund or the debt: known usage below the estimate gives
    // the difference back, above it takes the excess (availability may go
    // negative), known zero gives every token back, unknown changes
    // nothing; the request unit never comes back; each attempt settles
    // once), Q-9 (an admission given up before its lease restores both
    // dimensions exactly; releasing a lease gives no quota back; nothing
    // leaks once all is dropped)
    //
    // Everything happens within one window W, so no counted amount ages
    // out between two observations; the token bucket refills meanwhile, and
    // a refund never lifts it above its capacity.
    #[test]
    fn settlement_moves_availability_by_exactly_the_refund_or_debt(
        algorithm in common::algorithm(),
        concurrency in prop::option::of(1u64..4),
        ops in prop::collection::vec(op(), 1..80),
    ) {
        common::paused_runtime().block_on(async move {
            let c = controller(algorithm, concurrency);
            let bucket = matches!(algorithm, Algorithm::TokenBucket { .. });
            let mut held: Vec<Held> = Vec::new();
            for op in ops {
                let (req0, tok0, cap) = avail(&c.snapshot());
                match op {
                    Op::Acquire { tokens } => {
                        let acquire = c.acquire(&call(tokens), Deadline::NONE);
                        // Admitted at once, or given up at once.
                        let admitted = tokio::time::timeout(Duration::ZERO, acquire).await;
                        let (req1, tok1, _) = avail(&c.snapshot());
                        match admitted {
                            Ok(Ok(lease)) => {
                                prop_assert_eq!((req1, tok1), (req0 - 1, tok0 - tokens as i64));
                                held.push(Held { lease, estimate: tokens });
                            }
                            _ => prop_assert_eq!((req1, tok1), (req0, tok0), "given up: all back"),
                        }
                    }
                    Op::Settle { idx, reported } => {
                        let Some(h) = held.get_mut(idx) else { continue };
                        let est = h.estimate;
                        let usage = match reported {
                            Reported::Unknown => Usage::UNKNOWN,
                            Reported::Zero => Usage::known(0),
                            Reported::Below { percent } => Usage::known(est * percent / 100),
                            Reported::Exact => Usage::known(est),
                            Reported::Above { extra } => Usage::known(est + extra),
                        };
                        let first = !h.lease.is_reconciled();
                        let settled = h.lease.reconcile(usage);
                        let (req1, tok1, _) = avail(&c.snapshot());
                        prop_assert_eq!(req1, req0, "the request unit stays spent");
                        let Ok(s) = settled else {
                            prop_assert!(!first);
                            prop_assert_eq!(tok1, tok0, "a second settlement changes nothing");
                            continue;
                        };
                        prop_assert!(first);
                        let (refund, debt) = match usage.total() {
                            None => (0, 0),
                            Some(actual) => (est.saturating_sub(actual), actual.saturating_sub(est)),
                        };
                        prop_assert_eq!((s.refunded, s.debt), (refund, debt));
                        let expected = if debt > 0 {
                            tok0 - debt as i64
                        } else if bucket {
                            (tok0 + refund as i64).min(cap)
                        } else {
                            tok0 + refund as i64
                        };
                        prop_assert_eq!(tok1, expected, "{:?} of estimate {}", reported, est);
                    }
                    Op::Release { idx } => {
                        if idx < held.len() {
                            drop(held.remove(idx));
                            prop_assert_eq!(avail(&c.snapshot()), (req0, tok0, cap));
                        }
                    }
                    Op::RateLimited { idx, hint_ms } => {
                        if let Some(h) = held.get(idx) {
                            h.lease.rate_limited(hint_ms.map(Duration::from_millis));
                        }
                        prop_assert_eq!(avail(&c.snapshot()), (req0, tok0, cap));
                    }
                    Op::Advance { ms } => tokio::time::advance(Duration::from_millis(ms)).await,
                }
                for l in &c.snapshot().scopes[0].limits {
                    prop_assert!(l.available <= l.capacity as i64, "{:?} above capacity", l.dimension);
                }
            }
            drop(held);
            tokio::time::sleep(W * 8).await;
            let s = c.snapshot();
            prop_assert!(s.is_idle());
            for l in &s.scopes[0].limits {
                prop_assert_eq!(l.available, l.capacity as i64);
            }
            Ok(())
        })?;
    }

    // proves: CD-3, Q-9 (a cooldown that begins while granted attempts wait
    // for a concurrency permit preempts each of them when its permit comes:
    // the permit is passed on and both quota dimensions are refunded
    // exactly once; they re-enter admission and are admitted once the
    // cooldown ends, taking their quota once more)
    #[test]
    fn preemption_refunds_both_dimensions_exactly_once(
        algorithm in common::algorithm(),
        holders in prop::collection::vec(1u64..30, 1..4),
        waiters in prop::collection::vec(1u64..25, 1..5),
        reporter in 0usize..4,
        hint_ms in prop::option::of(1u64..10_000),
    ) {
        common::paused_runtime().block_on(async move {
            let c = controller(algorithm, Some(holders.len() as u64));
            let mut held = Vec::new();
            for &t in &holders {
                held.push(c.acquire(&call(t), Deadline::NONE).await.unwrap());
            }
            let (req0, tok0, _) = avail(&c.snapshot());
            let mut tasks = Vec::new();
            for &t in &waiters {
                let c = c.clone();
                tasks.push(tokio::spawn(async move {
                    let lease = c.acquire(&call(t), Deadline::NONE).await.unwrap();
                    let (req, tok, _) = avail(&c.snapshot());
                    (*lease.admission(), lease.generation(), req, tok)
                }));
                settle().await;
            }
            let total: u64 = waiters.iter().sum();
            let n = waiters.len();
            let s = c.snapshot();
            prop_assert_eq!(s.scopes[0].pending, n, "granted, waiting for permits");
            prop_assert_eq!(avail(&s), (req0 - n as i64, tok0 - total as i64, avail(&s).2));
            // A 429 of a started attempt begins a cooldown.
            let reporter = reporter % held.len();
            let started = held[reporter].rate_limited(hint_ms.map(Duration::from_millis));
            prop_assert!(started.until().is_some(), "{:?}", started);
            // The permits are handed on one by one, and each waiter is
            // preempted in turn.
            held.clear();
            for _ in 0..n + 1 {
                settle().await;
            }
            let s = c.snapshot();
            prop_assert_eq!(s.scopes[0].pending, 0);
            prop_assert_eq!(s.scopes[0].queued, n, "back in the queue");
            prop_assert_eq!(s.scopes[0].counters.preempted, n as u64);
            prop_assert_eq!(s.scopes[0].counters.refunded_reservations, n as u64);
            prop_assert_eq!(s.active, 0, "no permit held by a preempted call");
            prop_assert_eq!((avail(&s).0, avail(&s).1), (req0, tok0), "both dimensions refunded");
            for t in tasks {
                let (admission, generation, _, _) = t.await.unwrap();
                prop_assert_eq!(admission.preemptions, 1);
                prop_assert!(admission.cooldown);
                prop_assert_eq!(generation, 1);
            }
            let s = c.snapshot();
            prop_assert_eq!(s.scopes[0].counters.refunded_reservations, n as u64, "exactly once");
            prop_assert_eq!(s.scopes[0].counters.admitted, (holders.len() + n) as u64);
            let reserved: u64 = holders.iter().sum::<u64>() + total;
            prop_assert_eq!(s.scopes[0].counters.tokens_reserved, reserved);
            prop_assert!(s.is_idle());
            Ok(())
        })?;
    }
}

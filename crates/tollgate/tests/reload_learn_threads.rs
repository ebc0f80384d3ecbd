//! Reloads, learned limits and cancellations at random while many threads
//! admit, settle and report provider answers on a real clock (SPEC GW-15,
//! asserts invariants at the end only, never timings.
//! Every call finishes (admitted, or refused with a typed error by its
//! deadline: none is stranded), nothing leaks (idle, every limit whole
//! again once its window has passed), and `close()` completes.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use tokio::time::Instant;
use tollgate::config::{Algorithm, ControllerConfig, ScopeConfig};
use tollgate::quota::Dimension;
use tollgate::{
    AdmissionController, AdmissionError, BudgetReport, Call, Deadline, ScopeId, TokenEstimate,
    Usage,
};

use common::assert_idle;

const WINDOW: Duration = Duration::from_millis(30);
const TASKS: usize = 16;
const ROUNDS: usize = 40;
const RELOADS: usize = 40;

/// A small deterministic generator (xorshift64*).
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D) % n
    }
}

/// Configuration number `n`: scope `a` learns (sometimes with a configured
/// token limit, its window changing), scope `b` has request and token
/// limits whose amounts, windows and algorithm change, or is removed; the
/// concurrency cap goes up, down and away.
fn config(n: u64) -> ControllerConfig {
    let learn = if n.is_multiple_of(2) {
        WINDOW
    } else {
        WINDOW * 2
    };
    let mut a = ScopeConfig::new("a").learn_limits(learn);
    if n % 3 == 1 {
        a = a.tokens(60 + 20 * (n % 4), WINDOW);
    }
    let b = ScopeConfig::new("b")
        .requests(
            2 + n % 5,
            if n.is_multiple_of(4) {
                WINDOW / 2
            } else {
                WINDOW
            },
        )
        .algorithm(match n % 3 {
            0 => Algorithm::SlidingWindow,
            1 => Algorithm::TokenBucket { burst: None },
            _ => Algorithm::FixedWindow,
        });
    let b = if n % 5 == 2 {
        b
    } else {
        b.tokens(40 + 30 * (n % 3), WINDOW)
    };
    let scopes = if n % 6 == 5 { vec![a] } else { vec![a, b] };
    ControllerConfig {
        scopes,
        concurrency: match n % 4 {
            0 => None,
            k => Some(k * 2),
        },
        max_wait: Some(Duration::from_millis(100)),
        ..ControllerConfig::default()
    }
}

/// One answer for `a` advertising `limit` tokens, `remaining` of them
/// left, whole again within a window.
fn report(limit: u64, remaining: Option<u64>) -> [BudgetReport; 2] {
    [
        BudgetReport {
            dimension: Dimension::Requests,
            limit: Some(1_000),
            remaining: None,
            reset: None,
        },
        BudgetReport {
            dimension: Dimension::Tokens,
            limit: Some(limit),
            remaining,
            reset: remaining.map(|_| WINDOW),
        },
    ]
}

async fn worker(
    c: AdmissionController,
    b: ScopeId,
    seed: u64,
    closed: Arc<AtomicBool>,
    admitted: Arc<AtomicUsize>,
) {
    let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
    for _ in 0..ROUNDS {
        let scope = if rng.below(2) == 0 { ScopeId::FIRST } else { b };
        let estimate = 1 + rng.below(30);
        let call = Call::new(scope).with_estimate(TokenEstimate::new(estimate, 0));
        let deadline =
            Deadline::from_timeout(Some(Duration::from_millis(rng.below(80))), Instant::now());
        let acquire = c.acquire(&call, deadline);
        // Some give up while waiting: nothing may be left behind.
        let lease = if rng.below(6) == 0 {
            match tokio::time::timeout(Duration::from_micros(rng.below(3_000)), acquire).await {
                Ok(r) => r,
                Err(_) => continue,
            }
        } else {
            acquire.await
        };
        let mut lease = match lease {
            Ok(lease) => lease,
            Err(AdmissionError::Closed) => {
                assert!(closed.load(Ordering::SeqCst), "Closed before close()");
                continue;
            }
            Err(_) => continue,
        };
        admitted.fetch_add(1, Ordering::Relaxed);
        tokio::time::sleep(Duration::from_micros(rng.below(2_000))).await;
        if scope == ScopeId::FIRST && rng.below(2) == 0 {
            // The provider answers: limits flapping, sometimes less left.
            let now = Instant::now();
            lease.counted_by(now);
            let limit = [40, 80, 120, 200][rng.below(4) as usize];
            let remaining = (rng.below(3) == 0).then(|| rng.below(limit));
            for r in report(limit, remaining) {
                c.observe_answer(&lease, &r, now);
            }
            c.provider_answered(ScopeId::FIRST);
        }
        match rng.below(4) {
            0 => drop(lease),
            1 => {
                let used = rng.below(2 * estimate);
                lease.reconcile(Usage::from_io(used, 0)).expect("once");
            }
            2 => {
                lease.reconcile(Usage::from_io(0, 0)).expect("once");
            }
            _ => {
                let c = c.clone();
                // Settled from another task, later.
                tokio::spawn(async move {
                    tokio::time::sleep(Duration::from_micros(500)).await;
                    lease.reconcile(Usage::UNKNOWN).expect("once");
                    drop(c);
                });
            }
        }
    }
}

fn run(seed: u64) {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let c = AdmissionController::new(config(0)).unwrap();
        let b = c.scope_id("b").unwrap();
        let closed = Arc::new(AtomicBool::new(false));
        let admitted = Arc::new(AtomicUsize::new(0));
        let workers: Vec<_> = (0..TASKS)
            .map(|t| {
                tokio::spawn(worker(
                    c.clone(),
                    b,
                    seed * 1_000 + t as u64,
                    closed.clone(),
                    admitted.clone(),
                ))
            })
            .collect();
        let reloader = {
            let c = c.clone();
            tokio::spawn(async move {
                let mut rng = Rng(seed | 1);
                for _ in 0..RELOADS {
                    tokio::time::sleep(Duration::from_micros(rng.below(3_000))).await;
                    c.reconfigure(config(rng.below(60))).unwrap();
                }
            })
        };
        // Every call has a deadline under 100 ms: a worker still running
        // after 30 s holds a stranded call.
        for w in workers {
            tokio::time::timeout(Duration::from_secs(30), w)
                .await
                .expect("a call stranded")
                .expect("no panic");
        }
        reloader.await.unwrap();
        // The run exercised admission, not only refusals.
        assert!(admitted.load(Ordering::Relaxed) >= TASKS, "seed {seed}");
        // Settlements spawned last.
        tokio::time::sleep(Duration::from_millis(5)).await;
        c.reconfigure(config(0)).unwrap();
        assert_idle(&c);
        // Every window (transitional ones too) has passed: each limit is
        // whole again, learned ones included.
        tokio::time::sleep(WINDOW * 6).await;
        let s = c.snapshot();
        for scope in &s.scopes {
            for l in &scope.limits {
                assert_eq!(
                    l.available,
                    i64::try_from(l.capacity).unwrap(),
                    "{}: {l:?} not whole (seed {seed})",
                    scope.name
                );
            }
        }
        closed.store(true, Ordering::SeqCst);
        tokio::time::timeout(Duration::from_secs(5), c.close())
            .await
            .expect("close() completes");
    });
}

// proves: GW-15, Q-9, Q-13, Q-14 (reloads of limits, windows, algorithms,
// the concurrency cap and a scope's presence, learned limits flapping,
// remaining-budget reports and cancellations at random, on a real clock
// and many threads: every call finishes by its deadline, nothing is left
// held or counted once the windows have passed, `close()` completes)
#[test]
fn reloads_learning_and_cancellations_leave_nothing_behind() {
    let runs: u64 = std::env::var("TOLLGATE_STRESS_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3);
    for seed in 1..=runs {
        run(seed);
    }
}

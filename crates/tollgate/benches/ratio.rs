//! Interleaved cost ratios of the uncontended fast path (a scripted run,
//! not criterion).
//!
//! `cargo bench -p tollgate --bench ratio`
//!
//! On a shared machine the speed of the whole core drifts by ±15 % from
//! one second to the next, which moves criterion's separate measurements of
//! the semaphore and the lease apart. Here every round times one batch of
//! each variant back to back (the order rotating from round to round) and
//! keeps the ratios of the same round, so a drift that lasts longer than a
//! round cancels out. Reported: the median cost of each variant and the
//! median (with the quartiles) of the per-round ratios.
//!
//! Variants, as in `benches/admission.rs`: a bare `tokio::sync::Semaphore`
//! acquire + release; a lease with RPM, TPM and a concurrency limit
//! configured; the same with its usage settled before the release; the
//! same with a deadline.

use std::future::Future;
use std::hint::black_box;
use std::pin::Pin;
use std::time::{Duration, Instant};

use tokio::sync::Semaphore;
use tollgate::{Deadline, Usage};

mod common;
use common::{uncontended_call, uncontended_controller};

const BATCH: u32 = 20_000;
const ROUNDS: usize = 60;

type Op<'a> = Box<dyn Fn() -> Pin<Box<dyn Future<Output = ()> + 'a>> + 'a>;

fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

fn quartiles(values: &mut [f64]) -> (f64, f64, f64) {
    values.sort_by(f64::total_cmp);
    let n = values.len();
    (values[n / 4], values[n / 2], values[3 * n / 4])
}

/// Runs one batch inside a single `block_on`, as criterion's `to_async`
/// does.
fn batch(rt: &tokio::runtime::Runtime, op: &Op<'_>) -> Duration {
    let start = Instant::now();
    rt.block_on(op());
    start.elapsed()
}

fn main() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let sem = Semaphore::new(64);
    let controller = uncontended_controller();
    let call = uncontended_call();

    let variants: Vec<(&str, Op<'_>)> = vec![
        (
            "semaphore",
            Box::new(|| {
                Box::pin(async {
                    for _ in 0..BATCH {
                        let permit = sem.acquire().await.expect("open");
                        black_box(&permit);
                        drop(permit);
                    }
                })
            }),
        ),
        (
            "lease",
            Box::new(|| {
                Box::pin(async {
                    for _ in 0..BATCH {
                        let lease = controller
                            .acquire(&call, Deadline::NONE)
                            .await
                            .expect("admitted");
                        black_box(&lease);
                        drop(lease);
                    }
                })
            }),
        ),
        (
            "lease_reconciled",
            Box::new(|| {
                Box::pin(async {
                    for _ in 0..BATCH {
                        let mut lease = controller
                            .acquire(&call, Deadline::NONE)
                            .await
                            .expect("admitted");
                        black_box(lease.reconcile(Usage::from_io(100, 20)).expect("once"));
                        drop(lease);
                    }
                })
            }),
        ),
        (
            "lease_with_deadline",
            Box::new(|| {
                Box::pin(async {
                    for _ in 0..BATCH {
                        let deadline = Deadline::from_timeout(
                            Some(Duration::from_secs(30)),
                            tokio::time::Instant::now(),
                        );
                        let lease = controller.acquire(&call, deadline).await.expect("admitted");
                        black_box(&lease);
                        drop(lease);
                    }
                })
            }),
        ),
    ];

    for (_, op) in &variants {
        batch(&rt, op);
    }
    let mut per_op: Vec<Vec<f64>> = vec![Vec::new(); variants.len()];
    for round in 0..ROUNDS {
        let mut times = vec![0.0; variants.len()];
        for k in 0..variants.len() {
            let i = (round + k) % variants.len();
            let elapsed = batch(&rt, &variants[i].1);
            times[i] = elapsed.as_nanos() as f64 / f64::from(BATCH);
        }
        for (i, t) in times.iter().enumerate() {
            per_op[i].push(*t);
        }
    }

    println!("{ROUNDS} rounds of {BATCH} operations per variant, order rotating");
    for (i, (name, _)) in variants.iter().enumerate() {
        let mut v = per_op[i].clone();
        println!("{name:<22} median {:7.1} ns", median(&mut v));
    }
    let ratio = |a: usize, b: usize| -> Vec<f64> {
        per_op[a]
            .iter()
            .zip(&per_op[b])
            .map(|(x, y)| x / y)
            .collect()
    };
    for (label, a, b) in [
        ("lease / semaphore", 1, 0),
        ("reconciled / lease", 2, 1),
        ("with deadline / lease", 3, 1),
    ] {
        let (q1, m, q3) = quartiles(&mut ratio(a, b));
        println!("{label:<22} median {m:.3}  (quartiles {q1:.3}–{q3:.3})");
    }
}

//! Admission hot path (criterion).
//!
//! * `uncontended/*`: one acquire + release of a lease with RPM, TPM and a
//!   concurrency limit configured, next to a bare `tokio::sync::Semaphore`
//!   acquire + release measured in the same run; the same with the usage
//!   settled (`reconcile`) before the release, and with a deadline.
//! * `contended/*`: 10,000 tasks on a 2-thread runtime sharing one scope;
//!   see `benches/contended.rs` for the FIFO-checked throughput run.

use std::hint::black_box;

use criterion::{Criterion, criterion_group, criterion_main};
use tokio::sync::Semaphore;
use tollgate::{Deadline, Usage};

mod common;
use common::{uncontended_call, uncontended_controller};

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

fn uncontended(c: &mut Criterion) {
    let rt = runtime();
    let mut group = c.benchmark_group("uncontended");

    let sem = Semaphore::new(64);
    group.bench_function("tokio_semaphore", |b| {
        b.to_async(&rt).iter(|| async {
            let permit = sem.acquire().await.unwrap();
            black_box(&permit);
            drop(permit);
        })
    });

    let controller = rt.block_on(async { uncontended_controller() });
    let call = uncontended_call();
    group.bench_function("tollgate_lease", |b| {
        b.to_async(&rt).iter(|| async {
            let lease = controller.acquire(&call, Deadline::NONE).await.unwrap();
            black_box(&lease);
            drop(lease);
        })
    });
    group.bench_function("tollgate_lease_reconciled", |b| {
        b.to_async(&rt).iter(|| async {
            let mut lease = controller.acquire(&call, Deadline::NONE).await.unwrap();
            black_box(lease.reconcile(Usage::from_io(100, 20)).unwrap());
            drop(lease);
        })
    });
    let deadline_call = call;
    group.bench_function("tollgate_lease_with_deadline", |b| {
        b.to_async(&rt).iter(|| async {
            let deadline = Deadline::from_timeout(
                Some(std::time::Duration::from_secs(30)),
                tokio::time::Instant::now(),
            );
            let lease = controller.acquire(&deadline_call, deadline).await.unwrap();
            black_box(&lease);
            drop(lease);
        })
    });
    group.finish();
}

criterion_group!(benches, uncontended);
criterion_main!(benches);

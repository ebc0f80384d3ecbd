//! Contended admission throughput with a FIFO check (a scripted run, not
//! criterion: it reports admissions per second of wall time).
//!
//! `cargo bench -p tollgate --bench contended`
//!
//! * `throughput`: 10,000 tasks on a 2-thread runtime share one scope (RPM,
//!   TPM configured, not binding) and a concurrency limit of 256; each task
//!   acquires and releases 100 leases. Every lease reports its arrival
//!   ticket and its grant order in the scope; FIFO holds when sorting by
//!   grant order leaves the tickets strictly increasing.
//! * `serial`: the same with a concurrency limit of 1, so leases are held
//!   one at a time and the order in which holders observe their tickets is
//!   itself checked (every admission is a hand-over between tasks).

use std::sync::Arc;
use std::time::Instant;

use parking_lot::Mutex;
use tollgate::config::{MINUTE, ScopeConfig};
use tollgate::{AdmissionController, Call, Deadline, ScopeId, TokenEstimate};

const TASKS: usize = 10_000;

fn controller(concurrency: u64) -> AdmissionController {
    AdmissionController::builder()
        .scope(
            ScopeConfig::new("main")
                .requests(1 << 50, MINUTE)
                .tokens(1 << 60, MINUTE),
        )
        .concurrency(concurrency)
        .queue_capacity(TASKS)
        .build()
        .expect("valid configuration")
}

/// Runs the scenario; returns admissions per second and FIFO inversions.
fn run(concurrency: u64, per_task: usize, serial: bool) -> (f64, usize) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let c = controller(concurrency);
    let tickets = Arc::new(Mutex::new(Vec::with_capacity(TASKS * per_task)));
    let call = Call::new(ScopeId::FIRST).with_estimate(TokenEstimate::new(100, 50));
    let started = Instant::now();
    rt.block_on(async {
        let mut handles = Vec::with_capacity(TASKS);
        for _ in 0..TASKS {
            let (c, tickets) = (c.clone(), tickets.clone());
            handles.push(tokio::spawn(async move {
                let mut entries = Vec::with_capacity(per_task);
                for _ in 0..per_task {
                    let lease = c.acquire(&call, Deadline::NONE).await.expect("admitted");
                    let a = lease.admission();
                    if serial {
                        // Recorded while the only permit is held, so the
                        // recording order is the admission order.
                        tickets.lock().push((0, a.ticket));
                    } else {
                        entries.push((a.grant_order, a.ticket));
                    }
                    drop(lease);
                }
                tickets.lock().extend(entries);
            }));
        }
        for h in handles {
            h.await.expect("task");
        }
    });
    let elapsed = started.elapsed().as_secs_f64();
    let admissions = TASKS * per_task;
    let mut tickets = tickets.lock();
    if !serial {
        // Order by grant; the tickets must then be strictly increasing.
        tickets.sort_unstable_by_key(|e| e.0);
    }
    let inversions = tickets.windows(2).filter(|w| w[0].1 >= w[1].1).count();
    assert!(c.snapshot().is_idle());
    (admissions as f64 / elapsed, inversions)
}

fn main() {
    // `cargo bench` passes `--bench`; nothing else is parsed.
    let (rate, inversions) = run(256, 100, false);
    println!(
        "contended/throughput  tasks={TASKS} concurrency=256 admissions/s={rate:.0} fifo_inversions={inversions}"
    );
    assert_eq!(inversions, 0, "admissions left FIFO order");
    let (rate, inversions) = run(1, 20, true);
    println!(
        "contended/serial      tasks={TASKS} concurrency=1   admissions/s={rate:.0} fifo_inversions={inversions}"
    );
    assert_eq!(inversions, 0, "admissions left FIFO order");
}

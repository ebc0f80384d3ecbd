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
//!
//! Each runs with every call in the default flow (plain FIFO), then with
//! the tasks spread over 10 and 1,000 tenants (SPEC §15): FIFO is then
//! checked within each flow, and permits go to the flow holding the
//! fewest (FAIR-6).

use std::sync::Arc;
use std::time::Instant;

use parking_lot::Mutex;
use tollgate::config::{MINUTE, ScopeConfig};
use tollgate::{AdmissionController, Call, Deadline, Flow, Priority, ScopeId, TokenEstimate};

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

/// CPU time this process has used (user + system), from `/proc/self/stat`
/// (Linux; `None` elsewhere). On a machine shared with other work, rates per
/// CPU second vary far less than rates per wall second.
fn cpu_seconds() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // Fields after the command name (which may hold spaces) start at ')'.
    let rest = stat.rsplit_once(')')?.1;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let utime: f64 = fields.get(11)?.parse().ok()?;
    let stime: f64 = fields.get(12)?.parse().ok()?;
    // The kernel's USER_HZ is 100 on every Linux this runs on.
    Some((utime + stime) / 100.0)
}

/// Runs the scenario over `flows` tenants (0: every call in the default
/// flow); returns admissions per wall second and per CPU second, and FIFO
/// inversions within flows.
fn run(concurrency: u64, per_task: usize, serial: bool, flows: usize) -> (f64, f64, usize) {
    // CONTENDED_RUNTIME=current runs every task on one thread: the same
    // work without lock contention, for counting instructions
    // (`valgrind --tool=callgrind`) on a machine too busy to time.
    let rt = if std::env::var("CONTENDED_RUNTIME").is_ok_and(|v| v == "current") {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime")
    } else {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("runtime")
    };
    let c = controller(concurrency);
    let tickets = Arc::new(Mutex::new(Vec::with_capacity(TASKS * per_task)));
    let started = Instant::now();
    let cpu_started = cpu_seconds();
    rt.block_on(async {
        let mut handles = Vec::with_capacity(TASKS);
        for task in 0..TASKS {
            let (c, tickets) = (c.clone(), tickets.clone());
            let flow = match flows {
                0 => Flow::DEFAULT,
                n => Flow::new((task % n) as u32, Priority::Standard),
            };
            let call = Call::new(ScopeId::FIRST)
                .with_estimate(TokenEstimate::new(100, 50))
                .with_flow(flow);
            handles.push(tokio::spawn(async move {
                let mut entries = Vec::with_capacity(per_task);
                for _ in 0..per_task {
                    let lease = c.acquire(&call, Deadline::NONE).await.expect("admitted");
                    let a = lease.admission();
                    if serial {
                        // Recorded while the only permit is held, so the
                        // recording order is the admission order.
                        tickets.lock().push((flow.tenant(), 0, a.ticket));
                    } else {
                        entries.push((flow.tenant(), a.grant_order, a.ticket));
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
    let cpu = cpu_seconds()
        .zip(cpu_started)
        .map_or(f64::NAN, |(end, start)| end - start);
    let admissions = TASKS * per_task;
    let mut tickets = tickets.lock();
    // Within each flow, by grant (or recording) order: the tickets must
    // then be strictly increasing.
    tickets.sort_by_key(|e| (e.0, e.1));
    let inversions = tickets
        .windows(2)
        .filter(|w| w[0].0 == w[1].0 && w[0].2 >= w[1].2)
        .count();
    assert!(c.snapshot().is_idle());
    (
        admissions as f64 / elapsed,
        admissions as f64 / cpu,
        inversions,
    )
}

fn main() {
    // `cargo bench` passes `--bench`; nothing else is parsed. The
    // environment may pick the flow counts: CONTENDED_FLOWS=0,10.
    let flows: Vec<usize> = std::env::var("CONTENDED_FLOWS")
        .ok()
        .map(|v| v.split(',').filter_map(|n| n.trim().parse().ok()).collect())
        .unwrap_or_else(|| vec![0, 10, 1_000]);
    for flows in flows {
        let label = match flows {
            0 => "fifo".to_string(),
            n => format!("{n} flows"),
        };
        let (rate, per_cpu, inversions) = run(256, 100, false, flows);
        println!(
            "contended/throughput  {label:>11} tasks={TASKS} concurrency=256 admissions/s={rate:.0} per_cpu_s={per_cpu:.0} fifo_inversions={inversions}"
        );
        assert_eq!(inversions, 0, "admissions left FIFO order within a flow");
        let (rate, per_cpu, inversions) = run(1, 20, true, flows);
        println!(
            "contended/serial      {label:>11} tasks={TASKS} concurrency=1   admissions/s={rate:.0} per_cpu_s={per_cpu:.0} fifo_inversions={inversions}"
        );
        assert_eq!(inversions, 0, "admissions left FIFO order within a flow");
    }
}

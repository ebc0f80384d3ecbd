//! A profiling tool: N uncontended acquire + release cycles, for counting
//! instructions per operation under callgrind (robust to machine load,
//! unlike wall-clock timings).
//!
//! ```sh
//! cargo build --release -p tollgate --example lease_loop
//! valgrind --tool=callgrind --callgrind-out-file=/tmp/cg.0 \
//!     target/release/examples/lease_loop 0
//! valgrind --tool=callgrind --callgrind-out-file=/tmp/cg.n \
//!     target/release/examples/lease_loop 100000
//! # instructions per operation: (total of cg.n - total of cg.0) / 100000
//! ```
//!
//! A second argument `reconcile` settles `Usage::from_io(100, 20)` on
//! each lease before its release. The controller and the call are built
//! exactly as in `benches/common` (RPM and TPM sliding windows, a
//! concurrency limit of 64, one call at a time on a current-thread
//! runtime).

use std::hint::black_box;

use tollgate::config::{MINUTE, ScopeConfig};
use tollgate::{AdmissionController, Call, Deadline, ScopeId, TokenEstimate, Usage};

fn main() {
    let mut args = std::env::args().skip(1);
    let n: u64 = args
        .next()
        .map_or(100_000, |a| a.parse().expect("N: a number of operations"));
    let reconcile = match args.next().as_deref() {
        None | Some("lease") => false,
        Some("reconcile") => true,
        Some(other) => panic!("unknown mode {other:?} (lease or reconcile)"),
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    // As `benches/common/mod.rs`.
    let controller = AdmissionController::builder()
        .scope(
            ScopeConfig::new("main")
                .requests(1 << 60, MINUTE)
                .tokens(1 << 60, MINUTE),
        )
        .concurrency(64)
        .build()
        .expect("valid configuration");
    let call = Call::new(ScopeId::FIRST).with_estimate(TokenEstimate::new(100, 50));
    rt.block_on(async {
        for _ in 0..n {
            let mut lease = controller
                .acquire(&call, Deadline::NONE)
                .await
                .expect("admitted");
            if reconcile {
                black_box(lease.reconcile(Usage::from_io(100, 20)).expect("once"));
            }
            black_box(&lease);
            drop(lease);
        }
    });
}

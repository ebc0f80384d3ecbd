//! Input-token and output-token limits under real concurrency (SPEC Q-12
//! with Q-13): many worker threads on a real clock, tight deadlines and
//! cancellations at the await, settlements below the estimate. Asserts
//! invariants only: no rolling window over either limit, every unit back
//! and nothing held at the end.

mod common;

use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use tokio::time::Instant;
use tollgate::config::ScopeConfig;
use tollgate::{
    AdmissionController, AdmissionError, Call, Deadline, ScopeId, TokenEstimate, Usage,
};

use common::assert_idle;

const WINDOW: Duration = Duration::from_millis(20);
const INPUT: u64 = 600;
const OUTPUT: u64 = 300;
const TASKS: u64 = 32;
const ROUNDS: u64 = 150;

/// One admission: counted somewhere between `before` and `after`, with the
/// input and output tokens finally charged.
#[derive(Debug, Clone, Copy)]
struct Seen {
    before: Instant,
    after: Instant,
    input: u64,
    output: u64,
}

async fn worker(c: AdmissionController, task: u64, seen: Arc<Mutex<Vec<Seen>>>) {
    let mut rng = fastrand::Rng::with_seed(task + 7);
    for _ in 0..ROUNDS {
        let (input, output) = (rng.u64(1..=80), rng.u64(1..=40));
        let call = Call::new(ScopeId::FIRST).with_estimate(TokenEstimate::new(input, output));
        let timeout = if rng.u8(0..8) == 0 {
            Duration::from_micros(rng.u64(0..2_000))
        } else {
            Duration::from_secs(30)
        };
        let deadline = Deadline::from_timeout(Some(timeout), Instant::now());
        let before = Instant::now();
        let acquired = if rng.u8(0..8) == 0 {
            let cut = Duration::from_micros(rng.u64(0..2_000));
            match tokio::time::timeout(cut, c.acquire(&call, deadline)).await {
                Ok(r) => r,
                Err(_) => continue,
            }
        } else {
            c.acquire(&call, deadline).await
        };
        let mut lease = match acquired {
            Ok(lease) => lease,
            Err(AdmissionError::DeadlineExceeded { .. }) => continue,
            Err(e) => panic!("unexpected admission error: {e}"),
        };
        let after = Instant::now();
        tokio::time::sleep(Duration::from_micros(rng.u64(0..300))).await;
        let (used_in, used_out) = (rng.u64(0..=input), rng.u64(0..=output));
        lease
            .reconcile(Usage::from_io(used_in, used_out))
            .expect("settled once");
        drop(lease);
        seen.lock().push(Seen {
            before,
            after,
            input: used_in,
            output: used_out,
        });
    }
}

// proves, Q-13 (input and output limits under many threads on a
// real clock: admissions certainly counted within one window never exceed
// either limit, and every unit is back once the windows pass)
#[test]
fn input_and_output_limits_hold_under_real_threads() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(8)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let c = AdmissionController::builder()
            .scope(
                ScopeConfig::new("io")
                    .input_tokens(INPUT, WINDOW)
                    .output_tokens(OUTPUT, WINDOW),
            )
            .concurrency(8)
            .build()
            .unwrap();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let tasks: Vec<_> = (0..TASKS)
            .map(|t| tokio::spawn(worker(c.clone(), t, Arc::clone(&seen))))
            .collect();
        let joined = tokio::time::timeout(Duration::from_secs(120), async {
            for t in tasks {
                t.await.expect("worker panicked");
            }
        })
        .await;
        assert!(joined.is_ok(), "admissions stalled");

        let mut seen = std::mem::take(&mut *seen.lock());
        assert!(!seen.is_empty());
        seen.sort_by_key(|s| s.before);
        for i in 0..seen.len() {
            let end = seen[i].before + WINDOW;
            let (mut input, mut output) = (0, 0);
            for s in seen[i..].iter().take_while(|s| s.before < end) {
                if s.after < end {
                    input += s.input;
                    output += s.output;
                }
            }
            assert!(input <= INPUT, "{input} input tokens within one window");
            assert!(output <= OUTPUT, "{output} output tokens within one window");
        }

        tokio::time::sleep(3 * WINDOW).await;
        assert_idle(&c);
        for limit in &c.snapshot().scopes[0].limits {
            assert_eq!(
                limit.available, limit.capacity as i64,
                "{:?} not fully back",
                limit.dimension
            );
        }
        tokio::time::timeout(Duration::from_secs(10), c.close())
            .await
            .expect("close resolves");
    });
}

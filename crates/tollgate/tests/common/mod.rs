//! Helpers shared by the integration tests.
#![allow(dead_code)]

use std::time::Duration;

use tokio::time::Instant;
use tollgate::quota::Dimension;
use tollgate::{
    AdmissionController, AdmissionError, Call, Deadline, Lease, ScopeId, Snapshot, TokenEstimate,
};

/// Lets spawned tasks run until they block (current-thread runtime).
pub async fn settle() {
    for _ in 0..20 {
        tokio::task::yield_now().await;
    }
}

/// A current-thread runtime on tokio's paused clock (for property tests,
/// which cannot be `#[tokio::test]`s).
pub fn paused_runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .expect("runtime")
}

/// Any of the three algorithms (SPEC Q-2), for property tests.
pub fn algorithm() -> impl proptest::strategy::Strategy<Value = tollgate::config::Algorithm> {
    use tollgate::config::Algorithm;
    proptest::prop_oneof![
        proptest::strategy::Just(Algorithm::SlidingWindow),
        proptest::strategy::Just(Algorithm::TokenBucket { burst: None }),
        proptest::strategy::Just(Algorithm::FixedWindow),
    ]
}

/// A call on the first scope estimating `tokens` tokens.
pub fn tokens(n: u64) -> Call {
    Call::new(ScopeId::FIRST).with_estimate(TokenEstimate::new(n, 0))
}

/// A call on the first scope without estimate.
pub fn plain() -> Call {
    Call::new(ScopeId::FIRST)
}

/// A deadline `d` from now.
pub fn within(d: Duration) -> Deadline {
    Deadline::from_timeout(Some(d), Instant::now())
}

/// Availability of the first limit of `dim` in the first scope.
pub fn available(c: &AdmissionController, dim: Dimension) -> i64 {
    available_at(&c.snapshot(), 0, dim)
}

/// Availability of the first limit of `dim` in scope number `scope`.
pub fn available_at(s: &Snapshot, scope: usize, dim: Dimension) -> i64 {
    s.scopes[scope]
        .limits
        .iter()
        .find(|l| l.dimension == dim)
        .map(|l| l.available)
        .expect("no limit of that dimension")
}

/// Asserts that every reservation, queue entry and permit is back.
#[track_caller]
pub fn assert_idle(c: &AdmissionController) {
    let s = c.snapshot();
    assert!(s.is_idle(), "controller not idle: {s:#?}");
}

/// A circuit breaker that opens on the first failure and stays open 30 s.
pub fn breaker() -> tollgate::lifecycle::CircuitBreaker {
    tollgate::lifecycle::CircuitBreaker::new(tollgate::lifecycle::CircuitConfig {
        failure_threshold: 1,
        recovery_time: secs(30),
        half_open_calls: 1,
    })
    .expect("valid circuit configuration")
}

pub fn secs(s: u64) -> Duration {
    Duration::from_secs(s)
}

pub fn ms(s: u64) -> Duration {
    Duration::from_millis(s)
}

pub mod script;

/// How many one-request calls on the first scope `controller` admits now
/// (each with a 1 ms deadline, released at once), up to `most`.
pub async fn admitted_now(controller: &AdmissionController, most: u64) -> u64 {
    let mut n = 0;
    while n < most {
        match controller
            .acquire(&plain(), within(Duration::from_millis(1)))
            .await
        {
            Ok(lease) => drop(lease),
            Err(_) => break,
        }
        n += 1;
    }
    n
}

/// Spawns `call`'s acquire on `controller`; its result carries the instant
/// the lease was granted.
pub fn spawn_acquire(
    controller: &AdmissionController,
    call: Call,
    deadline: Deadline,
) -> tokio::task::JoinHandle<Result<(Instant, Lease), AdmissionError>> {
    let c = controller.clone();
    tokio::spawn(async move {
        c.acquire(&call, deadline)
            .await
            .map(|l| (Instant::now(), l))
    })
}

//! Configure an admission controller and watch it pace calls.
//!
//! `cargo run -p tollgate --example admission`
//!
//! A scope allows 3 requests and 1,000 tokens per 3 seconds, at most 2
//! calls run at once. Six calls arrive together; the controller admits them
//! in FIFO order as the quota allows, and settles each one's tokens with
//! the usage "reported" by the provider.

use std::time::Duration;

use tokio::time::Instant;
use tollgate::config::ScopeConfig;
use tollgate::{AdmissionController, Call, Deadline, Dimension, TokenEstimate, Usage};

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let window = Duration::from_secs(3);
    let controller = AdmissionController::builder()
        .scope(
            ScopeConfig::new("demo-account")
                .requests(3, window)
                .tokens(1_000, window),
        )
        .concurrency(2)
        .queue_capacity(100)
        .build()?;
    let scope = controller.scope_id("demo-account").ok_or("no scope")?;
    let start = Instant::now();

    let mut tasks = Vec::new();
    for i in 0..6u64 {
        let controller = controller.clone();
        tasks.push(tokio::spawn(async move {
            // 200 prompt tokens plus a 100-token output allowance.
            let call = Call::new(scope).with_estimate(TokenEstimate::new(200, 100));
            // The call's one deadline, fixed when it starts (DL-1).
            let deadline = Deadline::after(Duration::from_secs(60));
            let mut lease = controller.acquire(&call, deadline).await?;
            let waited = lease.admission().total_wait();
            // ... the provider call would go here; it reports 230 tokens.
            tokio::time::sleep(Duration::from_millis(300)).await;
            let settled = lease.reconcile(Usage::from_io(200, 30))?;
            println!(
                "call {i}: admitted after {:>5.2}s, reserved 300, used {:?}, refunded {}",
                waited.as_secs_f64(),
                settled.reported,
                settled.refunded
            );
            Ok::<_, Box<dyn std::error::Error + Send + Sync>>(())
        }));
    }
    for t in tasks {
        t.await?.map_err(|e| e.to_string())?;
    }
    let snapshot = controller.snapshot();
    let scope = snapshot.scope_named("demo-account").ok_or("no scope")?;
    println!(
        "done in {:.1}s: {} admitted, {} tokens reserved, {} refunded, {:?} tokens available",
        start.elapsed().as_secs_f64(),
        scope.counters.admitted,
        scope.counters.tokens_reserved,
        scope.counters.tokens_refunded,
        scope.available(Dimension::Tokens, window),
    );
    Ok(())
}

//! `invoke` and `stream` through a supervisor, against an in-memory provider.
//!
//! `cargo run -p tollgate --example lifecycle`
//!
//! The provider fails its first attempt with a 503, then answers; the
//! supervisor retries under the call's deadline. A stream then delivers its
//! chunks, and a second stream is dropped half-way, which cancels it and
//! returns its permits.

use std::pin::Pin;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use futures_core::Stream;
use futures_util::StreamExt;
use tollgate::config::{MINUTE, ScopeConfig};
use tollgate::lifecycle::{
    AttemptContext, CallOptions, Provider, ProviderError, Reply, StreamEvent, Supervisor,
};
use tollgate::{AdmissionController, Deadline, Usage};

/// Echoes the prompt; the first one-shot attempt fails with a 503.
#[derive(Default)]
struct Echo {
    attempts: AtomicU32,
}

type Chunks = Pin<Box<dyn Stream<Item = Result<StreamEvent<String>, ProviderError>> + Send>>;

impl Provider for Echo {
    type Request = String;
    type Response = String;
    type Chunk = String;
    type Stream = Chunks;

    async fn call(
        &self,
        prompt: &String,
        ctx: AttemptContext,
    ) -> Result<Reply<String>, ProviderError> {
        if self.attempts.fetch_add(1, Ordering::SeqCst) == 0 {
            return Err(ProviderError::from_status(503, "warming up"));
        }
        Ok(Reply::new(
            format!("echo (attempt {}): {prompt}", ctx.attempt),
            Usage::from_io(5, 5),
        ))
    }

    async fn stream(&self, prompt: &String, _: AttemptContext) -> Result<Chunks, ProviderError> {
        let words: Vec<String> = prompt.split(' ').map(str::to_owned).collect();
        let events = futures_util::stream::iter(words).then(|w| async move {
            tokio::time::sleep(Duration::from_millis(50)).await;
            Ok(StreamEvent::Chunk(w))
        });
        let usage = futures_util::stream::once(async { Ok(StreamEvent::Usage(Usage::known(12))) });
        Ok(Box::pin(events.chain(usage)))
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let controller = AdmissionController::builder()
        .scope(ScopeConfig::new("echo").requests(60, MINUTE))
        .concurrency(4)
        .build()?;
    let supervisor = Supervisor::builder(controller.clone(), Echo::default())
        .transport_timeout(Duration::from_secs(5))
        .build()?;
    // Each call's one deadline, fixed when the call starts (DL-1).
    let deadline = || Deadline::after(Duration::from_secs(10));

    let done = supervisor
        .invoke(
            &"hello there".to_string(),
            CallOptions::deadline(deadline()),
        )
        .await?;
    println!(
        "invoke: {:?} after {} attempts",
        done.response, done.attempts
    );

    let mut stream = supervisor
        .stream(
            &"one two three".to_string(),
            CallOptions::deadline(deadline()),
        )
        .await?;
    while let Some(chunk) = stream.next().await {
        println!("stream chunk: {}", chunk?);
    }

    let mut abandoned = supervisor
        .stream(
            &"never read to the end".to_string(),
            CallOptions::deadline(deadline()),
        )
        .await?;
    let first = abandoned.next().await.transpose()?;
    println!("read {first:?}, then dropped the stream");
    drop(abandoned);

    let s = controller.snapshot();
    println!(
        "active {} / permits free {:?} / admitted {} / tokens reported {}",
        s.active,
        s.concurrency_available,
        s.scopes[0].counters.admitted,
        s.scopes[0].counters.tokens_reported
    );
    Ok(())
}

//! A `tower` service behind `TollgateLayer`, with a token limit: the layer
//! reserves an estimate for every attempt and settles it with the usage
//! the response reports.
//!
//! `cargo run -p tollgate --features tower --example tower_tokens`
//!
//! A scope allows 1,000 tokens per 10 seconds. Each request reserves its
//! prompt's tokens (about one per four characters) plus its `max_tokens`;
//! the fake model then reports what it really used, and the difference
//! comes back at once, so more calls fit in the window than the estimates
//! alone would allow.

use std::time::Duration;

use tollgate::config::ScopeConfig;
use tollgate::lifecycle::{ErrorKind, ProviderError};
use tollgate::tower::TollgateLayer;
use tollgate::{AdmissionController, CharRatioEstimator, Dimension, TokenEstimate, Usage};
use tower::{Layer, Service, ServiceExt};

/// What the application sends.
#[derive(Debug, Clone)]
struct Completion {
    prompt: String,
    max_tokens: u64,
}

/// What the model answers, with the tokens it used.
#[derive(Debug)]
struct Answer {
    text: String,
    prompt_tokens: u64,
    completion_tokens: u64,
}

/// A model that answers with the prompt's first word, using a fraction of
/// the allowance it was given.
async fn model(request: Completion) -> Result<Answer, std::io::Error> {
    tokio::time::sleep(Duration::from_millis(100)).await;
    let word = request.prompt.split(' ').next().unwrap_or_default();
    Ok(Answer {
        text: format!("{word}!"),
        prompt_tokens: request.prompt.len() as u64 / 4,
        completion_tokens: request.max_tokens / 5,
    })
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let window = Duration::from_secs(10);
    let controller = AdmissionController::builder()
        .scope(ScopeConfig::new("model").tokens(1_000, window))
        .concurrency(2)
        .build()?;

    let ratio = CharRatioEstimator::new(4.0, 0)?;
    let layer = TollgateLayer::new(controller.clone(), |e: &std::io::Error| {
        ProviderError::new(ErrorKind::Connect, e.to_string())
    })
    // Reserve the prompt's tokens plus the whole output allowance ...
    .estimator(move |r: &Completion| {
        Ok(TokenEstimate::new(
            ratio.input_tokens(&r.prompt),
            r.max_tokens,
        ))
    })
    // ... and settle with what the model reports.
    .usage(|a: &Answer| Usage::from_io(a.prompt_tokens, a.completion_tokens))
    .timeout(Duration::from_secs(30));
    let mut service = layer.layer(tower::service_fn(model));

    for i in 0..4 {
        let request = Completion {
            prompt: format!("question {i}: what is the capital of France?"),
            max_tokens: 300,
        };
        let answer = service.ready().await?.call(request).await?;
        let snapshot = controller.snapshot();
        let scope = snapshot.scope_named("model").ok_or("no scope")?;
        println!(
            "call {i}: {:?} used {} tokens; {} of 1000 tokens available in the window",
            answer.text,
            answer.prompt_tokens + answer.completion_tokens,
            scope
                .available(Dimension::Tokens, window)
                .unwrap_or_default(),
        );
    }
    let snapshot = controller.snapshot();
    let counters = &snapshot.scopes[0].counters;
    println!(
        "reserved {} tokens, providers reported {}, {} refunded",
        counters.tokens_reserved, counters.tokens_reported, counters.tokens_refunded
    );
    Ok(())
}

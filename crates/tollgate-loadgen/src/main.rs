//! `tollgate-loadgen`: a small HTTP/1.1 keep-alive load generator for
//! OpenAI-compatible endpoints, used for tollgate's benchmarks.
//!
//! ```text
//! tollgate-loadgen --concurrency 64 --duration 10s            # closed loop
//! tollgate-loadgen --rate 2000 --duration 10s                 # open loop
//! tollgate-loadgen --stream --concurrency 64 --duration 10s   # streams, TTFT
//! ```
//!
//! Prints one JSON summary on stdout (see `report.rs`).
#![forbid(unsafe_code)]

mod args;
mod conn;
mod report;
mod run;

use std::sync::Arc;
use std::sync::atomic::AtomicU64;

use anyhow::Context;
use clap::Parser;
use tokio::time::Instant;

use crate::args::Args;
use crate::conn::Target;
use crate::report::{RunInfo, Summary};
use crate::run::{Plan, Recorder, closed_loop_worker, open_loop_worker};

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    args.validate()?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(args.threads)
        .enable_all()
        .build()
        .context("starting the runtime")?;
    let summary = runtime.block_on(run(args))?;
    println!("{}", serde_json::to_string_pretty(&summary)?);
    Ok(())
}

async fn run(args: Args) -> anyhow::Result<Summary> {
    let target = Arc::new(Target::new(
        &args.url,
        args.api_key.as_deref(),
        args.body()?,
    )?);
    let start = Instant::now();
    let plan = Plan {
        target,
        timeout: args.timeout,
        stream: args.stream,
        start,
    };
    let mut workers = Vec::with_capacity(args.concurrency);
    match args.rate {
        None => {
            let deadline = start + args.duration;
            for _ in 0..args.concurrency {
                workers.push(tokio::spawn(closed_loop_worker(plan.clone(), deadline)));
            }
        }
        Some(rate) => {
            let total = (rate * args.duration.as_secs_f64()).round() as u64;
            let next = Arc::new(AtomicU64::new(0));
            for _ in 0..args.concurrency {
                workers.push(tokio::spawn(open_loop_worker(
                    plan.clone(),
                    rate,
                    total,
                    Arc::clone(&next),
                )));
            }
        }
    }
    let mut all = Recorder::new()?;
    for worker in workers {
        all.merge(worker.await.context("a worker panicked")??);
    }
    let elapsed = all.last_end.map_or(start.elapsed(), |end| end - start);
    Ok(Summary::new(
        RunInfo {
            mode: if args.rate.is_some() {
                "open_loop"
            } else {
                "closed_loop"
            },
            url: args.url.clone(),
            stream: args.stream,
            connections: args.concurrency,
            target_rate: args.rate,
            duration: args.duration,
        },
        &all,
        elapsed,
    ))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use tollgate_sim::{SimConfig, Simulator};

    fn args(url: String, extra: &[&str]) -> Args {
        let mut argv = vec!["tollgate-loadgen", "--url", &url, "--duration", "300ms"];
        argv.extend_from_slice(extra);
        let args = Args::try_parse_from(argv).expect("flags parse");
        args.validate().expect("valid flags");
        args
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn closed_loop_streams_against_the_simulator() {
        let server = Simulator::spawn(SimConfig::default(), "127.0.0.1:0")
            .await
            .expect("sim");
        let url = server.url("/v1/chat/completions");
        let summary = run(args(url, &["--concurrency", "4", "--stream"]))
            .await
            .expect("run");
        assert_eq!(summary.mode, "closed_loop");
        assert!(summary.ok > 0);
        assert_eq!(summary.errors, 0, "{:?}", summary.error_samples);
        assert!(summary.non_2xx.is_empty());
        assert_eq!(summary.ttft_ms.as_ref().map(|p| p.count), Some(summary.ok));
        assert_eq!(server.stats().ok, summary.ok);
        // One connection per worker, reused.
        assert!(server.stats().max_active <= 4);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn open_loop_sends_exactly_rate_times_duration_and_counts_429s() {
        let server = Simulator::spawn(
            SimConfig {
                rpm: Some(10),
                window: Duration::from_secs(60),
                ..SimConfig::default()
            },
            "127.0.0.1:0",
        )
        .await
        .expect("sim");
        let url = server.url("/v1/chat/completions");
        let summary = run(args(url, &["--rate", "100", "--concurrency", "8"]))
            .await
            .expect("run");
        assert_eq!(summary.mode, "open_loop");
        assert_eq!(summary.sent, 30);
        assert_eq!(summary.ok, 10);
        assert_eq!(summary.non_2xx.get("429"), Some(&20));
        assert_eq!(summary.latency_ms.as_ref().map(|p| p.count), Some(30));
        assert_eq!(server.stats().rejected_429.rpm, 20);
    }

    #[test]
    fn bad_flags_and_urls_are_refused() {
        let parse = |argv: &[&str]| {
            Args::try_parse_from(std::iter::once("tollgate-loadgen").chain(argv.iter().copied()))
                .expect("parses")
        };
        assert!(parse(&["--concurrency", "0"]).validate().is_err());
        assert!(parse(&["--rate=-5"]).validate().is_err());
        assert!(parse(&["--rate", "0"]).validate().is_err());
        assert!(Target::new("https://example.com/", None, bytes::Bytes::new()).is_err());
        assert!(parse(&["--body", "{nope"]).body().is_err());
    }
}

//! `tollgate-tenants`: the two-tenant scenario of SPEC §15 against a
//! running gateway (BENCHMARKS.md, "Fair share between tenants").
//!
//! A bulk tenant sends `--bulk` chat requests at once; `--chat-after`
//! later an interactive tenant starts sending one request every
//! `--chat-every`, one at a time, until the bulk requests are all answered
//! (or `--chats` of them, or until `--stop-file` exists: the bulk traffic
//! can come from another process). Either tenant can be left out to
//! measure the other alone. Prints one JSON summary: the interactive
//! latencies (p50, p90, max), each tenant's statuses, and the time from the
//! burst to the last bulk answer.
//!
//! ```text
//! tollgate-tenants --url http://127.0.0.1:18080 --bulk-key $BULK --bulk 1000 \
//!     --chat-key $CHAT --chat-after 2s --chat-every 1s
//! ```
#![forbid(unsafe_code)]

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context;
use bytes::Bytes;
use clap::Parser;
use http::{Request, header};
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;
use tokio::time::Instant;

/// The command line.
#[derive(Debug, Parser)]
struct Args {
    /// The gateway, `http://host:port`.
    #[arg(long)]
    url: String,
    /// The model to ask for.
    #[arg(long, default_value = "chat")]
    model: String,
    /// The bulk tenant's API key (leave out: no bulk traffic).
    #[arg(long)]
    bulk_key: Option<String>,
    /// Requests the bulk tenant sends at once.
    #[arg(long, default_value_t = 1_000)]
    bulk: usize,
    /// The interactive tenant's API key (leave out: no interactive traffic).
    #[arg(long)]
    chat_key: Option<String>,
    /// When the interactive tenant starts, after the burst.
    #[arg(long, default_value = "2s", value_parser = humantime::parse_duration)]
    chat_after: Duration,
    /// The interactive tenant's spacing (one request at a time).
    #[arg(long, default_value = "1s", value_parser = humantime::parse_duration)]
    chat_every: Duration,
    /// Interactive requests at most (without bulk traffic, exactly).
    #[arg(long, default_value_t = 60)]
    chats: usize,
    /// Each request's `x-request-timeout`, in seconds.
    #[arg(long, default_value_t = 900)]
    timeout: u64,
    /// The interactive tenant stops once this file exists (the bulk
    /// traffic then comes from elsewhere, e.g. a `tollgate batch` run).
    #[arg(long)]
    stop_file: Option<std::path::PathBuf>,
}

/// Responses by status (0: transport error).
#[derive(Debug, Default)]
struct Statuses(Mutex<BTreeMap<u16, u64>>);

impl Statuses {
    fn add(&self, status: u16) {
        if let Ok(mut m) = self.0.lock() {
            *m.entry(status).or_default() += 1;
        }
    }

    fn take(&self) -> BTreeMap<u16, u64> {
        self.0.lock().map(|m| m.clone()).unwrap_or_default()
    }
}

/// One chat request on a connection of its own; its status (0 on a
/// transport error).
async fn send(addr: &str, host: &str, key: &str, body: Bytes, timeout: u64) -> u16 {
    let attempt = async {
        let stream = TcpStream::connect(addr).await?;
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .map_err(std::io::Error::other)?;
        tokio::spawn(conn);
        let request = Request::post("/v1/chat/completions")
            .header(header::HOST, host)
            .header(header::CONTENT_TYPE, "application/json")
            .header(header::AUTHORIZATION, format!("Bearer {key}"))
            .header("x-request-timeout", timeout.to_string())
            .body(Full::new(body))
            .map_err(std::io::Error::other)?;
        let response = sender
            .send_request(request)
            .await
            .map_err(std::io::Error::other)?;
        let status = response.status().as_u16();
        let _ = response.into_body().collect().await;
        Ok::<u16, std::io::Error>(status)
    };
    attempt.await.unwrap_or(0)
}

fn percentile(sorted: &[f64], p: f64) -> Option<f64> {
    if sorted.is_empty() {
        return None;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted.get(i).copied()
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("runtime")?;
    let summary = runtime.block_on(run(args))?;
    println!("{}", serde_json::to_string_pretty(&summary)?);
    Ok(())
}

async fn run(args: Args) -> anyhow::Result<serde_json::Value> {
    let host = args
        .url
        .trim_start_matches("http://")
        .trim_end_matches('/')
        .to_owned();
    let addr = host.clone();
    let body = Bytes::from(serde_json::to_vec(&serde_json::json!({
        "model": args.model,
        "messages": [{"role": "user", "content": "Say something."}],
        "max_tokens": 16,
    }))?);
    let start = Instant::now();
    let bulk_statuses = Arc::new(Statuses::default());
    let mut bulk = Vec::new();
    if let Some(key) = &args.bulk_key {
        for _ in 0..args.bulk {
            let (addr, host, key, body, statuses) = (
                addr.clone(),
                host.clone(),
                key.clone(),
                body.clone(),
                bulk_statuses.clone(),
            );
            let timeout = args.timeout;
            bulk.push(tokio::spawn(async move {
                let status = send(&addr, &host, &key, body, timeout).await;
                statuses.add(status);
                start.elapsed()
            }));
        }
    }
    let bulk_done = tokio::spawn(async move {
        let mut last = Duration::ZERO;
        for b in bulk {
            if let Ok(at) = b.await {
                last = last.max(at);
            }
        }
        last
    });
    let chat_statuses = Statuses::default();
    let mut latencies = Vec::new();
    if let Some(key) = &args.chat_key {
        tokio::time::sleep(args.chat_after).await;
        let mut next = Instant::now();
        while latencies.len() < args.chats {
            if args.bulk_key.is_some() && bulk_done.is_finished() {
                break;
            }
            tokio::time::sleep_until(next).await;
            if args.stop_file.as_ref().is_some_and(|f| f.exists()) {
                break;
            }
            next += args.chat_every;
            let sent = Instant::now();
            let status = send(&addr, &host, key, body.clone(), args.timeout).await;
            chat_statuses.add(status);
            latencies.push(sent.elapsed().as_secs_f64());
        }
    }
    let bulk_last = bulk_done.await.context("bulk")?;
    let mut sorted = latencies.clone();
    sorted.sort_by(f64::total_cmp);
    let statuses = |m: BTreeMap<u16, u64>| -> serde_json::Value {
        m.into_iter()
            .map(|(s, n)| (s.to_string(), serde_json::Value::from(n)))
            .collect::<serde_json::Map<_, _>>()
            .into()
    };
    Ok(serde_json::json!({
        "bulk": {
            "requests": if args.bulk_key.is_some() { args.bulk } else { 0 },
            "statuses": statuses(bulk_statuses.take()),
            "last_answer_seconds": bulk_last.as_secs_f64(),
        },
        "interactive": {
            "requests": latencies.len(),
            "statuses": statuses(chat_statuses.take()),
            "p50_seconds": percentile(&sorted, 0.5),
            "p90_seconds": percentile(&sorted, 0.9),
            "max_seconds": sorted.last(),
        },
    }))
}

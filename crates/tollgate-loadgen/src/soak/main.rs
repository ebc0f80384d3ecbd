//! `tollgate-soak`: a bounded soak of `tollgate serve` with well-behaved
//! and misbehaving clients, and the checks that must hold at its end.
//! Run it through `benches/soak/run.sh` (BENCHMARKS.md, "Soak").
//!
//! Checks (the run fails loudly, exit status 1, when one is violated):
//! - every well-behaved client got a complete response (a whole one-shot
//!   completion, or a stream ending with `[DONE]`) or a typed
//!   OpenAI-format error (as the HTTP body, or as the error event that
//!   ends a failed stream); and no client of any kind saw the gateway
//!   break the protocol;
//! - a client that stops reading a stream has its connection closed by
//!   the gateway within `--stall-grace` of its deadline (GW-17);
//! - no call was answered 503 `circuit_open` (the simulators' faults alone
//!   cannot open the circuit with the soak's threshold; client deadlines
//!   and disconnects must not count, GW-16);
//! - once the load is over, the admin snapshot shows nothing queued or
//!   active, and after the longest window every quota and pool is fully
//!   available again, with every circuit closed;
//! - the gateway's RSS grew by less than `--max-rss-growth-pct` between a
//!   quarter of the requests and all of them (50k and 200k requests in a
//!   full run). VmRSS is sampled every 100 ms; the figure of a checkpoint
//!   is the median of the samples of the last 10 s of load before it:
//!   under this load a single reading swings by ±6 % from one 100 ms to
//!   the next (each large stalled stream passes megabytes through the
//!   gateway's buffers), the median does not. At each checkpoint the
//!   sending pauses until every call ended, which also shows whether the
//!   gateway is idle then; the reading one second into that pause is
//!   reported as well.
#![forbid(unsafe_code)]

mod admin;
mod args;
mod client;
mod plan;
mod sse;
mod watch;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use anyhow::{Context, bail};
use bytes::Bytes;
use clap::Parser;
use hdrhistogram::Histogram;
use http::{Method, Request, StatusCode, header};
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};
use tokio::sync::Semaphore;
use tokio::time::Instant;

use crate::args::{Args, Gateway};
use crate::client::{Client, ClientConfig, Outcome};
use crate::plan::{BURST_EVERY, BURST_LEN, Behaviour, Call, Upstream, in_burst};
use crate::watch::CloseWatcher;

/// Below this many requests the RSS growth is reported, not checked: the
/// first checkpoint would fall within the gateway's warm-up.
const RSS_MIN_REQUESTS: u64 = 20_000;

/// Most violation messages kept for the report.
const SAMPLES: usize = 25;

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let gateway = args.validate()?;
    if !CloseWatcher::available() {
        bail!("/proc/net/tcp is not readable: the soak needs Linux");
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(args.threads)
        .enable_all()
        .build()
        .context("starting the runtime")?;
    let report = runtime.block_on(soak(args.clone(), gateway))?;
    let text = serde_json::to_string_pretty(&report)?;
    println!("{text}");
    if let Some(path) = &args.report {
        std::fs::write(path, &text).with_context(|| format!("writing {}", path.display()))?;
    }
    let failed: Vec<&Value> = report["checks"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|c| c["ok"] != json!(true))
        .collect();
    if failed.is_empty() {
        eprintln!("soak: PASSED");
        Ok(())
    } else {
        eprintln!("soak: FAILED");
        for c in failed {
            eprintln!("  FAILED {}: {}", c["name"], c["detail"]);
        }
        std::process::exit(1);
    }
}

/// The category of a call, for counting outcomes.
fn category(call: &Call) -> &'static str {
    if call.well_behaved() {
        return match (call.impatient, call.stream) {
            (true, _) => "impatient",
            (false, true) => "normal_stream",
            (false, false) => "normal_oneshot",
        };
    }
    match (call.behaviour, call.upstream) {
        (Behaviour::Normal, _) => unreachable!("well-behaved calls are counted above"),
        (Behaviour::CancelBeforeHeaders { .. }, _) => "cancel_before_headers",
        (Behaviour::CancelAfterHeaders, _) => "cancel_after_headers",
        (Behaviour::CancelMidStream { .. }, _) => "cancel_mid_stream",
        (Behaviour::Stall { .. }, Upstream::Slow) => "stall_slow",
        (Behaviour::Stall { .. }, Upstream::Bulk) => "stall_bulk",
    }
}

/// Everything recorded while the load runs.
struct Stats {
    counts: Mutex<BTreeMap<String, BTreeMap<String, u64>>>,
    violations: AtomicU64,
    samples: Mutex<Vec<String>>,
    /// Milliseconds from a stalled stream's deadline to the gateway's
    /// close (closes after the deadline only).
    close_ms: Mutex<BTreeMap<&'static str, Histogram<u64>>>,
    /// Milliseconds before the deadline, for closes before it.
    closed_early: Mutex<BTreeMap<&'static str, Vec<u64>>>,
    done: AtomicU64,
    in_flight: AtomicU64,
    last_end: Mutex<Option<Instant>>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A `/proc/PID/status` field in KiB.
fn proc_status_kib(pid: u32, field: &str) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
}

/// VmRSS of a process, in KiB.
fn vm_rss(pid: u32) -> Option<u64> {
    proc_status_kib(pid, "VmRSS:")
}

/// User + system CPU time of this process, in seconds (Linux: fields 14
/// and 15 of `/proc/self/stat`, in clock ticks of 1/100 s).
fn own_cpu_seconds() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    let rest = stat.rsplit_once(") ")?.1;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let utime: f64 = fields.get(11)?.parse().ok()?;
    let stime: f64 = fields.get(12)?.parse().ok()?;
    Some((utime + stime) / 100.0)
}

/// VmHWM (peak RSS) of a process, in KiB.
fn vm_hwm(pid: u32) -> Option<u64> {
    proc_status_kib(pid, "VmHWM:")
}

/// The gateway's RSS at one checkpoint, in KiB.
#[derive(Debug)]
struct RssPoint {
    requests: u64,
    /// Median of the samples of the last 10 s of load.
    median_10s: Option<u64>,
    /// Read when the pause began.
    under_load: Option<u64>,
    /// Read one second after the last call of the pause ended.
    quiet: Option<u64>,
}

/// VmRSS every 100 ms, with when.
struct RssSampler {
    samples: Arc<Mutex<Vec<(Instant, u64)>>>,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl RssSampler {
    fn spawn(pid: Option<u32>) -> Self {
        let samples = Arc::new(Mutex::new(Vec::new()));
        let task = pid.map(|pid| {
            let samples = Arc::clone(&samples);
            tokio::spawn(async move {
                let mut tick = tokio::time::interval(Duration::from_millis(100));
                loop {
                    tick.tick().await;
                    if let Some(kib) = vm_rss(pid) {
                        lock(&samples).push((Instant::now(), kib));
                    }
                }
            })
        });
        Self { samples, task }
    }

    /// The median of the samples of the last 10 s before `until` (none
    /// before `since`).
    fn median(&self, since: Instant, until: Instant) -> Option<u64> {
        let from = since.max(until - Duration::from_secs(10).min(until - since));
        let mut window: Vec<u64> = lock(&self.samples)
            .iter()
            .filter(|(at, _)| *at >= from && *at <= until)
            .map(|(_, kib)| *kib)
            .collect();
        window.sort_unstable();
        window.get(window.len() / 2).copied()
    }

    fn stop(&self) {
        if let Some(task) = &self.task {
            task.abort();
        }
    }
}

impl Stats {
    fn record(&self, call: &Call, index: u64, outcome: Outcome) {
        *lock(&self.counts)
            .entry(category(call).to_owned())
            .or_default()
            .entry(outcome.class.clone())
            .or_default() += 1;
        if let Some(detail) = &outcome.violation {
            self.violations.fetch_add(1, Ordering::Relaxed);
            let mut samples = lock(&self.samples);
            if samples.len() < SAMPLES {
                samples.push(format!(
                    "request {index} ({}): {}: {detail}",
                    category(call),
                    outcome.class
                ));
            }
        }
        if let Some(after) = outcome.close_after_deadline {
            if after < 0.0 {
                lock(&self.closed_early)
                    .entry(category(call))
                    .or_default()
                    .push((-after * 1000.0).round() as u64);
            } else {
                let ms = (after * 1000.0).round().max(1.0) as u64;
                let mut hists = lock(&self.close_ms);
                match hists.get_mut(category(call)) {
                    Some(h) => h.saturating_record(ms),
                    None => {
                        if let Ok(mut h) = Histogram::new_with_bounds(1, 3_600_000, 3) {
                            h.saturating_record(ms);
                            hists.insert(category(call), h);
                        }
                    }
                }
            }
        }
        *lock(&self.last_end) = Some(Instant::now());
        self.done.fetch_add(1, Ordering::Relaxed);
        self.in_flight.fetch_sub(1, Ordering::Relaxed);
    }
}

/// When request `index` is due: `index / rate` after the start, except
/// that a burst of impatient clients goes out at once.
fn due(start: Instant, index: u64, rate: f64) -> Instant {
    let slot = if in_burst(index) {
        index - index % BURST_EVERY + BURST_EVERY - BURST_LEN
    } else {
        index
    };
    start + Duration::from_secs_f64(slot as f64 / rate)
}

async fn soak(args: Args, gateway: Gateway) -> anyhow::Result<Value> {
    let admin = Admin {
        gateway: gateway.clone(),
        key: args.admin_key.clone(),
    };
    let before = admin.snapshot().await.context("reading /admin/snapshot")?;
    let busy_before = admin::busy(&before);
    if !busy_before.is_empty() {
        bail!("the gateway is not idle before the soak: {busy_before:?}");
    }
    let client = Arc::new(Client::new(ClientConfig {
        gateway: gateway.clone(),
        api_key: args.api_key.clone(),
        model: args.model.clone(),
        bulk_model: args.bulk_model.clone(),
        per_token: args.per_token,
        stall_grace: args.stall_grace,
        stall_rcvbuf: args.stall_rcvbuf,
        client_timeout: args.client_timeout,
    })?);
    let stats = Arc::new(Stats {
        counts: Mutex::new(BTreeMap::new()),
        violations: AtomicU64::new(0),
        samples: Mutex::new(Vec::new()),
        close_ms: Mutex::new(BTreeMap::new()),
        closed_early: Mutex::new(BTreeMap::new()),
        done: AtomicU64::new(0),
        in_flight: AtomicU64::new(0),
        last_end: Mutex::new(None),
    });
    let rss_start = args.gateway_pid.and_then(vm_rss);
    let args = Arc::new(args);
    let total = args.requests;
    let slots = Arc::new(Semaphore::new(args.concurrency));
    let start = Instant::now();
    let hard_stop = start + args.max_duration;
    let progress = {
        let stats = Arc::clone(&stats);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_secs(10));
            tick.tick().await;
            loop {
                tick.tick().await;
                let done = stats.done.load(Ordering::Relaxed);
                eprintln!(
                    "soak: {:>6.0} s  {done}/{total} done  {:.0}/s  in flight {}  violations {}",
                    start.elapsed().as_secs_f64(),
                    done as f64 / start.elapsed().as_secs_f64(),
                    stats.in_flight.load(Ordering::Relaxed),
                    stats.violations.load(Ordering::Relaxed)
                );
            }
        })
    };
    let mut sent = 0;
    let mut stopped_early = false;
    let all = u32::try_from(args.concurrency).unwrap_or(u32::MAX);
    let mut rss: Vec<RssPoint> = Vec::new();
    let sampler = RssSampler::spawn(args.gateway_pid);
    let mut load_since = start;
    let mut paused = Duration::ZERO;
    let mut checkpoint_busy: Vec<String> = Vec::new();
    let quarter = total / 4;
    for index in 0..total {
        if index > 0 && index.is_multiple_of(quarter) && index / quarter < 4 {
            let pause = Instant::now();
            let under_load = args.gateway_pid.and_then(vm_rss);
            let Ok(Ok(everything)) =
                tokio::time::timeout_at(hard_stop, slots.acquire_many(all)).await
            else {
                stopped_early = true;
                break;
            };
            tokio::time::sleep(Duration::from_secs(1)).await;
            let quiet = args.gateway_pid.and_then(vm_rss);
            let done = stats.done.load(Ordering::Relaxed);
            rss.push(RssPoint {
                requests: done,
                median_10s: sampler.median(load_since, pause),
                under_load,
                quiet,
            });
            // Every client is done: the gateway must be idle too.
            let busy = admin::busy(&admin.snapshot().await?);
            if !busy.is_empty() {
                checkpoint_busy.push(format!("at {done} requests: {busy:?}"));
            }
            eprintln!(
                "soak: checkpoint at {done} requests: VmRSS median {} KiB, now {} KiB, {} KiB after the calls ended{}",
                rss.last().and_then(|p| p.median_10s).unwrap_or(0),
                under_load.unwrap_or(0),
                quiet.unwrap_or(0),
                if busy.is_empty() {
                    ""
                } else {
                    "; the gateway is NOT idle"
                }
            );
            drop(everything);
            paused += pause.elapsed();
            load_since = Instant::now();
        }
        tokio::time::sleep_until(due(start + paused, index, args.rate)).await;
        let Ok(Ok(permit)) =
            tokio::time::timeout_at(hard_stop, Arc::clone(&slots).acquire_owned()).await
        else {
            stopped_early = true;
            break;
        };
        if Instant::now() >= hard_stop {
            stopped_early = true;
            break;
        }
        let call = plan::draw(args.seed, index, args.bulk_stall_tokens);
        let client = Arc::clone(&client);
        let stats = Arc::clone(&stats);
        sent += 1;
        stats.in_flight.fetch_add(1, Ordering::Relaxed);
        tokio::spawn(async move {
            let outcome = client.run(&call).await;
            stats.record(&call, index, outcome);
            drop(permit);
        });
    }
    // Every call bounds itself; this bounds the wait for all of them.
    let under_load = args.gateway_pid.and_then(vm_rss);
    let median_10s = sampler.median(load_since, Instant::now());
    let drained = tokio::time::timeout(
        args.client_timeout + Duration::from_secs(30),
        slots.acquire_many(all),
    )
    .await
    .is_ok();
    progress.abort();
    let last_end = lock(&stats.last_end).unwrap_or_else(Instant::now);
    let load_secs = (last_end - start).saturating_sub(paused).as_secs_f64();
    tokio::time::sleep(Duration::from_secs(1)).await;
    rss.push(RssPoint {
        requests: stats.done.load(Ordering::Relaxed),
        median_10s,
        under_load,
        quiet: args.gateway_pid.and_then(vm_rss),
    });
    sampler.stop();
    eprintln!("soak: load over after {load_secs:.1} s; waiting for the gateway to be idle");

    // Idle: nothing queued or active.
    let idle_start = Instant::now();
    let mut idle_problems = Vec::new();
    while idle_start.elapsed() < Duration::from_secs(30) {
        idle_problems = admin::busy(&admin.snapshot().await?);
        if idle_problems.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let idle_after = idle_start.elapsed().as_secs_f64();

    // Probes: well-behaved calls to each model until one succeeds (at most
    // 15 s), so that a half-open circuit sees the call it needs to close.
    let mut probes = BTreeMap::<String, u64>::new();
    for upstream in [Upstream::Slow, Upstream::Bulk] {
        let probe_start = Instant::now();
        while probe_start.elapsed() < Duration::from_secs(15) {
            let call = Call {
                behaviour: Behaviour::Normal,
                upstream,
                stream: false,
                include_usage: false,
                max_tokens: 8,
                timeout: None,
                impatient: false,
                reset: false,
            };
            let outcome = client.run(&call).await;
            let ok = outcome.class == "ok/oneshot";
            *probes.entry(outcome.class).or_default() += 1;
            if ok {
                break;
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }

    // Full: after the longest window, every unit is back.
    let window = admin::longest_window(&admin.snapshot().await?);
    eprintln!("soak: waiting {window:.0} s (the longest window) for every window to refill");
    tokio::time::sleep(Duration::from_secs_f64(window + 0.5)).await;
    let full_start = Instant::now();
    let (mut full_problems, mut last) = (Vec::new(), Value::Null);
    while full_start.elapsed() < args.refill_timeout {
        last = admin.snapshot().await?;
        full_problems = admin::not_full(&last);
        full_problems.extend(admin::circuits_not_closed(&last));
        if full_problems.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let full_after = window + 0.5 + full_start.elapsed().as_secs_f64();

    // The figures.
    let counts = lock(&stats.counts).clone();
    let done = stats.done.load(Ordering::Relaxed);
    let violations = stats.violations.load(Ordering::Relaxed);
    let rss_growth = match (
        rss.first().and_then(|p| p.median_10s),
        rss.last().and_then(|p| p.median_10s),
    ) {
        (Some(a), Some(b)) if rss.len() == 4 => Some((b as f64 - a as f64) / a as f64 * 100.0),
        _ => None,
    };
    let circuit_open: u64 = counts
        .values()
        .flat_map(|m| m.iter())
        .chain(probes.iter())
        .filter(|(class, _)| class.contains("circuit_open"))
        .map(|(_, n)| n)
        .sum();
    let well_behaved: BTreeMap<&str, u64> = counts
        .iter()
        .filter(|(cat, _)| cat.starts_with("normal") || *cat == "impatient")
        .flat_map(|(_, m)| m.iter())
        .fold(BTreeMap::new(), |mut acc, (class, n)| {
            let kind = if class.starts_with("ok/") {
                "complete"
            } else if class.starts_with("error/") {
                "typed_error"
            } else {
                "other"
            };
            *acc.entry(kind).or_default() += n;
            acc
        });
    let closed_early = lock(&stats.closed_early).clone();
    let stall_close: BTreeMap<&str, Value> = lock(&stats.close_ms)
        .iter()
        .map(|(cat, h)| {
            (
                *cat,
                json!({
                    "count": h.len(),
                    "p50_ms": h.value_at_quantile(0.5),
                    "p90_ms": h.value_at_quantile(0.9),
                    "p99_ms": h.value_at_quantile(0.99),
                    "max_ms": h.max(),
                    "closed_before_deadline": closed_early.get(cat).map_or(0, Vec::len),
                    "closed_before_deadline_ms": closed_early.get(cat).map(|v| {
                        let mut v = v.clone();
                        v.sort_unstable();
                        json!({"p50": v[v.len() / 2], "max": v[v.len() - 1]})
                    }),
                }),
            )
        })
        .collect();
    let check =
        |name: &str, ok: bool, detail: String| json!({"name": name, "ok": ok, "detail": detail});
    let checks = vec![
        check(
            "bounded",
            !stopped_early && drained && done == total,
            format!(
                "{done} of {total} requests done ({sent} sent){}{}",
                if stopped_early {
                    "; stopped at --max-duration"
                } else {
                    ""
                },
                if drained {
                    ""
                } else {
                    "; calls still running after the client timeout"
                }
            ),
        ),
        check(
            "no_violations",
            violations == 0,
            format!(
                "{violations} requests broke a rule (well-behaved: {} complete, {} typed errors, {} other)",
                well_behaved.get("complete").unwrap_or(&0),
                well_behaved.get("typed_error").unwrap_or(&0),
                well_behaved.get("other").unwrap_or(&0)
            ),
        ),
        check(
            "no_circuit_open",
            circuit_open == 0,
            format!("{circuit_open} calls (probes after the load included) answered circuit_open"),
        ),
        check(
            "idle_at_checkpoints",
            checkpoint_busy.is_empty(),
            if checkpoint_busy.is_empty() {
                format!("idle at each of the {} pauses", rss.len().saturating_sub(1))
            } else {
                format!("{checkpoint_busy:?}")
            },
        ),
        check(
            "idle_after_load",
            idle_problems.is_empty(),
            if idle_problems.is_empty() {
                format!("idle {idle_after:.1} s after the last response")
            } else {
                format!("still busy after {idle_after:.0} s: {idle_problems:?}")
            },
        ),
        check(
            "full_after_refill",
            full_problems.is_empty(),
            if full_problems.is_empty() {
                format!(
                    "every quota and pool full, circuits closed, {full_after:.1} s after the load"
                )
            } else {
                format!("after {full_after:.0} s: {full_problems:?}")
            },
        ),
        check(
            "rss_growth",
            args.gateway_pid.is_none()
                || total < RSS_MIN_REQUESTS
                || rss_growth.is_some_and(|g| g < args.max_rss_growth_pct),
            match rss_growth {
                Some(g) if total < RSS_MIN_REQUESTS => format!(
                    "{g:.2} % between {} and {} requests; not checked below {RSS_MIN_REQUESTS} requests (the first checkpoint falls in the warm-up)",
                    rss[0].requests, rss[3].requests
                ),
                Some(g) => format!(
                    "{g:.2} % between {} and {} requests (limit {} %)",
                    rss[0].requests, rss[3].requests, args.max_rss_growth_pct
                ),
                None if args.gateway_pid.is_none() => "not measured (no --gateway-pid)".into(),
                None => format!("checkpoints missing: {rss:?}"),
            },
        ),
    ];
    let passed = checks.iter().all(|c| c["ok"] == json!(true));
    Ok(json!({
        "passed": passed,
        "seed": args.seed,
        "requests": total,
        "sent": sent,
        "done": done,
        "target_rate": args.rate,
        "concurrency": args.concurrency,
        "load_seconds": (load_secs * 10.0).round() / 10.0,
        "achieved_rate": ((done as f64 / load_secs.max(1e-9)) * 10.0).round() / 10.0,
        "violations": violations,
        "violation_samples": lock(&stats.samples).clone(),
        "well_behaved": well_behaved,
        "outcomes": counts,
        "keepalive_retries": client.keepalive_retries.load(Ordering::Relaxed),
        "client_cpu_seconds": own_cpu_seconds(),
        "stall_close_after_deadline": stall_close,
        "rss_kib": {
            "start": rss_start,
            "checkpoints": rss.iter().map(|p| json!({
                "requests": p.requests,
                "median_10s_kib": p.median_10s,
                "at_pause_kib": p.under_load,
                "after_calls_ended_kib": p.quiet,
            })).collect::<Vec<_>>(),
            "hwm_kib": args.gateway_pid.and_then(vm_hwm),
            "growth_pct": rss_growth.map(|g| (g * 100.0).round() / 100.0),
            "after_refill": args.gateway_pid.and_then(vm_rss),
        },
        "idle_after_seconds": (idle_after * 10.0).round() / 10.0,
        "full_after_seconds": (full_after * 10.0).round() / 10.0,
        "probes": probes,
        "snapshot": admin::summary(&last),
        "checks": checks,
    }))
}

/// `GET /admin/snapshot` on a fresh connection.
struct Admin {
    gateway: Gateway,
    key: String,
}

impl Admin {
    async fn snapshot(&self) -> anyhow::Result<Value> {
        let stream = tokio::net::TcpStream::connect(self.gateway.addr).await?;
        let (mut sender, conn) =
            hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
        let task = tokio::spawn(async move {
            let _ = conn.await;
        });
        let request = Request::builder()
            .method(Method::GET)
            .uri("/admin/snapshot")
            .header(header::HOST, self.gateway.host.as_str())
            .header(header::AUTHORIZATION, format!("Bearer {}", self.key))
            .body(Empty::<Bytes>::new())?;
        let response = tokio::time::timeout(Duration::from_secs(10), async {
            let response = sender.send_request(request).await?;
            let status = response.status();
            let body = response.into_body().collect().await?.to_bytes();
            anyhow::Ok((status, body))
        })
        .await
        .context("/admin/snapshot did not answer within 10 s")??;
        task.abort();
        if response.0 != StatusCode::OK {
            bail!(
                "/admin/snapshot answered {}: {}",
                response.0,
                String::from_utf8_lossy(&response.1)
            );
        }
        Ok(serde_json::from_slice(&response.1)?)
    }
}

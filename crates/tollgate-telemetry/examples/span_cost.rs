//! What one call's spans cost (issue 25): builds, ends and exports the
//! spans of `N` gateway-like calls (a call span and one attempt span with
//! the attributes the gateway sets) to an OTLP/HTTP receiver, and prints
//! the request path's time per call (one thread) and the whole process's
//! CPU per call (request path, export task and HTTP client together).
//!
//!   cargo run --release -p tollgate-telemetry --example otlp_sink -- 127.0.0.1:18186 &
//!   cargo run --release -p tollgate-telemetry --example span_cost -- http://127.0.0.1:18186 200000

use std::time::{Duration, Instant, SystemTime};

use http::HeaderMap;
use tollgate::{Admission, LimitedBy, Usage};
use tollgate_telemetry::{AttemptTarget, CallEnd, Telemetry, TelemetryConfig};

/// User plus system CPU of this process so far (Linux `/proc/self/stat`).
fn cpu() -> Duration {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let after = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
    let fields: Vec<&str> = after.split_whitespace().collect();
    // Fields 14 and 15 of the file: the 12th and 13th after the name.
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|f| f.parse::<u64>().ok())
            .unwrap_or(0)
    };
    Duration::from_millis((ticks(11) + ticks(12)) * 10)
}

fn main() {
    let mut args = std::env::args().skip(1);
    let endpoint = args
        .next()
        .unwrap_or_else(|| "http://127.0.0.1:18186".to_owned());
    let n: u32 = args.next().and_then(|a| a.parse().ok()).unwrap_or(100_000);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("runtime");
    let telemetry = runtime.block_on(async {
        Telemetry::start(
            &TelemetryConfig {
                endpoint: Some(endpoint),
                queue_size: 1 << 20,
                ..TelemetryConfig::default()
            },
            "span_cost",
        )
        .expect("telemetry")
    });
    let target = AttemptTarget::new(
        "openai",
        "http://127.0.0.1:18080/v1",
        "gpt-4o-mini",
        Some("primary"),
    );
    let headers = HeaderMap::new();
    let admission = Admission {
        quota_wait: Duration::from_micros(120),
        concurrency_wait: Duration::from_micros(3),
        limited_by: LimitedBy::default(),
        cooldown: false,
        concurrency: false,
        preemptions: 0,
        ticket: 1,
        grant_order: 1,
    };
    let cpu0 = cpu();
    let start = Instant::now();
    for i in 0..n {
        let call = telemetry
            .call(&headers, "chat", "chat", SystemTime::now())
            .expect("on");
        call.requested("gpt-4o-mini");
        let mut attempt = call.attempt(&target, 1, Some(Duration::from_secs(30)));
        attempt.headers().iter().for_each(|h| {
            std::hint::black_box(h);
        });
        let usage = Some(Usage::from_io(12, 34));
        attempt.succeed(usage);
        let id = format!("req-{i:08}");
        call.finish(&CallEnd {
            status: Some(200),
            stream: false,
            attempts: 1,
            queue: Some(Duration::from_micros(150)),
            request_id: Some(&id),
            tenant: Some("team-a"),
            deployment: Some("primary"),
            class: Some("interactive"),
            limited_by: Some("none"),
            admission: Some(&admission),
            tokens_estimated: Some(1000),
            cost: Some(1234),
            usage,
            error: None,
        });
    }
    let path = start.elapsed();
    runtime.block_on(telemetry.flush());
    let total = start.elapsed();
    let used = cpu() - cpu0;
    let per = |d: Duration| d.as_secs_f64() * 1e6 / f64::from(n);
    println!(
        "calls {n}: request path {:.2} µs/call; until exported {:.2} µs/call wall, {:.2} µs/call CPU; dropped {}",
        per(path),
        per(total),
        per(used),
        telemetry.dropped()
    );
}

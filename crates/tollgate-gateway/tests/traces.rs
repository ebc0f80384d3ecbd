//! OpenTelemetry traces (SPEC OBS-5), end to end: a real gateway exports
//! over OTLP/HTTP to a collector the test runs
//! (`tollgate_telemetry::testing::Collector`: axum on 127.0.0.1:0,
//! decoding `ExportTraceServiceRequest` with the protocol's own prost
//! types), in front of a real simulator or the scripted upstream.
//!
//! Spans are exported in batches: every test flushes the gateway's queue
//! (`Telemetry::flush`, which returns once the batch was answered) and
//! polls with a bound, never sleeps and hopes.

mod common;

use std::time::Duration;

use common::upstream::{End, Reply, Scripted, chunk};
use common::*;
use tokio::net::TcpListener;
use tollgate_telemetry::testing::*;

/// The `[telemetry]` table exporting to `endpoint`.
fn telemetry(endpoint: &str, extra: &str) -> String {
    format!(
        "[telemetry]\nendpoint = \"{endpoint}\"\nservice_name = \"gw-under-test\"\n\
         schedule_delay = \"20ms\"\n{extra}\n"
    )
}

/// A scripted upstream's model `chat` (retries 10 ms apart), tenants, and
/// `[telemetry]`.
fn scripted_config(base_url: &str, telemetry: &str) -> String {
    format!(
        r#"
[retry]
max_attempts = 3
base_delay = "10ms"
factor = 1.0
max_delay = "10ms"
jitter = 0.0

[cooldown]
base = "10ms"
max = "20ms"

[providers.up]
base_url = "{base_url}"

[models.chat]
provider = "up"
upstream_model = "up-chat"

{}
{telemetry}
"#,
        tenants("", "")
    )
}

/// Flushes `gw`'s spans until `done` holds for what `collector` received.
async fn spans_until(
    gw: &Gateway,
    collector: &Collector,
    what: &str,
    done: impl Fn(&[Span]) -> bool,
) -> Vec<Span> {
    bounded(what, async {
        loop {
            gw.app.telemetry.flush().await;
            let spans: Vec<Span> = collector.spans().into_iter().map(|(_, s)| s).collect();
            if done(&spans) {
                return spans;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
}

fn calls(spans: &[Span]) -> Vec<&Span> {
    spans
        .iter()
        .filter(|s| kind(s) == SpanKind::Server)
        .collect()
}

const CLIENT_TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const CLIENT_PARENT: &str = "00f067aa0ba902b7";

// proves: OBS-5 (a call span continuing the client's traceparent, one child span per upstream attempt, GenAI and tollgate attributes, traceparent upstream per attempt with the client's tracestate, no prompt or completion exported)
#[tokio::test]
async fn retried_call_is_one_span_with_a_child_per_attempt() {
    let collector = Collector::start().await;
    let upstream =
        Scripted::start(vec![Reply::too_many("retry-after-ms", "10"), Reply::ok()]).await;
    let gw = Gateway::start(&scripted_config(
        &upstream.base_url,
        &telemetry(&collector.endpoint, ""),
    ))
    .await;
    let resp = client()
        .post(gw.url("/v1/chat/completions"))
        .bearer_auth(KEY_A)
        .header(
            "traceparent",
            format!("00-{CLIENT_TRACE}-{CLIENT_PARENT}-01"),
        )
        .header("tracestate", "vendor=a, other=b")
        .json(&chat("chat", false))
        .send()
        .await
        .expect("answered");
    assert_eq!(resp.status(), 200);
    let answer = resp.text().await.expect("body");
    assert!(answer.contains("hello"), "{answer}");
    let spans = spans_until(&gw, &collector, "the call and its attempts", |s| {
        s.len() >= 3
    })
    .await;
    assert_eq!(spans.len(), 3, "{spans:#?}");
    assert!(
        collector
            .spans()
            .iter()
            .all(|(svc, _)| svc == "gw-under-test"),
        "service.name from [telemetry]"
    );

    // The call: a server span continuing the client's trace.
    let call = calls(&spans);
    assert_eq!(call.len(), 1, "{spans:#?}");
    let call = call[0];
    assert_eq!(call.name, "chat chat");
    assert_eq!(hex(&call.trace_id), CLIENT_TRACE);
    assert_eq!(hex(&call.parent_span_id), CLIENT_PARENT);
    assert_eq!(
        string(call, "gen_ai.operation.name").as_deref(),
        Some("chat")
    );
    assert_eq!(
        string(call, "gen_ai.request.model").as_deref(),
        Some("chat")
    );
    assert_eq!(int(call, "gen_ai.usage.input_tokens"), Some(5));
    assert_eq!(int(call, "gen_ai.usage.output_tokens"), Some(1));
    assert_eq!(int(call, "http.response.status_code"), Some(200));
    assert_eq!(string(call, "tollgate.tenant").as_deref(), Some("a"));
    assert_eq!(string(call, "tollgate.class").as_deref(), Some("standard"));
    assert_eq!(string(call, "tollgate.deployment").as_deref(), Some("chat"));
    assert_eq!(int(call, "tollgate.attempt"), Some(2));
    assert!(string(call, "tollgate.limited_by").is_some(), "{call:#?}");
    assert!(double(call, "tollgate.quota_wait_ms").is_some_and(|w| w >= 0.0));
    assert!(double(call, "tollgate.concurrency_wait_ms").is_some_and(|w| w >= 0.0));
    assert!(int(call, "tollgate.tokens_estimated").is_some_and(|t| t > 0));
    assert!(attr(call, "error.type").is_none());
    assert!(!is_error(call));

    // One client span per attempt, children of the call.
    let attempts = attempts_of(&spans, call);
    assert_eq!(attempts.len(), 2, "{spans:#?}");
    let port = i64::from(
        upstream.base_url["http://127.0.0.1:".len()..]
            .trim_end_matches("/v1")
            .parse::<u16>()
            .expect("port"),
    );
    for (n, a) in attempts.iter().enumerate() {
        assert_eq!(a.trace_id, call.trace_id);
        assert_eq!(a.name, "chat up-chat");
        assert_eq!(int(a, "tollgate.attempt"), Some(n as i64 + 1));
        assert_eq!(string(a, "gen_ai.operation.name").as_deref(), Some("chat"));
        assert_eq!(
            string(a, "gen_ai.request.model").as_deref(),
            Some("up-chat")
        );
        assert_eq!(string(a, "gen_ai.provider.name").as_deref(), Some("openai"));
        assert_eq!(string(a, "server.address").as_deref(), Some("127.0.0.1"));
        assert_eq!(int(a, "server.port"), Some(port));
        // The default deadline (60 s) bounds every attempt.
        assert!(double(a, "tollgate.deadline_left_ms").is_some_and(|l| l > 0.0 && l <= 60_000.0));
        assert!(a.start_time_unix_nano >= call.start_time_unix_nano);
        assert!(a.end_time_unix_nano <= call.end_time_unix_nano);
    }
    let (first, second) = (attempts[0], attempts[1]);
    assert_eq!(string(first, "error.type").as_deref(), Some("rate_limited"));
    assert_eq!(int(first, "http.response.status_code"), Some(429));
    assert!(is_error(first));
    assert!(attr(first, "tollgate.retry_cause").is_none());
    assert_eq!(
        string(second, "tollgate.retry_cause").as_deref(),
        Some("rate_limited")
    );
    assert_eq!(
        string(second, "gen_ai.response.model").as_deref(),
        Some("up-chat")
    );
    assert_eq!(int(second, "gen_ai.usage.output_tokens"), Some(1));
    assert!(!is_error(second));
    assert!(first.end_time_unix_nano <= second.start_time_unix_nano);

    // Each upstream request carried its own attempt's traceparent.
    let seen = upstream.seen();
    assert_eq!(seen.len(), 2);
    for (s, a) in seen.iter().zip(&attempts) {
        let tp = s
            .headers
            .get("traceparent")
            .and_then(|v| v.to_str().ok())
            .expect("traceparent upstream");
        assert_eq!(tp, format!("00-{CLIENT_TRACE}-{}-01", hex(&a.span_id)));
        // And the client's tracestate, passed on (members trimmed).
        assert_eq!(
            s.headers.get("tracestate").and_then(|v| v.to_str().ok()),
            Some("vendor=a,other=b")
        );
    }

    // Neither the prompt nor the completion is exported.
    let raw = collector.raw();
    let text = String::from_utf8_lossy(&raw);
    assert!(!text.contains("Say something."), "prompt exported");
    assert!(!text.contains("hello"), "completion exported");
    assert!(!text.contains(KEY_A), "key exported");
    gw.wait_idle().await;
}

// proves: OBS-5 (a stream's call and attempt spans end with its last event, not its first, and carry its usage)
#[tokio::test]
async fn stream_span_ends_with_its_last_event() {
    let collector = Collector::start().await;
    let per_token = Duration::from_millis(20);
    let tokens = 8;
    let sim = slow_sim(per_token, tokens).await;
    let gw = Gateway::start(&format!(
        "{}\n{}",
        two_models(&sim.openai_base_url(), "", ""),
        telemetry(&collector.endpoint, "")
    ))
    .await;
    let resp = post_chat(&client(), &gw, Some(KEY_A), &chat("chat", true)).await;
    assert_eq!(resp.status(), 200);
    let read = read_sse(resp).await;
    assert!(read.completed(), "{read:?}");
    let spans = spans_until(&gw, &collector, "the stream's spans", |s| {
        !calls(s).is_empty()
    })
    .await;
    let call = calls(&spans)[0];
    assert_eq!(call.name, "chat chat");
    assert_eq!(
        int(call, "tollgate.stream").map(|_| ()),
        None,
        "stream is a bool"
    );
    assert_eq!(attr(call, "tollgate.stream"), Some(&Any::BoolValue(true)));
    assert!(
        int(call, "gen_ai.usage.output_tokens").is_some(),
        "{call:#?}"
    );
    assert!(!is_error(call), "{call:#?}");
    let attempts = attempts_of(&spans, call);
    assert_eq!(attempts.len(), 1, "{spans:#?}");
    let attempt = attempts[0];
    // The simulator spends at least `per_token` per chunk after the
    // first: both spans last the whole stream.
    let at_least = (per_token * (tokens - 1)).as_nanos() as u64;
    assert!(
        attempt.end_time_unix_nano - attempt.start_time_unix_nano >= at_least,
        "{attempt:#?}"
    );
    assert!(call.end_time_unix_nano - call.start_time_unix_nano >= at_least);
    assert!(attempt.end_time_unix_nano <= call.end_time_unix_nano);
    assert!(
        int(attempt, "gen_ai.usage.output_tokens").is_some(),
        "{attempt:#?}"
    );
    // No traceparent from the client: a new trace, the call at its root.
    assert!(call.parent_span_id.is_empty());
    assert_eq!(attempt.trace_id, call.trace_id);
    gw.wait_idle().await;
}

// proves: OBS-5 (a stream cut mid-answer ends its spans with the error; the stream's upstream request carries its attempt's traceparent)
#[tokio::test]
async fn cut_stream_span_carries_the_error() {
    let collector = Collector::start().await;
    let upstream = Scripted::start(vec![Reply::Stream {
        events: vec![chunk("Hello"), chunk(", wor")],
        end: End::Cut,
    }])
    .await;
    let gw = Gateway::start(&scripted_config(
        &upstream.base_url,
        &telemetry(&collector.endpoint, ""),
    ))
    .await;
    let resp = post_chat(&client(), &gw, Some(KEY_A), &chat("chat", true)).await;
    assert_eq!(resp.status(), 200);
    let read = read_sse(resp).await;
    assert!(!read.completed());
    let spans = spans_until(&gw, &collector, "the cut stream's spans", |s| {
        !calls(s).is_empty()
    })
    .await;
    let call = calls(&spans)[0];
    assert!(is_error(call), "{call:#?}");
    let error = string(call, "error.type").unwrap_or_default();
    assert!(error.starts_with("stream_failed"), "{error}");
    let attempts = attempts_of(&spans, call);
    assert_eq!(attempts.len(), 1, "{spans:#?}");
    assert!(is_error(attempts[0]));
    assert_eq!(string(attempts[0], "error.type"), Some(error));
    // The stream's upstream request carried its attempt's traceparent.
    let seen = upstream.seen();
    assert_eq!(seen.len(), 1);
    let tp = seen[0]
        .headers
        .get("traceparent")
        .and_then(|v| v.to_str().ok())
        .expect("traceparent upstream");
    assert_eq!(
        tp,
        format!(
            "00-{}-{}-01",
            hex(&attempts[0].trace_id),
            hex(&attempts[0].span_id)
        )
    );
    let text = String::from_utf8_lossy(&collector.raw()).into_owned();
    assert!(
        !text.contains("Hello") && !text.contains("wor"),
        "completion exported"
    );
    gw.wait_idle().await;
}

// proves: OBS-5 (an unreachable collector never fails a call; the spans it could not take are dropped and counted on /metrics)
#[tokio::test]
async fn unreachable_collector_fails_no_call_and_counts_dropped_spans() {
    // A port nobody listens on.
    let closed = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let endpoint = format!("http://{}", closed.local_addr().expect("addr"));
    drop(closed);
    let sim = fast_sim().await;
    let gw = Gateway::start(&format!(
        "{}\n{}",
        two_models(&sim.openai_base_url(), "", ""),
        telemetry(
            &endpoint,
            "queue_size = 2\nbatch_size = 1\nexport_timeout = \"1s\""
        )
    ))
    .await;
    let client = client();
    for _ in 0..6 {
        let resp = post_chat(&client, &gw, Some(KEY_A), &chat("chat", false)).await;
        assert_eq!(resp.status(), 200);
        let resp = post_chat(&client, &gw, Some(KEY_A), &chat("chat", true)).await;
        assert_eq!(resp.status(), 200);
        assert!(read_sse(resp).await.completed());
    }
    gw.wait_idle().await;
    gw.app.telemetry.flush().await;
    // 12 calls, each a call span and an attempt span: none reached a
    // collector, every one is counted.
    let dropped = gw.app.telemetry.dropped();
    assert_eq!(dropped, 24, "every span is counted dropped");
    let text = metrics_text(&gw).await;
    let line = text
        .lines()
        .find(|l| l.starts_with("tollgate_telemetry_spans_dropped_total"))
        .unwrap_or_else(|| panic!("no dropped-span metric:\n{text}"));
    let value: f64 = line
        .rsplit(' ')
        .next()
        .and_then(|v| v.parse().ok())
        .expect("a number");
    assert!(value >= 24.0, "{line}");
}

// proves: OBS-5 (a bad [telemetry] setting — an unparsable endpoint, an unknown protocol, a ratio outside 0..1, an unknown key — is a located configuration error at reload too; the running gateway stays)
#[tokio::test]
async fn bad_telemetry_refused_at_reload_with_its_location() {
    let collector = Collector::start().await;
    let sim = fast_sim().await;
    let good = format!(
        "{}\n{}",
        two_models(&sim.openai_base_url(), "", ""),
        telemetry(&collector.endpoint, "")
    );
    let (gw, path) = Gateway::start_file(&format!(
        "[server]\nadmin_key_env = \"CARGO_PKG_NAME\"\n{good}"
    ))
    .await;
    let bad_endpoint = |e: &str| format!("[telemetry]\nendpoint = \"{e}\"\n");
    for (table, field) in [
        (
            telemetry(&collector.endpoint, "sample_ratio = 1.5"),
            "telemetry.sample_ratio",
        ),
        (
            telemetry(&collector.endpoint, "sample_ratio = -0.5"),
            "telemetry.sample_ratio",
        ),
        (
            telemetry(&collector.endpoint, "protocol = \"grpc/carrier-pigeon\""),
            "telemetry.protocol",
        ),
        (
            telemetry(&collector.endpoint, "colour = \"blue\""),
            "telemetry.colour",
        ),
        (bad_endpoint("not a url"), "telemetry.endpoint"),
        (bad_endpoint("collector:4318"), "telemetry.endpoint"),
        (bad_endpoint("http://"), "telemetry.endpoint"),
    ] {
        let bad = &table;
        let text = format!(
            "[server]\nadmin_key_env = \"CARGO_PKG_NAME\"\n{}\n{table}",
            two_models(&sim.openai_base_url(), "", ""),
        );
        rewrite(&path, &text);
        let (status, body) = reload(&gw).await;
        assert_ne!(status, 200, "{bad}: {body}");
        assert!(body.contains(field), "{bad}: {body}");
        assert!(body.contains("line "), "located: {body}");
    }
    let resp = post_chat(&client(), &gw, Some(KEY_A), &chat("chat", false)).await;
    assert_eq!(resp.status(), 200, "the running configuration stays");
    let _ = std::fs::remove_file(&path);
}

// proves: OBS-5, GW-15 (a reload that changes [telemetry] keeps the running exporter — spans still go to the collector named at start, none to the new one — and warns that the change applies at restart)
#[tokio::test]
async fn reload_changing_telemetry_applies_at_restart_and_says_so() {
    // The test runtime is single-threaded: the server's tasks log into
    // this thread's subscriber.
    let (logs, _subscriber) = Logs::capture();
    let first = Collector::start().await;
    let second = Collector::start().await;
    let sim = fast_sim().await;
    let file = |endpoint: &str| {
        format!(
            "[server]\nadmin_key_env = \"CARGO_PKG_NAME\"\n{}\n{}",
            two_models(&sim.openai_base_url(), "", ""),
            telemetry(endpoint, "")
        )
    };
    let (gw, path) = Gateway::start_file(&file(&first.endpoint)).await;
    rewrite(&path, &file(&second.endpoint));
    let (status, body) = reload(&gw).await;
    assert_eq!(status, 200, "{body}");
    let text = logs.text();
    let warning = text
        .lines()
        .find(|l| l.contains("apply only after a restart"))
        .unwrap_or_else(|| panic!("no restart warning: {text}"));
    assert!(warning.contains("telemetry"), "{warning}");
    let resp = post_chat(&client(), &gw, Some(KEY_A), &chat("chat", false)).await;
    assert_eq!(resp.status(), 200);
    spans_until(
        &gw,
        &first,
        "the call's spans at the first collector",
        |s| !calls(s).is_empty(),
    )
    .await;
    assert!(
        second.spans().is_empty(),
        "the new endpoint takes effect only at a restart"
    );
    gw.wait_idle().await;
    let _ = std::fs::remove_file(&path);
}

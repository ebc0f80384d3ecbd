//! `tollgate batch` as a user runs it: the real binary, killed with
//! SIGKILL and resumed, against a strict simulator in this process whose
//! request count outlives the child (SPEC BATCH-1, BATCH-3).

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tokio::process::Command;
use tollgate_sim::{SimConfig, Simulator};

const BIN: &str = env!("CARGO_BIN_EXE_tollgate");

fn scratch(name: &str) -> PathBuf {
    static N: AtomicUsize = AtomicUsize::new(0);
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!(
        "batch-{name}-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("scratch dir");
    dir
}

fn write_input(path: &Path, n: usize) {
    let mut s = String::new();
    for i in 0..n {
        let line = json!({"custom_id": format!("req-{i:04}"), "method": "POST",
            "url": "/v1/chat/completions",
            "body": {"model": "sim-chat", "max_tokens": 4,
                     "messages": [{"role": "user", "content": format!("item {i}")}]}});
        s.push_str(&line.to_string());
        s.push('\n');
    }
    std::fs::write(path, s).expect("input");
}

/// Complete (newline-terminated) lines of the output.
fn complete_lines(path: &Path) -> usize {
    std::fs::read(path)
        .map(|d| d.iter().filter(|&&b| b == b'\n').count())
        .unwrap_or(0)
}

/// Waits (bounded) until `child`'s output holds `lines` whole lines; the
/// child must still run meanwhile.
async fn wait_for_lines(child: &mut tokio::process::Child, output: &Path, lines: usize) {
    let until = Instant::now() + Duration::from_secs(20);
    while complete_lines(output) < lines {
        assert!(Instant::now() < until, "the run made no progress");
        assert!(
            child.try_wait().expect("child").is_none(),
            "the run ended before it was stopped"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Sends `child` the signal `flag` (`-INT`, `-TERM`).
fn signal(child: &tokio::process::Child, flag: &str) {
    let pid = child.id().expect("pid").to_string();
    let status = std::process::Command::new("kill")
        .args([flag, &pid])
        .status()
        .expect("kill");
    assert!(status.success(), "kill {flag}");
}

/// The output's lines, each whole JSON, checked to hold one line per
/// `custom_id` and `n` in all (SPEC BATCH-3).
fn one_line_per_item(output: &Path, n: usize) -> Vec<Value> {
    let data = std::fs::read_to_string(output).expect("output");
    assert!(data.is_empty() || data.ends_with('\n'), "a torn last line");
    let mut ids = HashSet::new();
    let lines: Vec<Value> = data
        .lines()
        .map(|line| {
            let v: Value = serde_json::from_str(line).expect("no corrupt line");
            assert!(
                ids.insert(v["custom_id"].as_str().expect("id").to_owned()),
                "one line per custom_id: {line}"
            );
            v
        })
        .collect();
    assert_eq!(lines.len(), n);
    lines
}

// proves: BATCH-3 (a real child killed with SIGKILL mid-run, then resumed:
// exactly one line per custom_id, no corrupt line, a torn last line cut
// off, finished items never sent again — the simulator's request count
// proves it — and at most the items in flight sent twice)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_mid_run_then_resume_sends_finished_items_never_again() {
    let dir = scratch("kill");
    let (input, output) = (dir.join("in.jsonl"), dir.join("out.jsonl"));
    let n = 400;
    write_input(&input, n);
    let rpm = 100;
    let server = Simulator::spawn(
        SimConfig {
            rpm: Some(rpm),
            window: Duration::from_secs(1),
            ..SimConfig::default()
        },
        "127.0.0.1:0",
    )
    .await
    .expect("simulator");
    let concurrency = 16;
    let args = |cmd: &mut Command| {
        cmd.arg("batch")
            .arg(&input)
            .arg("-o")
            .arg(&output)
            .args(["--base-url", &server.openai_base_url()])
            .args(["--rpm", &rpm.to_string(), "--window", "1s"])
            .args(["--concurrency", &concurrency.to_string()])
            .args(["--progress", "off"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
    };

    let mut cmd = Command::new(BIN);
    args(&mut cmd);
    let mut child = cmd.spawn().expect("spawn tollgate batch");
    wait_for_lines(&mut child, &output, 120).await;
    child.start_kill().expect("SIGKILL");
    let status = child.wait().await.expect("wait");
    assert!(!status.success());

    // A write torn by the crash leaves a last line without its newline.
    let mut torn = std::fs::OpenOptions::new()
        .append(true)
        .open(&output)
        .expect("output");
    std::io::Write::write_all(&mut torn, br#"{"id":"batch_req_0","custom_id":"req-03"#)
        .expect("torn");
    drop(torn);

    let finished = complete_lines(&output);
    let sent_before = server.stats().requests_total;
    assert!(finished < n, "killed mid-run");
    assert!(
        sent_before >= finished as u64 && sent_before - finished as u64 <= concurrency,
        "lost at most the items in flight: sent {sent_before}, finished {finished}"
    );

    let mut cmd = Command::new(BIN);
    args(&mut cmd);
    let status = tokio::time::timeout(Duration::from_secs(30), cmd.status())
        .await
        .expect("resume finished in time")
        .expect("resume");
    assert_eq!(status.code(), Some(0));

    let sent_after = server.stats().requests_total;
    let refused = server.stats().rejected_429.total();
    assert_eq!(
        sent_after - sent_before - refused,
        (n - finished) as u64,
        "the resumed run sent exactly the unfinished items"
    );
    for v in one_line_per_item(&output, n) {
        assert_eq!(v["response"]["status_code"], 200, "{v}");
    }
    // The resumed process starts with an empty window (LC-8): its first
    // request goes alone and may draw one 429 (retried), whose headers
    // then pace the rest (Q-14).
    assert!(server.stats().rejected_429.total() <= 1);
    server.shutdown().await.expect("shutdown");
    let _ = std::fs::remove_dir_all(&dir);
}

// proves: BATCH-1 (the binary reports each problem with its line and code,
// exits 2 and sends nothing), BATCH-6 (`--sim` on the shipped example
// works with no account)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_exits_2_and_the_shipped_example_runs_on_the_simulator() {
    let dir = scratch("cli");
    let input = dir.join("bad.jsonl");
    std::fs::write(
        &input,
        "{\"custom_id\":\"a\",\"method\":\"POST\",\"url\":\"/v1/embeddings\",\"body\":{\"model\":\"e\",\"input\":\"x\"}}\nnot json\n",
    )
    .expect("input");
    let out = Command::new(BIN)
        .arg("batch")
        .arg(&input)
        .arg("-o")
        .arg(dir.join("out.jsonl"))
        .arg("--sim")
        .output()
        .await
        .expect("run");
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("line 2: invalid_json_line"), "{stderr}");
    assert!(stderr.contains("nothing was sent"), "{stderr}");
    assert!(!dir.join("out.jsonl").exists());

    let example = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/batch.jsonl");
    let output = dir.join("example.jsonl");
    let out = Command::new(BIN)
        .arg("batch")
        .arg("--sim")
        .arg(&example)
        .arg("-o")
        .arg(&output)
        .args(["--progress", "off"])
        .output()
        .await
        .expect("run");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{stdout}");
    assert!(stdout.contains("0 429s"), "{stdout}");
    let lines = std::fs::read_to_string(example)
        .expect("example")
        .lines()
        .count();
    assert_eq!(complete_lines(&output), lines);
    let _ = std::fs::remove_dir_all(&dir);
}

// proves: BATCH-4 (plain progress lines when stderr is not a terminal; a
// final summary with wall time against the lower bound, quota-wait
// percentiles and tokens, also as JSON), BATCH-6 (the summary's bound)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn progress_lines_and_summary_json() {
    let dir = scratch("progress");
    let example = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/batch.jsonl");
    let summary = dir.join("summary.json");
    let out = Command::new(BIN)
        .arg("batch")
        .arg("--sim")
        .arg(&example)
        .arg("-o")
        .arg(dir.join("out.jsonl"))
        .args([
            "--rpm",
            "12",
            "--window",
            "1s",
            "--progress-interval",
            "300ms",
        ])
        .arg("--summary-json")
        .arg(&summary)
        .arg("--plot")
        .arg(dir.join("plot.svg"))
        .output()
        .await
        .expect("run");
    assert_eq!(out.status.code(), Some(0));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("progress: "), "{stderr}");
    assert!(stderr.contains("items/s"), "{stderr}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("physical lower bound 1.00 s"), "{stdout}");
    assert!(stdout.contains("quota wait: p50"), "{stdout}");
    let s: Value =
        serde_json::from_slice(&std::fs::read(&summary).expect("summary")).expect("json");
    assert_eq!(s["outcome"], "complete");
    assert_eq!(s["succeeded"], 24);
    assert_eq!(s["lower_bound_s"], 1.0);
    assert!(s["quota_wait_ms"]["p95"].as_f64().expect("p95") > 0.0);
    assert!(s["tokens"]["reserved"].as_u64().expect("reserved") > 0);
    assert_eq!(s["sim"]["rejected_429"], 0);
    let svg = std::fs::read_to_string(dir.join("plot.svg")).expect("plot");
    assert!(svg.contains("requests started in the trailing 1s (limit 12)"));
    let _ = std::fs::remove_dir_all(&dir);
}

// proves: OBS-5 (`tollgate batch` exports traces when the standard
// OTEL_EXPORTER_OTLP_ENDPOINT / OTEL_SERVICE_NAME variables say so: one
// span per item with its custom_id, each with its attempts; a variable
// that is not a URL stops the run with an error naming it)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn otel_variables_turn_on_batch_traces() {
    use tollgate_telemetry::testing::{Collector, SpanKind, attempts_of, kind, string};
    let collector = Collector::start().await;
    let dir = scratch("otel");
    let example = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/batch.jsonl");
    let run = |endpoint: &str, output: &str| {
        let mut cmd = Command::new(BIN);
        cmd.arg("batch")
            .arg("--sim")
            .arg(&example)
            .arg("-o")
            .arg(dir.join(output))
            .args(["--progress", "off"])
            .env("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint)
            .env("OTEL_SERVICE_NAME", "cli-batch");
        cmd
    };
    let out = run(&collector.endpoint, "out.jsonl")
        .output()
        .await
        .expect("run");
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let ids: HashSet<String> = std::fs::read_to_string(&example)
        .expect("example")
        .lines()
        .map(|l| {
            let v: Value = serde_json::from_str(l).expect("json");
            v["custom_id"].as_str().expect("custom_id").to_owned()
        })
        .collect();
    let all = collector.spans();
    assert!(
        all.iter().all(|(svc, _)| svc == "cli-batch"),
        "OTEL_SERVICE_NAME"
    );
    let spans: Vec<_> = all.into_iter().map(|(_, s)| s).collect();
    let items: Vec<_> = spans
        .iter()
        .filter(|s| kind(s) == SpanKind::Internal)
        .collect();
    let traced: HashSet<String> = items
        .iter()
        .filter_map(|s| string(s, "tollgate.custom_id"))
        .collect();
    assert_eq!(items.len(), ids.len(), "one span per item");
    assert_eq!(traced, ids);
    assert!(items.iter().all(|s| !attempts_of(&spans, s).is_empty()));

    let out = run("collector:4318", "bad.jsonl")
        .output()
        .await
        .expect("run");
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("OTEL_EXPORTER_OTLP_ENDPOINT"), "{stderr}");
    let _ = std::fs::remove_dir_all(&dir);
}

// proves: BATCH-2, BATCH-3 (SIGTERM, what service managers send, stops
// the run as Ctrl-C does: no new item starts, the calls at the provider
// finish and are recorded, exit 3; the resume sends only what was never
// sent, so every item is sent and recorded exactly once). Found by a
// review: SIGTERM killed the run at once, calls paid for and unrecorded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_stops_cleanly_and_the_resume_sends_nothing_twice() {
    let dir = scratch("term");
    let (input, output) = (dir.join("in.jsonl"), dir.join("out.jsonl"));
    let n = 200;
    write_input(&input, n);
    let server = Simulator::spawn(
        SimConfig {
            ttft: Duration::from_millis(100),
            ..SimConfig::default()
        },
        "127.0.0.1:0",
    )
    .await
    .expect("simulator");
    let args = |cmd: &mut Command| {
        cmd.arg("batch")
            .arg(&input)
            .arg("-o")
            .arg(&output)
            .args(["--base-url", &server.openai_base_url()])
            .args(["--concurrency", "8", "--progress", "off"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
    };
    let mut cmd = Command::new(BIN);
    args(&mut cmd);
    let mut child = cmd.spawn().expect("spawn tollgate batch");
    wait_for_lines(&mut child, &output, 20).await;
    signal(&child, "-TERM");
    let status = tokio::time::timeout(Duration::from_secs(30), child.wait())
        .await
        .expect("stopped in time")
        .expect("wait");
    assert_eq!(status.code(), Some(3), "stopped, to be resumed");
    let finished = complete_lines(&output);
    assert!(finished < n, "stopped mid-run");
    assert_eq!(
        server.stats().requests_total,
        finished as u64,
        "every call sent before the stop was recorded"
    );

    let mut cmd = Command::new(BIN);
    args(&mut cmd);
    let status = tokio::time::timeout(Duration::from_secs(60), cmd.status())
        .await
        .expect("resume finished in time")
        .expect("resume");
    assert_eq!(status.code(), Some(0));
    assert_eq!(
        server.stats().requests_total,
        n as u64,
        "nothing sent twice"
    );
    one_line_per_item(&output, n);
    server.shutdown().await.expect("shutdown");
    let _ = std::fs::remove_dir_all(&dir);
}

// proves: BATCH-1 (a report that cannot be written, `--summary-json` or
// `--plot` in a folder that does not exist or naming a folder, is refused
// before anything is sent, not after every item was paid for). Found by a
// review: the run sent every item, then exited 1 without its summary.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unwritable_report_is_refused_before_anything_is_sent() {
    let dir = scratch("reports");
    let (input, output) = (dir.join("in.jsonl"), dir.join("out.jsonl"));
    write_input(&input, 5);
    let server = Simulator::spawn(SimConfig::default(), "127.0.0.1:0")
        .await
        .expect("simulator");
    let base_url = server.openai_base_url();
    let run = |reports: &[(&str, &Path)]| {
        let mut cmd = Command::new(BIN);
        cmd.arg("batch")
            .arg(&input)
            .arg("-o")
            .arg(&output)
            .args(["--base-url", &base_url, "--progress", "off"])
            .stdin(Stdio::null());
        for (flag, path) in reports {
            cmd.arg(flag).arg(path);
        }
        cmd
    };
    let missing = dir.join("no-such-folder").join("report");
    for (flag, path) in [
        ("--summary-json", missing.with_extension("json")),
        ("--plot", missing.with_extension("svg")),
        ("--plot", dir.clone()),
    ] {
        let out = run(&[(flag, &path)]).output().await.expect("run");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(
            out.status.code(),
            Some(1),
            "{flag} {}: {stderr}",
            path.display()
        );
        assert!(stderr.contains(&path.display().to_string()), "{stderr}");
        assert_eq!(server.stats().requests_total, 0, "nothing sent");
        assert_eq!(complete_lines(&output), 0, "nothing recorded");
    }
    // A writable pair: the run completes and writes both.
    let (summary, plot) = (dir.join("s.json"), dir.join("p.svg"));
    let status = run(&[("--summary-json", &summary), ("--plot", &plot)])
        .stdout(Stdio::null())
        .status()
        .await
        .expect("run");
    assert_eq!(status.code(), Some(0));
    assert!(summary.is_file() && plot.is_file());
    let leftovers: Vec<_> = std::fs::read_dir(&dir)
        .expect("dir")
        .filter_map(Result::ok)
        .filter(|e| e.file_name().to_string_lossy().contains("tollgate-probe"))
        .collect();
    assert!(leftovers.is_empty(), "probe files left: {leftovers:?}");
    server.shutdown().await.expect("shutdown");
    let _ = std::fs::remove_dir_all(&dir);
}

/// An upstream on a real socket: the first request gets a chat answer,
/// the second is held unanswered (a call at the provider that a stop must
/// wait for), every later one gets a 400.
async fn holding_upstream() -> (String, std::sync::Arc<AtomicUsize>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let url = format!("http://{}/v1", listener.local_addr().expect("addr"));
    let seen = std::sync::Arc::new(AtomicUsize::new(0));
    let counter = std::sync::Arc::clone(&seen);
    tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            let counter = std::sync::Arc::clone(&counter);
            tokio::spawn(async move {
                let mut data = Vec::new();
                let mut buf = [0_u8; 4096];
                loop {
                    // One whole request: its head, then content-length bytes.
                    let Some(end) = data.windows(4).position(|w| w == b"\r\n\r\n") else {
                        match socket.read(&mut buf).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => data.extend_from_slice(&buf[..n]),
                        }
                        continue;
                    };
                    let head = String::from_utf8_lossy(&data[..end]).to_ascii_lowercase();
                    let length: usize = head
                        .lines()
                        .find_map(|l| l.strip_prefix("content-length:"))
                        .and_then(|v| v.trim().parse().ok())
                        .unwrap_or(0);
                    if data.len() < end + 4 + length {
                        match socket.read(&mut buf).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => data.extend_from_slice(&buf[..n]),
                        }
                        continue;
                    }
                    data.drain(..end + 4 + length);
                    let (status, body) = match counter.fetch_add(1, Ordering::SeqCst) {
                        0 => (
                            "200 OK",
                            json!({"id": "c1", "object": "chat.completion", "created": 0,
                                "model": "sim-chat", "choices": [{"index": 0,
                                "message": {"role": "assistant", "content": "ok"},
                                "finish_reason": "stop"}],
                                "usage": {"prompt_tokens": 5, "completion_tokens": 1,
                                          "total_tokens": 6}})
                            .to_string(),
                        ),
                        1 => {
                            // Held: the connection stays open, never answered.
                            std::future::pending::<()>().await;
                            unreachable!()
                        }
                        _ => (
                            "400 Bad Request",
                            json!({"error": {"message": "bad item", "type": "invalid_request_error",
                                "param": null, "code": null}})
                            .to_string(),
                        ),
                    };
                    let response = format!(
                        "HTTP/1.1 {status}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
                        body.len()
                    );
                    if socket.write_all(response.as_bytes()).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    (url, seen)
}

// proves: BATCH-2 (a stop of another kind, here `--abort-on`, drains the
// calls already at the provider; Ctrl-C during that drain is still heard:
// the first says it is stopping, the second quits at once with 130, and
// the lines already written stay whole)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ctrl_c_is_heard_while_another_stop_drains() {
    use tokio::io::AsyncBufReadExt;
    let dir = scratch("drain-int");
    let (input, output) = (dir.join("in.jsonl"), dir.join("out.jsonl"));
    write_input(&input, 3);
    let (url, seen) = holding_upstream().await;
    let mut child = Command::new(BIN)
        .arg("batch")
        .arg(&input)
        .arg("-o")
        .arg(&output)
        .args([
            "--base-url",
            &url,
            "--concurrency",
            "2",
            "--progress",
            "off",
        ])
        .args(["--abort-on", "invalid_request"])
        .env("OPENAI_API_KEY", "sk-test")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn tollgate batch");
    let mut stderr = tokio::io::BufReader::new(child.stderr.take().expect("stderr")).lines();
    let (lines_tx, mut lines) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Ok(Some(line)) = stderr.next_line().await {
            let _ = lines_tx.send(line);
        }
    });
    // The answered item and the refused one are recorded; the held one
    // keeps the run draining (for up to DRAIN_GRACE, a minute).
    let until = Instant::now() + Duration::from_secs(20);
    while seen.load(Ordering::SeqCst) < 3 || complete_lines(&output) < 2 {
        assert!(Instant::now() < until, "the run did not reach its stop");
        assert!(child.try_wait().expect("child").is_none(), "the run ended");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(child.try_wait().expect("child").is_none(), "the run ended");
    signal(&child, "-INT");
    let heard = tokio::time::timeout(Duration::from_secs(20), async {
        while let Some(line) = lines.recv().await {
            if line.starts_with("stopping:") {
                return true;
            }
        }
        false
    })
    .await;
    assert_eq!(
        heard,
        Ok(true),
        "the first Ctrl-C was not heard during the drain"
    );
    // A second signal within a second of the first is taken as the same
    // stop (a terminal's Ctrl-C forwarded once more by a wrapper).
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    signal(&child, "-INT");
    let status = tokio::time::timeout(Duration::from_secs(20), child.wait())
        .await
        .expect("the second Ctrl-C did not quit during the drain")
        .expect("wait");
    assert_eq!(status.code(), Some(130));
    let data = std::fs::read_to_string(&output).expect("output");
    assert!(data.ends_with('\n'), "lines stay whole: {data}");
    for line in data.lines() {
        serde_json::from_str::<Value>(line).expect("no corrupt line");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

//! The access log on a standard output nobody reads (SPEC GW-14, GW-17):
//! the real binary, its stdout a pipe the test stops reading after the
//! banner.

mod common;

use std::io::{BufRead, BufReader, Read};
use std::process::{Command, Stdio};

use common::{BIN, PATIENCE, client, terminate, write_config};

const TENANT: &str = "sk-cli-access-log";

/// Far more lines (about 310 bytes each, 3.7 MB) than the pipe (64 KiB)
/// and the gateway's queue and buffer of lines (about 2 MiB) hold.
const REQUESTS: usize = 12_000;

// proves: GW-14, GW-17 (with its standard output blocked, the gateway
// still answers every request; the access lines it could not write are
// counted, on /metrics and in the log at shutdown, and every other line
// arrives whole once the output is read again: written + dropped =
// requests)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stdout_nobody_reads_costs_counted_lines_not_answers() {
    let sim = tollgate_sim::Simulator::spawn(tollgate_sim::SimConfig::default(), "127.0.0.1:0")
        .await
        .unwrap();
    let hash = tollgate_gateway::auth::hash_key_for_config(TENANT).unwrap();
    let path = write_config(
        "access-log.toml",
        &format!(
            "[providers.sim]\nbase_url = \"{}\"\n\n\
             [models.chat]\nprovider = \"sim\"\nupstream_model = \"sim-chat\"\n\n\
             [tenants.t]\nkeys_sha256 = [\"{hash}\"]\n",
            sim.openai_base_url()
        ),
    );
    let mut child = Command::new(BIN)
        .args(["serve", "--listen", "127.0.0.1:0", "--config"])
        .arg(&path)
        // The count of dropped lines is a warning at shutdown.
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stderr = child.stderr.take().unwrap();
    let log = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = stderr.read_to_string(&mut text);
        text
    });
    // Read up to the banner, then stop reading.
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    let base = loop {
        let mut line = String::new();
        assert!(stdout.read_line(&mut line).unwrap() > 0, "no banner");
        if let Some(rest) = line.split("listening on ").nth(1) {
            break rest.split_whitespace().next().unwrap().to_owned();
        }
    };

    let client = client();
    let url = format!("{base}/v1/chat/completions");
    let answered = tokio::time::timeout(PATIENCE * 4, async {
        let mut tasks = Vec::new();
        for worker in 0..8 {
            let client = client.clone();
            let url = url.clone();
            tasks.push(tokio::spawn(async move {
                for _ in (worker..REQUESTS).step_by(8) {
                    let resp = client
                        .post(&url)
                        .bearer_auth(TENANT)
                        .json(&serde_json::json!({
                            "model": "chat",
                            "messages": [{"role": "user", "content": "Hi"}],
                            "max_tokens": 4,
                        }))
                        .send()
                        .await
                        .unwrap();
                    assert_eq!(resp.status(), 200);
                    resp.bytes().await.unwrap();
                }
            }));
        }
        for task in tasks {
            task.await.unwrap();
        }
    })
    .await;
    assert!(answered.is_ok(), "requests waited for the blocked output");
    let metrics = client
        .get(format!("{base}/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let counted: u64 = metrics
        .lines()
        .find_map(|l| l.strip_prefix("tollgate_access_log_lines_dropped_total "))
        .expect("the dropped lines' counter")
        .trim()
        .parse()
        .unwrap();
    assert!(counted > 0, "nothing dropped: the output never blocked");

    // Read again, then stop the gateway: the lines it kept come out.
    let out = std::thread::spawn(move || {
        let mut text = String::new();
        stdout.read_to_string(&mut text).unwrap();
        text
    });
    assert!(terminate(&mut child).success());
    let text = out.join().unwrap();
    let log = log.join().unwrap();
    let dropped: usize = log
        .lines()
        .find(|l| l.contains("access lines dropped"))
        .and_then(|l| l.split("dropped=").nth(1))
        .and_then(|v| v.split_whitespace().next())
        .unwrap_or_else(|| panic!("the shutdown's count of dropped lines: {log}"))
        .parse()
        .unwrap();
    let written: Vec<&str> = text
        .lines()
        .filter(|l| l.contains(" route=chat "))
        .collect();
    for line in &written {
        assert!(
            line.contains(" access request_id=") && line.contains(" status=200 "),
            "a torn line: {line}"
        );
        assert!(line.contains(" class="), "a torn line: {line}");
    }
    assert!(dropped as u64 >= counted);
    assert_eq!(
        written.len() + dropped,
        REQUESTS,
        "a line neither written nor counted"
    );
}

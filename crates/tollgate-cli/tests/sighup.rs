//! Hot reload by a real SIGHUP to the `tollgate serve` process (SPEC
//! GW-15): the signal path of the binary, which the in-process tests of
//! the gateway (`/admin/reload`) do not reach.

mod common;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_tollgate");

/// How long the binary may take to start or to apply a reload.
const PATIENCE: Duration = Duration::from_secs(30);

const OLD_KEY: &str = "sk-sighup-old";
/// SHA-256 of `OLD_KEY`.
const OLD_HASH: &str = "5e8e8b50ad324926110c95f0b695e887933d0e658ce5920f60a49a51a46b2886";
const NEW_KEY: &str = "sk-sighup-new";
/// SHA-256 of `NEW_KEY`.
const NEW_HASH: &str = "2990e6b2c67c78552e779cdd2b078735d946e5a19932e6d797a38c6ce6a989df";

/// One tenant holding the key of `hash`, and one model called `model`.
fn config(hash: &str, model: &str) -> String {
    format!(
        "[providers.p]\nbase_url = \"http://127.0.0.1:9/v1\"\n\n\
         [models.{model}]\nprovider = \"p\"\n\n\
         [tenants.t]\nkeys_sha256 = [\"{hash}\"]\n"
    )
}

/// A running `tollgate serve --config`, killed on drop; its stderr (the
/// log) is collected.
struct Served {
    child: Child,
    base: String,
    log: Arc<Mutex<String>>,
}

impl Served {
    fn start(config: &Path) -> Served {
        let mut child = Command::new(BIN)
            .args(["serve", "--listen", "127.0.0.1:0", "--config"])
            .arg(config)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let stderr = child.stderr.take().unwrap();
        let rx = common::announced_urls(stdout);
        let log = Arc::new(Mutex::new(String::new()));
        let sink = Arc::clone(&log);
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { return };
                let mut log = sink.lock().unwrap();
                log.push_str(&line);
                log.push('\n');
            }
        });
        let base = match rx.recv_timeout(PATIENCE) {
            Ok(base) => base,
            Err(_) => {
                let _ = child.kill();
                panic!("no banner from tollgate serve");
            }
        };
        Served { child, base, log }
    }

    fn hangup(&self) {
        let status = Command::new("kill")
            .args(["-HUP", &self.child.id().to_string()])
            .status()
            .unwrap();
        assert!(status.success(), "kill -HUP");
    }

    fn log(&self) -> String {
        self.log.lock().unwrap().clone()
    }

    fn alive(&mut self) -> bool {
        self.child.try_wait().unwrap().is_none()
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `GET /v1/models` with `key` over `client`: the status and the model
/// names.
async fn models(client: &reqwest::Client, served: &Served, key: &str) -> (u16, Vec<String>) {
    let resp = client
        .get(format!("{}/v1/models", served.base))
        .bearer_auth(key)
        .send()
        .await
        .unwrap();
    let status = resp.status().as_u16();
    let body: Value = resp.json().await.unwrap_or(Value::Null);
    let names = body["data"]
        .as_array()
        .map(|list| {
            list.iter()
                .filter_map(|m| m["id"].as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default();
    (status, names)
}

/// Polls `check` every 20 ms until it holds, for at most `PATIENCE`.
async fn eventually<F, Fut>(what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let until = Instant::now() + PATIENCE;
    while !check().await {
        assert!(Instant::now() < until, "timed out waiting for: {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn config_path(text: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!(
        "sighup-{}-{}",
        std::process::id(),
        line!()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("gateway.toml");
    std::fs::write(&path, text).unwrap();
    path
}

// proves: GW-15 (SIGHUP re-reads the file: a rotated key works and the
// removed one gets 401 at once, the models change, over the same
// keep-alive client; an invalid file is refused with its located error in
// the log and the running configuration stays; the process never stops)
#[tokio::test]
async fn sighup_reloads_the_file_and_refuses_an_invalid_one() {
    let path = config_path(&config(OLD_HASH, "m1"));
    let mut served = Served::start(&path);
    let client = reqwest::Client::builder()
        .no_proxy()
        .timeout(PATIENCE)
        .build()
        .unwrap();
    assert_eq!(
        models(&client, &served, OLD_KEY).await,
        (200, vec!["m1".to_owned()])
    );
    assert_eq!(models(&client, &served, NEW_KEY).await.0, 401);

    // Key rotation and a model renamed, applied by the signal.
    std::fs::write(&path, config(NEW_HASH, "m2")).unwrap();
    served.hangup();
    eventually("the new key is accepted", || async {
        models(&client, &served, NEW_KEY).await.0 == 200
    })
    .await;
    assert_eq!(
        models(&client, &served, NEW_KEY).await,
        (200, vec!["m2".to_owned()])
    );
    assert_eq!(models(&client, &served, OLD_KEY).await.0, 401);
    assert!(served.alive());

    // An invalid file: refused, located, and the running config stays.
    std::fs::write(
        &path,
        format!(
            "{}[models.m3]\nprovider = \"p\"\nconcurrency = 0\n",
            config(OLD_HASH, "m2")
        ),
    )
    .unwrap();
    served.hangup();
    eventually("the refusal is logged", || {
        let log = served.log();
        async move { log.contains("configuration reload refused") }
    })
    .await;
    let log = served.log();
    assert!(log.contains("models.m3.concurrency"), "{log}");
    assert!(log.contains("gateway.toml"), "{log}");
    assert_eq!(
        models(&client, &served, NEW_KEY).await,
        (200, vec!["m2".to_owned()])
    );
    assert_eq!(models(&client, &served, OLD_KEY).await.0, 401);
    assert!(served.alive());
}

//! `server.state_dir` with the real binary (SPEC DQ-8): a day limit holds
//! across `kill -9` and a restart on the same directory, as the simulated
//! provider counts it; a state file that cannot be read stops the start.

mod common;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use common::{Served, client, serve_fails, stderr, write_config};
use tollgate_sim::{SimConfig, SimServer, Simulator};

/// Requests per day (calendar day and rolling day, both kept).
const DAY: u64 = 100;
/// Requests per second (sliding, not kept): what the gateway can admit in
/// any second, so in the at most `state_save_interval` (200 ms) plus one
/// write that a kill can lose.
const PER_SECOND: u64 = 20;

/// A gateway in front of `base` whose scope has the day limits, keeping
/// its state in `dir`; `extra` goes into `[server]`.
fn config(base: &str, dir: &Path, extra: &str) -> String {
    format!(
        "[server]\nstate_dir = {dir:?}\n{extra}\n\
         [providers.p]\nbase_url = \"{base}\"\n\n\
         [scopes.acct]\nlimits = [{{ requests = {DAY}, per = \"day\" }}, \
         {{ requests = {DAY}, per = \"1d\" }}, {{ requests = {PER_SECOND}, per = \"1s\" }}]\n\n\
         [models.m]\nprovider = \"p\"\nscope = \"acct\"\n\n\
         [anonymous]\nenabled = true\n"
    )
}

fn state_dir(name: &str) -> PathBuf {
    let d = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("state-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

async fn sim() -> SimServer {
    let config = SimConfig {
        ttft: Duration::from_millis(5),
        per_token: Duration::ZERO,
        completion_tokens: 4,
        ..SimConfig::default()
    };
    Simulator::spawn(config, "127.0.0.1:0").await.unwrap()
}

/// `tasks` clients calling `url` back to back until `stop`; `refused` is
/// set at the first 429 (calls wait for the per-second limit within their
/// deadline: a 429 says the day is spent).
fn load(
    url: String,
    tasks: usize,
    stop: Arc<AtomicBool>,
    refused: Arc<AtomicBool>,
) -> Vec<tokio::task::JoinHandle<()>> {
    (0..tasks)
        .map(|_| {
            let (url, stop, refused) = (url.clone(), Arc::clone(&stop), Arc::clone(&refused));
            tokio::spawn(async move {
                let http = client();
                let body = serde_json::json!({
                    "model": "m",
                    "messages": [{"role": "user", "content": "hi"}],
                    "max_tokens": 4,
                });
                while !stop.load(Ordering::Relaxed) {
                    let status = http
                        .post(&url)
                        .json(&body)
                        .send()
                        .await
                        .map_or(0, |r| r.status().as_u16());
                    if status == 429 {
                        refused.store(true, Ordering::Relaxed);
                    }
                    if status != 200 {
                        tokio::time::sleep(Duration::from_millis(20)).await;
                    }
                }
            })
        })
        .collect()
}

async fn eventually(what: &str, mut cond: impl FnMut() -> bool) {
    let until = std::time::Instant::now() + Duration::from_secs(60);
    while !cond() {
        assert!(std::time::Instant::now() < until, "never: {what}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

// proves: DQ-8 (kill -9 of `tollgate serve` under load, then a restart on
// the same state_dir: the simulated provider receives at most the day
// limit plus what the documented bound allows, the admissions of the last
// save interval, here at most one second's PER_SECOND; without the state
// the restarted gateway hands out a fresh day and the provider gets
// about 1.5 days)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_day_limit_holds_across_kill_9_and_restart() {
    let sim = sim().await;
    let dir = state_dir("kill9");
    let path = write_config("kill9.toml", &config(&sim.openai_base_url(), &dir, ""));
    let args = ["--config", path.to_str().unwrap()];

    let mut first = Served::start(&args, &[]);
    let stop = Arc::new(AtomicBool::new(false));
    let refused = Arc::new(AtomicBool::new(false));
    let tasks = load(
        first.url("/v1/chat/completions"),
        6,
        Arc::clone(&stop),
        Arc::clone(&refused),
    );
    // Mid-day, mid-load: killed without a chance to save.
    eventually("half the day spent", || sim.stats().ok >= DAY / 2).await;
    first.child.kill().unwrap();
    first.child.wait().unwrap();
    stop.store(true, Ordering::Relaxed);
    for t in tasks {
        t.await.unwrap();
    }
    // Calls in flight at the kill reached the provider too: it counts
    // every request it received.
    let before = sim.stats().requests_total;

    let second = Served::start(&args, &[]);
    let stop = Arc::new(AtomicBool::new(false));
    assert!(!refused.load(Ordering::Relaxed), "half a day was left");
    let tasks = load(
        second.url("/v1/chat/completions"),
        6,
        Arc::clone(&stop),
        Arc::clone(&refused),
    );
    // Until the restarted gateway says the day is spent.
    eventually("a 429", || refused.load(Ordering::Relaxed)).await;
    stop.store(true, Ordering::Relaxed);
    for t in tasks {
        t.await.unwrap();
    }
    let total = sim.stats().requests_total;
    eprintln!("provider received {before} before the kill, {total} in all");
    assert!(
        total <= DAY + PER_SECOND,
        "the provider received {total} (before the kill {before}): more than \
         {DAY} per day + {PER_SECOND}"
    );
    assert!(total >= DAY, "refused before the day was used: {total}");
    drop(second);
    let _ = std::fs::remove_dir_all(&dir);
}

// proves: DQ-8 (a state file that is not a database stops `tollgate
// serve` with an error naming the setting and the file; with
// on_unreadable_state = "start_empty" it starts)
#[tokio::test]
async fn an_unreadable_state_file_stops_the_start() {
    let dir = state_dir("garbage");
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("tollgate-state.sqlite3");
    std::fs::write(&file, vec![7u8; 4_096]).unwrap();
    let path = write_config("garbage.toml", &config("http://127.0.0.1:9/v1", &dir, ""));
    let err = stderr(&serve_fails(path.to_str().unwrap()));
    assert!(err.contains("server.state_dir"), "{err}");
    assert!(err.contains(&file.display().to_string()), "{err}");
    assert!(err.contains("not a database"), "{err}");

    let path = write_config(
        "empty.toml",
        &config(
            "http://127.0.0.1:9/v1",
            &dir,
            "on_unreadable_state = \"start_empty\"",
        ),
    );
    let served = Served::start(&["--config", path.to_str().unwrap()], &[]);
    let resp = client().get(served.url("/healthz")).send().await.unwrap();
    assert_eq!(resp.status(), 200);
    drop(served);
    let _ = std::fs::remove_dir_all(&dir);
}

const KEY_A: &str = "sk-state-tenant-a";
const KEY_B: &str = "sk-state-tenant-b";
const KEY_C: &str = "sk-state-tenant-c";
const ADMIN: &str = "sk-state-admin";

/// With `all`: tenant `a` (50 requests per day), tenant `b`'s limit on
/// model `m` (30 per day) and the account scope `acct` (100 per day);
/// without: none of them. Tenants `b` and `c` always; `c` has no limits
/// of its own, so it is told the account's.
fn readd_config(base: &str, dir: &Path, all: bool) -> String {
    let hash = |key| tollgate_gateway::auth::hash_key_for_config(key).unwrap();
    let (scope, model_scope, tenant_a, b_on_m) = if all {
        (
            "[scopes.acct]\nlimits = [{ requests = 100, per = \"1d\" }]\n".to_owned(),
            "scope = \"acct\"\n",
            format!(
                "[tenants.a]\nkeys_sha256 = [\"{}\"]\nlimits = [{{ requests = 50, per = \"1d\" }}]\n",
                hash(KEY_A)
            ),
            "[tenants.b.per_model.m]\nlimits = [{ requests = 30, per = \"1d\" }]\n",
        )
    } else {
        (String::new(), "", String::new(), "")
    };
    format!(
        "[server]\nstate_dir = {dir:?}\nadmin_key_env = \"TOLLGATE_TEST_ADMIN_KEY\"\n\n\
         [providers.p]\nbase_url = \"{base}\"\n\n{scope}\n\
         [models.m]\nprovider = \"p\"\n{model_scope}\n\
         [tenants.b]\nkeys_sha256 = [\"{}\"]\n{b_on_m}\n\
         [tenants.c]\nkeys_sha256 = [\"{}\"]\n\n{tenant_a}",
        hash(KEY_B),
        hash(KEY_C)
    )
}

/// One call as `key`: the requests it has left by the response's headers.
async fn remaining(served: &Served, key: &str) -> u64 {
    let resp = client()
        .post(served.url("/v1/chat/completions"))
        .bearer_auth(key)
        .json(&serde_json::json!({
            "model": "m",
            "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 4,
        }))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    resp.headers()["x-ratelimit-remaining-requests"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap()
}

/// Rewrites the configuration at `path` and reloads it by the admin
/// endpoint.
async fn reload_to(served: &Served, path: &Path, text: &str) {
    std::fs::write(path, text).unwrap();
    let resp = client()
        .post(served.url("/admin/reload"))
        .bearer_auth(ADMIN)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200, "{:?}", resp.text().await);
}

/// One call each of `a`, `b` and `c` (in that order): what each is told
/// it has left (a: its own day, b: its day on `m`, c: the account's).
async fn one_each(served: &Served) -> [u64; 3] {
    [
        remaining(served, KEY_A).await,
        remaining(served, KEY_B).await,
        remaining(served, KEY_C).await,
    ]
}

// proves: DQ-8, GW-15 (a tenant, a tenant's limits on a model and an
// account scope that a reload or a deploy leaves out and a later reload
// adds back count what they had spent that day, as the file kept it:
// after remove-and-re-add reloads in one process, after a deploy without
// them and a reload adding them, and after the restart that follows; not
// a fresh day)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_and_a_scope_added_back_by_a_reload_keep_their_day() {
    let sim = sim().await;
    let dir = state_dir("readd");
    let base = sim.openai_base_url();
    let path = write_config("readd.toml", &readd_config(&base, &dir, true));
    let args = ["--config", path.to_str().unwrap()];
    let env = [("TOLLGATE_TEST_ADMIN_KEY", ADMIN)];
    let restart = |all: bool| {
        std::fs::write(&path, readd_config(&base, &dir, all)).unwrap();
        Served::start(&args, &env)
    };

    // a: 10 of 50; b on m: 5 of 30; the account: 20 of 100.
    let mut served = Served::start(&args, &env);
    for (key, n) in [(KEY_A, 10), (KEY_B, 5), (KEY_C, 5)] {
        for _ in 0..n {
            remaining(&served, key).await;
        }
    }
    served.terminate();

    // One process: left out by a reload, added back by the next.
    let mut served = restart(true);
    reload_to(&served, &path, &readd_config(&base, &dir, false)).await;
    reload_to(&served, &path, &readd_config(&base, &dir, true)).await;
    assert_eq!(
        one_each(&served).await,
        [50 - 11, 30 - 6, 100 - 23],
        "re-added by reloads"
    );
    served.terminate();

    // A deploy without them, then a reload that adds them back.
    let mut served = restart(false);
    reload_to(&served, &path, &readd_config(&base, &dir, true)).await;
    assert_eq!(
        one_each(&served).await,
        [50 - 12, 30 - 7, 100 - 26],
        "deployed back"
    );
    served.terminate();

    // And the restart after that.
    let served = restart(true);
    assert_eq!(
        one_each(&served).await,
        [50 - 13, 30 - 8, 100 - 29],
        "restarted"
    );
    drop(served);
    let _ = std::fs::remove_dir_all(&dir);
}

//! Gateway replicas sharing one account's budget through a real
//! `redis-server` (SPEC DQ-1..DQ-5), against one strict simulator with the
//! account's limits, on 2-second windows.
//!
//! Each test starts its own Redis on a free port; without `redis-server`
//! the tests skip, unless `TOLLGATE_REQUIRE_REDIS=1` (set in CI).

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use common::{Gateway, KEY_A, client, sim, tenants};
use serde_json::{Value, json};
use tollgate::StoreMode;
use tollgate_redis::RedisServer;
use tollgate_sim::{ChargeMode, SimConfig, SimServer};

const W: Duration = Duration::from_secs(2);
const RPM: u64 = 30;
const TPM: u64 = 1_500;

/// The account: a strict provider that counts tokens the way the gateway's
/// `accounting = "openai"` reserves them (characters / 4 + max_tokens, at
/// admission, never reconciled), so its token limit is what binds.
async fn account() -> SimServer {
    sim(SimConfig {
        rpm: Some(RPM),
        tpm: Some(TPM),
        window: W,
        charge: ChargeMode::Chars {
            chars_per_token: 4,
            output: true,
        },
        ..SimConfig::default()
    })
    .await
}

/// One replica: the account's whole limits on scope `account`, its quota in
/// `redis` under `prefix`.
async fn replica(sim: &SimServer, redis: &RedisServer, prefix: &str, store_extra: &str) -> Gateway {
    let store = format!(
        "[quota_store]\nbackend = \"redis\"\nurl = \"{}\"\nprefix = \"{prefix}\"\n{store_extra}",
        redis.url()
    );
    replica_with(sim, &store).await
}

/// One replica with the account's whole limits and `store` (TOML lines).
async fn replica_with(sim: &SimServer, store: &str) -> Gateway {
    let toml = format!(
        "[providers.p]\nbase_url = \"{}\"\naccounting = \"openai\"\nreconciles = false\n\n\
         [scopes.account]\nlimits = [{{ requests = {RPM}, per = \"2s\" }}, {{ tokens = {TPM}, per = \"2s\" }}]\n\n\
         [models.gpt-4o-mini]\nprovider = \"p\"\nscope = \"account\"\n\n{store}\n\n{}",
        sim.openai_base_url(),
        tenants("", ""),
    );
    Gateway::start(&toml).await
}

fn body() -> Value {
    json!({
        "model": "gpt-4o-mini",
        "messages": [{"role": "user", "content": "Say something short."}],
        "max_tokens": 60,
    })
}

/// `n` items spread over the replicas by `workers` concurrent clients.
/// Returns (200s, other statuses).
async fn load(replicas: &[Gateway], n: usize, workers: usize) -> (usize, Vec<u16>) {
    let next = Arc::new(AtomicUsize::new(0));
    let ok = Arc::new(AtomicUsize::new(0));
    let urls: Arc<Vec<String>> = Arc::new(
        replicas
            .iter()
            .map(|g| g.url("/v1/chat/completions"))
            .collect(),
    );
    let tasks: Vec<_> = (0..workers)
        .map(|w| {
            let (next, ok, urls) = (next.clone(), ok.clone(), urls.clone());
            tokio::spawn(async move {
                let http = client();
                let mut failed = Vec::new();
                while next.fetch_add(1, Ordering::Relaxed) < n {
                    let url = &urls[w % urls.len()];
                    let resp = http
                        .post(url)
                        .bearer_auth(KEY_A)
                        .header("x-request-timeout", "30")
                        .json(&body())
                        .send()
                        .await
                        .expect("replica answers");
                    let status = resp.status().as_u16();
                    let _ = resp.bytes().await;
                    if status == 200 {
                        ok.fetch_add(1, Ordering::Relaxed);
                    } else {
                        failed.push(status);
                    }
                }
                failed
            })
        })
        .collect();
    let mut failed = Vec::new();
    for t in tasks {
        failed.extend(t.await.expect("worker"));
    }
    (ok.load(Ordering::Relaxed), failed)
}

// proves: DQ-2, Q-7 (three gateway replicas, each configured with the
// account's whole RPM and TPM, share them through Redis under concurrent
// load: the strict provider sees zero 429s and no rolling window over
// either limit, tokens included; every item succeeds)
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_replicas_hold_the_account_limits_together() {
    let Some(redis) = RedisServer::start_or_skip("three_replicas_hold_the_account_limits_together")
    else {
        return;
    };
    let sim = account().await;
    let prefix = format!("gw-{}", std::process::id());
    let mut replicas = Vec::new();
    for _ in 0..3 {
        replicas.push(replica(&sim, &redis, &prefix, "").await);
    }
    // About three windows of the token budget (66 tokens an item as the
    // provider counts them, 22 a window), from 12 clients.
    let n = 60;
    let (ok, failed) = load(&replicas, n, 12).await;
    assert_eq!(failed, Vec::<u16>::new(), "every item succeeds");
    assert_eq!(ok, n);
    let stats = sim.stats();
    assert_eq!(stats.rejected_429.total(), 0, "{stats:?}");
    assert!(stats.max_requests_in_window <= RPM, "{stats:?}");
    assert!(stats.max_tokens_in_window <= TPM, "{stats:?}");
    for r in &replicas {
        assert_eq!(r.upstream_scope("account").store, Some(StoreMode::Shared));
        r.wait_idle().await;
    }

    // The contrast: the same replicas with per-process quotas each spend
    // the whole budget, and the provider refuses.
    let sim = account().await;
    let mut local = Vec::new();
    for _ in 0..3 {
        local.push(replica_with(&sim, "").await);
    }
    let _ = load(&local, 45, 12).await;
    assert!(sim.stats().rejected_429.total() > 0, "{:?}", sim.stats());
}

// proves: DQ-3, DQ-5 (Redis killed: under `fail_closed` every call is
// answered 503 `quota_store_unavailable` at once, never after a wait, and
// `/readyz` says so; Redis back: the same replica serves again without a
// restart)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fail_closed_answers_503_at_once_and_recovers() {
    let Some(mut redis) =
        RedisServer::start_or_skip("fail_closed_answers_503_at_once_and_recovers")
    else {
        return;
    };
    let sim = account().await;
    let gw = replica(&sim, &redis, &format!("fc-{}", std::process::id()), "").await;
    let http = client();
    let url = gw.url("/v1/chat/completions");
    let send = || http.post(&url).bearer_auth(KEY_A).json(&body()).send();
    assert_eq!(send().await.expect("answer").status(), 200);

    redis.kill();
    for _ in 0..5 {
        let started = Instant::now();
        let resp = send().await.expect("answer");
        let took = started.elapsed();
        assert_eq!(resp.status(), 503);
        let error: Value = resp.json().await.expect("json");
        assert_eq!(error["error"]["code"], "quota_store_unavailable", "{error}");
        // The operation timeout is 50 ms; a loaded CI machine gets slack,
        // but a call never waits for the store to come back.
        assert!(took < Duration::from_secs(2), "answered after {took:?}");
    }
    let ready = http.get(gw.url("/readyz")).send().await.expect("readyz");
    assert_eq!(ready.status(), 503);
    assert_eq!(
        sim.stats().requests_total,
        1,
        "nothing reached the provider"
    );

    redis.restart().expect("restart");
    common::eventually("shared mode again", || {
        gw.upstream_scope("account").store == Some(StoreMode::Shared)
    })
    .await;
    assert_eq!(send().await.expect("answer").status(), 200);
    let ready = http.get(gw.url("/readyz")).send().await.expect("readyz");
    assert_eq!(ready.status(), 200);
}

// proves: DQ-3 (Redis killed: under `fail_open_local` the replica keeps
// serving from its local share, limit / replicas of every limit, never
// more; the state shows in the snapshot and `/readyz`)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fail_open_local_serves_the_local_share() {
    let Some(mut redis) = RedisServer::start_or_skip("fail_open_local_serves_the_local_share")
    else {
        return;
    };
    let sim = account().await;
    let gw = replica(
        &sim,
        &redis,
        &format!("fo-{}", std::process::id()),
        "on_unavailable = \"fail_open_local\"\nreplicas = 3",
    )
    .await;
    redis.kill();
    // Ten items: the local share admits RPM / 3 = 10 requests and
    // TPM / 3 = 500 tokens (7 items) per window.
    let (ok, failed) = load(std::slice::from_ref(&gw), 10, 4).await;
    assert_eq!(failed, Vec::<u16>::new());
    assert_eq!(ok, 10);
    assert_eq!(
        gw.upstream_scope("account").store,
        Some(StoreMode::LocalFallback)
    );
    let ready: Value = client()
        .get(gw.url("/readyz"))
        .send()
        .await
        .expect("readyz")
        .json()
        .await
        .expect("json");
    assert_eq!(ready["status"], "degraded", "{ready}");
    let stats = sim.stats();
    assert!(
        stats.max_requests_in_window <= RPM / 3 && stats.max_tokens_in_window <= TPM / 3,
        "the local share only: {stats:?}"
    );
    gw.wait_idle().await;
}

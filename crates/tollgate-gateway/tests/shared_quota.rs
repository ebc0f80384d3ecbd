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

use common::{
    Gateway, KEY_A, RemoteSim, client, one_more_call_draws_no_429, reload, rewrite, sim, tenants,
};
use serde_json::{Value, json};
use tollgate::StoreMode;
use tollgate_redis::{RedisCluster, RedisServer};
use tollgate_sim::{ChargeMode, SimConfig, SimServer};

const W: Duration = Duration::from_secs(2);
const RPM: u64 = 30;
const TPM: u64 = 1_500;

/// The account: a strict provider that counts tokens the way the gateway's
/// `accounting = "openai"` reserves them (characters / 4 + max_tokens, at
/// admission, never reconciled), so its token limit is what binds. It runs
/// on its own runtime ([`RemoteSim`]): "zero 429s" holds while requests
/// reach it within the arrival bound of being sent (SPEC Q-15).
async fn account() -> RemoteSim {
    RemoteSim::start(account_config()).await
}

/// The account's simulator configuration (see [`account`]).
fn account_config() -> SimConfig {
    SimConfig {
        rpm: Some(RPM),
        tpm: Some(TPM),
        window: W,
        charge: ChargeMode::Chars {
            chars_per_token: 4,
            output: true,
        },
        ..SimConfig::default()
    }
}

/// A store timeout for tests about sharing, not outages: the default 50 ms
/// is meant for a production host, and on two shared cores running two
/// test binaries a Redis round trip sometimes takes longer (flake hunt:
/// the rest of a 60-item job, 19 or all 60 items, answered 503 after one
/// reservation timed out). A timeout is a store failure (SPEC DQ-3:
/// `fail_closed` refuses every call until the store answers again),
/// which is not what these tests are about.
const LOADED_HOST: &str = "timeout = \"2s\"";

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

/// Loads `replicas` with about three windows of the token budget (66
/// tokens an item as the provider counts them, 22 a window) from 12
/// clients: every item succeeds, the strict provider sees zero 429s and
/// no rolling window over either limit, and every replica stays shared.
async fn held_together(sim: &SimServer, replicas: &[Gateway]) {
    let n = 60;
    let (ok, failed) = load(replicas, n, 12).await;
    assert_eq!(failed, Vec::<u16>::new(), "every item succeeds");
    assert_eq!(ok, n);
    let stats = sim.stats();
    assert_eq!(stats.rejected_429.total(), 0, "{stats:?}");
    assert!(stats.max_requests_in_window <= RPM, "{stats:?}");
    assert!(stats.max_tokens_in_window <= TPM, "{stats:?}");
    for r in replicas {
        assert_eq!(r.upstream_scope("account").store, Some(StoreMode::Shared));
        r.wait_idle().await;
    }
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
        replicas.push(replica(&sim, &redis, &prefix, LOADED_HOST).await);
    }
    held_together(&sim, &replicas).await;

    // The contrast: the same replicas with per-process quotas each admit
    // the whole budget. 45 calls at once, 15 a replica (each admits 23 a
    // window): the provider takes a second to answer a call it admits, so
    // its first answer is the refusal of the 24th and no budget header
    // can teach a replica the others' spend before that (SPEC Q-14). With
    // 12 clients and prompt answers the headers sometimes held the three
    // replicas under the limit and this assertion failed (3 runs in 30
    // under load).
    let sim = RemoteSim::start(SimConfig {
        ttft: Duration::from_secs(1),
        ..account_config()
    })
    .await;
    let mut local = Vec::new();
    for _ in 0..3 {
        local.push(replica_with(&sim, "").await);
    }
    let _ = load(&local, 45, 45).await;
    assert!(sim.stats().rejected_429.total() > 0, "{:?}", sim.stats());
}

// proves: DQ-7, DQ-2 (the same three replicas on a Redis Cluster over
// TLS, configured as `[quota_store] cluster = true` with the seeds'
// `rediss://` URLs and `ca_file`: zero 429s, no window over either limit)
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_replicas_on_a_tls_cluster_hold_the_account_limits_together() {
    let Some(cluster) = RedisCluster::start_tls_or_skip(
        "three_replicas_on_a_tls_cluster_hold_the_account_limits_together",
    ) else {
        return;
    };
    let sim = account().await;
    // A generous timeout: a round trip stalled by a loaded machine is no
    // outage here (one would make its call, and the next few, 503; with
    // 1 s, every call of one run answered 503 at a load of 15 to 26 on
    // two cores, where a TLS handshake to each node is slow).
    let store = format!(
        "[quota_store]\nbackend = \"redis\"\nurl = \"{}\"\ncluster = true\nca_file = \"{}\"\n\
         prefix = \"gw-cluster-{}\"\ntimeout = \"5s\"\n",
        cluster.urls(),
        cluster.ca_file().expect("a TLS cluster").display(),
        std::process::id()
    );
    let mut replicas = Vec::new();
    for _ in 0..3 {
        replicas.push(replica_with(&sim, &store).await);
    }
    held_together(&sim, &replicas).await;
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
    assert_eq!(until_served(send).await, 200);

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
    assert_eq!(until_served(send).await, 200);
    let ready = http.get(gw.url("/readyz")).send().await.expect("readyz");
    assert_eq!(ready.status(), 200);
}

/// The status of `send`'s answer, asked again (up to ten times) while it is
/// a 503: a replica with the 50 ms default store timeout rightly answers
/// 503 when a round trip takes longer (DQ-3), which two loaded cores
/// sometimes make it do (flake hunt: once in about 40 runs) outside the
/// outage a test studies.
async fn until_served<F, Fut>(send: F) -> reqwest::StatusCode
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = reqwest::Result<reqwest::Response>>,
{
    let mut status = send().await.expect("answer").status();
    for _ in 0..10 {
        if status != 503 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
        status = send().await.expect("answer").status();
    }
    status
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

// proves: DQ-2, Q-9, GW-6, GW-17 (hostile clients against a replica whose
// quota lives in Redis: requests with deadlines of a millisecond and
// clients that hang up while their call is upstream cost only themselves;
// one window later the shared budget is whole again, the replica is idle,
// and a well-behaved client is served)
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn hostile_clients_leave_the_shared_budget_whole() {
    let Some(redis) = RedisServer::start_or_skip("hostile_clients_leave_the_shared_budget_whole")
    else {
        return;
    };
    // Answers take 300 ms, so a client can hang up while its call is
    // upstream. On its own runtime, as `account` is.
    let sim = RemoteSim::start(SimConfig {
        rpm: Some(RPM),
        tpm: Some(TPM),
        window: W,
        ttft: Duration::from_millis(300),
        ..SimConfig::default()
    })
    .await;
    let gw = replica(
        &sim,
        &redis,
        &format!("hostile-{}", std::process::id()),
        LOADED_HOST,
    )
    .await;
    let http = client();
    let url = gw.url("/v1/chat/completions");
    // Tiny deadlines: admitted or refused, never left holding anything.
    let tiny: Vec<_> = (0..20)
        .map(|_| {
            http.post(&url)
                .bearer_auth(KEY_A)
                .header("x-request-timeout", "0.001")
                .json(&body())
                .send()
        })
        .collect();
    for resp in futures_util::future::join_all(tiny).await {
        let status = resp.expect("answer").status().as_u16();
        assert!(
            [200, 429, 504].contains(&status),
            "tiny deadline answered {status}"
        );
    }
    // Clients that hang up while their call waits or is upstream.
    let gone: Vec<_> = (0..10)
        .map(|_| common::spawn_chat(&gw, KEY_A, body()))
        .collect();
    tokio::time::sleep(Duration::from_millis(100)).await;
    for task in gone {
        task.abort();
    }
    // Every amount taken ages out within a window of its count (plus the
    // arrival bound); then the shared store has the whole budget again.
    let app = gw.current();
    let controller = &app.upstream[0].controller;
    let scope = controller.scope_id("account").expect("scope");
    let give_up = Instant::now() + common::PATIENCE;
    loop {
        let limits = controller
            .shared_limits(scope)
            .await
            .expect("a shared scope");
        let limits = limits.expect("Redis answers");
        if limits.iter().all(|l| l.available == l.limit as i64) {
            break;
        }
        assert!(Instant::now() < give_up, "budget never whole: {limits:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    gw.wait_idle().await;
    let resp = http
        .post(&url)
        .bearer_auth(KEY_A)
        .json(&body())
        .send()
        .await
        .expect("answer");
    assert_eq!(resp.status(), 200);
    assert_eq!(sim.stats().rejected_429.total(), 0, "{:?}", sim.stats());
}

/// The replica configuration of [`replica`] as text, for building states
/// directly.
fn replica_toml(sim: &SimServer, redis: &RedisServer, prefix: &str) -> String {
    format!(
        "[providers.p]\nbase_url = \"{}\"\n\n\
         [scopes.account]\nlimits = [{{ requests = {RPM}, per = \"2s\" }}]\n\n\
         [models.gpt-4o-mini]\nprovider = \"p\"\nscope = \"account\"\n\n\
         [quota_store]\nbackend = \"redis\"\nurl = \"{}\"\nprefix = \"{prefix}\"\n\n{}",
        sim.openai_base_url(),
        redis.url(),
        tenants("", ""),
    )
}

// proves: GW-15, DQ-1 (a reload that leaves `[quota_store]` as it was keeps
// the store's connection and every unchanged scope's controller; one that
// changes it connects anew and starts the scopes afresh)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_keeps_the_store_unless_it_changed() {
    use tollgate_gateway::build::build_with;
    use tollgate_gateway::config::GatewayConfig;
    use tollgate_gateway::metrics::Metrics;

    let Some(redis) = RedisServer::start_or_skip("a_reload_keeps_the_store_unless_it_changed")
    else {
        return;
    };
    let sim = account().await;
    let load = |prefix: &str| {
        GatewayConfig::from_toml(&replica_toml(&sim, &redis, prefix), "t.toml").expect("valid")
    };
    let first = build_with(&load("r1"), Metrics::install(), None).expect("build");
    // One admission through the first state's scope.
    let controller = &first.upstream[0].controller;
    let scope = controller.scope_id("account").expect("scope");
    drop(
        controller
            .acquire(&tollgate::Call::new(scope), tollgate::Deadline::NONE)
            .await
            .expect("admitted"),
    );
    let admitted = |state: &tollgate_gateway::state::AppState| {
        state.upstream[0].controller.snapshot().scopes[0]
            .counters
            .admitted
    };
    let same = build_with(&load("r1"), Metrics::install(), Some(&first)).expect("reload");
    let (a, b) = (
        first.quota_store.as_ref().expect("shared"),
        same.quota_store.as_ref().expect("shared"),
    );
    assert!(Arc::ptr_eq(a, b), "the connection is kept");
    assert_eq!(admitted(&same), 1, "the scope's controller is kept");
    let other = build_with(&load("r2"), Metrics::install(), Some(&same)).expect("reload");
    assert!(!Arc::ptr_eq(b, other.quota_store.as_ref().expect("shared")));
    assert_eq!(
        admitted(&other),
        0,
        "another store: the scope starts afresh"
    );
}

/// The window of the reload tests: short enough that the last call, which
/// waits for two of the five to leave, answers within its 10 s. The count
/// read after the reload is compared exactly only while none of the five
/// can have left the window: a fifth call the store held back for about a
/// window (behind an estimate of others' use, DQ-9) or a stalled machine
/// leaves the first four leaving just as the reload runs.
const RELOAD_W: Duration = Duration::from_secs(8);

/// One replica reloadable from a file: `requests` per [`RELOAD_W`] on
/// scope `account` in `redis`, `[cooldown] max = max`. The store's timeout
/// is long (5 s: at a load of 14 on two cores a round trip took over 2 s
/// and one of the five calls answered 503): a slow operation must not make
/// the store unavailable here (this test is about the reload).
fn reloadable(sim: &SimServer, redis: &RedisServer, requests: u64, max: &str) -> String {
    format!(
        "[server]\nadmin_key_env = \"CARGO_PKG_NAME\"\n\n\
         [providers.p]\nbase_url = \"{}\"\n\n\
         [cooldown]\nmax = \"{max}\"\n\n\
         [scopes.account]\nlimits = [{{ requests = {requests}, per = \"{}s\" }}]\n\n\
         [models.gpt-4o-mini]\nprovider = \"p\"\nscope = \"account\"\n\n\
         [quota_store]\nbackend = \"redis\"\nurl = \"{}\"\nprefix = \"reload\"\ntimeout = \"5s\"\n\n{}",
        sim.openai_base_url(),
        RELOAD_W.as_secs(),
        redis.url(),
        tenants("", ""),
    )
}

/// Five calls of tenant A one after the other, each answered 200; returns
/// the instant before each was sent.
async fn five_calls(gw: &Gateway) -> Vec<Instant> {
    let client = client();
    let mut sent = Vec::new();
    for _ in 0..5 {
        sent.push(Instant::now());
        let r = client
            .post(gw.url("/v1/chat/completions"))
            .bearer_auth(KEY_A)
            .json(&body())
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
    }
    sent
}

// proves: GW-15, DQ-1, CD-1 (a reload of a scope kept in Redis keeps its
// in-process parts: the running cooldown goes on, and the new amount
// applies to the count the store kept; the provider refuses nothing)
#[tokio::test]
async fn a_reload_keeps_a_shared_scopes_cooldown_and_count() {
    let Some(redis) =
        RedisServer::start_or_skip("a_reload_keeps_a_shared_scopes_cooldown_and_count")
    else {
        return;
    };
    let sim = sim(SimConfig {
        rpm: Some(5),
        window: RELOAD_W,
        ..SimConfig::default()
    })
    .await;
    let (gw, path) = Gateway::start_file(&reloadable(&sim, &redis, 5, "60s")).await;
    // Each of the five is counted until at least one window after it was
    // sent.
    let first = five_calls(&gw).await[0];
    let controller = |gw: &Gateway| {
        let app = gw.current();
        let s = app.upstream.iter().find(|s| &*s.name == "account").unwrap();
        s.controller.clone()
    };
    let before = controller(&gw);
    let scope = before.scope_id("account").unwrap();
    before.start_cooldown(scope, Duration::from_secs(1));
    let cooling = before.cooldown(scope).unwrap();
    assert!(cooling.1.is_some());
    // What the store counts (the 5, and what the provider's headers showed
    // held by others, DQ-9: an answer the store recorded late can show one
    // of the account's as another's for a window).
    // Every settlement and report landed first.
    before.idle().await;
    let counted = before.shared_limits(scope).await.unwrap().unwrap()[0];
    assert_eq!(counted.limit, 5);
    assert!(counted.available < 5, "counted: {counted:?}");
    rewrite(&path, &reloadable(&sim, &redis, 4, "30s"));
    assert_eq!(reload(&gw).await.0, 200);
    let after = controller(&gw);
    let (generation, running) = after.cooldown(scope).unwrap();
    let read = after.clock().now();
    assert_eq!(generation, cooling.0, "the cooldown's generation goes on");
    if cooling.1.is_some_and(|end| read < end) {
        assert_eq!(running, cooling.1, "the cooldown goes on");
    }
    let limits = after.shared_limits(scope).await.unwrap().unwrap();
    let elapsed = first.elapsed();
    assert_eq!(limits[0].limit, 4);
    // Exact while none of the five can have left the window; after a
    // stall as long as the window, only what the window still holds.
    if elapsed < RELOAD_W {
        assert_eq!(
            limits[0].available,
            counted.available - 1,
            "the count the store kept, of 4 ({elapsed:?} after the first call)"
        );
    } else {
        assert!(limits[0].available <= 4, "{limits:?}");
        eprintln!("note: the machine stalled {elapsed:?}: the exact count was not checked");
    }
    one_more_call_draws_no_429(&gw, &sim, KEY_A, &body()).await;
    gw.wait_idle().await;
}

// proves: GW-15, DQ-1, Q-7 (a reload lowers a shared scope's `requests`
// from 5 to 4 while the window holds the five admitted under the old
// limit: the k-th call admitted after it needs k + 1 of the five gone, so
// it answers no earlier than one window after the (k + 1)-th of them was
// sent: the window never holds more than the new limit's admissions. The
// provider takes 100 a window and reports its remaining budget, so only
// the store holds the calls back, with the DQ-9 feedback running.)
#[tokio::test]
async fn a_lowered_shared_limit_admits_nothing_over_it_after_a_reload() {
    let Some(redis) =
        RedisServer::start_or_skip("a_lowered_shared_limit_admits_nothing_over_it_after_a_reload")
    else {
        return;
    };
    let sim = sim(SimConfig {
        rpm: Some(100),
        window: RELOAD_W,
        ..SimConfig::default()
    })
    .await;
    let (gw, path) = Gateway::start_file(&reloadable(&sim, &redis, 5, "60s")).await;
    let sent = five_calls(&gw).await;
    rewrite(&path, &reloadable(&sim, &redis, 4, "60s"));
    assert_eq!(reload(&gw).await.0, 200);
    let client = client();
    let calls: Vec<_> = (0..4)
        .map(|_| {
            let req = client
                .post(gw.url("/v1/chat/completions"))
                .bearer_auth(KEY_A)
                .header("x-request-timeout", "30")
                .json(&body());
            tokio::spawn(async move {
                let status = req.send().await.map(|r| r.status());
                (status, Instant::now())
            })
        })
        .collect();
    let mut answered = Vec::new();
    for call in calls {
        let (status, at) = call.await.unwrap();
        assert_eq!(status.unwrap(), 200);
        answered.push(at);
    }
    answered.sort();
    for (k, at) in answered.iter().enumerate() {
        let gone = sent[k + 1] + RELOAD_W;
        assert!(
            *at >= gone,
            "call {k} after the reload answered {:?} before the {}th of the five left",
            gone - *at,
            k + 2
        );
    }
    assert_eq!(sim.stats().rejected_429.total(), 0);
    gw.wait_idle().await;
}

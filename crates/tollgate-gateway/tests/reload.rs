//! Reloading the configuration (SPEC GW-15): a valid file replaces
//! tenants, keys, models, deployments and limits without dropping a
//! connection or a call; an invalid one is refused with its located error
//! and the running configuration stays.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use common::*;
use tollgate::quota::Dimension;
use tollgate_gateway::config::GatewayConfig;

/// Models `chat` (scope `one`, `one_rpm`) and `extra` (scope `two`,
/// `two_rpm`) on `base_url`; tenant `a`, and `b` when `with_b`.
fn config(base_url: &str, one_rpm: u64, two_rpm: u64, with_b: bool) -> String {
    let b = if with_b {
        format!("[tenants.b]\nkeys_sha256 = [\"{}\"]\n", key_hash(KEY_B))
    } else {
        String::new()
    };
    format!(
        r#"
[server]
admin_key_env = "CARGO_PKG_NAME"

[providers.sim]
base_url = "{base_url}"

[scopes.one]
rpm = {one_rpm}
[scopes.two]
rpm = {two_rpm}

[models.chat]
provider = "sim"
upstream_model = "sim-chat"
scope = "one"

[models.extra]
provider = "sim"
upstream_model = "sim-chat"
scope = "two"

[tenants.a]
keys_sha256 = ["{}"]
rpm = 1000
{b}
"#,
        key_hash(KEY_A)
    )
}

// proves: GW-15 (reloads under load fail no request: connections and
// calls in flight, one-shot and streaming, finish normally)
#[tokio::test]
async fn reloads_under_load_fail_no_request() {
    let sim = slow_sim(Duration::from_millis(2), 20).await;
    let base = sim.openai_base_url();
    let (gw, path) = Gateway::start_file(&config(&base, 100_000, 100_000, true)).await;
    let stop = Arc::new(AtomicBool::new(false));
    let workers: Vec<_> = (0..6)
        .map(|i| {
            let (client, url, stop) = (client(), gw.url("/v1/chat/completions"), stop.clone());
            tokio::spawn(async move {
                let mut outcomes = Vec::new();
                while !stop.load(Ordering::Relaxed) {
                    let stream = i % 2 == 0;
                    let resp = client
                        .post(&url)
                        .bearer_auth(KEY_A)
                        .json(&chat("chat", stream))
                        .send()
                        .await;
                    let outcome = match resp {
                        Ok(r) if r.status() == 200 && stream => {
                            let read = read_sse(r).await;
                            if read.completed() {
                                Ok(())
                            } else {
                                Err(format!("{read:?}"))
                            }
                        }
                        Ok(r) if r.status() == 200 => {
                            r.bytes().await.map(drop).map_err(|e| e.to_string())
                        }
                        Ok(r) => Err(format!("status {}", r.status())),
                        Err(e) => Err(e.to_string()),
                    };
                    outcomes.push(outcome);
                }
                outcomes
            })
        })
        .collect();
    for n in 0..6u64 {
        tokio::time::sleep(Duration::from_millis(60)).await;
        // Alternate the limits of scope `one` (a new scope state each time)
        // and the tenants.
        rewrite(&path, &config(&base, 100_000 + n, 100_000, n % 2 == 0));
        assert_eq!(reload(&gw).await.0, 200);
    }
    stop.store(true, Ordering::Relaxed);
    let mut total = 0;
    for w in workers {
        for outcome in bounded("worker ends", w).await.unwrap() {
            assert_eq!(outcome, Ok(()));
            total += 1;
        }
    }
    assert!(
        total > 6,
        "the load ran during the reloads ({total} requests)"
    );
    gw.wait_idle().await;
}

// proves: GW-15 (a key removed by a reload gets 401 at once; a tenant
// added gets served; key rotation without a restart)
#[tokio::test]
async fn a_key_removed_by_reload_is_refused_at_once() {
    let sim = fast_sim().await;
    let base = sim.openai_base_url();
    let (gw, path) = Gateway::start_file(&config(&base, 100, 100, true)).await;
    let client = client();
    let r = post_chat(&client, &gw, Some(KEY_B), &chat("chat", false)).await;
    assert_eq!(r.status(), 200);
    rewrite(&path, &config(&base, 100, 100, false));
    assert_eq!(reload(&gw).await.0, 200);
    let r = post_chat(&client, &gw, Some(KEY_B), &chat("chat", false)).await;
    assert_eq!(r.status(), 401, "the removed key");
    let r = post_chat(&client, &gw, Some(KEY_A), &chat("chat", false)).await;
    assert_eq!(r.status(), 200);
    rewrite(&path, &config(&base, 100, 100, true));
    assert_eq!(reload(&gw).await.0, 200);
    let r = post_chat(&client, &gw, Some(KEY_B), &chat("chat", false)).await;
    assert_eq!(r.status(), 200, "the key added back");
}

// proves: GW-15 (an invalid file is refused with the same located error as
// at start, which is logged, and the old configuration keeps running)
#[tokio::test]
async fn an_invalid_file_leaves_the_old_configuration_running() {
    // The test runtime is single-threaded: the server's tasks log into
    // this thread's subscriber.
    let (logs, _subscriber) = Logs::capture();
    let sim = fast_sim().await;
    let base = sim.openai_base_url();
    let (gw, path) = Gateway::start_file(&config(&base, 100, 100, true)).await;
    // rpm = 0 is a located error (CFG-1).
    rewrite(&path, &config(&base, 0, 100, false));
    let at_start = GatewayConfig::load(&path).unwrap_err().to_string();
    assert!(at_start.contains("scopes.one.rpm"), "{at_start}");
    assert!(at_start.contains("line "), "{at_start}");
    let (status, body) = reload(&gw).await;
    assert_eq!(status, 422);
    let body: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(body["error"]["message"], at_start.as_str());
    assert_eq!(body["error"]["code"], "reload_refused");
    let logged = logs.text();
    assert!(
        logged.contains("configuration reload refused") && logged.contains(&at_start),
        "the located error is logged: {logged}"
    );
    // Still the old configuration: b's key works, scope one has 100.
    let r = post_chat(&client(), &gw, Some(KEY_B), &chat("chat", false)).await;
    assert_eq!(r.status(), 200);
    let one = gw.upstream_scope("one");
    assert_eq!(one.limits[0].limit, 100);
    // Without the admin key nothing is reloaded.
    let r = client().post(gw.url("/admin/reload")).send().await.unwrap();
    assert_eq!(r.status(), 401);
}

// proves: GW-15 (a reload carries every scope's and tenant's quota state
// into its new configuration: a changed limit applies to the window in
// progress, counting what was admitted before)
#[tokio::test]
async fn reloads_carry_every_scopes_quota_state() {
    let sim = fast_sim().await;
    let base = sim.openai_base_url();
    let (gw, path) = Gateway::start_file(&config(&base, 5, 5, true)).await;
    let client = client();
    for model in ["chat", "chat", "extra", "extra"] {
        let r = post_chat(&client, &gw, Some(KEY_A), &chat(model, false)).await;
        assert_eq!(r.status(), 200);
    }
    let available = |gw: &Gateway, scope: &str| {
        gw.upstream_scope(scope)
            .limits
            .iter()
            .find(|l| l.dimension == Dimension::Requests)
            .map(|l| l.available)
    };
    assert_eq!(available(&gw, "one"), Some(3));
    rewrite(&path, &config(&base, 5, 6, false));
    assert_eq!(reload(&gw).await.0, 200);
    assert_eq!(available(&gw, "one"), Some(3), "unchanged: kept");
    assert_eq!(available(&gw, "two"), Some(4), "raised to 6: 2 of it used");
    rewrite(&path, &config(&base, 1, 6, false));
    assert_eq!(reload(&gw).await.0, 200);
    assert_eq!(
        available(&gw, "one"),
        Some(-1),
        "lowered to 1: 2 of it used"
    );
    let a = gw.tenant_scope("tenant:a");
    assert_eq!(a.counters.admitted, 4, "tenant a's state carried");
}

/// Model `chat` on `base_url` in scope `one` (5 requests per 3 s, as the
/// simulator), with `[cooldown] max = max`; tenant `a`.
fn five_per_window(base_url: &str, max: &str) -> String {
    format!(
        r#"
[server]
admin_key_env = "CARGO_PKG_NAME"

[providers.sim]
base_url = "{base_url}"

[cooldown]
max = "{max}"

[scopes.one]
limits = [{{ requests = 5, per = "3s" }}]

[models.chat]
provider = "sim"
upstream_model = "sim-chat"
scope = "one"

[tenants.a]
keys_sha256 = ["{}"]
"#,
        key_hash(KEY_A)
    )
}

// proves: GW-15, Q-7 (the reproduction: a reload that changes only
// `[cooldown] max` keeps the scope's window, so the request that the full
// window holds back is still held back after the reload and the provider,
// 5 requests per window like the scope, refuses nothing)
#[tokio::test]
async fn a_reload_of_the_cooldown_alone_draws_no_provider_429() {
    let sim = sim(tollgate_sim::SimConfig {
        rpm: Some(5),
        window: Duration::from_secs(3),
        ..tollgate_sim::SimConfig::default()
    })
    .await;
    let base = sim.openai_base_url();
    let (gw, path) = Gateway::start_file(&five_per_window(&base, "60s")).await;
    let client = client();
    for _ in 0..5 {
        let r = post_chat(&client, &gw, Some(KEY_A), &chat("chat", false)).await;
        assert_eq!(r.status(), 200);
    }
    rewrite(&path, &five_per_window(&base, "30s"));
    assert_eq!(reload(&gw).await.0, 200);
    // The sixth waits in the gateway for the window, then goes.
    one_more_call_draws_no_429(&gw, &sim, KEY_A, &chat("chat", false)).await;
    gw.wait_idle().await;
}

// proves: GW-15, POOL-1 (a tenant's limits and its per-model limits carry
// their state into the new configuration)
#[tokio::test]
async fn tenant_limits_carry_their_state() {
    let sim = fast_sim().await;
    let base = sim.openai_base_url();
    let tenant = |rpm: u64, per_model: u64| {
        format!(
            "[server]\nadmin_key_env = \"CARGO_PKG_NAME\"\n{}",
            two_models(
                &base,
                &format!(
                    "rpm = {rpm}\n[tenants.a.per_model.chat]\nlimits = [{{ requests = {per_model}, per = \"1h\" }}]"
                ),
                "",
            )
        )
    };
    let (gw, path) = Gateway::start_file(&tenant(100, 3)).await;
    let client = client();
    for _ in 0..2 {
        let r = post_chat(&client, &gw, Some(KEY_A), &chat("chat", false)).await;
        assert_eq!(r.status(), 200);
    }
    rewrite(&path, &tenant(101, 4));
    assert_eq!(reload(&gw).await.0, 200);
    let requests = |scope: &str| {
        gw.tenant_scope(scope)
            .limits
            .iter()
            .find(|l| l.dimension == Dimension::Requests)
            .map(|l| l.available)
    };
    assert_eq!(requests("tenant:a"), Some(99), "101 - 2");
    assert_eq!(requests("tenant:a/chat"), Some(2), "4 per hour - 2");
    for _ in 0..2 {
        let r = post_chat(&client, &gw, Some(KEY_A), &chat("chat", false)).await;
        assert_eq!(r.status(), 200);
    }
    let r = post_chat(&client, &gw, Some(KEY_A), &chat("chat", false)).await;
    assert_eq!(
        r.status(),
        429,
        "4 of 4 this hour, 2 of them before the reload"
    );
    gw.wait_idle().await;
}

// proves: GW-15 (a call in flight finishes under the settings it started
// with: a stream of a model the reload removes completes; new requests no
// longer find the model)
#[tokio::test]
async fn a_call_in_flight_finishes_under_its_starting_settings() {
    let sim = slow_sim(Duration::from_millis(20), 30).await;
    let base = sim.openai_base_url();
    let (gw, path) = Gateway::start_file(&config(&base, 100, 100, true)).await;
    let mut held = post_chat(&client(), &gw, Some(KEY_A), &chat("extra", true)).await;
    assert_eq!(held.status(), 200);
    let first = bounded("first chunk", held.chunk()).await.unwrap().unwrap();
    let without_extra = config(&base, 100, 100, true)
        .replace("[models.extra]", "[models.gone]")
        .replace("scope = \"two\"", "scope = \"one\"");
    rewrite(&path, &without_extra);
    assert_eq!(reload(&gw).await.0, 200);
    let r = post_chat(&client(), &gw, Some(KEY_A), &chat("extra", true)).await;
    assert_eq!(r.status(), 404);
    let read = read_sse_from(
        held.bytes_stream(),
        String::from_utf8_lossy(&first).into_owned(),
    )
    .await;
    assert!(read.completed(), "{read:?}");
    gw.wait_idle().await;
    assert!(
        gw.app.upstream_snapshot().is_idle(),
        "the old state is idle too"
    );
}

// proves: GW-15, GW-8 (once a shutdown began, a reload swaps nothing in: a
// state built meanwhile is refused, so every state the shutdown closes is
// every state there is). Noticed in review: a reload whose build overlapped
// the shutdown's start swapped in a state never marked or closed.
#[tokio::test]
async fn no_reload_swaps_a_state_in_after_the_shutdown_began() {
    let sim = fast_sim().await;
    let toml = config(&sim.openai_base_url(), 100, 100, true);
    let path = std::env::temp_dir().join(format!(
        "tollgate-test-reload-shutdown-{}.toml",
        std::process::id()
    ));
    std::fs::write(&path, &toml).unwrap();
    let config = GatewayConfig::load(&path).unwrap();
    let metrics = tollgate_gateway::metrics::Metrics::install();
    let app = tollgate_gateway::build::build(&config, metrics.clone()).unwrap();
    let live = tollgate_gateway::live::Live::new(Arc::clone(&app), Some(path.clone()), metrics);
    live.reload()
        .await
        .expect("a reload before the shutdown swaps");
    let before = live.current();
    assert!(!Arc::ptr_eq(&before, &app));
    let closing = live.begin_shutdown();
    assert_eq!(
        closing.len(),
        2,
        "the current state and the one it replaced"
    );
    assert!(closing.iter().all(|s| s.is_shutting_down()));
    let refused = live.reload().await;
    assert!(refused.is_err(), "a reload after the shutdown began");
    assert!(Arc::ptr_eq(&live.current(), &before), "nothing swapped in");
    let _ = std::fs::remove_file(&path);
}

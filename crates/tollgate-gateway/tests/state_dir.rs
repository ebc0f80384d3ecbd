//! `server.state_dir` in the gateway (SPEC DQ-8): what is saved before a
//! reload and after it is what a new process on the same directory counts;
//! with the Redis store the upstream scopes are not written (Redis holds
//! them), the tenants' per-replica limits are.

mod common;

use std::path::PathBuf;

use common::{Gateway, KEY_A, chat, client, fast_sim, post_chat, reload, rewrite, tenants};
use tollgate_gateway::persist;
use tollgate_redis::RedisServer;

fn state_dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("tollgate-gw-state-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

/// Scope `acct` with `day` requests per UTC day for model `m`, tenant `a`
/// with 50 requests per rolling day, state in `dir`, `store` (TOML lines).
fn config(base: &str, dir: &std::path::Path, day: u64, store: &str) -> String {
    config_per(base, dir, day, "day", store)
}

/// [`config`] with `per` as the scope's window.
fn config_per(base: &str, dir: &std::path::Path, day: u64, per: &str, store: &str) -> String {
    format!(
        "[server]\nadmin_key_env = \"CARGO_PKG_NAME\"\nstate_dir = {dir:?}\n\n\
         [providers.p]\nbase_url = \"{base}\"\n\n\
         [scopes.acct]\nlimits = [{{ requests = {day}, per = \"{per}\" }}]\n\n\
         [models.m]\nprovider = \"p\"\nscope = \"acct\"\n\n{store}\n\n{}",
        tenants("limits = [{ requests = 50, per = \"1d\" }]", "")
    )
}

async fn calls(gw: &Gateway, n: usize) -> Vec<u16> {
    let http = client();
    let mut out = Vec::new();
    for _ in 0..n {
        let r = post_chat(&http, gw, Some(KEY_A), &chat("m", false)).await;
        out.push(r.status().as_u16());
    }
    out
}

// proves: DQ-8, GW-15 (a reload keeps the counts and the next save after it
// rewrites the file from them: a new process on the same state_dir counts
// the day spent before and after the reload, upstream and tenant alike)
#[tokio::test]
async fn what_a_reload_keeps_is_what_the_next_process_counts() {
    let sim = fast_sim().await;
    let dir = state_dir("reload");
    let (gw, path) = Gateway::start_file(&config(&sim.openai_base_url(), &dir, 5, "")).await;
    let file = persist::open(&gw.current().config).unwrap().unwrap();
    assert_eq!(calls(&gw, 2).await, [200, 200]);
    assert_eq!(
        persist::save(&file, &gw.current()).unwrap(),
        2,
        "acct and tenant a"
    );
    // A larger day: the reload keeps the 2 counted.
    rewrite(&path, &config(&sim.openai_base_url(), &dir, 6, ""));
    assert_eq!(reload(&gw).await.0, 200);
    assert_eq!(calls(&gw, 1).await, [200]);
    file.rewrite_all();
    assert_eq!(persist::save(&file, &gw.current()).unwrap(), 2);
    drop((gw, file));

    let (next, _) = Gateway::start_file(&config(&sim.openai_base_url(), &dir, 6, "")).await;
    let file = persist::open(&next.current().config).unwrap().unwrap();
    assert_eq!(persist::restore(&file, &next.current()), 2);
    let tenant = next.tenant_scope("tenant:a");
    assert_eq!(tenant.limits[0].available, 50 - 3, "the tenant's day too");
    assert_eq!(
        calls(&next, 4).await,
        [200, 200, 200, 429],
        "6 per day, 3 spent"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

// proves: DQ-8 (with the Redis store nothing of the upstream scopes is
// written: Redis holds it; the tenant's limit, per replica, is)
#[tokio::test]
async fn with_redis_the_upstream_scopes_are_not_written() {
    let Some(redis) = RedisServer::start_or_skip("with_redis_the_upstream_scopes_are_not_written")
    else {
        return;
    };
    let sim = fast_sim().await;
    let dir = state_dir("redis");
    let store = format!(
        "[quota_store]\nbackend = \"redis\"\nurl = \"{}\"\nprefix = \"state\"\ntimeout = \"2s\"",
        redis.url()
    );
    let (gw, _) =
        Gateway::start_file(&config_per(&sim.openai_base_url(), &dir, 5, "1d", &store)).await;
    let file = persist::open(&gw.current().config).unwrap().unwrap();
    assert_eq!(calls(&gw, 2).await, [200, 200]);
    assert_eq!(
        persist::save(&file, &gw.current()).unwrap(),
        1,
        "tenant a only"
    );
    drop(file);
    let reopened = persist::open(&gw.current().config).unwrap().unwrap();
    assert_eq!(reopened.loaded_scopes(), 1);
    let _ = std::fs::remove_dir_all(&dir);
}

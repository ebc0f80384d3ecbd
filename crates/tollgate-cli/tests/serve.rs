//! `tollgate serve` as a user runs it: the real binary, its exit status,
//! its messages (SPEC GW-9, GW-8, OBS-1).

mod common;

use common::{Served, client, serve_fails, stderr, write_config};

use std::path::PathBuf;

use serde_json::Value;

/// Minimal valid content around a model table.
fn with_model(model: &str) -> String {
    format!("[providers.p]\nbase_url = \"http://127.0.0.1:9/v1\"\n\n[models.m]\n{model}\n")
}

// proves: GW-9 (a missing file fails with its name and a clear reason, non-zero exit)
#[test]
fn missing_config_file() {
    let path = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("does-not-exist.toml");
    let out = serve_fails(path.to_str().unwrap());
    let err = stderr(&out);
    assert!(err.contains("does-not-exist.toml"), "{err}");
    assert!(err.contains("no such file"), "{err}");
}

// proves: GW-9 (bad TOML fails with the file and the place)
#[test]
fn bad_toml() {
    let path = write_config("broken.toml", "[providers.p]\nbase_url = \"http://x\n");
    let err = stderr(&serve_fails(path.to_str().unwrap()));
    assert!(err.contains("broken.toml"), "{err}");
    assert!(err.contains("invalid TOML"), "{err}");
    assert!(err.contains("line 2"), "{err}");
}

// proves: GW-9, CFG-1 (a zero limit is an error naming the field, never "unlimited")
#[test]
fn zero_limit() {
    let path = write_config(
        "zero.toml",
        &with_model("provider = \"p\"\nconcurrency = 0"),
    );
    let err = stderr(&serve_fails(path.to_str().unwrap()));
    assert!(err.contains("zero.toml"), "{err}");
    assert!(err.contains("models.m.concurrency"), "{err}");
    assert!(err.contains("positive integer"), "{err}");
    assert!(err.contains("line 6"), "{err}");
}

// proves: GW-9 (a reference to an unknown provider names the field and the known providers)
#[test]
fn unknown_provider_reference() {
    let path = write_config("unknown.toml", &with_model("provider = \"nope\""));
    let err = stderr(&serve_fails(path.to_str().unwrap()));
    assert!(err.contains("unknown.toml"), "{err}");
    assert!(err.contains("models.m.provider"), "{err}");
    assert!(err.contains("unknown provider \"nope\""), "{err}");
    assert!(
        err.contains("\"p\""),
        "the known providers are listed: {err}"
    );
}

// proves: GW-9 (without a config the gateway serves the built-in default in front of an in-process simulator, at once, on every route), WIRE-1, WIRE-3, GW-8 (SIGTERM ends it cleanly)
#[tokio::test]
async fn built_in_default_answers_and_sigterm_stops_it() {
    let mut served = Served::start(&[], &[]);
    let client = client();
    let resp = client
        .post(served.url("/v1/chat/completions"))
        .bearer_auth("tollgate-demo-key")
        .json(&serde_json::json!({
            "model": "sim-chat",
            "messages": [{"role": "user", "content": "Hello!"}],
        }))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let body: Value = resp.json().await.unwrap();
    assert_eq!(body["object"], "chat.completion");

    let resp = client
        .get(served.url("/v1/models"))
        .bearer_auth("tollgate-demo-key")
        .send()
        .await
        .unwrap();
    let body: Value = resp.json().await.unwrap();
    let ids: Vec<&str> = body["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["sim-chat", "sim-claude", "sim-embed"]);

    // The other dialects of the built-in default (SPEC WIRE-1, WIRE-3).
    let resp = client
        .post(served.url("/v1/responses"))
        .bearer_auth("tollgate-demo-key")
        .json(&serde_json::json!({"model": "sim-chat", "input": "Hello!"}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let body: Value = resp.json().await.unwrap();
    assert_eq!(body["object"], "response");
    let resp = client
        .post(served.url("/v1/messages"))
        .header("x-api-key", "tollgate-demo-key")
        .header("anthropic-version", "2023-06-01")
        .json(&serde_json::json!({
            "model": "sim-claude",
            "max_tokens": 64,
            "messages": [{"role": "user", "content": "Hello!"}],
        }))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let body: Value = resp.json().await.unwrap();
    assert_eq!(body["type"], "message");

    let status = served.terminate();
    assert!(status.success(), "SIGTERM is a clean stop: {status:?}");
}

// proves: OBS-1 (the admin snapshot needs the admin key from the environment, shows pools and scopes back at zero and holds no keys), OBS-2
#[tokio::test]
async fn admin_snapshot_with_key_from_the_environment() {
    const ADMIN: &str = "admin-secret-for-tests";
    const TENANT: &str = "sk-cli-tenant-key";
    let sim = tollgate_sim::Simulator::spawn(tollgate_sim::SimConfig::default(), "127.0.0.1:0")
        .await
        .unwrap();
    let hash = tollgate_gateway::auth::hash_key_for_config(TENANT).unwrap();
    let path = write_config(
        "admin.toml",
        &format!(
            r#"
[server]
admin_key_env = "TOLLGATE_TEST_ADMIN_KEY"

[providers.sim]
base_url = "{}"

[scopes.main]
rpm = 100
tpm = 100000

[models.chat]
provider = "sim"
upstream_model = "sim-chat"
scope = "main"
concurrency = 2

[tenants.t]
keys_sha256 = ["{hash}"]
concurrency = 2
"#,
            sim.openai_base_url()
        ),
    );
    let mut served = Served::start(
        &["--config", path.to_str().unwrap()],
        &[("TOLLGATE_TEST_ADMIN_KEY", ADMIN)],
    );
    let client = client();
    let resp = client
        .post(served.url("/v1/chat/completions"))
        .bearer_auth(TENANT)
        .json(&serde_json::json!({
            "model": "chat",
            "messages": [{"role": "user", "content": "Hello!"}],
        }))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    resp.bytes().await.unwrap();

    for bad in [None, Some(TENANT), Some("wrong")] {
        let mut req = client.get(served.url("/admin/snapshot"));
        if let Some(key) = bad {
            req = req.bearer_auth(key);
        }
        assert_eq!(req.send().await.unwrap().status(), 401, "{bad:?}");
    }
    let resp = client
        .get(served.url("/admin/snapshot"))
        .bearer_auth(ADMIN)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let text = resp.text().await.unwrap();
    for secret in [ADMIN, TENANT, hash.as_str()] {
        assert!(!text.contains(secret), "snapshot leaks {secret}");
    }
    let snap: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(snap["shutting_down"], false);
    for side in ["upstream", "tenants"] {
        let s = &snap[side];
        assert_eq!(s["active"], 0, "{side}: {s}");
        for pool in s["pools"].as_array().unwrap() {
            assert_eq!(pool["available"], pool["limit"], "{side}: {pool}");
            assert_eq!(pool["waiting"], 0);
        }
        for scope in s["scopes"].as_array().unwrap() {
            assert_eq!(scope["queued"], 0);
            assert_eq!(scope["pending"], 0);
        }
    }
    let main = snap["upstream"]["scopes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["name"] == "main")
        .unwrap();
    assert_eq!(main["admitted"], 1);
    assert_eq!(snap["circuits"][0]["state"], "closed");

    let metrics = client
        .get(served.url("/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(metrics.contains("tollgate_"));
    for secret in [ADMIN, TENANT, hash.as_str()] {
        assert!(!metrics.contains(secret), "metrics leak {secret}");
    }
    assert!(served.terminate().success());
    sim.shutdown().await.unwrap();
}

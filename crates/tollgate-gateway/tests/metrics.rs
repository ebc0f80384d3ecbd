//! Metrics (SPEC OBS-2): per deployment, tenant scopes by name, and an
//! optional listener of their own.

mod common;

use std::sync::Arc;

use common::*;
use tokio::net::TcpListener;
use tollgate_gateway::build::build;
use tollgate_gateway::config::GatewayConfig;
use tollgate_gateway::live::Live;
use tollgate_gateway::metrics::Metrics;
use tollgate_gateway::server::{ServeOptions, serve_live};

/// Model `metered` (a name no other test uses: metrics are process-wide)
/// with deployments `east` and `west`.
fn config(east: &str, west: &str) -> String {
    two_deployments("metered", east, west, "", "", "")
}

// proves: OBS-2 (per-deployment metrics labelled by configured names only;
// tenant scopes named by the tenant's configured name, never a key), GW-11
#[tokio::test]
async fn metrics_per_deployment_and_named_tenant_scopes() {
    let (east, west) = (fast_sim().await, fast_sim().await);
    let gw = Gateway::start(&config(&east.openai_base_url(), &west.openai_base_url())).await;
    let client = client();
    for _ in 0..4 {
        let r = post_chat(&client, &gw, Some(KEY_A), &chat("metered", false)).await;
        assert_eq!(r.status(), 200);
    }
    let text = client
        .get(gw.url("/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let attempts = |d: &str| {
        text.lines()
            .find(|l| {
                l.starts_with("tollgate_deployment_attempts_total")
                    && l.contains("model=\"metered\"")
                    && l.contains(&format!("deployment=\"{d}\""))
            })
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    assert_eq!(
        attempts("east") + attempts("west"),
        4.0,
        "one attempt each: {text}"
    );
    for family in [
        "tollgate_deployment_in_flight",
        "tollgate_deployment_queued",
        "tollgate_deployment_circuit_state",
        "tollgate_deployment_quota_wait_seconds",
    ] {
        assert!(
            text.lines().any(|l| l.starts_with(family)
                && l.contains("model=\"metered\"")
                && l.contains("deployment=\"east\"")),
            "{family} missing: {text}"
        );
    }
    assert!(text.contains("scope=\"tenant:a\""), "{text}");
    assert!(!text.contains("scope=\"#"), "no ordinal labels: {text}");
    assert!(!text.contains(KEY_A));
}

// proves: OBS-2 (`server.metrics_listen`: /metrics on its own address and
// not on the API's), OBS-6 (the status page there)
#[tokio::test]
async fn metrics_can_have_a_listener_of_their_own() {
    let sim = fast_sim().await;
    let toml = config(&sim.openai_base_url(), &sim.openai_base_url());
    let config = GatewayConfig::from_toml(&toml, "test.toml").unwrap();
    let metrics = Metrics::install();
    let app = build(&config, metrics.clone()).unwrap();
    let _ = app.access_log.capture();
    let live = Arc::new(Live::new(app, None, metrics));
    let api = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let side = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let (api_addr, side_addr) = (api.local_addr().unwrap(), side.local_addr().unwrap());
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(serve_live(
        api,
        Some(side),
        live,
        ServeOptions::from_config(&config.server),
        async move {
            let _ = rx.await;
        },
    ));
    let client = client();
    let on_api = client
        .get(format!("http://{api_addr}/metrics"))
        .send()
        .await
        .unwrap();
    assert_eq!(on_api.status(), 404);
    let on_side = client
        .get(format!("http://{side_addr}/metrics"))
        .send()
        .await
        .unwrap();
    assert_eq!(on_side.status(), 200);
    assert!(on_side.text().await.unwrap().contains("# TYPE"));
    // proves: OBS-6 (the status page and its JSON are served there without
    // a key, as /metrics is; on the API's address they need the admin key,
    // and without one configured there is none: 404)
    for path in ["/status", "/status/json"] {
        let open = client
            .get(format!("http://{side_addr}{path}"))
            .send()
            .await
            .unwrap();
        assert_eq!(open.status(), 200, "{path}");
        let guarded = client
            .get(format!("http://{api_addr}{path}"))
            .send()
            .await
            .unwrap();
        assert_eq!(guarded.status(), 404, "{path}");
    }
    let json: serde_json::Value = client
        .get(format!("http://{side_addr}/status/json"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert!(
        json["scopes"].as_array().is_some_and(|s| !s.is_empty()),
        "{json}"
    );
    let bad = client
        .get(format!("http://{side_addr}/status/json?since=yesterday"))
        .send()
        .await
        .unwrap();
    let (status, _, error) = error_of(bad).await;
    assert_eq!((status, code(&error)), (400, "invalid_since"));
    let _ = tx.send(());
    bounded("serve returns", task).await.unwrap().unwrap();
}

//! Fallback models (SPEC GW-10) and the circuit breaker as the client sees
//! it (CB-3, GW-4).

mod common;

use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use common::upstream::{End, Reply, Scripted, chunk};
use common::*;
use tollgate::lifecycle::CircuitState;
use tollgate_gateway::state::AppState;
use tollgate_sim::SimConfig;
use tollgate_sim::faults::FaultPlan;

/// Model `primary` on provider `bad` falls back to `backup` on provider
/// `good`; `solo` is on `bad` without fallbacks. Two attempts per model.
fn config(bad: &str, good: &str, circuit: &str) -> String {
    format!(
        r#"
[retry]
max_attempts = 2
base_delay = "10ms"
jitter = 0.0

[providers.bad]
base_url = "{bad}"
{circuit}

[providers.good]
base_url = "{good}"

[models.primary]
provider = "bad"
upstream_model = "primary-upstream"
concurrency = 1
fallbacks = ["backup"]

[models.solo]
provider = "bad"

[models.backup]
provider = "good"
upstream_model = "backup-upstream"
concurrency = 1

{}
"#,
        tenants("concurrency = 1\nmax_waiting = 0", "")
    )
}

/// What the fallback upstream saw of the gateway when its request
/// arrived: permits in use of (`model:primary`, `model:backup`,
/// `tenant:a`).
type Observed = Arc<Mutex<Vec<(usize, usize, usize)>>>;

/// A scripted upstream that records the gateway's pools as each request
/// arrives (the gateway is attached once built).
async fn observing_upstream(
    script: Vec<Reply>,
) -> (Scripted, Arc<OnceLock<Arc<AppState>>>, Observed) {
    let app: Arc<OnceLock<Arc<AppState>>> = Arc::new(OnceLock::new());
    let observed: Observed = Arc::default();
    let hook = {
        let (app, observed) = (Arc::clone(&app), Arc::clone(&observed));
        Arc::new(move |_n: u32| {
            let Some(app) = app.get() else { return };
            let in_use = |name: &str| {
                let s = app.upstream_snapshot();
                let t = app.tenant_snapshot();
                let p = s
                    .pools
                    .iter()
                    .chain(t.pools.iter())
                    .find(|p| p.name == name)
                    .expect("pool exists");
                p.limit - p.available
            };
            observed.lock().unwrap().push((
                in_use("model:primary"),
                in_use("model:backup"),
                in_use("tenant:a"),
            ));
        })
    };
    let upstream = Scripted::start_with_hook(script, Some(hook)).await;
    (upstream, app, observed)
}

// proves: GW-10 (primary exhausted with 5xx ⇒ the fallback answers, under the same tenant permit; the primary's model permit is released before the fallback's is taken), POOL-1
#[tokio::test]
async fn server_errors_fall_back_to_the_next_model() {
    let bad = sim(SimConfig {
        error_rate: 1.0,
        ..SimConfig::default()
    })
    .await;
    let (good, app, observed) = observing_upstream(vec![Reply::ok()]).await;
    let gw = Gateway::start(&config(&bad.openai_base_url(), &good.base_url, "")).await;
    let _ = app.set(Arc::clone(&gw.app));

    let resp = post_chat(&client(), &gw, Some(KEY_A), &chat("primary", false)).await;
    assert_eq!(resp.status(), 200);
    let body: serde_json::Value = resp.json().await.unwrap();
    assert_eq!(body["choices"][0]["message"]["content"], "hello");

    // Both attempts of the primary, then one of the fallback, which got
    // its own upstream model name.
    assert_eq!(bad.stats().requests_total, 2);
    assert_eq!(bad.stats().faults.server_error, 2);
    let seen = good.seen();
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].body["model"], "backup-upstream");
    // When the fallback's request went out: primary permit back, backup
    // permit taken, the one tenant permit still held.
    assert_eq!(*observed.lock().unwrap(), [(0, 1, 1)]);
    // One tenant admission for the whole call.
    assert_eq!(gw.tenant_scope("tenant:a").counters.admitted, 1);
    gw.wait_idle().await;
}

// proves: GW-10, LC-3 (a stream whose primary fails before its first chunk falls back)
#[tokio::test]
async fn stream_falls_back_before_its_first_chunk() {
    let bad = sim(SimConfig {
        error_rate: 1.0,
        ..SimConfig::default()
    })
    .await;
    let (good, app, observed) = observing_upstream(vec![Reply::Stream {
        events: vec![chunk("from"), chunk(" backup")],
        end: End::Done,
    }])
    .await;
    let gw = Gateway::start(&config(&bad.openai_base_url(), &good.base_url, "")).await;
    let _ = app.set(Arc::clone(&gw.app));

    let resp = post_chat(&client(), &gw, Some(KEY_A), &chat("primary", true)).await;
    assert_eq!(resp.status(), 200);
    let read = read_sse(resp).await;
    assert!(read.completed(), "{read:?}");
    assert_eq!(read.text(), "from backup");
    assert_eq!(bad.stats().requests_total, 2);
    assert_eq!(good.attempts(), 1);
    assert_eq!(*observed.lock().unwrap(), [(0, 1, 1)]);
    gw.wait_idle().await;
}

// proves: GW-10 (open circuit ⇒ straight to the fallback, no request to the failing provider), CB-3, GW-4 (open circuit without fallback ⇒ 503 circuit_open)
#[tokio::test]
async fn open_circuit_falls_back_or_is_a_503() {
    let bad = sim(SimConfig {
        error_rate: 1.0,
        ..SimConfig::default()
    })
    .await;
    let good = Scripted::start(vec![Reply::ok()]).await;
    let circuit = "[providers.bad.circuit]\nfailure_threshold = 1\nrecovery_time = \"60s\"\nhalf_open_calls = 1";
    let gw = Gateway::start(&config(&bad.openai_base_url(), &good.base_url, circuit)).await;
    let client = client();

    // The first call exhausts the primary (one logical failure: the
    // circuit opens) and falls back.
    let resp = post_chat(&client, &gw, Some(KEY_A), &chat("primary", false)).await;
    assert_eq!(resp.status(), 200);
    resp.bytes().await.unwrap();
    let bad_requests = bad.stats().requests_total;
    assert_eq!(bad_requests, 2);
    let breaker = &gw
        .app
        .breakers
        .iter()
        .find(|(n, _)| &**n == "bad")
        .unwrap()
        .1;
    assert_eq!(breaker.state(), CircuitState::Open);

    // The next goes straight to the fallback.
    let resp = post_chat(&client, &gw, Some(KEY_A), &chat("primary", false)).await;
    assert_eq!(resp.status(), 200);
    resp.bytes().await.unwrap();
    assert_eq!(bad.stats().requests_total, bad_requests);
    assert_eq!(good.attempts(), 2);

    // A model of the same provider without a fallback: 503.
    let resp = post_chat(&client, &gw, Some(KEY_A), &chat("solo", false)).await;
    let (status, retry_after, error) = error_of(resp).await;
    assert_eq!((status, code(&error)), (503, "circuit_open"));
    assert!(
        retry_after.is_some(),
        "the circuit's reopening time is known"
    );
    assert_eq!(bad.stats().requests_total, bad_requests);

    let metrics = client.get(gw.url("/metrics")).send().await.unwrap();
    let text = metrics.text().await.unwrap();
    assert!(text.contains("tollgate_fallbacks_total"), "{text}");
    gw.wait_idle().await;
}

/// A simulator seed whose first stream is cut after at least `min` events.
fn seed_cutting_first_stream(config: &SimConfig, events: u32, min: u32) -> u64 {
    (0..10_000)
        .find(|&seed| {
            let c = SimConfig {
                seed,
                ..config.clone()
            };
            FaultPlan::draw(&c, 0, events)
                .disconnect_after
                .is_some_and(|k| k >= min)
        })
        .expect("a seed cuts the first stream late enough")
}

// proves: GW-10, LC-3 (a stream that already sent a chunk never falls back and is never replayed: the client gets an error event and an aborted body)
#[tokio::test]
async fn stream_that_sent_a_chunk_does_not_fall_back() {
    const TOKENS: u32 = 16;
    let mut cutting = SimConfig {
        disconnect_rate: 1.0,
        completion_tokens: TOKENS,
        per_token: Duration::from_millis(10),
        ..SimConfig::default()
    };
    // role + content + finish + the usage chunk the gateway asks for.
    cutting.seed = seed_cutting_first_stream(&cutting, TOKENS + 3, 4);
    let bad = sim(cutting).await;
    let good = Scripted::start(vec![Reply::Stream {
        events: vec![chunk("replayed")],
        end: End::Done,
    }])
    .await;
    let gw = Gateway::start(&config(&bad.openai_base_url(), &good.base_url, "")).await;

    let resp = post_chat(&client(), &gw, Some(KEY_A), &chat("primary", true)).await;
    assert_eq!(resp.status(), 200);
    let read = read_sse(resp).await;
    assert!(read.end.is_err(), "the body must not end cleanly: {read:?}");
    assert!(!read.events.iter().any(|e| e == "[DONE]"), "{read:?}");
    assert_eq!(read.errors().len(), 1, "one error event: {read:?}");
    assert!(!read.text().contains("replayed"));
    assert_eq!(bad.stats().faults.disconnect, 1);
    assert_eq!(bad.stats().requests_total, 1, "no retry after output began");
    assert_eq!(good.attempts(), 0, "no fallback after output began");
    gw.wait_idle().await;
}

// proves: GW-10, RT-2 (a 4xx from the primary is the request's own fault: passed on with its status, neither retried nor sent to the fallback)
#[tokio::test]
async fn client_errors_do_not_fall_back() {
    let bad = Scripted::start(vec![Reply::Status {
        status: 400,
        headers: Vec::new(),
        body: r#"{"error":{"message":"'messages' is too long","type":"invalid_request_error","param":"messages","code":null}}"#
            .to_owned(),
    }])
    .await;
    let good = Scripted::start(vec![Reply::ok()]).await;
    let gw = Gateway::start(&config(&bad.base_url, &good.base_url, "")).await;
    let resp = post_chat(&client(), &gw, Some(KEY_A), &chat("primary", false)).await;
    let (status, _, error) = error_of(resp).await;
    assert_eq!((status, code(&error)), (400, "upstream_rejected"));
    assert!(
        error["message"].as_str().unwrap().contains("too long"),
        "{error}"
    );
    assert_eq!(bad.attempts(), 1);
    assert_eq!(good.attempts(), 0);
    gw.wait_idle().await;
}

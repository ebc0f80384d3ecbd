//! A tenant's per-model limits bind that model only (SPEC GW-12): a call
//! they refuse costs the tenant's own limits nothing, and a call waiting
//! for them holds no concurrency permit of the tenant (ADM-2). And a
//! client that stops reading a one-shot response loses its connection at
//! the send timeout (GW-17). Found in review, where the first version
//! charged every per-model refusal to the tenant's own limits (a few
//! refusals of one model starved the others), held the tenant's permit
//! through a per-model wait, and let a stalled reader keep the only
//! connection slot for good.

mod common;

use std::time::Duration;

use common::upstream::{Reply, Scripted};
use common::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};
use tokio::time::Instant;
use tollgate::quota::Dimension;

// proves: GW-12, GW-4 (a per-model refusal charges the tenant's own
// limits nothing: nothing was sent upstream)
#[tokio::test]
async fn a_per_model_refusal_costs_the_tenant_nothing() {
    let sim = fast_sim().await;
    let gw = Gateway::start(&two_models(
        &sim.openai_base_url(),
        "rpm = 100\ntpm = 100000\n[tenants.a.per_model.chat]\nlimits = [{ requests = 1, per = \"1h\" }]",
        "",
    ))
    .await;
    let client = client();
    let r = post_chat(&client, &gw, Some(KEY_A), &chat("chat", false)).await;
    assert_eq!(r.status(), 200);
    let own = |gw: &Gateway, d: Dimension| {
        gw.tenant_scope("tenant:a")
            .limits
            .iter()
            .find(|l| l.dimension == d)
            .map(|l| l.available)
            .unwrap()
    };
    let (req_before, tok_before) = (own(&gw, Dimension::Requests), own(&gw, Dimension::Tokens));
    for _ in 0..5 {
        let r = post_chat(&client, &gw, Some(KEY_A), &chat("chat", false)).await;
        assert_eq!(r.status(), 429);
    }
    assert_eq!(
        sim.stats().requests_total,
        1,
        "refusals sent nothing upstream"
    );
    let (req_after, tok_after) = (own(&gw, Dimension::Requests), own(&gw, Dimension::Tokens));
    eprintln!("requests {req_before} -> {req_after}, tokens {tok_before} -> {tok_after}");
    assert_eq!(
        (req_after, tok_after),
        (req_before, tok_before),
        "5 calls refused by the per-model limit (nothing sent upstream) stay charged to tenant:a"
    );
}

// proves: ADM-2, GW-12 (a call waiting for a per-model limit holds no
// permit of the tenant: another model of the tenant is served meanwhile)
#[tokio::test]
async fn a_per_model_wait_holds_no_tenant_permit() {
    let sim = fast_sim().await;
    let gw = Gateway::start(&two_models(
        &sim.openai_base_url(),
        "concurrency = 1\n[tenants.a.per_model.chat]\nlimits = [{ requests = 1, per = \"4s\" }]",
        "",
    ))
    .await;
    let client = client();
    let r = post_chat(&client, &gw, Some(KEY_A), &chat("chat", false)).await;
    assert_eq!(r.status(), 200);
    // Waits ~4 s for the per-model quota.
    let waiting = spawn_chat(&gw, KEY_A, chat("chat", false));
    tokio::time::sleep(Duration::from_millis(300)).await;
    let started = Instant::now();
    let r = post_chat(&client, &gw, Some(KEY_A), &chat("other", false)).await;
    let took = started.elapsed();
    let _ = waiting.await;
    assert_eq!(r.status(), 200);
    assert!(
        took < Duration::from_secs(2),
        "`other` waited {took:?} behind a call that only waits for chat's per-model quota"
    );
}

// proves: GW-17 (a client that stops reading a large one-shot response
// loses its connection at the send timeout: the only connection slot comes
// back)
#[tokio::test]
async fn a_stalled_one_shot_reader_loses_its_connection() {
    let text = "x".repeat(16 * 1024 * 1024);
    let body = serde_json::json!({
        "id": "c", "object": "chat.completion", "created": 0, "model": "m",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 5, "completion_tokens": 1, "total_tokens": 6}
    })
    .to_string();
    let up = Scripted::start(vec![Reply::Status {
        status: 200,
        headers: Vec::new(),
        body,
    }])
    .await;
    let toml = format!(
        r#"
[server]
max_connections = 1
idle_timeout = "2s"
header_read_timeout = "2s"

[providers.up]
base_url = "{}"

[models.chat]
provider = "up"
upstream_model = "sim-chat"

{}
"#,
        up.base_url,
        tenants("", "")
    );
    let gw = Gateway::start(&toml).await;
    let socket = TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(4096).unwrap();
    let mut stalled = socket.connect(gw.addr().parse().unwrap()).await.unwrap();
    let req = chat("chat", false).to_string();
    stalled
        .write_all(
            format!(
                "POST /v1/chat/completions HTTP/1.1\r\nhost: g\r\ncontent-type: application/json\r\nauthorization: Bearer {KEY_A}\r\nx-request-timeout: 1\r\ncontent-length: {}\r\n\r\n{req}",
                req.len()
            )
            .as_bytes(),
        )
        .await
        .unwrap();
    // Read a little, then stop reading.
    let mut buf = [0u8; 1024];
    let _ = stalled.read(&mut buf).await.unwrap();
    eventually("the call is over", || gw.is_idle()).await;
    let mut second = TcpStream::connect(gw.addr()).await.unwrap();
    second
        .write_all(b"GET /healthz HTTP/1.1\r\nhost: g\r\n\r\n")
        .await
        .unwrap();
    let mut got = [0u8; 64];
    let served = tokio::time::timeout(Duration::from_secs(10), second.read(&mut got)).await;
    assert!(
        matches!(served, Ok(Ok(n)) if n > 0),
        "a reader that stopped reading a one-shot answer holds the only connection slot \
         10 s past its 1 s deadline"
    );
    drop(stalled);
}

// proves: GW-12 (refusals by one model's limit leave the tenant's other
// models served)
#[tokio::test]
async fn per_model_refusals_leave_other_models_served() {
    let sim = fast_sim().await;
    let gw = Gateway::start(&two_models(
        &sim.openai_base_url(),
        "rpm = 10\n[tenants.a.per_model.chat]\nlimits = [{ requests = 1, per = \"1h\" }]",
        "",
    ))
    .await;
    let client = client();
    // The consequence: the refusals exhaust the tenant's own budget, so a
    // model without a per-model limit is refused too.
    let mut refused_other = 0;
    for _ in 0..10 {
        let _ = post_chat(&client, &gw, Some(KEY_A), &chat("chat", false)).await;
    }
    let r = client
        .post(gw.url("/v1/chat/completions"))
        .bearer_auth(KEY_A)
        .header("x-request-timeout", "1")
        .json(&chat("other", false))
        .send()
        .await
        .unwrap();
    if r.status() == 429 {
        refused_other += 1;
    }
    assert_eq!(
        refused_other, 0,
        "`other` refused after chat's per-model refusals ate tenant:a's rpm"
    );
    assert_eq!(
        sim.stats().requests_total,
        2,
        "one `chat` call and the `other` call went upstream, no refused one"
    );
}

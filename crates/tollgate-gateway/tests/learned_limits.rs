//! Limits learned from the upstream's `x-ratelimit-limit-*` headers (SPEC
//! Q-14) when the advertised amount goes down, end to end: a real gateway in
//! front of a scripted upstream over real sockets. One answer cannot make
//! larger calls fail; a lowered limit that two answers confirm fails the
//! queued call it can no longer hold at once (400 `estimate_exceeds_limit`)
//! and the call behind it goes on.

mod common;

use std::time::Duration;

use serde_json::{Value, json};

use common::upstream::{Reply, Scripted, completion};
use common::{Gateway, KEY_A, bounded, client, code, error_of, eventually, spawn_chat, tenants};

/// A 200 advertising `tokens` tokens and 1,000 requests per window.
fn advertising(tokens: u64) -> Reply {
    Reply::Status {
        status: 200,
        headers: vec![
            ("x-ratelimit-limit-requests", "1000".to_owned()),
            ("x-ratelimit-limit-tokens", tokens.to_string()),
        ],
        body: completion(),
    }
}

/// A gateway whose model `gpt-4o-mini` learns its limits over `window`
/// from `upstream`.
async fn gateway(upstream: &Scripted, window: &str) -> Gateway {
    let toml = format!(
        "[providers.p]\nbase_url = \"{}\"\n\n\
         [scopes.s]\nlearn_limits = true\nlearn_window = \"{window}\"\n\n\
         [models.gpt-4o-mini]\nprovider = \"p\"\nscope = \"s\"\n\n{}",
        upstream.base_url,
        tenants("", ""),
    );
    Gateway::start(&toml).await
}

/// A chat body asking for `max_tokens` output tokens.
fn body(max_tokens: u64) -> Value {
    json!({
        "model": "gpt-4o-mini",
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": max_tokens,
    })
}

async fn status(response: reqwest::Result<reqwest::Response>) -> (u16, String) {
    let response = response.expect("the gateway answers");
    let status = response.status().as_u16();
    if status == 200 {
        return (200, String::new());
    }
    let (status, _, error) = error_of(response).await;
    (status, code(&error).to_owned())
}

// proves: Q-14 (an upstream that advertises `x-ratelimit-limit-tokens: 40`
// once does not make larger calls fail: the next larger call goes out alone
// once the window is empty, the upstream's answer corrects the limit, and
// the calls after it go at once). Found in review, where the first version
// failed: every call larger than 40 tokens was refused with 400
// `estimate_exceeds_limit` before anything was sent, until restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_limit_advertised_once_refuses_no_larger_call() {
    let upstream = Scripted::start(vec![advertising(40), advertising(100_000)]).await;
    let gw = gateway(&upstream, "1s").await;
    let c = client();
    let send = |max_tokens| {
        let req = c
            .post(gw.url("/v1/chat/completions"))
            .bearer_auth(KEY_A)
            .json(&body(max_tokens));
        async move { bounded("a chat call answered", req.send()).await }
    };
    assert_eq!(status(send(1).await).await, (200, String::new()));
    // Larger than the 40 advertised once.
    assert_eq!(status(send(200).await).await, (200, String::new()));
    assert_eq!(status(send(200).await).await, (200, String::new()));
    assert_eq!(upstream.attempts(), 3);
    let limits = gw.upstream_scope("s").limits;
    assert!(
        limits.iter().any(|l| l.limit == 100_000),
        "the corrected limit: {limits:?}"
    );
}

// proves, Q-4 (a lowered limit that two answers confirm fails
// at once the queued call that can no longer fit, with 400
// `estimate_exceeds_limit`, and the call queued behind it, which fits, is
// admitted at once instead of waiting behind a stranded head). Found in
// review, where the first version failed: the head waited with no timer
// until its deadline and the call that fitted waited behind it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_that_fits_does_not_wait_behind_a_head_that_never_will() {
    let slow_lower = Reply::Delayed {
        delay: Duration::from_millis(700),
        reply: Box::new(advertising(100)),
    };
    let upstream = Scripted::start(vec![
        advertising(1_000),
        advertising(1_000),
        slow_lower.clone(),
        slow_lower,
        advertising(100),
    ])
    .await;
    // A long window: the head would wait about 30 s for room.
    let gw = gateway(&upstream, "30s").await;
    let c = client();
    for _ in 0..2 {
        let req = c
            .post(gw.url("/v1/chat/completions"))
            .bearer_auth(KEY_A)
            .json(&body(1));
        assert_eq!(
            status(bounded("learning call", req.send()).await).await.0,
            200
        );
    }
    // Two calls at the upstream, answering slowly that the limit is 100.
    let answering = [
        spawn_chat(&gw, KEY_A, body(1)),
        spawn_chat(&gw, KEY_A, body(1)),
    ];
    eventually("both calls reached the upstream", || {
        upstream.attempts() == 4
    })
    .await;
    // Nearly the whole 1,000: waits for the window.
    let head = spawn_chat(&gw, KEY_A, body(990));
    eventually("the large call is queued", || {
        gw.upstream_scope("s").queued == 1
    })
    .await;
    let fits = spawn_chat(&gw, KEY_A, body(1));
    eventually("the small call is queued", || {
        gw.upstream_scope("s").queued == 2
    })
    .await;

    let (head, fits) = bounded("both queued calls answered", async {
        (head.await.unwrap(), fits.await.unwrap())
    })
    .await;
    assert_eq!(
        status(head).await,
        (400, "estimate_exceeds_limit".to_owned())
    );
    assert_eq!(status(fits).await, (200, String::new()));
    for a in answering {
        assert_eq!(status(a.await.unwrap()).await.0, 200);
    }
    assert_eq!(upstream.attempts(), 5, "the refused call was never sent");
    assert_eq!(gw.upstream_scope("s").queued, 0);
}

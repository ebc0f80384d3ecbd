//! Gateway replicas that learn from the provider together (SPEC DQ-9):
//! three replicas on one real `redis-server`, in front of one strict
//! simulator that another consumer (unseen by the gateway) also spends,
//! on 2-second windows. Every verdict is the simulator's own count.
//!
//! Without redis-server the test skips, unless `TOLLGATE_REQUIRE_REDIS=1`.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use common::{Gateway, KEY_A, RemoteSim, client, tenants};
use serde_json::json;
use tollgate::StoreMode;
use tollgate_redis::RedisServer;
use tollgate_sim::{IngressDelay, SimConfig, SimServer};

const W: Duration = Duration::from_secs(2);

/// One replica: the account's whole limit (40 requests a window) on scope
/// `s`, kept in `redis`.
async fn replica(sim: &SimServer, redis: &RedisServer) -> Gateway {
    let toml = format!(
        "[providers.p]\nbase_url = \"{}\"\n\n\
         [scopes.s]\nlimits = [{{ requests = 40, per = \"2s\" }}]\n\n\
         [models.gpt-4o-mini]\nprovider = \"p\"\nscope = \"s\"\n\n\
         [quota_store]\nbackend = \"redis\"\nurl = \"{}\"\nprefix = \"fb\"\ntimeout = \"2s\"\n\n{}",
        sim.openai_base_url(),
        redis.url(),
        tenants("", ""),
    );
    Gateway::start(&toml).await
}

/// `n` items spread over `replicas` by `workers` clients, each sending its
/// next item once the previous one is answered. Returns the failures
/// (status, body) and the time from the first send to the last answer.
async fn job(replicas: &[Gateway], n: usize, workers: usize) -> (Vec<(u16, String)>, Duration) {
    let next = Arc::new(AtomicUsize::new(0));
    let urls: Arc<Vec<String>> = Arc::new(
        replicas
            .iter()
            .map(|g| g.url("/v1/chat/completions"))
            .collect(),
    );
    let body = json!({
        "model": "gpt-4o-mini",
        "messages": [{"role": "user", "content": "Say something."}],
        "max_tokens": 16,
    });
    let started = Instant::now();
    let tasks: Vec<_> = (0..workers)
        .map(|w| {
            let (next, urls, body) = (next.clone(), urls.clone(), body.clone());
            tokio::spawn(async move {
                let http = client();
                let mut failed = Vec::new();
                while next.fetch_add(1, Ordering::Relaxed) < n {
                    let resp = http
                        .post(&urls[w % urls.len()])
                        .bearer_auth(KEY_A)
                        .header("x-request-timeout", "30")
                        .json(&body)
                        .send()
                        .await
                        .expect("replica answers");
                    let status = resp.status().as_u16();
                    let text = resp.text().await.unwrap_or_default();
                    if status != 200 {
                        failed.push((status, text));
                    }
                }
                failed
            })
        })
        .collect();
    let mut failed = Vec::new();
    for t in tasks {
        let done = common::bounded("the job's workers finish", t).await;
        failed.extend(done.expect("a worker does not panic"));
    }
    (failed, started.elapsed())
}

// proves: DQ-9, Q-14, CD-1 (three replicas sharing one Redis, in front of
// a provider whose budget another consumer spends 30 % of, with arrival
// delays: what the remaining-budget headers teach any replica is taken
// out of the shared window, so the replicas together draw no more
// provider 429s than one replica does under the same load, which Q-14
// bounds by one a window (provider_accounting.rs,
// `hidden_consumer_is_learned_from_the_headers`, says why not zero: the
// consumer's spending after the latest answer is unseen until the next).
// Without DQ-9 every replica ignores the headers and each pays its own
// 429s at every window edge.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_replicas_learn_a_hidden_consumer_together() {
    let Some(redis) = RedisServer::start_or_skip("three_replicas_learn_a_hidden_consumer_together")
    else {
        return;
    };
    let sim = RemoteSim::start(SimConfig {
        rpm: Some(40),
        window: W,
        background_rpm: Some(12),
        ingress_delay: IngressDelay::range(Duration::from_millis(5), Duration::from_millis(60)),
        seed: 11,
        ..SimConfig::default()
    })
    .await;
    let replicas = [
        replica(&sim, &redis).await,
        replica(&sim, &redis).await,
        replica(&sim, &redis).await,
    ];
    // The other consumer has been spending for a whole window already.
    tokio::time::sleep(W).await;

    // About 3 windows of what is left (28 a window), 15 clients.
    let (failed, elapsed) = job(&replicas, 84, 15).await;
    let stats = sim.stats();
    let gaps: u64 = replicas
        .iter()
        .map(|r| r.upstream_scope("s").counters.gap_requests)
        .sum();
    eprintln!("{:?} for 84 items; gap taken {gaps}; {stats:?}", elapsed);
    assert_eq!(failed, Vec::<(u16, String)>::new(), "items lost");
    assert!(stats.background_requests > 0, "{stats:?}");
    let windows = elapsed.as_nanos().div_ceil(W.as_nanos()) as u64;
    assert!(
        stats.rejected_429.total() <= windows,
        "at most one provider 429 a window, as one replica ({elapsed:?}): {stats:?}"
    );
    assert!(gaps > 0, "the replicas took the consumer's share out");
    for r in &replicas {
        assert_eq!(r.upstream_scope("s").store, Some(StoreMode::Shared));
        r.wait_idle().await;
    }
}

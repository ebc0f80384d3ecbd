//! Property tests of the fair scheduler (SPEC FAIR-4, FAIR-5, ADM-4) on
//! paused time: random flows, weights, sizes and settlements, checked
//! against independent models of weighted service and of the sliding
//! window.

mod common;

use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use proptest::prelude::*;
use tokio::time::Instant;
use tollgate::config::{MINUTE, ScopeConfig};
use tollgate::{
    AdmissionController, Call, Deadline, Flow, Lease, Priority, ScopeId, TokenEstimate, Usage,
};

use common::{paused_runtime as runtime, settle};

/// One flow of a case: its weight and its calls (estimate, reported use;
/// `None` = unknown usage).
#[derive(Debug, Clone)]
struct FlowPlan {
    weight: u32,
    calls: Vec<(u64, Option<u64>)>,
}

/// What the test saw of one grant.
#[derive(Debug, Clone, Copy)]
struct Granted {
    flow: usize,
    /// Index of the call in its flow.
    index: usize,
    order: u64,
    ticket: u64,
    at: Instant,
}

fn flow_of(i: usize, weight: u32) -> Flow {
    Flow::new(i as u32 + 1, Priority::Standard).with_weight(weight)
}

/// Submits every call of every flow while the scope is full (so all of
/// them wait), interleaving flows in arrival, and collects the grants in
/// grant order. Each lease is settled with its planned use at once. With
/// `named` false every call is in the default flow.
async fn run(
    c: &AdmissionController,
    flows: &[FlowPlan],
    fill: Lease,
    named: bool,
) -> Vec<Granted> {
    let log = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    let longest = flows.iter().map(|f| f.calls.len()).max().unwrap_or(0);
    for index in 0..longest {
        for (i, f) in flows.iter().enumerate() {
            let Some(&(estimate, used)) = f.calls.get(index) else {
                continue;
            };
            let (c, log) = (c.clone(), log.clone());
            let flow = if named {
                flow_of(i, f.weight)
            } else {
                Flow::DEFAULT
            };
            let call = Call::new(ScopeId::FIRST)
                .with_flow(flow)
                .with_estimate(TokenEstimate::new(estimate, 0));
            tasks.push(tokio::spawn(async move {
                let mut lease = c.acquire(&call, Deadline::NONE).await.unwrap();
                let a = lease.admission();
                log.lock().push(Granted {
                    flow: i,
                    index,
                    order: a.grant_order,
                    ticket: a.ticket,
                    at: Instant::now(),
                });
                let usage = used.map_or(Usage::UNKNOWN, Usage::known);
                lease.reconcile(usage).unwrap();
            }));
        }
    }
    // Spawned tasks first run in spawn order: arrivals (tickets) follow it.
    settle().await;
    drop(fill);
    for t in tasks {
        t.await.unwrap();
    }
    let mut grants = std::mem::take(&mut *log.lock());
    grants.sort_by_key(|g| g.order);
    grants
}

fn flows(max_flows: usize, max_estimate: u64) -> impl Strategy<Value = Vec<FlowPlan>> {
    prop::collection::vec(
        (
            1u32..5,
            prop::collection::vec(
                (1..=max_estimate)
                    .prop_flat_map(|e| (Just(e), prop::option::weighted(0.9, 0..=2 * e))),
                2..14,
            ),
        )
            .prop_map(|(weight, calls)| FlowPlan { weight, calls }),
        2..=max_flows,
    )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    // proves: FAIR-4, FAIR-3, FAIR-1 (while two flows of one class stay
    // backlogged, their weighted served cost — estimates, replaced by the
    // reported use once settled — differs by at most 2 × the largest
    // single reservation plus one unit at every grant; each flow is FIFO)
    #[test]
    fn weighted_service_stays_within_the_bound(flows in flows(4, 200)) {
        let grants = runtime().block_on(async {
            // One grant per second, token costs: every settlement lands
            // before the next grant, as it would for calls shorter than
            // the spacing.
            let c = AdmissionController::builder()
                .scope(ScopeConfig::new("p").requests(1, Duration::from_secs(1)).tokens(1 << 40, MINUTE))
                .build()
                .unwrap();
            let fill = c.acquire(&Call::new(ScopeId::FIRST).with_tokens(1), Deadline::NONE).await.unwrap();
            run(&c, &flows, fill, true).await
        });
        // The largest single reservation, weighted: max(estimate, use) / w.
        let largest = flows
            .iter()
            .flat_map(|f| f.calls.iter().map(move |&(e, u)| e.max(u.unwrap_or(e)) as f64 / f64::from(f.weight)))
            .fold(0.0, f64::max);
        let bound = 2.0 * largest + 1.0;
        let mut served = vec![0.0f64; flows.len()];
        let mut left: Vec<usize> = flows.iter().map(|f| f.calls.len()).collect();
        let mut next = vec![0usize; flows.len()];
        for g in &grants {
            let f = &flows[g.flow];
            prop_assert_eq!(g.index, next[g.flow], "FIFO within flow {}", g.flow);
            next[g.flow] += 1;
            let (estimate, used) = f.calls[g.index];
            let w = f64::from(f.weight);
            served[g.flow] += estimate as f64 / w;
            for j in 0..flows.len() {
                // Both backlogged up to this grant.
                if j == g.flow || left[j] == 0 {
                    continue;
                }
                let gap = (served[g.flow] - served[j]).abs();
                prop_assert!(gap <= bound, "flows {} and {j}: gap {gap:.1} > {bound:.1} at grant {}", g.flow, g.order);
            }
            left[g.flow] -= 1;
            // Its settlement lands before the next grant.
            served[g.flow] += (used.unwrap_or(estimate) as f64 - estimate as f64) / w;
        }
    }
}

/// The earliest instant from `from` at which `amount` fits in a sliding
/// window of `limit` per `window`, given what was granted before.
fn fits_at(
    granted: &[(Instant, u64)],
    amount: u64,
    limit: u64,
    window: Duration,
    from: Instant,
) -> Instant {
    let used_at = |t: Instant| -> u64 {
        granted
            .iter()
            .filter(|(at, _)| *at + window > t)
            .map(|(_, a)| a)
            .sum()
    };
    let mut candidates: Vec<Instant> = granted
        .iter()
        .map(|(at, _)| *at + window)
        .filter(|t| *t > from)
        .collect();
    candidates.push(from);
    candidates.sort();
    candidates
        .into_iter()
        .find(|t| used_at(*t) + amount <= limit)
        .expect("fits once everything aged out")
}

const LIMIT: u64 = 1_000;
const WINDOW: Duration = Duration::from_secs(10);

fn sized_flows() -> impl Strategy<Value = (bool, Vec<FlowPlan>)> {
    let small = (
        1u32..5,
        prop::collection::vec((5u64..=60).prop_map(|e| (e, Some(e))), 20..120),
    )
        .prop_map(|(weight, calls)| FlowPlan { weight, calls });
    let large = (
        1u32..5,
        prop::collection::vec((300u64..=LIMIT).prop_map(|e| (e, Some(e))), 1..4),
    )
        .prop_map(|(weight, calls)| FlowPlan { weight, calls });
    (any::<bool>(), large, prop::collection::vec(small, 0..4)).prop_map(|(named, large, small)| {
        let mut all = vec![large];
        all.extend(small);
        (named, all)
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    // proves: FAIR-5, FAIR-4, Q-4 (work conserving: every grant, a very
    // large call among many small ones included, happens at the first
    // instant it fits after the grant before it; a large call is chosen
    // within the bound of grants its counter allows the others) and
    // FAIR-1 / ADM-4 (a single flow, default or not, is FIFO with FIFO's
    // instants)
    #[test]
    fn grants_come_as_soon_as_the_chosen_call_fits((named, flows) in sized_flows()) {
        let grants = runtime().block_on(async {
            let c = AdmissionController::builder()
                .scope(ScopeConfig::new("p").tokens(LIMIT, WINDOW))
                .build()
                .unwrap();
            let fill = c.acquire(&Call::new(ScopeId::FIRST).with_tokens(LIMIT), Deadline::NONE).await.unwrap();
            let t0 = Instant::now();
            // A single flow is sometimes the default one (plain FIFO).
            let grants = run(&c, &flows, fill, named || flows.len() > 1).await;
            (t0, grants)
        });
        let (t0, grants) = grants;
        let weight = |i: usize| f64::from(flows[i].weight);
        let cost = |g: &Granted| flows[g.flow].calls[g.index].0;
        // Exact sliding window of what was granted (the fill at t0).
        let mut history = vec![(t0, LIMIT)];
        let mut previous = t0;
        for g in &grants {
            let earliest = fits_at(&history, cost(g), LIMIT, WINDOW, previous);
            // The store merges grants closer than W/512 and counts them
            // until W after the latest: never earlier, at most that late.
            prop_assert!(g.at >= earliest, "grant {} at {:?} before it fits at {:?}", g.order, g.at - t0, earliest - t0);
            prop_assert!(g.at <= earliest + WINDOW / 512, "grant {} at {:?}, fits at {:?}: idle", g.order, g.at - t0, earliest - t0);
            history.push((g.at, cost(g)));
            previous = g.at;
        }
        if flows.len() == 1 {
            let tickets: Vec<_> = grants.iter().map(|g| g.ticket).collect();
            let mut sorted = tickets.clone();
            sorted.sort();
            prop_assert_eq!(tickets, sorted, "a single flow is FIFO");
        }
        // Chosen within the bound: while the large flow's next call is first
        // in its line (flow 0's weighted service then is S), another flow j,
        // whose service was S_j at that moment, is granted at most
        // (S - S_j) / (smallest cost of j / w_j) + 1 times before it.
        let mut served = vec![0.0f64; flows.len()];
        let mut at_head = served.clone();
        let mut since = vec![0usize; flows.len()];
        let mut large_left = flows[0].calls.len();
        for g in &grants {
            let w = weight(g.flow);
            if g.flow == 0 {
                served[0] += cost(g) as f64 / w;
                large_left -= 1;
                at_head = served.clone();
                since.iter_mut().for_each(|n| *n = 0);
                continue;
            }
            if large_left > 0 {
                since[g.flow] += 1;
                let step = flows[g.flow].calls.iter().map(|c| c.0).min().unwrap() as f64 / w;
                let ahead = at_head[0] - at_head[g.flow];
                let allowed = if ahead < -1e-9 { 0.0 } else { (ahead / step + 1e-9).floor() + 1.0 };
                prop_assert!(
                    since[g.flow] as f64 <= allowed,
                    "flow {} granted {} times while the large call waited (bound {allowed})",
                    g.flow, since[g.flow]
                );
            }
            served[g.flow] += cost(g) as f64 / w;
        }
    }
}

//! What a call tells about itself: tracing spans (SPEC OBS-3, RT-7) and
//! what each admission waited for (OBS-4). All on paused time.

mod common;

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use common::script::{End, Script, Step};
use common::{ms, secs, settle, tokens};
use futures_util::StreamExt;
use parking_lot::Mutex;
use tokio::time::Instant;
use tollgate::config::{MINUTE, ScopeConfig};
use tollgate::lifecycle::{CallOptions, ProviderError, Supervisor};
use tollgate::quota::LimitedBy;
use tollgate::{Admission, AdmissionController, Call, CallId, Deadline, ScopeId};
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Metadata, Subscriber};

// ---------------------------------------------------------------- OBS-3

/// One recorded span or event: its name (the message for events), its
/// fields as text, and the span it belongs to.
#[derive(Debug, Clone)]
struct Rec {
    name: String,
    fields: BTreeMap<String, String>,
    parent: Option<u64>,
}

impl Rec {
    fn field(&self, name: &str) -> Option<&str> {
        self.fields.get(name).map(String::as_str)
    }
}

#[derive(Debug, Default)]
struct Captured {
    /// Span `i` has id `i + 1`.
    spans: Vec<Rec>,
    events: Vec<Rec>,
    /// Entered spans (the test runs on one thread).
    stack: Vec<u64>,
}

/// A subscriber that keeps every span and event it sees, with its parent.
#[derive(Clone, Default)]
struct Capture(Arc<Mutex<Captured>>);

struct Fields<'a>(&'a mut BTreeMap<String, String>);

impl Visit for Fields<'_> {
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().to_string(), value.to_string());
    }

    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        self.0
            .insert(field.name().to_string(), format!("{value:?}"));
    }
}

impl Subscriber for Capture {
    fn enabled(&self, _: &Metadata<'_>) -> bool {
        true
    }

    fn new_span(&self, attrs: &Attributes<'_>) -> Id {
        let mut c = self.0.lock();
        let mut fields = BTreeMap::new();
        attrs.record(&mut Fields(&mut fields));
        let parent = match attrs.parent() {
            Some(p) => Some(p.into_u64()),
            None if attrs.is_contextual() => c.stack.last().copied(),
            None => None,
        };
        c.spans.push(Rec {
            name: attrs.metadata().name().to_string(),
            fields,
            parent,
        });
        Id::from_u64(c.spans.len() as u64)
    }

    fn record(&self, span: &Id, values: &Record<'_>) {
        let mut c = self.0.lock();
        let i = span.into_u64() as usize - 1;
        values.record(&mut Fields(&mut c.spans[i].fields));
    }

    fn record_follows_from(&self, _: &Id, _: &Id) {}

    fn event(&self, event: &Event<'_>) {
        let mut c = self.0.lock();
        let mut fields = BTreeMap::new();
        event.record(&mut Fields(&mut fields));
        let parent = match event.parent() {
            Some(p) => Some(p.into_u64()),
            None if event.is_contextual() => c.stack.last().copied(),
            None => None,
        };
        c.events.push(Rec {
            name: fields.get("message").cloned().unwrap_or_default(),
            fields,
            parent,
        });
    }

    fn enter(&self, span: &Id) {
        self.0.lock().stack.push(span.into_u64());
    }

    fn exit(&self, span: &Id) {
        let mut c = self.0.lock();
        if let Some(i) = c.stack.iter().rposition(|s| *s == span.into_u64()) {
            c.stack.remove(i);
        }
    }
}

impl Captured {
    fn spans_named(&self, name: &str) -> Vec<(u64, &Rec)> {
        self.spans
            .iter()
            .enumerate()
            .filter(|(_, s)| s.name == name)
            .map(|(i, s)| (i as u64 + 1, s))
            .collect()
    }

    /// Whether span `id` is `ancestor` or lies inside it.
    fn within(&self, mut id: Option<u64>, ancestor: u64) -> bool {
        while let Some(i) = id {
            if i == ancestor {
                return true;
            }
            id = self.spans[i as usize - 1].parent;
        }
        false
    }

    fn all_text(&self) -> String {
        self.spans
            .iter()
            .chain(&self.events)
            .map(|r| format!("{} {:?}", r.name, r.fields))
            .collect::<Vec<_>>()
            .join("\n")
    }
}

const SECRET: &str = "SECRET-PROMPT-do-not-log";

// proves: OBS-3, RT-7 (every call has a `call` span with its id, shape,
// idempotency and remaining budget; every attempt has its own `attempt`
// span inside it with the attempt number and its timeout; a failed attempt
// is reported inside the call with its error class, the remaining budget
// and the retry decision with its delay; the call's end with its outcome
// and attempts; no prompt and no response anywhere)
#[tokio::test(start_paused = true)]
async fn calls_and_attempts_have_spans_with_rt7_fields_and_no_payloads() {
    let capture = Capture::default();
    let _default = tracing::subscriber::set_default(capture.clone());
    let controller = AdmissionController::builder()
        .scope(ScopeConfig::new("main").requests(100, MINUTE))
        .build()
        .unwrap();
    let steps = vec![
        Step::fail(ProviderError::from_status(503, "overloaded")),
        Step::ok(),
        Step::chunks(&["chunk-payload"], End::Eof),
    ];
    let sup = Supervisor::builder(controller, Script::new(steps))
        .without_jitter()
        .build()
        .unwrap();
    let options = |id| CallOptions {
        id: Some(CallId(id)),
        deadline: Deadline::from_timeout(Some(secs(30)), Instant::now()),
        idempotent: true,
    };
    let done = sup.invoke(&SECRET.to_string(), options(7)).await.unwrap();
    assert_eq!(done.attempts, 2);
    let mut s = sup.stream(&SECRET.to_string(), options(8)).await.unwrap();
    while let Some(c) = s.next().await {
        c.unwrap();
    }
    drop(s);
    settle().await;

    let c = capture.0.lock();
    let calls = c.spans_named("call");
    assert_eq!(calls.len(), 2, "one span per call: {calls:?}");
    let (invoke_id, invoke) = calls[0];
    assert_eq!(invoke.field("call"), Some("Some(CallId(7))"));
    assert_eq!(invoke.field("shape"), Some("invoke"));
    assert_eq!(invoke.field("idempotent"), Some("true"));
    assert_eq!(invoke.field("budget_ms"), Some("30000"));
    let (stream_id, stream) = calls[1];
    assert_eq!(stream.field("call"), Some("Some(CallId(8))"));
    assert_eq!(stream.field("shape"), Some("stream"));

    let attempts = c.spans_named("attempt");
    assert_eq!(attempts.len(), 3, "one span per attempt: {attempts:?}");
    for (n, (_, a)) in attempts[..2].iter().enumerate() {
        assert!(c.within(a.parent, invoke_id), "attempt inside its call");
        assert_eq!(a.field("call"), Some("Some(CallId(7))"));
        assert_eq!(a.field("attempt"), Some((n + 1).to_string().as_str()));
    }
    // The second attempt starts after a 1 s backoff: 29 s are left.
    assert_eq!(attempts[0].1.field("timeout_ms"), Some("30000"));
    assert_eq!(attempts[1].1.field("timeout_ms"), Some("29000"));
    assert!(c.within(attempts[2].1.parent, stream_id));
    assert_eq!(attempts[2].1.field("attempt"), Some("1"));

    let failed: Vec<_> = c
        .events
        .iter()
        .filter(|e| e.name == "attempt failed")
        .collect();
    assert_eq!(failed.len(), 1, "{failed:?}");
    let f = failed[0];
    assert!(c.within(f.parent, invoke_id), "reported inside the call");
    assert_eq!(f.field("call"), Some("Some(CallId(7))"));
    assert_eq!(f.field("attempt"), Some("1"));
    assert_eq!(f.field("class"), Some("server"));
    assert_eq!(f.field("remaining_ms"), Some("30000"));
    assert_eq!(f.field("decision"), Some("Retry(1s)"));

    let finished: Vec<_> = c
        .events
        .iter()
        .filter(|e| e.name == "call finished")
        .collect();
    assert_eq!(finished.len(), 2, "{finished:?}");
    assert_eq!(finished[0].field("call"), Some("Some(CallId(7))"));
    assert_eq!(finished[0].field("terminal"), Some("completed"));
    assert_eq!(finished[0].field("attempts"), Some("2"));
    assert_eq!(finished[1].field("call"), Some("Some(CallId(8))"));
    assert_eq!(finished[1].field("terminal"), Some("completed"));

    let text = c.all_text();
    for payload in [SECRET, "reply to", "chunk-payload"] {
        assert!(!text.contains(payload), "{payload:?} was logged:\n{text}");
    }
}

// ---------------------------------------------------------------- OBS-4

fn controller(scope: ScopeConfig, concurrency: Option<u64>) -> AdmissionController {
    let mut b = AdmissionController::builder().scope(scope);
    if let Some(c) = concurrency {
        b = b.concurrency(c);
    }
    b.build().unwrap()
}

/// Admits `second` on its own task while `first` is held for `hold`; returns
/// what the admission reported.
async fn second_admission(
    c: &AdmissionController,
    first: Call,
    second: Call,
    hold: Duration,
) -> Admission {
    let held = c.acquire(&first, Deadline::NONE).await.unwrap();
    let c2 = c.clone();
    let waiter = tokio::spawn(async move {
        let lease = c2.acquire(&second, Deadline::NONE).await.unwrap();
        *lease.admission()
    });
    settle().await;
    tokio::time::sleep(hold).await;
    drop(held);
    waiter.await.unwrap()
}

const NOT_LIMITED: LimitedBy = LimitedBy {
    requests: false,
    tokens: false,
    input_tokens: false,
    output_tokens: false,
    cost: false,
};

// proves: OBS-4 (every admission reports which limit bound its wait: none,
// a request limit, a token limit, both, concurrency, a cooldown, and its
// quota wait and concurrency wait as separate durations)
#[tokio::test(start_paused = true)]
async fn every_admission_reports_what_it_waited_for() {
    let both = || {
        ScopeConfig::new("main")
            .requests(1, MINUTE)
            .tokens(100, MINUTE)
    };
    let roomy = || {
        ScopeConfig::new("main")
            .requests(100, MINUTE)
            .tokens(1_000, MINUTE)
    };

    // Nothing to wait for.
    let c = controller(roomy(), Some(4));
    let a = *c
        .acquire(&tokens(10), Deadline::NONE)
        .await
        .unwrap()
        .admission();
    assert_eq!(
        (a.limited_by, a.cooldown, a.concurrency),
        (NOT_LIMITED, false, false)
    );
    assert_eq!((a.quota_wait, a.concurrency_wait), (secs(0), secs(0)));

    // A request limit.
    let c = controller(
        ScopeConfig::new("main")
            .requests(1, MINUTE)
            .tokens(1_000, MINUTE),
        None,
    );
    let a = second_admission(&c, tokens(10), tokens(10), secs(0)).await;
    let requests_only = LimitedBy {
        requests: true,
        tokens: false,
        ..NOT_LIMITED
    };
    assert_eq!(a.limited_by, requests_only);
    assert_eq!((a.quota_wait, a.concurrency_wait), (MINUTE, secs(0)));
    assert!(!a.cooldown && !a.concurrency);

    // A token limit.
    let c = controller(
        ScopeConfig::new("main")
            .requests(100, MINUTE)
            .tokens(100, MINUTE),
        None,
    );
    let a = second_admission(&c, tokens(100), tokens(10), secs(0)).await;
    let tokens_only = LimitedBy {
        requests: false,
        tokens: true,
        ..NOT_LIMITED
    };
    assert_eq!(a.limited_by, tokens_only);
    assert_eq!((a.quota_wait, a.concurrency_wait), (MINUTE, secs(0)));

    // Both.
    let c = controller(both(), None);
    let a = second_admission(&c, tokens(100), tokens(10), secs(0)).await;
    let both_limits = LimitedBy {
        requests: true,
        tokens: true,
        ..NOT_LIMITED
    };
    assert_eq!(a.limited_by, both_limits);
    assert_eq!(a.quota_wait, MINUTE);

    // Concurrency only.
    let c = controller(roomy(), Some(1));
    let a = second_admission(&c, tokens(10), tokens(10), secs(5)).await;
    assert_eq!(a.limited_by, NOT_LIMITED);
    assert!(a.concurrency && !a.cooldown);
    assert_eq!((a.quota_wait, a.concurrency_wait), (secs(0), secs(5)));

    // A cooldown.
    let c = controller(roomy(), None);
    c.start_cooldown(ScopeId::FIRST, secs(3));
    let lease = c.acquire(&tokens(10), Deadline::NONE).await.unwrap();
    let a = *lease.admission();
    assert!(a.cooldown && !a.concurrency);
    assert_eq!(a.limited_by, NOT_LIMITED);
    assert_eq!((a.quota_wait, a.concurrency_wait), (secs(3), secs(0)));
    drop(lease);

    // The request limit, then concurrency: measured apart. The first lease
    // is held for 90 s; the second gets its request unit at 60 s and its
    // permit at 90 s.
    let c = controller(both(), Some(1));
    let a = second_admission(&c, tokens(10), tokens(10), secs(90)).await;
    assert_eq!(a.limited_by, requests_only);
    assert!(a.concurrency);
    assert_eq!((a.quota_wait, a.concurrency_wait), (MINUTE, secs(30)));
    assert_eq!(a.total_wait(), secs(90));

    // Without a token estimate the call is plain: still reported.
    let c = controller(ScopeConfig::new("main").requests(1, MINUTE), None);
    let plain = Call::new(ScopeId::FIRST);
    let a = second_admission(&c, plain, plain, ms(0)).await;
    assert_eq!(a.limited_by, requests_only);
}

// ---------------------------------------------------------------- OBS-1

// proves: OBS-1 (one scope's limits read on their own are the snapshot's
// entry for that scope, brought up to the same instant; an unknown scope
// has none)
#[tokio::test(start_paused = true)]
async fn one_scopes_limits_read_alone_match_the_snapshot() {
    let c = AdmissionController::builder()
        .scope(
            ScopeConfig::new("a")
                .requests(60, MINUTE)
                .tokens(1_000, MINUTE),
        )
        .scope(ScopeConfig::new("b").requests(5, secs(1)))
        .build()
        .unwrap();
    let b = c.scope_id("b").unwrap();
    let mut held = Vec::new();
    for _ in 0..3 {
        held.push(c.acquire(&Call::new(b), Deadline::NONE).await.unwrap());
    }
    let lease = c.acquire(&tokens(400), Deadline::NONE).await.unwrap();
    tokio::time::sleep(ms(1_500)).await;
    for id in [c.scope_id("a").unwrap(), b] {
        let mut alone = Vec::new();
        assert!(c.scope_limits(id, &mut alone));
        let snapshot = c.snapshot();
        assert_eq!(alone, snapshot.scope(id).unwrap().limits, "scope {id:?}");
    }
    // Sliding past its window, scope b has its 5 requests back.
    let mut alone = Vec::new();
    c.scope_limits(b, &mut alone);
    assert_eq!(alone[0].available, 5);
    drop((held, lease));
    // A scope id of a controller with three scopes: unknown to this one.
    let other = AdmissionController::builder()
        .scope(ScopeConfig::new("x").requests(1, MINUTE))
        .scope(ScopeConfig::new("y").requests(1, MINUTE))
        .scope(ScopeConfig::new("z").requests(1, MINUTE))
        .build()
        .unwrap();
    let unknown = other.scope_id("z").unwrap();
    assert!(!c.scope_limits(unknown, &mut alone));
}

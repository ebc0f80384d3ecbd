//! A call id belongs to the whole call (SPEC ADM-6): across its attempts
//! and the backoff delays between them, until the call is terminal. All on
//! paused time.

mod common;

use std::time::Duration;

use common::script::{End, Script, Step};
use common::settle;
use futures_util::StreamExt;
use tollgate::config::{MINUTE, ScopeConfig};
use tollgate::lifecycle::{
    AttemptPolicy, CallError, CallOptions, ErrorKind, ProviderError, Supervisor,
};
use tollgate::{AdmissionController, AdmissionError, Call, CallId, Deadline, ScopeId};

const ID: CallId = CallId(7);

fn supervisor(steps: Vec<Step>) -> (AdmissionController, Supervisor<Script>) {
    let controller = AdmissionController::builder()
        .scope(ScopeConfig::new("main").requests(100, MINUTE))
        .build()
        .unwrap();
    let sup = Supervisor::builder(controller.clone(), Script::new(steps))
        .policy(AttemptPolicy {
            base_delay: Duration::from_secs(1),
            jitter: 0.0,
            ..AttemptPolicy::default()
        })
        .without_jitter()
        .build()
        .unwrap();
    (controller, sup)
}

fn with_id() -> CallOptions {
    CallOptions {
        id: Some(ID),
        ..CallOptions::default()
    }
}

fn is_conflict(e: &CallError) -> bool {
    matches!(e, CallError::Admission(AdmissionError::Conflict(id)) if *id == ID)
}

// proves: ADM-6 (during the backoff between two attempts the id is still
// taken: a duplicate call, supervised or not, is refused; the original's
// next attempt is not)
#[tokio::test(start_paused = true)]
async fn the_id_is_held_across_the_backoff() {
    let (controller, sup) = supervisor(vec![
        Step::fail(ProviderError::new(ErrorKind::Server, "boom")),
        Step::ok(),
    ]);
    let original = tokio::spawn({
        let sup = sup.clone();
        async move { sup.invoke(&"first".to_string(), with_id()).await }
    });
    settle().await;
    // The first attempt failed; the call sleeps 1 s before the next.
    tokio::time::advance(Duration::from_millis(500)).await;
    assert!(!original.is_finished());
    let duplicate = sup.invoke(&"again".to_string(), with_id()).await;
    assert!(duplicate.as_ref().is_err_and(is_conflict), "{duplicate:?}");
    let direct = controller
        .acquire(&Call::new(ScopeId::FIRST).with_id(ID), Deadline::NONE)
        .await;
    assert!(
        matches!(direct, Err(AdmissionError::Conflict(id)) if id == ID),
        "{direct:?}"
    );

    let done = original
        .await
        .unwrap()
        .expect("the original call completes");
    assert_eq!(done.attempts, 2);
    // Terminal: the id is free again.
    let lease = controller
        .acquire(&Call::new(ScopeId::FIRST).with_id(ID), Deadline::NONE)
        .await
        .expect("the id is free once the call is terminal");
    drop(lease);
}

// proves: ADM-6 (a stream holds its id until its end, not only until its
// admission)
#[tokio::test(start_paused = true)]
async fn a_stream_holds_its_id_until_it_ends() {
    let (controller, sup) = supervisor(vec![Step::chunks(&["a", "b"], End::Eof)]);
    let mut stream = sup.stream(&"s".to_string(), with_id()).await.unwrap();
    let direct = controller
        .acquire(&Call::new(ScopeId::FIRST).with_id(ID), Deadline::NONE)
        .await;
    assert!(
        matches!(direct, Err(AdmissionError::Conflict(_))),
        "{direct:?}"
    );
    while let Some(item) = stream.next().await {
        item.unwrap();
    }
    drop(stream);
    let lease = controller
        .acquire(&Call::new(ScopeId::FIRST).with_id(ID), Deadline::NONE)
        .await
        .expect("free after the stream ended");
    drop(lease);
}

// proves: ADM-6 (a refused duplicate leaves the original's claim alone)
#[tokio::test(start_paused = true)]
async fn a_refused_duplicate_does_not_free_the_id() {
    let (controller, _sup) = supervisor(vec![]);
    let claim = controller.claim(ID).unwrap();
    assert!(matches!(
        controller.claim(ID),
        Err(AdmissionError::Conflict(_))
    ));
    // The refused claim above must not have freed the id.
    assert!(matches!(
        controller.claim(ID),
        Err(AdmissionError::Conflict(_))
    ));
    drop(claim);
    drop(
        controller
            .claim(ID)
            .expect("free after the claim is dropped"),
    );
}

//! A cut attempt's lease goes to its provider (`Provider::cut`), which
//! returns its permit once the attempt's work has ended (SPEC POOL-1,
//! ADM-7, DL-6): the seam the Python package uses, whose attempts run as
//! tasks on an event loop that end some time after they are cancelled.

use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use tollgate::config::{MINUTE, ScopeConfig};
use tollgate::lifecycle::{
    AttemptContext, AttemptPolicy, CallError, CallOptions, Provider, ProviderError, Reply,
    StreamEvent, Supervisor,
};
use tollgate::{AdmissionController, Deadline, Lease, Phase, Usage};

/// A request's first `hang` attempts never answer; later ones answer at
/// once. A cut attempt's lease is parked in `parked`, as if its work were
/// still unwinding.
#[derive(Clone, Default)]
struct Lingering {
    parked: Arc<Mutex<Vec<Lease>>>,
}

impl Provider for Lingering {
    type Request = u32;
    type Response = &'static str;
    type Chunk = &'static str;
    type Stream = futures_util::stream::Empty<Result<StreamEvent<&'static str>, ProviderError>>;

    async fn call(
        &self,
        hang: &u32,
        attempt: AttemptContext,
    ) -> Result<Reply<&'static str>, ProviderError> {
        if attempt.attempt <= *hang {
            std::future::pending::<()>().await;
        }
        Ok(Reply::new("ok", Usage::known(1)))
    }

    async fn stream(&self, _: &u32, _: AttemptContext) -> Result<Self::Stream, ProviderError> {
        Ok(futures_util::stream::empty())
    }

    fn cut(&self, _: &u32, lease: Lease) {
        self.parked.lock().push(lease);
    }
}

/// A controller of 100 requests a minute and one permit.
fn one_permit() -> AdmissionController {
    AdmissionController::builder()
        .scope(ScopeConfig::new("main").requests(100, MINUTE))
        .concurrency(1)
        .build()
        .unwrap()
}

fn supervisor(provider: Lingering, attempt_timeout: Option<Duration>) -> Supervisor<Lingering> {
    let mut b = Supervisor::builder(one_permit(), provider)
        .policy(AttemptPolicy {
            max_attempts: 2,
            jitter: 0.0,
            base_delay: Duration::from_millis(10),
            ..AttemptPolicy::default()
        })
        .without_jitter();
    if let Some(t) = attempt_timeout {
        b = b.transport_timeout(t);
    }
    b.build().unwrap()
}

/// While the parked lease lives (its work "still runs"), the only permit
/// is held and a call waiting for it meets its deadline; once the work
/// has ended (the lease dropped), the next call is admitted.
async fn held_until_let_go<P>(sup: &Supervisor<P>, request: &P::Request, parked: &Mutex<Vec<Lease>>)
where
    P: Provider<Response = &'static str>,
{
    let waiting = sup.invoke(request, within(1)).await;
    assert!(
        matches!(
            waiting,
            Err(CallError::Deadline {
                phase: Phase::Concurrency,
                ..
            })
        ),
        "{waiting:?}"
    );
    parked.lock().clear();
    assert_eq!(
        sup.invoke(request, within(1))
            .await
            .expect("admitted")
            .response,
        "ok"
    );
}

fn within(secs: u64) -> CallOptions {
    CallOptions {
        deadline: Deadline::after(Duration::from_secs(secs)),
        ..CallOptions::default()
    }
}

// proves: POOL-1 (an attempt's permit is released when the attempt ends,
// and a cut attempt ends when its provider says its work has), ADM-7 (the
// concurrency limit bounds the work in flight), DL-6 (the deadline's
// error comes back at once; the permit follows the work)
#[tokio::test(start_paused = true)]
async fn a_deadline_cut_attempt_holds_its_permit_until_its_provider_lets_go() {
    let provider = Lingering::default();
    let sup = supervisor(provider.clone(), None);
    let cut = sup.invoke(&1, within(1)).await;
    assert!(
        matches!(
            cut,
            Err(CallError::Deadline {
                phase: Phase::Transport,
                ..
            })
        ),
        "{cut:?}"
    );
    assert_eq!(provider.parked.lock().len(), 1, "the cut attempt's lease");
    held_until_let_go(&sup, &0, &provider.parked).await;
}

// proves: POOL-1 (the permit of an attempt cut by its attempt timeout is
// not held during backoff, yet goes back only once its work has ended:
// the retry waits for it), ADM-7
#[tokio::test(start_paused = true)]
async fn the_retry_after_an_attempt_timeout_waits_for_the_cut_attempts_work() {
    let provider = Lingering::default();
    let sup = supervisor(provider.clone(), Some(Duration::from_secs(1)));
    let parked = Arc::clone(&provider.parked);
    let unwound = Arc::new(Mutex::new(None));
    let at = Arc::clone(&unwound);
    let work = tokio::spawn(async move {
        while parked.lock().is_empty() {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        // The cut attempt unwinds for 3 s, then lets its lease go.
        tokio::time::sleep(Duration::from_secs(3)).await;
        *at.lock() = Some(tokio::time::Instant::now());
        parked.lock().clear();
    });
    let done = sup.invoke(&1, within(30)).await.expect("the retry answers");
    let answered = tokio::time::Instant::now();
    let unwound = unwound.lock().take();
    work.abort();
    assert_eq!(done.response, "ok");
    assert!(
        matches!(unwound, Some(t) if t <= answered),
        "the retry ran before the cut attempt's work ended"
    );
}

/// An attempt that answers a timeout error of its own exactly at the
/// call's deadline (its transport enforces the same deadline): it ended,
/// nothing of it still runs. Records what `cut` was handed.
#[derive(Clone, Default)]
struct TimesOutAtTheDeadline {
    cut: Arc<Mutex<u32>>,
}

impl Provider for TimesOutAtTheDeadline {
    type Request = ();
    type Response = &'static str;
    type Chunk = &'static str;
    type Stream = futures_util::stream::Empty<Result<StreamEvent<&'static str>, ProviderError>>;

    async fn call(
        &self,
        _: &(),
        attempt: AttemptContext,
    ) -> Result<Reply<&'static str>, ProviderError> {
        if let Some(at) = attempt.deadline.instant() {
            tokio::time::sleep_until(at).await;
        }
        Err(ProviderError::new(
            tollgate::lifecycle::ErrorKind::Timeout,
            "read timed out",
        ))
    }

    async fn stream(&self, _: &(), _: AttemptContext) -> Result<Self::Stream, ProviderError> {
        Ok(futures_util::stream::empty())
    }

    fn cut(&self, _: &(), lease: Lease) {
        *self.cut.lock() += 1;
        drop(lease);
    }
}

// proves: POOL-1 (an attempt's permit is released when the attempt ends:
// an attempt that answered, even with its own timeout at the deadline, is
// not a cut one whose work may still run), DL-6
#[tokio::test(start_paused = true)]
async fn an_attempt_that_answered_at_the_deadline_is_not_handed_to_cut() {
    let provider = TimesOutAtTheDeadline::default();
    let sup = Supervisor::builder(one_permit(), provider.clone())
        .build()
        .unwrap();
    let out = sup.invoke(&(), within(1)).await;
    assert!(
        matches!(
            out,
            Err(CallError::Deadline {
                phase: Phase::Transport,
                ..
            })
        ),
        "{out:?}"
    );
    assert_eq!(
        *provider.cut.lock(),
        0,
        "the attempt answered: nothing was cut"
    );
    assert_eq!(sup.controller().snapshot().active, 0, "its permit is back");
}

/// Streams one chunk, then never ends; a stream let go parks its lease
/// in `parked`, as if its read were still unwinding.
#[derive(Clone, Default)]
struct LingeringStream {
    parked: Arc<Mutex<Vec<Lease>>>,
}

type OneThenPending = futures_util::stream::Chain<
    futures_util::stream::Iter<
        std::vec::IntoIter<Result<StreamEvent<&'static str>, ProviderError>>,
    >,
    futures_util::stream::Pending<Result<StreamEvent<&'static str>, ProviderError>>,
>;

impl Provider for LingeringStream {
    type Request = ();
    type Response = &'static str;
    type Chunk = &'static str;
    type Stream = OneThenPending;

    async fn call(&self, _: &(), _: AttemptContext) -> Result<Reply<&'static str>, ProviderError> {
        Ok(Reply::new("ok", Usage::known(1)))
    }

    async fn stream(&self, _: &(), _: AttemptContext) -> Result<Self::Stream, ProviderError> {
        use futures_util::StreamExt;
        Ok(
            futures_util::stream::iter(vec![Ok(StreamEvent::Chunk("a"))])
                .chain(futures_util::stream::pending()),
        )
    }

    fn stream_cut(&self, stream: Self::Stream, lease: Lease) {
        drop(stream);
        self.parked.lock().push(lease);
    }
}

// proves: LC-5 (a consumer that drops the stream early: upstream aborted,
// permits released once its work has ended), POOL-1, ADM-7
#[tokio::test(start_paused = true)]
async fn a_stream_dropped_mid_way_hands_its_lease_to_its_provider() {
    use futures_util::StreamExt;
    let provider = LingeringStream::default();
    let sup = Supervisor::builder(one_permit(), provider.clone())
        .build()
        .unwrap();
    let mut stream = sup.stream(&(), within(30)).await.expect("opened");
    assert_eq!(stream.next().await.map(Result::ok), Some(Some("a")));
    drop(stream);
    assert_eq!(provider.parked.lock().len(), 1, "the stream's lease");
    held_until_let_go(&sup, &(), &provider.parked).await;
}

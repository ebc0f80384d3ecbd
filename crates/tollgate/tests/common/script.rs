//! A scripted in-memory provider that records whether its work was
//! finished or dropped, so tests can prove no attempt outlives its call.

use std::collections::VecDeque;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, AtomicU32, Ordering};
use std::time::Duration;

use futures_core::Stream;
use parking_lot::Mutex;
use tollgate::Usage;
use tollgate::lifecycle::{AttemptContext, Provider, ProviderError, Reply, StreamEvent};

/// One scripted stream event, after a delay.
#[derive(Debug, Clone)]
pub enum Ev {
    Chunk(&'static str),
    Usage(u64),
    ErrorChunk(&'static str, ProviderError),
}

/// How a scripted stream ends.
#[derive(Debug, Clone)]
pub enum End {
    Eof,
    Fail(ProviderError),
    Hang,
}

/// What one attempt does.
#[derive(Debug, Clone)]
pub enum Step {
    Reply {
        after: Duration,
        usage: Usage,
    },
    Fail {
        after: Duration,
        error: ProviderError,
    },
    Hang,
    Stream {
        events: Vec<(Duration, Ev)>,
        end: End,
    },
}

impl Step {
    pub fn ok() -> Self {
        Step::Reply {
            after: Duration::ZERO,
            usage: Usage::known(10),
        }
    }

    pub fn fail(error: ProviderError) -> Self {
        Step::Fail {
            after: Duration::ZERO,
            error,
        }
    }

    pub fn chunks(chunks: &[&'static str], end: End) -> Self {
        Step::Stream {
            events: chunks
                .iter()
                .map(|c| (Duration::ZERO, Ev::Chunk(c)))
                .collect(),
            end,
        }
    }
}

/// Counts of attempts, as the provider saw them.
#[derive(Debug, Default)]
pub struct Work {
    pub started: AtomicU32,
    pub finished: AtomicU32,
    pub dropped: AtomicU32,
    pub in_flight: AtomicI64,
}

impl Work {
    pub fn started(&self) -> u32 {
        self.started.load(Ordering::SeqCst)
    }

    pub fn in_flight(&self) -> i64 {
        self.in_flight.load(Ordering::SeqCst)
    }

    pub fn dropped(&self) -> u32 {
        self.dropped.load(Ordering::SeqCst)
    }
}

/// Marks one attempt in flight until finished or dropped.
struct Tracker {
    work: Arc<Work>,
    finished: bool,
}

impl Tracker {
    fn new(work: &Arc<Work>) -> Self {
        work.started.fetch_add(1, Ordering::SeqCst);
        work.in_flight.fetch_add(1, Ordering::SeqCst);
        Tracker {
            work: Arc::clone(work),
            finished: false,
        }
    }

    fn finish(&mut self) {
        if !std::mem::replace(&mut self.finished, true) {
            self.work.finished.fetch_add(1, Ordering::SeqCst);
            self.work.in_flight.fetch_sub(1, Ordering::SeqCst);
        }
    }
}

impl Drop for Tracker {
    fn drop(&mut self) {
        if !self.finished {
            self.work.dropped.fetch_add(1, Ordering::SeqCst);
            self.work.in_flight.fetch_sub(1, Ordering::SeqCst);
        }
    }
}

/// Plays one step per attempt, in order; `Step::ok()` once the script runs out.
#[derive(Debug, Default)]
pub struct Script {
    steps: Mutex<VecDeque<Step>>,
    pub work: Arc<Work>,
}

impl Script {
    pub fn new(steps: Vec<Step>) -> Self {
        Script {
            steps: Mutex::new(steps.into()),
            work: Arc::new(Work::default()),
        }
    }

    fn next(&self) -> Step {
        self.steps.lock().pop_front().unwrap_or_else(Step::ok)
    }
}

pub type ScriptStream =
    Pin<Box<dyn Stream<Item = Result<StreamEvent<String>, ProviderError>> + Send>>;

impl Provider for Script {
    type Request = String;
    type Response = String;
    type Chunk = String;
    type Stream = ScriptStream;

    async fn call(
        &self,
        request: &String,
        _: AttemptContext,
    ) -> Result<Reply<String>, ProviderError> {
        let mut tracker = Tracker::new(&self.work);
        let result = match self.next() {
            Step::Reply { after, usage } => {
                tokio::time::sleep(after).await;
                Ok(Reply::new(format!("reply to {request}"), usage))
            }
            Step::Fail { after, error } => {
                tokio::time::sleep(after).await;
                Err(error)
            }
            Step::Hang | Step::Stream { .. } => std::future::pending().await,
        };
        tracker.finish();
        result
    }

    async fn stream(&self, _: &String, _: AttemptContext) -> Result<ScriptStream, ProviderError> {
        let mut tracker = Tracker::new(&self.work);
        let (events, end) = match self.next() {
            Step::Stream { events, end } => (events, end),
            Step::Fail { after, error } => {
                tokio::time::sleep(after).await;
                tracker.finish();
                return Err(error);
            }
            Step::Hang => std::future::pending().await,
            Step::Reply { .. } => (vec![], End::Eof),
        };
        let state = (tracker, VecDeque::from(events), Some(end));
        Ok(Box::pin(futures_util::stream::unfold(
            state,
            |(mut tracker, mut events, mut end)| async move {
                if let Some((after, ev)) = events.pop_front() {
                    tokio::time::sleep(after).await;
                    let item = match ev {
                        Ev::Chunk(c) => Ok(StreamEvent::Chunk(c.to_string())),
                        Ev::Usage(n) => Ok(StreamEvent::Usage(Usage::known(n))),
                        Ev::ErrorChunk(c, e) => Ok(StreamEvent::Error(c.to_string(), e)),
                    };
                    return Some((item, (tracker, events, end)));
                }
                match end.take()? {
                    End::Eof => {
                        tracker.finish();
                        None
                    }
                    End::Fail(e) => {
                        tracker.finish();
                        Some((Err(e), (tracker, events, None)))
                    }
                    End::Hang => std::future::pending().await,
                }
            },
        )))
    }
}

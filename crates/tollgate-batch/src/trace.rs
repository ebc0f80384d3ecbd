//! The batch runner's traces (SPEC OBS-5): one span per item, the root of
//! its own trace, with a CLIENT span per attempt, exported over OTLP/HTTP
//! by `tollgate-telemetry` exactly as the gateway exports its calls (the
//! same attribute names, plus the item's `tollgate.custom_id`). Off
//! unless an endpoint is set (`OTEL_EXPORTER_OTLP_ENDPOINT`, or
//! [`crate::BatchConfig::telemetry`]); an unreachable collector drops
//! spans, never delays an item.

use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use tollgate::Usage;
use tollgate::lifecycle::{AttemptContext, ProviderError};
use tollgate_openai::provider::Endpoint;
use tollgate_telemetry::semconv as sc;
use tollgate_telemetry::{AttemptSpan, AttemptTarget, CallEnd, CallTrace, Telemetry, TraceHeaders};

use crate::input::Item;

/// `gen_ai.provider.name` of the runner's upstream (an OpenAI-compatible
/// API).
const PROVIDER_NAME: &str = "openai";

/// An item's trace, shared by its attempts.
#[derive(Clone)]
pub(crate) struct ItemTrace(Arc<Traced>);

struct Traced {
    call: CallTrace,
    target: AttemptTarget,
    /// What the last answered attempt reported, for the item's span.
    usage: Mutex<Option<Usage>>,
}

impl std::fmt::Debug for ItemTrace {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.call.fmt(f)
    }
}

impl ItemTrace {
    /// The trace of `item` sent to `base_url`, or `None` when tracing is
    /// off.
    pub(crate) fn start(telemetry: &Telemetry, item: &Item, base_url: &str) -> Option<Self> {
        let (operation, route) = match item.endpoint {
            Endpoint::Embeddings => (sc::OP_EMBEDDINGS, "embeddings"),
            _ => (sc::OP_CHAT, "chat"),
        };
        let call = telemetry.item(&item.custom_id, operation, route, SystemTime::now())?;
        call.requested(&item.model);
        Some(ItemTrace(Arc::new(Traced {
            call,
            target: AttemptTarget::new(PROVIDER_NAME, base_url, &item.model, None),
            usage: Mutex::new(None),
        })))
    }

    /// The span of attempt `attempt` and the headers it adds to the
    /// request: its `traceparent`.
    pub(crate) fn attempt(&self, attempt: &AttemptContext) -> (Attempt, TraceHeaders) {
        let left = attempt.deadline.remaining(tollgate::clock::Instant::now());
        let span = self.0.call.attempt(&self.0.target, attempt.attempt, left);
        let headers = span.headers();
        (
            Attempt {
                span,
                item: Arc::clone(&self.0),
            },
            headers,
        )
    }

    /// Ends the item's span with what its output line says.
    pub(crate) fn finish(self, mut end: CallEnd<'_>) {
        if end.usage.is_none() {
            end.usage = *self.0.usage.lock().unwrap_or_else(|p| p.into_inner());
        }
        self.0.call.finish(&end);
    }
}

/// One attempt's span; dropped without an outcome it ends as
/// `cancelled`.
pub(crate) struct Attempt {
    span: AttemptSpan,
    item: Arc<Traced>,
}

impl Attempt {
    /// The attempt's outcome.
    pub(crate) fn end<T>(mut self, result: &Result<T, ProviderError>, usage: Option<Usage>) {
        match result {
            Ok(_) => {
                *self.item.usage.lock().unwrap_or_else(|p| p.into_inner()) = usage;
                self.span.succeed(usage);
            }
            Err(e) => self.span.failed(e),
        }
    }
}

/// An item's trace until its line is recorded: dropped before (the run
/// stopped, the item runs again on resume) it ends its span as
/// `not_recorded`.
pub(crate) struct Unfinished(Option<ItemTrace>);

impl Unfinished {
    pub(crate) fn new(trace: Option<ItemTrace>) -> Self {
        Unfinished(trace)
    }

    /// A handle for the item's attempts.
    pub(crate) fn get(&self) -> Option<ItemTrace> {
        self.0.clone()
    }

    /// The trace, to end with the recorded line.
    pub(crate) fn take(&mut self) -> Option<ItemTrace> {
        self.0.take()
    }
}

impl Drop for Unfinished {
    fn drop(&mut self) {
        if let Some(t) = self.0.take() {
            t.finish(CallEnd {
                error: Some("not_recorded"),
                ..CallEnd::default()
            });
        }
    }
}

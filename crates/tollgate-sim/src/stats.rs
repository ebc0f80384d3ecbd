//! Counters of `GET /stats` (SIM-4) and the snapshot type both the route and
//! [`crate::Simulator::stats`] return.

use serde::{Deserialize, Serialize};

use crate::anthropic::limits::{MessagesCause, MessagesLimits};
use crate::referee::{Referee, RejectCause};

/// A point-in-time copy of the simulator's counters.
///
/// Everything counts from start or the last reset, except `active` (requests
/// running now). To prove that a client never exceeded its quota, check that
/// `rejected_429` is all zero against a limited simulator, or compare
/// `max_requests_in_window` / `max_tokens_in_window` with the client's
/// configured limits against an unlimited one (both maxima are tracked either
/// way).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct SimStats {
    /// API requests received (chat completions, embeddings, responses, the
    /// Azure routes and Anthropic messages), whatever their outcome.
    pub requests_total: u64,
    /// Successful (200) responses started.
    pub ok: u64,
    /// 429 responses, by the limit that refused them (each counted once).
    pub rejected_429: RejectedStats,
    /// 401 responses (missing or wrong key).
    pub unauthorized: u64,
    /// 400 responses (bad JSON, missing model, …).
    pub bad_request: u64,
    /// Injected faults, by kind.
    pub faults: FaultStats,
    /// Admitted requests whose client went away before the response was
    /// complete (the handler or the body stream was dropped early).
    pub client_disconnects: u64,
    /// Requests holding a concurrency slot now.
    pub active: u64,
    /// The most requests ever in progress at once.
    pub max_active: u64,
    /// Requests charged to the window (admitted client requests).
    pub requests_charged: u64,
    /// Tokens charged to the window for admitted client requests, by the
    /// charge mode (after reconciliation when it is on).
    pub tokens_charged: u64,
    /// The most requests ever inside one window, at the counting instants
    /// (client requests, charged refusals and the background consumer).
    pub max_requests_in_window: u64,
    /// The most tokens ever inside one window, at the counting instants
    /// (client charges, charged refusals and the background consumer).
    pub max_tokens_in_window: u64,
    /// Request units spent by the background consumer.
    #[serde(default)]
    pub background_requests: u64,
    /// Tokens spent by the background consumer.
    #[serde(default)]
    pub background_tokens: u64,
    /// Background consumer ticks skipped because the windows had no room.
    #[serde(default)]
    pub background_skipped: u64,
    /// Refused (429) requests that were charged a request unit
    /// (`charge_refusals` = `requests` or `all`).
    #[serde(default)]
    pub refusal_requests_charged: u64,
    /// Tokens charged for refused requests (`charge_refusals` = `all`).
    #[serde(default)]
    pub refusal_tokens_charged: u64,
    /// Admitted requests whose token charge was replaced by their usage
    /// (`reconcile`).
    #[serde(default)]
    pub reconciled: u64,
    /// `POST /v1/messages` requests admitted by the Anthropic buckets.
    #[serde(default)]
    pub messages_charged: u64,
    /// Input tokens taken by admitted `POST /v1/messages` requests (ITPM).
    #[serde(default)]
    pub input_tokens_charged: u64,
    /// Output tokens taken by admitted `POST /v1/messages` requests (OTPM),
    /// after the unused allowance was given back.
    #[serde(default)]
    pub output_tokens_charged: u64,
    /// Output allowance (`max_tokens` minus the tokens generated) given back
    /// to the OTPM bucket when responses ended.
    #[serde(default)]
    pub output_tokens_refunded: u64,
    /// What the requests served would cost at the list prices of the
    /// repository's price file, in pico-dollars (10^-12 dollars; exact):
    /// every admitted request, prompt and whole completion, not refusals
    /// or injected 5xx ([`crate::prices`]).
    #[serde(default)]
    pub cost_charged_pico_usd: u128,
    /// Admitted requests billed at a list price.
    #[serde(default)]
    pub priced_requests: u64,
    /// Admitted requests of a model without a price (not in the cost).
    #[serde(default)]
    pub unpriced_requests: u64,
    /// Requests per route.
    pub routes: RouteStats,
    /// The limits in force (`null` = unlimited).
    pub limits: LimitStats,
}

/// 429 responses by cause.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct RejectedStats {
    /// Request window full.
    pub rpm: u64,
    /// Token window full.
    pub tpm: u64,
    /// One request larger than the whole token limit.
    pub too_large: u64,
    /// Concurrency cap reached.
    pub concurrency: u64,
    /// `POST /v1/messages`: the Anthropic request bucket was empty.
    #[serde(default)]
    pub anthropic_rpm: u64,
    /// `POST /v1/messages`: the input-token bucket (ITPM) lacked room.
    #[serde(default)]
    pub itpm: u64,
    /// `POST /v1/messages`: the output-token bucket (OTPM) lacked room for
    /// `max_tokens`.
    #[serde(default)]
    pub otpm: u64,
}

impl RejectedStats {
    /// All 429s.
    pub fn total(&self) -> u64 {
        self.rpm
            + self.tpm
            + self.too_large
            + self.concurrency
            + self.anthropic_rpm
            + self.itpm
            + self.otpm
    }
}

/// Injected faults by kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct FaultStats {
    /// 500/503 answers (not charged).
    pub server_error: u64,
    /// Streams cut mid-way by the simulator.
    pub disconnect: u64,
    /// Responses whose headers were held back.
    pub slow_headers: u64,
}

/// Requests per route.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct RouteStats {
    /// `POST /v1/chat/completions`.
    pub chat_completions: u64,
    /// `POST /v1/embeddings`.
    pub embeddings: u64,
    /// `GET /v1/models`.
    pub models: u64,
    /// Any unknown path (and an Azure path without `api-version`).
    pub not_found: u64,
    /// `POST /v1/responses`.
    #[serde(default)]
    pub responses: u64,
    /// `POST /openai/deployments/{deployment}/chat/completions`.
    #[serde(default)]
    pub azure_chat_completions: u64,
    /// `POST /openai/deployments/{deployment}/embeddings`.
    #[serde(default)]
    pub azure_embeddings: u64,
    /// `POST /v1/messages`.
    #[serde(default)]
    pub messages: u64,
}

/// The configured limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct LimitStats {
    /// Requests per window.
    pub rpm: Option<u64>,
    /// Tokens per window.
    pub tpm: Option<u64>,
    /// Concurrent requests.
    pub max_concurrency: Option<u64>,
    /// Window length in milliseconds (also the replenishment period of the
    /// Anthropic buckets).
    pub window_ms: u64,
    /// `POST /v1/messages` requests per window.
    #[serde(default)]
    pub anthropic_rpm: Option<u64>,
    /// `POST /v1/messages` input tokens per window.
    #[serde(default)]
    pub itpm: Option<u64>,
    /// `POST /v1/messages` output tokens per window.
    #[serde(default)]
    pub otpm: Option<u64>,
}

/// The counters that are not derived from the referee.
#[derive(Debug, Clone, Default)]
pub(crate) struct Counters {
    pub(crate) requests_total: u64,
    pub(crate) ok: u64,
    pub(crate) rejected: RejectedStats,
    pub(crate) unauthorized: u64,
    pub(crate) bad_request: u64,
    pub(crate) faults: FaultStats,
    pub(crate) client_disconnects: u64,
    pub(crate) routes: RouteStats,
    pub(crate) cost_pico: u128,
    pub(crate) priced: u64,
    pub(crate) unpriced: u64,
}

impl Counters {
    /// An admitted request billed `bill` pico-dollars (`None`: no price).
    pub(crate) fn bill(&mut self, bill: Option<u128>) {
        match bill {
            Some(b) => {
                self.cost_pico = self.cost_pico.saturating_add(b);
                self.priced += 1;
            }
            None => self.unpriced += 1,
        }
    }

    pub(crate) fn count_rejection(&mut self, cause: RejectCause) {
        let slot = match cause {
            RejectCause::Requests => &mut self.rejected.rpm,
            RejectCause::Tokens => &mut self.rejected.tpm,
            RejectCause::TooLarge => &mut self.rejected.too_large,
            RejectCause::Concurrency => &mut self.rejected.concurrency,
        };
        *slot += 1;
    }

    pub(crate) fn count_messages_rejection(&mut self, cause: MessagesCause) {
        let slot = match cause {
            MessagesCause::Requests => &mut self.rejected.anthropic_rpm,
            MessagesCause::InputTokens => &mut self.rejected.itpm,
            MessagesCause::OutputTokens => &mut self.rejected.otpm,
            MessagesCause::TooLarge => &mut self.rejected.too_large,
            MessagesCause::Concurrency => &mut self.rejected.concurrency,
        };
        *slot += 1;
    }

    pub(crate) fn snapshot(&self, referee: &Referee, messages: &MessagesLimits) -> SimStats {
        let limits = referee.limits();
        let anthropic = messages.config();
        SimStats {
            requests_total: self.requests_total,
            ok: self.ok,
            rejected_429: self.rejected,
            unauthorized: self.unauthorized,
            bad_request: self.bad_request,
            faults: self.faults,
            client_disconnects: self.client_disconnects,
            active: referee.active(),
            max_active: referee.max_active(),
            requests_charged: referee.charged_requests(),
            tokens_charged: referee.charged_tokens(),
            max_requests_in_window: referee.max_requests_in_window(),
            max_tokens_in_window: referee.max_tokens_in_window(),
            background_requests: referee.background().requests,
            background_tokens: referee.background().tokens,
            background_skipped: referee.background().skipped,
            refusal_requests_charged: referee.refused_requests_charged(),
            refusal_tokens_charged: referee.refused_tokens_charged(),
            reconciled: referee.reconciled(),
            messages_charged: messages.charged_requests(),
            input_tokens_charged: messages.input_charged(),
            output_tokens_charged: messages.output_charged(),
            output_tokens_refunded: messages.output_refunded(),
            cost_charged_pico_usd: self.cost_pico,
            priced_requests: self.priced,
            unpriced_requests: self.unpriced,
            routes: self.routes,
            limits: LimitStats {
                rpm: limits.requests,
                tpm: limits.tokens,
                max_concurrency: limits.concurrency,
                window_ms: u64::try_from(limits.window.as_millis()).unwrap_or(u64::MAX),
                anthropic_rpm: anthropic.requests,
                itpm: anthropic.input_tokens,
                otpm: anthropic.output_tokens,
            },
        }
    }
}

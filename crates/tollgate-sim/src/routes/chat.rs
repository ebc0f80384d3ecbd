//! `POST /v1/chat/completions` (and, through [`complete`], the Azure
//! deployment route).
//!
//! Order of work for every request: count it and take its sequence number →
//! key check (401) → parse and validate (400) → count tokens → draw the fault
//! plan → ingress delay (if configured) → admission at the counting instant
//! in one critical section (429, injected 5xx, or charge) → slow-headers
//! fault → latency → answer.

use axum::Json;
use axum::response::{IntoResponse, Response};

use super::{Call, FINGERPRINT, bad_request, parse_json, require_model, unix_now};
use crate::accounting::ChargeMode;
use crate::faults::FaultPlan;
use crate::headers::add_rate_headers;
use crate::script::Pacing;
use crate::state::Charge;
use crate::stream::{StreamPlan, event_stream_response, sse_body};
use crate::tokens::{chat_prompt_tokens, completion_tokens, content_chars};
use crate::wire::{
    ApiError, AssistantMessage, ChatCompletion, ChatRequest, Choice, StreamOptions, Usage,
};

/// The generated text, one word per completion token.
const WORDS: [&str; 12] = [
    " the", " gate", " lets", " each", " token", " through", " at", " its", " own", " pace",
    " and", " counts",
];

/// The text of completion token `i` (the first one has no leading space).
pub(crate) fn token_text(i: u64) -> &'static str {
    let word = WORDS
        .get((i % WORDS.len() as u64) as usize)
        .copied()
        .unwrap_or(" ");
    if i == 0 { word.trim_start() } else { word }
}

/// A validated chat request, with its token counts.
struct Plan {
    model: String,
    stream: bool,
    include_usage: bool,
    usage: Usage,
    finish_reason: &'static str,
    /// Characters of the message contents (character-based charge modes).
    chars: u64,
    /// `max_completion_tokens` or `max_tokens`, when set.
    requested: Option<u64>,
}

/// `count_chars`: whether the charge mode needs the characters of the
/// message contents (not counted otherwise: the default path stays cheap).
fn validate(
    request: ChatRequest,
    configured_completion: u32,
    count_chars: bool,
) -> Result<Plan, ApiError> {
    let model = require_model(request.model)?;
    let messages = match request.messages {
        Some(m) if !m.is_empty() => m,
        Some(_) => {
            return Err(ApiError::invalid(
                "`messages` must contain at least one message.",
                Some("messages"),
            ));
        }
        None => {
            return Err(ApiError::invalid(
                "Missing required parameter: `messages`.",
                Some("messages"),
            ));
        }
    };
    if let Some(n) = request.n
        && n != 1
    {
        return Err(ApiError::invalid(
            "The simulator supports only n = 1.",
            Some("n"),
        ));
    }
    let (requested, param) = match (request.max_completion_tokens, request.max_tokens) {
        (Some(m), _) => (Some(m), "max_completion_tokens"),
        (None, m) => (m, "max_tokens"),
    };
    if requested == Some(0) {
        return Err(ApiError::invalid(
            format!("`{param}` must be at least 1."),
            Some(param),
        ));
    }
    let prompt_tokens = chat_prompt_tokens(messages.iter().map(|m| m.content.as_ref()));
    let chars = if count_chars {
        messages
            .iter()
            .filter_map(|m| m.content.as_ref())
            .map(content_chars)
            .fold(0u64, u64::saturating_add)
    } else {
        0
    };
    let completion = completion_tokens(requested, configured_completion);
    let finish_reason = if requested.is_some_and(|r| r < u64::from(configured_completion)) {
        "length"
    } else {
        "stop"
    };
    let stream = request.stream.unwrap_or(false);
    let include_usage = stream
        && matches!(
            request.stream_options,
            Some(StreamOptions {
                include_usage: Some(true)
            })
        );
    Ok(Plan {
        model,
        stream,
        include_usage,
        usage: Usage {
            prompt_tokens,
            completion_tokens: completion,
            total_tokens: prompt_tokens.saturating_add(completion),
        },
        finish_reason,
        chars,
        requested,
    })
}

/// The Azure operation name of chat completions (in Azure's 429 message).
pub(super) const AZURE_OPERATION: &str = "ChatCompletions_Create";

/// Everything after the key check of `call`: shared by the OpenAI route
/// and the Azure deployment route (whose deployment name is the model, and
/// whose 429s are Azure's).
pub(super) async fn complete(call: Call<'_>, body: &[u8]) -> Response {
    let Call { shared, seq, .. } = call;
    let plan = match parse_json::<ChatRequest>(body).and_then(|mut r| {
        r.model = call.dialect.model(r.model);
        let count_chars = shared.config.charge != ChargeMode::Usage;
        validate(r, shared.config.completion_tokens, count_chars)
    }) {
        Ok(plan) => plan,
        Err(e) => return bad_request(shared, e),
    };
    let events = if plan.stream {
        StreamPlan::event_count(plan.usage.completion_tokens, plan.include_usage)
    } else {
        0
    };
    let faults = FaultPlan::draw(&shared.config, seq, events);
    let charge = Charge {
        tokens: shared.config.charge.chat(
            plan.chars,
            plan.requested,
            plan.usage.total_tokens,
            u64::from(shared.config.completion_tokens),
        ),
        usage: plan.usage.total_tokens,
        bill: crate::state::bill(
            &plan.model,
            plan.usage.prompt_tokens,
            plan.usage.completion_tokens,
        ),
    };
    call.ingress().await;
    let (mut guard, state) = match call.admit(charge, &faults, AZURE_OPERATION) {
        Ok(admitted) => admitted,
        Err(response) => return *response,
    };
    let config = &shared.config;
    if faults.slow_headers {
        shared.count(|c| c.faults.slow_headers += 1);
        tokio::time::sleep(config.slow_headers_delay).await;
    }
    let id = format!("chatcmpl-sim-{seq}");
    let created = unix_now();

    let mut response = if plan.stream {
        let stream = StreamPlan {
            id,
            model: plan.model,
            created,
            usage: plan.usage,
            finish_reason: plan.finish_reason,
            include_usage: plan.include_usage,
            ttft: config.ttft,
            per_token: config.per_token,
            disconnect_after: faults.disconnect_after,
        };
        shared.count(|c| c.ok += 1);
        event_stream_response(sse_body(stream, guard))
    } else {
        Pacing::of(config)
            .one_shot(plan.usage.completion_tokens)
            .await;
        let content: String = (0..plan.usage.completion_tokens).map(token_text).collect();
        let completion = ChatCompletion {
            id: &id,
            object: "chat.completion",
            created,
            model: &plan.model,
            system_fingerprint: FINGERPRINT,
            choices: [Choice {
                index: 0,
                message: AssistantMessage {
                    role: "assistant",
                    content: &content,
                    refusal: None,
                },
                logprobs: None,
                finish_reason: plan.finish_reason,
            }],
            usage: plan.usage,
        };
        let response = Json(&completion).into_response();
        guard.finish(|c| c.ok += 1);
        response
    };
    add_rate_headers(response.headers_mut(), &state, seq);
    response
}

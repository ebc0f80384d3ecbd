//! `POST /v1/messages`: Anthropic's Messages API.
//!
//! Order of work: count it and take its sequence number → `x-api-key` check
//! when a key is configured (401 `authentication_error`) →
//! `anthropic-version` header (400) → parse and validate (400
//! `invalid_request_error`, `max_tokens` required) → count input tokens →
//! draw the fault plan → ingress delay → admission on the Anthropic buckets
//! and the account's concurrency cap in one critical section (429
//! `rate_limit_error`, injected 500/529, or taken) → slow-headers fault →
//! latency → answer. Every answer after the key check carries the
//! `anthropic-ratelimit-*` headers of the limited buckets.

use std::sync::Arc;

use axum::Json;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use serde_json::Value;

use super::bad_request;
use super::chat::token_text;
use crate::anthropic::headers::{add_rate_headers, rejection_response, server_error_response};
use crate::anthropic::stream::MessagesScript;
use crate::anthropic::wire::{AnthropicError, Message, MessagesRequest, MessagesUsage, TextBlock};
use crate::faults::FaultPlan;
use crate::script::{EventScript, Pacing, script_response};
use crate::state::{MessagesAdmission, MessagesDemand, Route, Shared};
use crate::tokens::{completion_tokens, messages_input_tokens};

/// A validated Messages request.
struct Plan {
    model: String,
    stream: bool,
    demand: MessagesDemand,
    stop_reason: &'static str,
}

/// Whether `content` is a string or an array of content blocks (objects
/// with a string `type`).
fn is_content(content: &Value) -> bool {
    match content {
        Value::String(_) => true,
        Value::Array(blocks) => blocks
            .iter()
            .all(|b| b.get("type").is_some_and(Value::is_string)),
        _ => false,
    }
}

fn validate(request: MessagesRequest, configured: u32) -> Result<Plan, AnthropicError> {
    let model = match request.model {
        Some(m) if !m.trim().is_empty() => m,
        _ => return Err(AnthropicError::invalid("model: Field required")),
    };
    let max_tokens = match request.max_tokens {
        None => return Err(AnthropicError::invalid("max_tokens: Field required")),
        Some(0) => {
            return Err(AnthropicError::invalid(
                "max_tokens: Input should be greater than or equal to 1",
            ));
        }
        Some(m) => m,
    };
    let messages = match request.messages {
        None => return Err(AnthropicError::invalid("messages: Field required")),
        Some(m) if m.is_empty() => {
            return Err(AnthropicError::invalid(
                "messages: at least one message is required",
            ));
        }
        Some(m) => m,
    };
    for (i, message) in messages.iter().enumerate() {
        if !matches!(message.role.as_deref(), Some("user" | "assistant")) {
            return Err(AnthropicError::invalid(format!(
                "messages.{i}.role: Input should be 'user' or 'assistant'"
            )));
        }
        if !message.content.as_ref().is_some_and(is_content) {
            return Err(AnthropicError::invalid(format!(
                "messages.{i}.content: Input should be a string or a list of content blocks"
            )));
        }
    }
    if let Some(system) = &request.system
        && !is_content(system)
    {
        return Err(AnthropicError::invalid(
            "system: Input should be a string or a list of text blocks",
        ));
    }
    let input = messages_input_tokens(
        request.system.as_ref(),
        messages.iter().map(|m| m.content.as_ref()),
    );
    let generated = completion_tokens(Some(max_tokens), configured);
    let bill = crate::state::bill(&model, input, generated);
    Ok(Plan {
        model,
        stream: request.stream.unwrap_or(false),
        demand: MessagesDemand {
            input,
            max_tokens,
            generated,
            bill,
        },
        // Cut by the request's allowance, or the simulator's natural end.
        stop_reason: if max_tokens < u64::from(configured) {
            "max_tokens"
        } else {
            "end_turn"
        },
    })
}

/// Checks `x-api-key` when a key is configured; counts the 401.
fn authorize(shared: &Shared, headers: &HeaderMap) -> Result<(), AnthropicError> {
    let Some(key) = &shared.config.anthropic_key else {
        return Ok(());
    };
    let given = headers.get("x-api-key").and_then(|v| v.to_str().ok());
    if given == Some(key.as_str()) {
        return Ok(());
    }
    shared.count(|c| c.unauthorized += 1);
    Err(AnthropicError {
        status: StatusCode::UNAUTHORIZED,
        kind: "authentication_error",
        message: if given.is_some() {
            "invalid x-api-key".to_owned()
        } else {
            "x-api-key header is required".to_owned()
        },
    })
}

fn parse(body: &[u8], configured: u32) -> Result<Plan, AnthropicError> {
    let request: MessagesRequest = serde_json::from_slice(body)
        .map_err(|e| AnthropicError::invalid(format!("The request body is not valid JSON: {e}")))?;
    validate(request, configured)
}

pub(super) async fn messages(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let received = tokio::time::Instant::now();
    let seq = shared.begin(Route::Messages);
    if let Err(e) = authorize(&shared, &headers) {
        return e.into_response();
    }
    let plan = if headers.get("anthropic-version").is_none() {
        Err(AnthropicError::invalid(
            "anthropic-version: header is required",
        ))
    } else {
        parse(&body, shared.config.completion_tokens)
    };
    let plan = match plan {
        Ok(plan) => plan,
        Err(e) => return bad_request(&shared, e),
    };
    let events = if plan.stream {
        MessagesScript::event_count(plan.demand.generated)
    } else {
        0
    };
    let faults = FaultPlan::draw(&shared.config, seq, events);
    shared.ingress(seq, received).await;
    let (mut guard, state) = match shared.admit_messages(plan.demand, &faults) {
        MessagesAdmission::Admitted { guard, state } => (guard, state),
        MessagesAdmission::Rejected(rejection) => {
            return rejection_response(&rejection, &plan.demand, seq);
        }
        MessagesAdmission::ServerError { status, state } => {
            return server_error_response(status, &state, seq);
        }
    };
    let config = &shared.config;
    if faults.slow_headers {
        shared.count(|c| c.faults.slow_headers += 1);
        tokio::time::sleep(config.slow_headers_delay).await;
    }
    let id = format!("msg_sim_{seq}");
    let usage = MessagesUsage {
        input_tokens: plan.demand.input,
        output_tokens: plan.demand.generated,
    };
    let mut response = if plan.stream {
        shared.count(|c| c.ok += 1);
        let script = MessagesScript {
            id,
            model: plan.model,
            usage,
            stop_reason: plan.stop_reason,
        };
        script_response(script, Pacing::of(config), guard, faults.disconnect_after)
    } else {
        Pacing::of(config).one_shot(usage.output_tokens).await;
        let text: String = (0..usage.output_tokens).map(token_text).collect();
        let message = Message {
            id: &id,
            kind: "message",
            role: "assistant",
            model: &plan.model,
            content: vec![TextBlock {
                kind: "text",
                text: &text,
            }],
            stop_reason: Some(plan.stop_reason),
            stop_sequence: None,
            usage,
        };
        let response = Json(&message).into_response();
        guard.finish(|c| c.ok += 1);
        response
    };
    add_rate_headers(response.headers_mut(), &state, seq);
    response
}

//! `POST /v1/responses`: OpenAI's Responses API, under the same bearer key,
//! limits (RPM, TPM, concurrency, charge mode, reconciliation), faults and
//! latency model as chat completions, with OpenAI-format errors.
//!
//! Order of work: count it and take its sequence number → key check (401) →
//! parse and validate (400) → count tokens → draw the fault plan → ingress
//! delay → admission (429, injected 5xx, or charge) → slow-headers fault →
//! latency → answer.

use axum::Json;
use axum::response::{IntoResponse, Response};
use serde_json::Value;

use super::chat::token_text;
use super::{Call, bad_request, parse_json, require_model, unix_now};
use crate::faults::FaultPlan;
use crate::headers::add_rate_headers;
use crate::responses::stream::ResponsesScript;
use crate::responses::wire::{ResponseDoc, ResponsesRequest, ResponsesUsage};
use crate::script::{EventScript, Pacing, script_response};
use crate::state::Charge;
use crate::tokens::{completion_tokens, content_chars, responses_input_tokens};
use crate::wire::ApiError;

/// Roles an input message item may carry.
const ROLES: [&str; 4] = ["user", "assistant", "system", "developer"];

/// A validated Responses request.
struct Plan {
    model: String,
    stream: bool,
    instructions: Option<String>,
    max_output_tokens: Option<u64>,
    usage: ResponsesUsage,
    /// Characters of the instructions and item contents (character-based
    /// charge modes).
    chars: u64,
}

/// The `content` values of the input items: a string input is one item;
/// an array holds objects whose `content` (when present) is a string or an
/// array of parts, and whose `role` (when present) is a known one.
fn input_contents(input: Option<Value>) -> Result<Vec<Value>, ApiError> {
    let bad = |message: &str| ApiError::invalid(message, Some("input"));
    match input {
        None => Err(bad("Missing required parameter: 'input'.")),
        Some(Value::String(s)) => Ok(vec![Value::String(s)]),
        Some(Value::Array(items)) if items.is_empty() => {
            Err(bad("'input' must contain at least one item."))
        }
        Some(Value::Array(items)) => items
            .into_iter()
            .map(|item| {
                let Value::Object(mut item) = item else {
                    return Err(bad("Each item of 'input' must be an object."));
                };
                if let Some(role) = item.get("role")
                    && !role.as_str().is_some_and(|r| ROLES.contains(&r))
                {
                    return Err(bad(
                        "An input message's 'role' must be one of user, assistant, system, developer.",
                    ));
                }
                match item.remove("content") {
                    None => Ok(Value::Null),
                    Some(c @ Value::String(_)) => Ok(c),
                    Some(Value::Array(parts)) if parts.iter().all(Value::is_object) => {
                        Ok(Value::Array(parts))
                    }
                    Some(_) => Err(bad(
                        "An input item's 'content' must be a string or an array of content parts.",
                    )),
                }
            })
            .collect(),
        Some(_) => Err(bad("'input' must be a string or an array of input items.")),
    }
}

fn validate(
    request: ResponsesRequest,
    configured: u32,
    count_chars: bool,
) -> Result<Plan, ApiError> {
    let model = require_model(request.model)?;
    let contents = input_contents(request.input)?;
    if request.max_output_tokens == Some(0) {
        return Err(ApiError::invalid(
            "`max_output_tokens` must be at least 1.",
            Some("max_output_tokens"),
        ));
    }
    let instructions = request.instructions.map(Value::String);
    let input_tokens = responses_input_tokens(instructions.as_ref(), contents.iter().map(Some));
    let chars = if count_chars {
        instructions
            .iter()
            .chain(&contents)
            .map(content_chars)
            .fold(0u64, u64::saturating_add)
    } else {
        0
    };
    let output_tokens = completion_tokens(request.max_output_tokens, configured);
    Ok(Plan {
        model,
        stream: request.stream.unwrap_or(false),
        instructions: instructions.and_then(|v| v.as_str().map(str::to_owned)),
        max_output_tokens: request.max_output_tokens,
        usage: ResponsesUsage {
            input_tokens,
            output_tokens,
        },
        chars,
    })
}

/// Everything after the key check of `call`.
pub(super) async fn respond(call: Call<'_>, body: &[u8]) -> Response {
    let Call { shared, seq, .. } = call;
    let config = &shared.config;
    let count_chars = config.charge != crate::accounting::ChargeMode::Usage;
    let plan = match parse_json::<ResponsesRequest>(body)
        .and_then(|r| validate(r, config.completion_tokens, count_chars))
    {
        Ok(plan) => plan,
        Err(e) => return bad_request(shared, e),
    };
    let events = if plan.stream {
        ResponsesScript::event_count(plan.usage.output_tokens)
    } else {
        0
    };
    let faults = FaultPlan::draw(config, seq, events);
    let usage = plan
        .usage
        .input_tokens
        .saturating_add(plan.usage.output_tokens);
    let charge = Charge {
        tokens: config.charge.chat(
            plan.chars,
            plan.max_output_tokens,
            usage,
            u64::from(config.completion_tokens),
        ),
        usage,
        bill: crate::state::bill(
            &plan.model,
            plan.usage.input_tokens,
            plan.usage.output_tokens,
        ),
    };
    call.ingress().await;
    // No Azure route serves the Responses API: no Azure operation name.
    let (mut guard, state) = match call.admit(charge, &faults, "") {
        Ok(admitted) => admitted,
        Err(response) => return *response,
    };
    if faults.slow_headers {
        shared.count(|c| c.faults.slow_headers += 1);
        tokio::time::sleep(config.slow_headers_delay).await;
    }
    let doc = ResponseDoc {
        id: format!("resp_sim_{seq}"),
        message_id: format!("msg_sim_{seq}"),
        model: plan.model,
        created_at: unix_now(),
        instructions: plan.instructions,
        max_output_tokens: plan.max_output_tokens,
        usage: plan.usage,
        truncated: plan
            .max_output_tokens
            .is_some_and(|m| m < u64::from(config.completion_tokens)),
    };
    let text: String = (0..plan.usage.output_tokens).map(token_text).collect();
    let mut response = if plan.stream {
        shared.count(|c| c.ok += 1);
        let script = ResponsesScript { doc, text };
        script_response(script, Pacing::of(config), guard, faults.disconnect_after)
    } else {
        Pacing::of(config).one_shot(plan.usage.output_tokens).await;
        let response = Json(doc.object(Some(&text))).into_response();
        guard.finish(|c| c.ok += 1);
        response
    };
    add_rate_headers(response.headers_mut(), &state, seq);
    response
}

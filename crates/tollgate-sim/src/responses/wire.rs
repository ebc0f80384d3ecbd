//! Responses API wire types: the request fields the simulator reads and the
//! `response` object (one-shot body, and the `response` of the stream's
//! lifecycle events).

use serde::Deserialize;
use serde_json::{Value, json};

/// The fields of a Responses request the simulator uses; the rest are
/// accepted and ignored.
#[derive(Debug, Deserialize)]
pub(crate) struct ResponsesRequest {
    pub(crate) model: Option<String>,
    /// A string, or an array of input items.
    pub(crate) input: Option<Value>,
    pub(crate) instructions: Option<String>,
    pub(crate) max_output_tokens: Option<u64>,
    pub(crate) stream: Option<bool>,
}

/// `usage` of a response.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ResponsesUsage {
    pub(crate) input_tokens: u64,
    pub(crate) output_tokens: u64,
}

/// Everything a response object says about one request.
#[derive(Debug, Clone)]
pub(crate) struct ResponseDoc {
    pub(crate) id: String,
    pub(crate) message_id: String,
    pub(crate) model: String,
    pub(crate) created_at: u64,
    pub(crate) instructions: Option<String>,
    pub(crate) max_output_tokens: Option<u64>,
    pub(crate) usage: ResponsesUsage,
    /// Whether `max_output_tokens` cut the output (status `incomplete`).
    pub(crate) truncated: bool,
}

impl ResponseDoc {
    /// The terminal status: `completed`, or `incomplete` when
    /// `max_output_tokens` cut the output (as OpenAI reports it).
    pub(crate) fn final_status(&self) -> &'static str {
        if self.truncated {
            "incomplete"
        } else {
            "completed"
        }
    }

    /// The assistant message item, with `text` once it is known.
    pub(crate) fn message(&self, status: &str, text: Option<&str>) -> Value {
        let content: Vec<Value> = text.map(|t| self.part(t)).into_iter().collect();
        json!({
            "type": "message",
            "id": self.message_id,
            "status": status,
            "role": "assistant",
            "content": content,
        })
    }

    /// An `output_text` content part.
    pub(crate) fn part(&self, text: &str) -> Value {
        json!({"type": "output_text", "text": text, "annotations": []})
    }

    /// The response object: `in_progress` without output or usage when
    /// `text` is `None`, else final with its output and usage.
    pub(crate) fn object(&self, text: Option<&str>) -> Value {
        let (status, output, usage, incomplete) = match text {
            None => ("in_progress", Vec::new(), Value::Null, Value::Null),
            Some(text) => (
                self.final_status(),
                vec![self.message(self.final_status(), Some(text))],
                json!({
                    "input_tokens": self.usage.input_tokens,
                    "input_tokens_details": {"cached_tokens": 0},
                    "output_tokens": self.usage.output_tokens,
                    "output_tokens_details": {"reasoning_tokens": 0},
                    "total_tokens": self.usage.input_tokens.saturating_add(self.usage.output_tokens),
                }),
                if self.truncated {
                    json!({"reason": "max_output_tokens"})
                } else {
                    Value::Null
                },
            ),
        };
        json!({
            "id": self.id,
            "object": "response",
            "created_at": self.created_at,
            "status": status,
            "error": null,
            "incomplete_details": incomplete,
            "instructions": self.instructions,
            "max_output_tokens": self.max_output_tokens,
            "model": self.model,
            "output": output,
            "parallel_tool_calls": true,
            "store": false,
            "usage": usage,
        })
    }
}

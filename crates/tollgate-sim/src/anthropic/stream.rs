//! The streamed Messages body: Anthropic's SSE events, each an `event:` line
//! and a `data:` JSON object whose `type` repeats the event name.
//!
//! 1. after `ttft`: `message_start` (the message with empty content, `usage`
//!    with the input tokens and `output_tokens` 1, as Anthropic sends);
//! 2. `content_block_start` (index 0, an empty text block);
//! 3. `ping`;
//! 4. for each output token, after `per_token`: `content_block_delta` with
//!    `{"type":"text_delta","text":...}`;
//! 5. `content_block_stop`;
//! 6. `message_delta` with `stop_reason` and the cumulative
//!    `usage.output_tokens`;
//! 7. `message_stop`.

use bytes::Bytes;
use serde_json::json;

use super::wire::{Message, MessagesUsage};
use crate::routes::chat::token_text;
use crate::script::{EventScript, sse_event};

/// What one Messages stream sends.
pub(crate) struct MessagesScript {
    pub(crate) id: String,
    pub(crate) model: String,
    pub(crate) usage: MessagesUsage,
    pub(crate) stop_reason: &'static str,
}

/// Events before the first delta.
const HEAD: u32 = 3;
/// Events after the last delta.
const TAIL: u32 = 3;

impl EventScript for MessagesScript {
    const HEAD: u32 = HEAD;
    const TAIL: u32 = TAIL;

    fn output_tokens(&self) -> u64 {
        self.usage.output_tokens
    }

    fn event(&self, i: u32) -> Bytes {
        let n = self.deltas();
        match i {
            0 => {
                let message = Message {
                    id: &self.id,
                    kind: "message",
                    role: "assistant",
                    model: &self.model,
                    content: Vec::new(),
                    stop_reason: None,
                    stop_sequence: None,
                    usage: MessagesUsage {
                        input_tokens: self.usage.input_tokens,
                        output_tokens: self.usage.output_tokens.min(1),
                    },
                };
                sse_event(
                    "message_start",
                    &json!({"type": "message_start", "message": message}),
                )
            }
            1 => sse_event(
                "content_block_start",
                &json!({
                    "type": "content_block_start",
                    "index": 0,
                    "content_block": {"type": "text", "text": ""},
                }),
            ),
            2 => sse_event("ping", &json!({"type": "ping"})),
            i if i - HEAD < n => sse_event(
                "content_block_delta",
                &json!({
                    "type": "content_block_delta",
                    "index": 0,
                    "delta": {"type": "text_delta", "text": token_text(u64::from(i - HEAD))},
                }),
            ),
            i if i - HEAD == n => sse_event(
                "content_block_stop",
                &json!({"type": "content_block_stop", "index": 0}),
            ),
            i if i - HEAD == n + 1 => sse_event(
                "message_delta",
                &json!({
                    "type": "message_delta",
                    "delta": {"stop_reason": self.stop_reason, "stop_sequence": null},
                    "usage": {"output_tokens": self.usage.output_tokens},
                }),
            ),
            _ => sse_event("message_stop", &json!({"type": "message_stop"})),
        }
    }
}

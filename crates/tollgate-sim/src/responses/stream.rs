//! The streamed Responses body: typed SSE events, each an `event:` line and
//! a `data:` JSON object with the same `type` and a `sequence_number`.
//!
//! 1. after `ttft`: `response.created` (the response `in_progress`, no
//!    output, `usage: null`);
//! 2. `response.in_progress`;
//! 3. `response.output_item.added` (the message item, `in_progress`);
//! 4. `response.content_part.added` (an empty `output_text` part);
//! 5. for each output token, after `per_token`:
//!    `response.output_text.delta` with `delta`;
//! 6. `response.output_text.done` with the whole `text`;
//! 7. `response.content_part.done`;
//! 8. `response.output_item.done`;
//! 9. `response.completed` — or `response.incomplete` when
//!    `max_output_tokens` cut the output — whose `response` carries `usage`.
//!
//! No `[DONE]` sentinel: the Responses API ends with the terminal event.

use bytes::Bytes;
use serde_json::{Value, json};

use super::wire::ResponseDoc;
use crate::routes::chat::token_text;
use crate::script::{EventScript, sse_event};

/// Events before the first delta.
const HEAD: u32 = 4;
/// Events after the last delta.
const TAIL: u32 = 4;

/// What one Responses stream sends.
pub(crate) struct ResponsesScript {
    pub(crate) doc: ResponseDoc,
    /// The whole output text.
    pub(crate) text: String,
}

impl ResponsesScript {
    fn emit(&self, i: u32, kind: &str, mut data: Value) -> Bytes {
        data["type"] = json!(kind);
        data["sequence_number"] = json!(i);
        sse_event(kind, &data)
    }
}

impl EventScript for ResponsesScript {
    const HEAD: u32 = HEAD;
    const TAIL: u32 = TAIL;

    fn output_tokens(&self) -> u64 {
        self.doc.usage.output_tokens
    }

    fn event(&self, i: u32) -> Bytes {
        let doc = &self.doc;
        let n = self.deltas();
        let at = json!({"item_id": doc.message_id, "output_index": 0, "content_index": 0});
        let with = |mut base: Value, key: &str, value: Value| {
            base[key] = value;
            base
        };
        match i {
            0 => self.emit(i, "response.created", json!({"response": doc.object(None)})),
            1 => self.emit(
                i,
                "response.in_progress",
                json!({"response": doc.object(None)}),
            ),
            2 => self.emit(
                i,
                "response.output_item.added",
                json!({"output_index": 0, "item": doc.message("in_progress", None)}),
            ),
            3 => self.emit(
                i,
                "response.content_part.added",
                with(at, "part", doc.part("")),
            ),
            i if i - HEAD < n => self.emit(
                i,
                "response.output_text.delta",
                with(at, "delta", json!(token_text(u64::from(i - HEAD)))),
            ),
            i if i - HEAD == n => self.emit(
                i,
                "response.output_text.done",
                with(at, "text", json!(self.text)),
            ),
            i if i - HEAD == n + 1 => self.emit(
                i,
                "response.content_part.done",
                with(at, "part", doc.part(&self.text)),
            ),
            i if i - HEAD == n + 2 => self.emit(
                i,
                "response.output_item.done",
                json!({
                    "output_index": 0,
                    "item": doc.message(doc.final_status(), Some(&self.text)),
                }),
            ),
            _ => {
                let kind = if doc.truncated {
                    "response.incomplete"
                } else {
                    "response.completed"
                };
                self.emit(i, kind, json!({"response": doc.object(Some(&self.text))}))
            }
        }
    }
}

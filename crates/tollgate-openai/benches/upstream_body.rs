//! What building the upstream body of a chat request costs (SPEC GW-5,
//! GW-17): the client's text with `model`, the output cap and (for a
//! stream) `stream_options` set in place (`edited`, what the gateway does),
//! against a clone of the parsed request serialised again (`copy`, the
//! fallback), for an SDK's small request and a 1 MiB prompt.
//!
//!   cargo bench -p tollgate-openai --bench upstream_body

use std::hint::black_box;

use bytes::Bytes;
use criterion::{Criterion, criterion_group, criterion_main};
use serde_json::json;
use tollgate_openai::UpstreamRequest;
use tollgate_openai::wire::{CapField, ChatCompletionRequest};

/// A chat body without an output cap whose messages hold about `bytes`
/// of text in all.
fn body(bytes: usize, stream: bool) -> Bytes {
    let text = "Requests without max_tokens are capped upstream. ".repeat(bytes / 50 + 1);
    let mut body = json!({
        "model": "gpt-4o",
        "messages": [
            {"role": "system", "content": "You are terse."},
            {"role": "user", "content": text},
        ],
        "temperature": 0.2,
    });
    if stream {
        body["stream"] = json!(true);
    }
    Bytes::from(body.to_string())
}

fn bench(c: &mut Criterion) {
    let cap = Some((1024, CapField::MaxCompletionTokens));
    for (name, bytes, stream) in [
        ("small", 300, false),
        ("small_stream", 300, true),
        ("1mib", 1 << 20, false),
    ] {
        let body = body(bytes, stream);
        let request: ChatCompletionRequest = serde_json::from_slice(&body).expect("a request");
        let mut group = c.benchmark_group(format!("upstream_body/{name}"));
        group.bench_function("edited", |b| {
            b.iter(|| UpstreamRequest::chat_from(&request, &body, black_box("gpt-4o-prod"), cap))
        });
        group.bench_function("copy", |b| {
            b.iter(|| {
                let mut copy = request.clone();
                copy.cap_output(1024, CapField::MaxCompletionTokens);
                UpstreamRequest::chat(&copy, black_box("gpt-4o-prod"))
            })
        });
        group.finish();
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);

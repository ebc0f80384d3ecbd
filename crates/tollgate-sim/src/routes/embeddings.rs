//! `POST /v1/embeddings` (and, through [`embed`], the Azure deployment
//! route).
//!
//! Inputs: a string, an array of strings, an array of token ids, or an array
//! of token-id arrays. Charged tokens: text tokens of each string, or the
//! number of ids. Vectors are deterministic (seeded by a hash of the input)
//! and of unit length; `encoding_format: "base64"` returns little-endian
//! `f32`s in base64, as the official SDKs request by default. Latency: `ttft`
//! before the body. Faults: 5xx and slow headers (no stream to cut).

use axum::Json;
use axum::response::{IntoResponse, Response};
use serde_json::Value;

use super::{Call, bad_request, parse_json, require_model};
use crate::faults::FaultPlan;
use crate::headers::add_rate_headers;
use crate::state::Charge;
use crate::tokens::text_tokens;
use crate::wire::{
    ApiError, Embedding, EmbeddingList, EmbeddingUsage, EmbeddingVector, EmbeddingsRequest,
};

/// Most inputs per request (OpenAI's limit).
const MAX_INPUTS: usize = 2048;
/// Largest `dimensions` accepted.
const MAX_DIMENSIONS: u32 = 8192;

/// One input item: its token count and the seed of its vector.
struct Item {
    tokens: u64,
    seed: u64,
    /// Characters of a string input; `None` for a token-id input.
    chars: Option<u64>,
}

fn fnv1a(bytes: impl IntoIterator<Item = u8>) -> u64 {
    bytes.into_iter().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

fn token_ids(values: &[Value]) -> Option<Item> {
    let ids: Option<Vec<u64>> = values.iter().map(Value::as_u64).collect();
    let ids = ids?;
    Some(Item {
        tokens: ids.len() as u64,
        seed: fnv1a(ids.iter().flat_map(|id| id.to_le_bytes())),
        chars: None,
    })
}

fn text(s: &str) -> Item {
    Item {
        tokens: text_tokens(s),
        seed: fnv1a(s.bytes()),
        chars: Some(s.chars().count() as u64),
    }
}

fn parse_input(input: Option<Value>) -> Result<Vec<Item>, ApiError> {
    let bad = || {
        ApiError::invalid(
            "`input` must be a non-empty string, array of strings, array of token ids \
             or array of token-id arrays.",
            Some("input"),
        )
    };
    let items = match input {
        Some(Value::String(s)) if !s.is_empty() => vec![text(&s)],
        Some(Value::Array(values)) if !values.is_empty() => {
            if values.iter().all(Value::is_number) {
                vec![token_ids(&values).ok_or_else(bad)?]
            } else {
                values
                    .iter()
                    .map(|v| match v {
                        Value::String(s) if !s.is_empty() => Some(text(s)),
                        Value::Array(ids) if !ids.is_empty() => token_ids(ids),
                        _ => None,
                    })
                    .collect::<Option<Vec<_>>>()
                    .ok_or_else(bad)?
            }
        }
        _ => return Err(bad()),
    };
    if items.len() > MAX_INPUTS {
        return Err(ApiError::invalid(
            format!("At most {MAX_INPUTS} inputs per request."),
            Some("input"),
        ));
    }
    Ok(items)
}

/// A deterministic unit vector of `dim` components for `seed`.
fn vector(seed: u64, dim: u32) -> Vec<f32> {
    let mut rng = fastrand::Rng::with_seed(seed);
    let mut v: Vec<f32> = (0..dim).map(|_| rng.f32() * 2.0 - 1.0).collect();
    let norm = v.iter().map(|x| x * x).sum::<f32>().sqrt();
    if norm > 0.0 {
        v.iter_mut().for_each(|x| *x /= norm);
    }
    v
}

/// Standard base64 (with padding) of `bytes`.
fn base64(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    // `i & 63` is always a valid index into the 64-symbol alphabet.
    let sym = |i: u32| char::from(ALPHABET[(i & 63) as usize]);
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let b = [
            chunk.first().copied().unwrap_or(0),
            chunk.get(1).copied().unwrap_or(0),
            chunk.get(2).copied().unwrap_or(0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        out.push(sym(n >> 18));
        out.push(sym(n >> 12));
        out.push(if chunk.len() > 1 { sym(n >> 6) } else { '=' });
        out.push(if chunk.len() > 2 { sym(n) } else { '=' });
    }
    out
}

struct Plan {
    model: String,
    items: Vec<Item>,
    dim: u32,
    base64: bool,
    tokens: u64,
}

fn validate(request: EmbeddingsRequest, default_dim: u32) -> Result<Plan, ApiError> {
    let model = require_model(request.model)?;
    let items = parse_input(request.input)?;
    let base64 = match request.encoding_format.as_deref() {
        None | Some("float") => false,
        Some("base64") => true,
        Some(_) => {
            return Err(ApiError::invalid(
                "`encoding_format` must be \"float\" or \"base64\".",
                Some("encoding_format"),
            ));
        }
    };
    let dim = match request.dimensions {
        None => default_dim,
        Some(d) if (1..=MAX_DIMENSIONS).contains(&d) => d,
        Some(_) => {
            return Err(ApiError::invalid(
                format!("`dimensions` must be between 1 and {MAX_DIMENSIONS}."),
                Some("dimensions"),
            ));
        }
    };
    let tokens = items.iter().map(|i| i.tokens).sum();
    Ok(Plan {
        model,
        items,
        dim,
        base64,
        tokens,
    })
}

/// The Azure operation name of embeddings (in Azure's 429 message).
pub(super) const AZURE_OPERATION: &str = "Embeddings_Create";

/// Everything after the key check of `call`: shared by the OpenAI route
/// and the Azure deployment route.
pub(super) async fn embed(call: Call<'_>, body: &[u8]) -> Response {
    let Call { shared, seq, .. } = call;
    let plan = match parse_json::<EmbeddingsRequest>(body).and_then(|mut r| {
        r.model = call.dialect.model(r.model);
        validate(r, shared.config.embedding_dim)
    }) {
        Ok(plan) => plan,
        Err(e) => return bad_request(shared, e),
    };
    let faults = FaultPlan::draw(&shared.config, seq, 0);
    let (chars, ids) = plan
        .items
        .iter()
        .fold((0u64, 0u64), |(c, i), item| match item.chars {
            Some(n) => (c.saturating_add(n), i),
            None => (c, i.saturating_add(item.tokens)),
        });
    let charge = Charge {
        tokens: shared.config.charge.embeddings(chars, ids, plan.tokens),
        usage: plan.tokens,
        bill: crate::state::bill(&plan.model, plan.tokens, 0),
    };
    call.ingress().await;
    let (mut guard, state) = match call.admit(charge, &faults, AZURE_OPERATION) {
        Ok(admitted) => admitted,
        Err(response) => return *response,
    };
    if faults.slow_headers {
        shared.count(|c| c.faults.slow_headers += 1);
        tokio::time::sleep(shared.config.slow_headers_delay).await;
    }
    if !shared.config.ttft.is_zero() {
        tokio::time::sleep(shared.config.ttft).await;
    }
    let data = plan
        .items
        .iter()
        .enumerate()
        .map(|(index, item)| {
            let v = vector(item.seed, plan.dim);
            let embedding = if plan.base64 {
                let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
                EmbeddingVector::Base64(base64(&bytes))
            } else {
                EmbeddingVector::Float(v)
            };
            Embedding {
                object: "embedding",
                index,
                embedding,
            }
        })
        .collect();
    let list = EmbeddingList {
        object: "list",
        data,
        model: &plan.model,
        usage: EmbeddingUsage {
            prompt_tokens: plan.tokens,
            total_tokens: plan.tokens,
        },
    };
    let mut response = Json(&list).into_response();
    guard.finish(|c| c.ok += 1);
    add_rate_headers(response.headers_mut(), &state, seq);
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_matches_known_vectors() {
        assert_eq!(base64(b""), "");
        assert_eq!(base64(b"f"), "Zg==");
        assert_eq!(base64(b"fo"), "Zm8=");
        assert_eq!(base64(b"foo"), "Zm9v");
        assert_eq!(base64(b"foobar"), "Zm9vYmFy");
    }

    #[test]
    fn vectors_are_deterministic_unit_vectors() {
        let a = vector(1, 16);
        assert_eq!(a, vector(1, 16));
        assert_ne!(a, vector(2, 16));
        let norm: f32 = a.iter().map(|x| x * x).sum();
        assert!((norm - 1.0).abs() < 1e-4);
    }

    #[test]
    fn inputs_of_every_shape_are_counted() {
        let count = |v: Value| {
            parse_input(Some(v))
                .map(|items| items.iter().map(|i| i.tokens).collect::<Vec<_>>())
                .map_err(|e| e.param)
        };
        use serde_json::json;
        assert_eq!(count(json!("abcdefgh")), Ok(vec![2]));
        assert_eq!(count(json!(["abcd", "abcde"])), Ok(vec![1, 2]));
        assert_eq!(count(json!([1, 2, 3])), Ok(vec![3]));
        assert_eq!(count(json!([[1, 2], [3]])), Ok(vec![2, 1]));
        for bad in [json!(""), json!([]), json!([""]), json!([1.5]), json!(7)] {
            assert_eq!(count(bad), Err(Some("input")));
        }
    }
}

//! Embeddings: request and response.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::usage::Usage;

/// `POST /v1/embeddings` request body.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EmbeddingsRequest {
    /// Model name.
    pub model: String,
    /// What to embed.
    pub input: EmbeddingInput,
    /// `float` or `base64`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub encoding_format: Option<String>,
    /// Requested vector size.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dimensions: Option<u64>,
    /// Every other field (`user`, …), kept verbatim.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

impl EmbeddingsRequest {
    /// A request with only `model` and `input`.
    pub fn new(model: impl Into<String>, input: EmbeddingInput) -> Self {
        EmbeddingsRequest {
            model: model.into(),
            input,
            encoding_format: None,
            dimensions: None,
            extra: Map::new(),
        }
    }
}

/// The `input` of an embeddings request, in each of its four shapes.
///
/// An empty array reads as `Texts(vec![])`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum EmbeddingInput {
    /// `"input": "text"`.
    Text(String),
    /// `"input": ["a", "b"]`.
    Texts(Vec<String>),
    /// `"input": [1, 2, 3]`: one pre-tokenised input.
    Tokens(Vec<u32>),
    /// `"input": [[1, 2], [3]]`: several pre-tokenised inputs.
    TokenBatches(Vec<Vec<u32>>),
}

impl EmbeddingInput {
    /// Number of inputs (vectors the response will hold).
    pub fn len(&self) -> usize {
        match self {
            EmbeddingInput::Text(_) | EmbeddingInput::Tokens(_) => 1,
            EmbeddingInput::Texts(v) => v.len(),
            EmbeddingInput::TokenBatches(v) => v.len(),
        }
    }

    /// `true` when there is no input at all.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Embeddings response body.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct EmbeddingsResponse {
    /// `"list"`.
    #[serde(default)]
    pub object: String,
    /// One entry per input.
    #[serde(default)]
    pub data: Vec<Embedding>,
    /// Model that answered.
    #[serde(default)]
    pub model: String,
    /// Token usage (`prompt_tokens`, `total_tokens`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
    /// Every other field, kept verbatim.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

/// One embedding vector of a response.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Embedding {
    /// `"embedding"`.
    #[serde(default)]
    pub object: String,
    /// Index of the input this vector belongs to.
    #[serde(default)]
    pub index: u32,
    /// The vector.
    pub embedding: EmbeddingVector,
    /// Every other field, kept verbatim.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

/// A vector as floats or as base64 (`encoding_format: "base64"`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum EmbeddingVector {
    /// Float components (kept as `f64` so that they print back unchanged).
    Float(Vec<f64>),
    /// Little-endian `f32` components, base64-encoded.
    Base64(String),
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn input_shapes() {
        let cases = [
            (json!("hello"), EmbeddingInput::Text("hello".into()), 1),
            (
                json!(["a", "b"]),
                EmbeddingInput::Texts(vec!["a".into(), "b".into()]),
                2,
            ),
            (json!([1, 2, 3]), EmbeddingInput::Tokens(vec![1, 2, 3]), 1),
            (
                json!([[1, 2], [3]]),
                EmbeddingInput::TokenBatches(vec![vec![1, 2], vec![3]]),
                2,
            ),
            (json!([]), EmbeddingInput::Texts(vec![]), 0),
        ];
        for (raw, expected, len) in cases {
            let input: EmbeddingInput = serde_json::from_value(raw.clone()).expect("input");
            assert_eq!(input, expected);
            assert_eq!(input.len(), len);
            assert_eq!(serde_json::to_value(&input).expect("serialize"), raw);
        }
        for bad in [json!(5), json!(["a", 1]), json!([-1]), json!({"text": "a"})] {
            assert!(serde_json::from_value::<EmbeddingInput>(bad).is_err());
        }
    }

    #[test]
    fn request_and_response_round_trip_unknown_fields() {
        let raw = json!({"model": "text-embedding-3-small", "input": ["a"], "dimensions": 256,
                         "user": "u1", "x-future": {"k": [1]}});
        let req: EmbeddingsRequest = serde_json::from_value(raw.clone()).expect("request");
        assert_eq!(req.dimensions, Some(256));
        assert_eq!(serde_json::to_value(&req).expect("serialize"), raw);

        let raw = json!({
            "object": "list",
            "data": [
                {"object": "embedding", "index": 0, "embedding": [0.1, -0.25, 3.0e-5]},
                {"object": "embedding", "index": 1, "embedding": "AACAPw==", "x": 1}
            ],
            "model": "text-embedding-3-small",
            "usage": {"prompt_tokens": 2, "total_tokens": 2},
            "x-future": true
        });
        let resp: EmbeddingsResponse = serde_json::from_value(raw.clone()).expect("response");
        assert!(matches!(resp.data[1].embedding, EmbeddingVector::Base64(_)));
        assert_eq!(resp.usage.as_ref().and_then(Usage::known_total), Some(2));
        assert_eq!(serde_json::to_value(&resp).expect("serialize"), raw);
    }
}

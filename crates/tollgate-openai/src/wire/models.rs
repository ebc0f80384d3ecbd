//! `GET /v1/models`.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// The models list body: `{"object": "list", "data": [...]}`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ModelList {
    /// `"list"`.
    #[serde(default)]
    pub object: String,
    /// The models.
    #[serde(default)]
    pub data: Vec<Model>,
    /// Every other field, kept verbatim.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

impl ModelList {
    /// A list of `models` with `object: "list"`.
    pub fn new(models: Vec<Model>) -> Self {
        ModelList {
            object: "list".to_owned(),
            data: models,
            extra: Map::new(),
        }
    }
}

/// One model entry.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Model {
    /// Model name, as clients send it in `model`.
    pub id: String,
    /// `"model"`.
    #[serde(default)]
    pub object: String,
    /// Unix seconds.
    #[serde(default)]
    pub created: u64,
    /// Owner label.
    #[serde(default)]
    pub owned_by: String,
    /// Every other field, kept verbatim.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

impl Model {
    /// A model entry with `object: "model"`.
    pub fn new(id: impl Into<String>, owned_by: impl Into<String>, created: u64) -> Self {
        Model {
            id: id.into(),
            object: "model".to_owned(),
            created,
            owned_by: owned_by.into(),
            extra: Map::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn models_list_round_trip() {
        let raw = json!({"object": "list", "data": [
            {"id": "gpt-4o", "object": "model", "created": 1, "owned_by": "system", "x": [1]}
        ], "has_more": false});
        let list: ModelList = serde_json::from_value(raw.clone()).expect("list");
        assert_eq!(list.data[0].id, "gpt-4o");
        assert_eq!(serde_json::to_value(&list).expect("serialize"), raw);

        let built = ModelList::new(vec![Model::new("m", "tollgate", 2)]);
        assert_eq!(
            serde_json::to_value(&built).expect("serialize"),
            json!({"object": "list", "data": [
                {"id": "m", "object": "model", "created": 2, "owned_by": "tollgate"}]})
        );
    }
}

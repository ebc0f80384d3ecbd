//! The `usage` object and the classification of its counters (SPEC Q-6).

use serde::{Deserialize, Deserializer, Serialize};
use serde_json::{Map, Value};

/// The `usage` object of a response or of the final stream chunk.
///
/// The counters are kept exactly as the provider wrote them: `None` means the
/// key was absent, `Some(Value::Null)` means an explicit `null`, anything else
/// is the raw value, valid or not. Use [`Usage::total`], [`Usage::prompt`],
/// [`Usage::completion`] and [`Usage::cached`] for the classified view and
/// [`Usage::known_total`] for the SPEC Q-6 charge.
///
/// Provider spellings other than OpenAI's chat names (`input_tokens`,
/// `output_tokens`, `input_tokens_details`, `cache_read_input_tokens`, …) stay
/// in [`Usage::extra`] and are consulted as fallbacks by the accessors.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Usage {
    /// Raw `prompt_tokens` (input tokens).
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "present"
    )]
    pub prompt_tokens: Option<Value>,
    /// Raw `completion_tokens` (output tokens, reasoning included).
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "present"
    )]
    pub completion_tokens: Option<Value>,
    /// Raw `total_tokens`.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "present"
    )]
    pub total_tokens: Option<Value>,
    /// Raw `prompt_tokens_details` (holds `cached_tokens`).
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "present"
    )]
    pub prompt_tokens_details: Option<Value>,
    /// Every other field, kept verbatim.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

/// Deserializes a field that is present in the input into `Some`, including
/// an explicit `null` (`Some(Value::Null)`). Absent fields get the `default`.
fn present<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Option<Value>, D::Error> {
    Value::deserialize(deserializer).map(Some)
}

/// One usage counter, classified.
///
/// Valid values are non-negative integers written as a JSON integer, as an
/// integral float (`12.0`) or as a string of ASCII digits (`"12"`). Negative
/// or fractional numbers, booleans, explicit `null`, other strings, arrays and
/// objects are [`Counter::Invalid`]. (The raw field on [`Usage`] still tells an
/// explicit `null` apart when a caller needs that.)
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Counter {
    /// The provider did not report the counter.
    Absent,
    /// The provider reported something that is not a valid count.
    Invalid,
    /// A valid count.
    Value(u64),
}

impl Counter {
    /// Classifies one raw JSON value (the key is known to be present).
    pub fn classify(value: &Value) -> Counter {
        match value {
            Value::Number(n) => {
                if let Some(v) = n.as_u64() {
                    Counter::Value(v)
                } else if n.is_i64() {
                    // Representable as i64 but not as u64: negative.
                    Counter::Invalid
                } else {
                    match n.as_f64() {
                        Some(f) => classify_float(f),
                        None => Counter::Invalid,
                    }
                }
            }
            Value::String(s) => {
                if !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()) {
                    s.parse::<u64>().map_or(Counter::Invalid, Counter::Value)
                } else {
                    Counter::Invalid
                }
            }
            Value::Null | Value::Bool(_) | Value::Array(_) | Value::Object(_) => Counter::Invalid,
        }
    }

    /// Classifies an optional raw value: `None` is [`Counter::Absent`].
    pub fn from_raw(value: Option<&Value>) -> Counter {
        value.map_or(Counter::Absent, Counter::classify)
    }

    /// The count, if valid.
    pub fn value(self) -> Option<u64> {
        match self {
            Counter::Value(v) => Some(v),
            Counter::Absent | Counter::Invalid => None,
        }
    }

    /// `true` for [`Counter::Value`].
    pub fn is_valid(self) -> bool {
        matches!(self, Counter::Value(_))
    }
}

/// 2^64 as an `f64`: the first float that no longer fits in a `u64`.
const TWO_POW_64: f64 = 18_446_744_073_709_551_616.0;

fn classify_float(f: f64) -> Counter {
    if f.is_finite() && f >= 0.0 && f.fract() == 0.0 && f < TWO_POW_64 {
        // In range and integral, so the conversion is exact.
        Counter::Value(f as u64)
    } else {
        Counter::Invalid
    }
}

/// The four classified counters of a [`Usage`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct UsageCounters {
    /// `total_tokens`.
    pub total: Counter,
    /// `prompt_tokens`, else `input_tokens`.
    pub prompt: Counter,
    /// `completion_tokens`, else `output_tokens`.
    pub completion: Counter,
    /// Cached input tokens (telemetry only, never a charge: SPEC Q-6).
    pub cached: Counter,
}

impl Usage {
    /// Usage with valid `prompt_tokens`, `completion_tokens` and their sum as
    /// `total_tokens` (what the simulator reports).
    pub fn from_counts(prompt: u64, completion: u64) -> Usage {
        Usage {
            prompt_tokens: Some(Value::from(prompt)),
            completion_tokens: Some(Value::from(completion)),
            total_tokens: Some(Value::from(prompt.saturating_add(completion))),
            prompt_tokens_details: None,
            extra: Map::new(),
        }
    }

    /// Embeddings usage: `prompt_tokens` and `total_tokens` both `prompt`.
    pub fn from_prompt(prompt: u64) -> Usage {
        Usage {
            prompt_tokens: Some(Value::from(prompt)),
            completion_tokens: None,
            total_tokens: Some(Value::from(prompt)),
            prompt_tokens_details: None,
            extra: Map::new(),
        }
    }

    /// Sets `prompt_tokens_details.cached_tokens`, keeping other details.
    pub fn with_cached(mut self, cached: u64) -> Usage {
        match &mut self.prompt_tokens_details {
            Some(Value::Object(details)) => {
                details.insert("cached_tokens".to_owned(), Value::from(cached));
            }
            other => {
                let mut details = Map::new();
                details.insert("cached_tokens".to_owned(), Value::from(cached));
                *other = Some(Value::Object(details));
            }
        }
        self
    }

    /// `total_tokens`, classified.
    pub fn total(&self) -> Counter {
        first_reported(&[self.total_tokens.as_ref()])
    }

    /// `prompt_tokens`, falling back to `input_tokens` when `prompt_tokens` is
    /// absent or `null`.
    pub fn prompt(&self) -> Counter {
        first_reported(&[self.prompt_tokens.as_ref(), self.extra.get("input_tokens")])
    }

    /// `completion_tokens`, falling back to `output_tokens` when
    /// `completion_tokens` is absent or `null`.
    pub fn completion(&self) -> Counter {
        first_reported(&[
            self.completion_tokens.as_ref(),
            self.extra.get("output_tokens"),
        ])
    }

    /// Cached input tokens: `prompt_tokens_details.cached_tokens`, else
    /// `input_tokens_details.cached_tokens`, else `cache_read_input_tokens`
    /// (each consulted only when the previous is absent or `null`).
    pub fn cached(&self) -> Counter {
        first_reported(&[
            self.prompt_tokens_details
                .as_ref()
                .and_then(|d| d.get("cached_tokens")),
            self.extra
                .get("input_tokens_details")
                .and_then(|d| d.get("cached_tokens")),
            self.extra.get("cache_read_input_tokens"),
        ])
    }

    /// All four counters.
    pub fn counters(&self) -> UsageCounters {
        UsageCounters {
            total: self.total(),
            prompt: self.prompt(),
            completion: self.completion(),
            cached: self.cached(),
        }
    }

    /// The tokens to charge per SPEC Q-6, or `None` when usage is unknown
    /// (the quota layer then keeps the estimate, Q-5).
    ///
    /// This is `self.to_engine().total()`: the Q-6 rules themselves live in
    /// the engine ([`tollgate::Usage::from_counters`]); see
    /// [`Usage::to_engine`] for how the raw counters are handed over.
    ///
    /// `Some(0)` is "known zero", which differs from `None` ("unknown").
    pub fn known_total(&self) -> Option<u64> {
        self.to_engine().total()
    }

    /// The engine's view of this usage (SPEC ).
    ///
    /// The four counters are classified as by [`Usage::counters`] and passed
    /// to [`tollgate::Usage::from_counters`], with one adjustment: an
    /// explicit `"total_tokens": null` counts as an absent total (the
    /// provider did not compute one), so the charge falls back to prompt +
    /// completion. Any other invalid total makes the usage unknown, since the
    /// provider's own sum is broken and its components are not trusted over
    /// it. Cached tokens are carried as telemetry, never charged.
    pub fn to_engine(&self) -> tollgate::Usage {
        let total = match &self.total_tokens {
            Some(Value::Null) => Counter::Absent,
            _ => self.total(),
        };
        tollgate::Usage::from_counters(
            total.into(),
            self.prompt().into(),
            self.completion().into(),
            self.cached().into(),
        )
        .with_parts(self.parts())
    }

    /// The tokens by how they are priced (SPEC BUD-2), from OpenAI's
    /// nesting: `prompt_tokens` (or `input_tokens`) includes the cached
    /// and the audio input of `prompt_tokens_details` (or
    /// `input_tokens_details`), `completion_tokens` (or `output_tokens`)
    /// the reasoning and audio output of `completion_tokens_details` (or
    /// `output_tokens_details`). `None` when the input and output are not
    /// both known (one absent counts as zero next to a valid other), when
    /// a detail is present but not a valid count, or when the details add
    /// up to more than their parent: the cost is then unknown and the
    /// reservation stays.
    pub fn parts(&self) -> Option<tollgate::Parts> {
        let (input, output) = match (self.prompt(), self.completion()) {
            (Counter::Value(i), Counter::Value(o)) => (i, o),
            (Counter::Value(i), Counter::Absent) => (i, 0),
            (Counter::Absent, Counter::Value(o)) => (0, o),
            _ => return None,
        };
        let input_details = first_present(&[
            self.prompt_tokens_details.as_ref(),
            self.extra.get("input_tokens_details"),
        ]);
        let output_details = first_present(&[
            self.extra.get("completion_tokens_details"),
            self.extra.get("output_tokens_details"),
        ]);
        let cached = detail(input_details, "cached_tokens")?;
        let input_audio = detail(input_details, "audio_tokens")?;
        let reasoning = detail(output_details, "reasoning_tokens")?;
        let output_audio = detail(output_details, "audio_tokens")?;
        let plain_input = input.checked_sub(cached)?.checked_sub(input_audio)?;
        let plain_output = output.checked_sub(reasoning)?.checked_sub(output_audio)?;
        Some(tollgate::Parts {
            input: plain_input,
            cached_input: cached,
            input_audio,
            output: plain_output,
            reasoning,
            output_audio,
            ..tollgate::Parts::default()
        })
    }
}

impl From<Counter> for tollgate::Counter {
    fn from(counter: Counter) -> Self {
        match counter {
            Counter::Absent => tollgate::Counter::Absent,
            Counter::Invalid => tollgate::Counter::Invalid,
            Counter::Value(v) => tollgate::Counter::Value(v),
        }
    }
}

impl From<&Usage> for tollgate::Usage {
    fn from(usage: &Usage) -> Self {
        usage.to_engine()
    }
}

/// The first of `sources` that is present and not `null`.
fn first_present<'a>(sources: &[Option<&'a Value>]) -> Option<&'a Value> {
    sources.iter().flatten().copied().find(|v| !v.is_null())
}

/// A count inside a details object: zero when the object or the key is
/// absent or `null`, `None` when it is not a valid count (or the details
/// are not an object).
fn detail(details: Option<&Value>, key: &str) -> Option<u64> {
    let Some(details) = details else {
        return Some(0);
    };
    let object = details.as_object()?;
    match object.get(key) {
        None | Some(Value::Null) => Some(0),
        Some(v) => Counter::classify(v).value(),
    }
}

/// Classifies the first source that is present and not `null`. When every
/// source is absent or `null`, the result is `Absent` if all were absent and
/// `Invalid` if at least one was an explicit `null`.
fn first_reported(sources: &[Option<&Value>]) -> Counter {
    let mut saw_null = false;
    for source in sources.iter().flatten() {
        if source.is_null() {
            saw_null = true;
        } else {
            return Counter::classify(source);
        }
    }
    if saw_null {
        Counter::Invalid
    } else {
        Counter::Absent
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn usage(v: Value) -> Usage {
        serde_json::from_value(v).expect("usage")
    }

    // proves: Q-6
    #[test]
    fn counter_classification_table() {
        let table: &[(Value, Counter)] = &[
            (json!(0), Counter::Value(0)),
            (json!(12), Counter::Value(12)),
            (json!(u64::MAX), Counter::Value(u64::MAX)),
            (json!(12.0), Counter::Value(12)),
            (json!(-0.0), Counter::Value(0)),
            (json!("12"), Counter::Value(12)),
            (json!("0"), Counter::Value(0)),
            (json!(-1), Counter::Invalid),
            (json!(-1.0), Counter::Invalid),
            (json!(1.5), Counter::Invalid),
            (json!(1e300), Counter::Invalid),
            (json!(true), Counter::Invalid),
            (json!(false), Counter::Invalid),
            (Value::Null, Counter::Invalid),
            (json!(""), Counter::Invalid),
            (json!("-3"), Counter::Invalid),
            (json!("+3"), Counter::Invalid),
            (json!(" 3"), Counter::Invalid),
            (json!("3.0"), Counter::Invalid),
            (json!("abc"), Counter::Invalid),
            (json!("99999999999999999999999"), Counter::Invalid),
            (json!([1]), Counter::Invalid),
            (json!({"n": 1}), Counter::Invalid),
        ];
        for (raw, expected) in table {
            assert_eq!(Counter::classify(raw), *expected, "{raw}");
        }
        assert_eq!(Counter::from_raw(None), Counter::Absent);
    }

    // proves: Q-6
    #[test]
    fn absent_null_and_valid_are_distinguished_in_the_raw_fields() {
        let u = usage(json!({"prompt_tokens": 5, "total_tokens": null}));
        assert_eq!(u.prompt_tokens, Some(json!(5)));
        assert_eq!(u.total_tokens, Some(Value::Null));
        assert_eq!(u.completion_tokens, None);
        assert_eq!(u.total(), Counter::Invalid);
        assert_eq!(u.completion(), Counter::Absent);
        // The explicit null survives a round trip.
        let back = serde_json::to_value(&u).expect("serialize");
        assert_eq!(back, json!({"prompt_tokens": 5, "total_tokens": null}));
    }

    // proves: Q-6
    #[test]
    fn known_total_follows_q6() {
        let cases: &[(Value, Option<u64>)] = &[
            (json!({"total_tokens": 30, "prompt_tokens": 1}), Some(30)),
            (json!({"total_tokens": "30"}), Some(30)),
            (json!({"total_tokens": 0}), Some(0)),
            (
                json!({"prompt_tokens": 10, "completion_tokens": 5}),
                Some(15),
            ),
            (json!({"prompt_tokens": 10}), Some(10)),
            (
                json!({"total_tokens": null, "completion_tokens": 7}),
                Some(7),
            ),
            (json!({"total_tokens": -1, "prompt_tokens": 10}), None),
            (json!({"total_tokens": 1.5}), None),
            (json!({"prompt_tokens": 10, "completion_tokens": "x"}), None),
            (json!({"prompt_tokens": null, "completion_tokens": 3}), None),
            (json!({}), None),
            (json!({"prompt_tokens_details": {"cached_tokens": 9}}), None),
            (json!({"input_tokens": 4, "output_tokens": 6}), Some(10)),
            (
                json!({"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}),
                Some(0),
            ),
        ];
        for (raw, expected) in cases {
            assert_eq!(usage(raw.clone()).known_total(), *expected, "{raw}");
        }
    }

    // proves: Q-6
    #[test]
    fn cached_is_telemetry_with_fallbacks() {
        let u = usage(json!({
            "prompt_tokens": 100, "completion_tokens": 10, "total_tokens": 110,
            "prompt_tokens_details": {"cached_tokens": 64}
        }));
        assert_eq!(u.cached(), Counter::Value(64));
        assert_eq!(u.known_total(), Some(110));

        let u = usage(json!({"prompt_tokens_details": {"cached_tokens": null},
                             "cache_read_input_tokens": 8}));
        assert_eq!(u.cached(), Counter::Value(8));
        let u = usage(json!({"input_tokens_details": {"cached_tokens": 0}}));
        assert_eq!(u.cached(), Counter::Value(0));
        let u = usage(json!({"prompt_tokens_details": {"cached_tokens": null}}));
        assert_eq!(u.cached(), Counter::Invalid);
        let u = usage(json!({"prompt_tokens_details": {"cached_tokens": -2},
                             "cache_read_input_tokens": 8}));
        assert_eq!(u.cached(), Counter::Invalid);
        assert_eq!(usage(json!({})).cached(), Counter::Absent);
    }

    #[test]
    fn constructors() {
        let u = Usage::from_counts(7, 3).with_cached(2);
        assert_eq!(
            u.counters(),
            UsageCounters {
                total: Counter::Value(10),
                prompt: Counter::Value(7),
                completion: Counter::Value(3),
                cached: Counter::Value(2),
            }
        );
        let u = Usage::from_prompt(4);
        assert_eq!(u.known_total(), Some(4));
        assert_eq!(u.completion(), Counter::Absent);
    }

    // proves: Q-6 (the engine's rules decide the charge; cached tokens are
    // telemetry), Q-5 (unknown and known zero stay apart)
    #[test]
    fn engine_view_carries_components_and_cached() {
        let u = usage(json!({"prompt_tokens": 7, "completion_tokens": 3,
                             "prompt_tokens_details": {"cached_tokens": 5}}));
        let engine = u.to_engine();
        assert_eq!(engine.total(), Some(10));
        assert_eq!((engine.input(), engine.output()), (Some(7), Some(3)));
        assert_eq!(engine.cached(), Some(5));
        assert_eq!(tollgate::Usage::from(&u), engine);
        assert_eq!(usage(json!({})).to_engine(), tollgate::Usage::UNKNOWN);
        assert_eq!(
            usage(json!({"total_tokens": 0})).to_engine().total(),
            Some(0)
        );
        assert_eq!(
            tollgate::Counter::from(Counter::Invalid),
            tollgate::Counter::Invalid
        );
    }

    #[test]
    fn unknown_usage_fields_round_trip() {
        let raw = json!({
            "prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7,
            "completion_tokens_details": {"reasoning_tokens": 2},
            "vendor_cost": {"usd": 0.01}
        });
        let u = usage(raw.clone());
        assert!(u.extra.contains_key("vendor_cost"));
        assert_eq!(serde_json::to_value(&u).expect("serialize"), raw);
    }
}

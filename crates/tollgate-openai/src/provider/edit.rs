//! The client's body with a few top-level members set, as text: what goes
//! upstream when the gateway renames the model, adds an output cap or asks
//! a stream for its usage. The rest of the body is copied as it came, so a
//! large prompt costs a scan and a copy, not a clone of the parsed request
//! and its serialisation (SPEC GW-17).

use super::members::top_level;

/// A member to set: its key and its value's JSON text.
pub(super) type Member<'a> = (&'static str, &'a [u8]);

/// `body` with each of `set` replacing the top-level member of its key, or
/// added at the end when there is none; every other byte as it came.
/// `None` when the body is not plain enough to edit as text (an escape in
/// a top-level key, deep nesting: see [`top_level`]) or holds one of the
/// keys twice: the caller then serialises a copy of the parsed request.
pub(super) fn with_members(body: &[u8], set: &[Member<'_>]) -> Option<Vec<u8>> {
    let top = top_level(body)?;
    let mut at: Vec<Option<std::ops::Range<usize>>> = vec![None; set.len()];
    for (key, value) in &top.members {
        if let Some(k) = set.iter().position(|(name, _)| name.as_bytes() == *key)
            && at.get_mut(k)?.replace(value.clone()).is_some()
        {
            return None;
        }
    }
    let added: usize = set.iter().map(|(k, v)| k.len() + v.len() + 4).sum();
    let mut out = Vec::with_capacity(body.len() + added);
    let mut replaced: Vec<(std::ops::Range<usize>, &[u8])> = at
        .iter()
        .zip(set)
        .filter_map(|(range, (_, value))| Some((range.clone()?, *value)))
        .collect();
    replaced.sort_unstable_by_key(|(range, _)| range.start);
    let mut from = 0;
    for (range, value) in replaced {
        out.extend_from_slice(body.get(from..range.start)?);
        out.extend_from_slice(value);
        from = range.end;
    }
    out.extend_from_slice(body.get(from..top.close)?);
    let mut first = top.members.is_empty();
    for (range, (key, value)) in at.iter().zip(set) {
        if range.is_none() {
            if !first {
                out.push(b',');
            }
            first = false;
            out.push(b'"');
            out.extend_from_slice(key.as_bytes());
            out.extend_from_slice(b"\":");
            out.extend_from_slice(value);
        }
    }
    out.extend_from_slice(body.get(top.close..)?);
    Some(out)
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use super::with_members;

    fn edit(body: &str, set: &[(&'static str, &str)]) -> Option<String> {
        let set: Vec<_> = set.iter().map(|(k, v)| (*k, v.as_bytes())).collect();
        with_members(body.as_bytes(), &set).map(|b| String::from_utf8(b).unwrap())
    }

    // proves: GW-5, GW-17 (members are replaced where they are and added
    // at the end, every other byte kept as sent: spacing, order, escapes
    // and numbers serde_json would rewrite)
    #[test]
    fn sets_members_and_keeps_the_rest_as_sent() {
        let body = "{ \"model\" : \"a\", \"messages\":[{\"content\":\"\\u00e9 \\\"q\\\"\"}],\n \"seed\": 1.50e3 }";
        let out = edit(body, &[("model", "\"b\""), ("max_tokens", "16")]).unwrap();
        assert_eq!(
            out,
            "{ \"model\" : \"b\", \"messages\":[{\"content\":\"\\u00e9 \\\"q\\\"\"}],\n \"seed\": 1.50e3 ,\"max_tokens\":16}"
        );
        let v: Value = serde_json::from_str(&out).unwrap();
        assert_eq!(v["max_tokens"], 16);
        assert_eq!(
            edit("{}", &[("a", "1"), ("b", "null")]).unwrap(),
            "{\"a\":1,\"b\":null}"
        );
        assert_eq!(edit(" { } ", &[("a", "[]")]).unwrap(), " { \"a\":[]} ");
        assert_eq!(
            edit(
                r#"{"stream_options":null,"x":{"model":"nested"}}"#,
                &[
                    ("stream_options", r#"{"include_usage":true}"#),
                    ("model", "\"m\"")
                ]
            )
            .unwrap(),
            r#"{"stream_options":{"include_usage":true},"x":{"model":"nested"},"model":"m"}"#
        );
        assert_eq!(edit(r#"{"a":1}"#, &[]).unwrap(), r#"{"a":1}"#);
        let v: Value = serde_json::from_str(
            &edit(r#"{"z":true,"model":"a"}"#, &[("model", "\"b\"")]).unwrap(),
        )
        .unwrap();
        assert_eq!(v, json!({"z": true, "model": "b"}));
    }

    // proves: GW-5 (what cannot be edited as text is left to a copy of the
    // parsed request: an escaped top-level key, a key set twice, anything
    // but a plain object)
    #[test]
    fn leaves_the_unusual_to_the_parsed_copy() {
        for body in [
            r#"{"mod\u0065l":"a"}"#,
            r#"{"model":"a","model":"b"}"#,
            r#"["model"]"#,
            r#"{"model":"a"} x"#,
            r#"{"model":"a",}"#,
            "",
        ] {
            assert_eq!(edit(body, &[("model", "\"b\"")]), None, "{body}");
        }
        // Another key twice is not this edit's concern.
        assert!(edit(r#"{"a":1,"a":2}"#, &[("model", "\"b\"")]).is_some());
    }
}

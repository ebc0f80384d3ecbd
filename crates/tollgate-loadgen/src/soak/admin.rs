//! The gateway's `/admin/snapshot` and what it must show once the load is
//! over: nothing queued or active, and (after the windows refilled) every
//! quota and pool fully available.

use serde_json::{Value, json};

/// The two controllers of the snapshot.
const SIDES: [&str; 2] = ["upstream", "tenants"];

fn num(v: &Value) -> Option<f64> {
    v.as_f64()
}

/// What is still queued or active (empty when idle).
pub fn busy(snapshot: &Value) -> Vec<String> {
    let mut problems = Vec::new();
    for side in SIDES {
        let s = &snapshot[side];
        if s.is_null() {
            problems.push(format!("{side}: missing from the snapshot"));
            continue;
        }
        if num(&s["active"]) != Some(0.0) {
            problems.push(format!("{side}: active = {}", s["active"]));
        }
        for scope in s["scopes"].as_array().into_iter().flatten() {
            for field in ["queued", "waiting_for_slot", "pending"] {
                if let Some(n) = num(&scope[field])
                    && n != 0.0
                {
                    problems.push(format!("{side} scope {}: {field} = {n}", scope["name"]));
                }
            }
        }
        for pool in s["pools"].as_array().into_iter().flatten() {
            if num(&pool["waiting"]) != Some(0.0) {
                problems.push(format!(
                    "{side} pool {}: waiting = {}",
                    pool["name"], pool["waiting"]
                ));
            }
            if num(&pool["available"]) != num(&pool["limit"]) {
                problems.push(format!(
                    "{side} pool {}: available {} of {}",
                    pool["name"], pool["available"], pool["limit"]
                ));
            }
        }
    }
    problems
}

/// What is not fully available (empty when every unit is back).
pub fn not_full(snapshot: &Value) -> Vec<String> {
    let mut problems = busy(snapshot);
    for side in SIDES {
        for scope in snapshot[side]["scopes"].as_array().into_iter().flatten() {
            for limit in scope["limits"].as_array().into_iter().flatten() {
                if num(&limit["available"]) != num(&limit["capacity"]) {
                    problems.push(format!(
                        "{side} scope {} {} per {} s: available {} of {}",
                        scope["name"],
                        limit["dimension"],
                        limit["window_seconds"],
                        limit["available"],
                        limit["capacity"]
                    ));
                }
            }
        }
    }
    if snapshot["shutting_down"] != json!(false) {
        problems.push("the gateway is shutting down".into());
    }
    problems
}

/// Circuits that are not closed.
pub fn circuits_not_closed(snapshot: &Value) -> Vec<String> {
    snapshot["circuits"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|c| c["state"] != "closed")
        .map(|c| format!("circuit of {} is {}", c["provider"], c["state"]))
        .collect()
}

/// The longest window of any limit, in seconds.
pub fn longest_window(snapshot: &Value) -> f64 {
    SIDES
        .iter()
        .flat_map(|side| snapshot[side]["scopes"].as_array().into_iter().flatten())
        .flat_map(|scope| scope["limits"].as_array().into_iter().flatten())
        .filter_map(|l| num(&l["window_seconds"]))
        .fold(0.0, f64::max)
}

/// The figures worth recording: per scope and pool, and the circuits.
pub fn summary(snapshot: &Value) -> Value {
    let mut out = serde_json::Map::new();
    for side in SIDES {
        let s = &snapshot[side];
        let scopes: Vec<Value> = s["scopes"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|sc| {
                json!({
                    "name": sc["name"],
                    "queued": sc["queued"],
                    "pending": sc["pending"],
                    "admitted": sc["admitted"],
                    "limits": sc["limits"].as_array().into_iter().flatten().map(|l| json!({
                        "dimension": l["dimension"],
                        "window_seconds": l["window_seconds"],
                        "available": l["available"],
                        "capacity": l["capacity"],
                        "algorithm": l["algorithm"],
                    })).collect::<Vec<_>>(),
                    "tokens_debt": sc["tokens_debt"],
                    "unknown_usage": sc["unknown_usage"],
                })
            })
            .collect();
        out.insert(
            side.to_owned(),
            json!({
                "active": s["active"],
                "scopes": scopes,
                "pools": s["pools"],
            }),
        );
    }
    out.insert("circuits".into(), snapshot["circuits"].clone());
    Value::Object(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn snap(active: u64, available: u64) -> Value {
        let side = json!({
            "active": active,
            "scopes": [{"name": "s", "queued": 0, "waiting_for_slot": 0, "pending": 0,
                "limits": [{"dimension": "requests", "window_seconds": 1.0,
                    "available": available, "capacity": 10}]}],
            "pools": [{"name": "p", "limit": 4, "available": 4 - active, "waiting": 0}],
        });
        json!({"shutting_down": false, "upstream": side, "tenants": side,
            "circuits": [{"provider": "sim", "state": "closed"}]})
    }

    #[test]
    fn idle_and_full_only_when_everything_is_back() {
        assert!(not_full(&snap(0, 10)).is_empty());
        assert!(busy(&snap(0, 3)).is_empty());
        assert_eq!(not_full(&snap(0, 3)).len(), 2);
        assert_eq!(busy(&snap(1, 10)).len(), 4);
        assert!(!busy(&json!({})).is_empty());
        assert_eq!(longest_window(&snap(0, 10)), 1.0);
        assert!(circuits_not_closed(&snap(0, 10)).is_empty());
    }
}

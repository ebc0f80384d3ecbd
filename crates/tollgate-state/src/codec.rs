//! One saved limit ↔ one row of the `counted` table.
//!
//! The dimension is stored by its name ([`Dimension::as_str`]) and looked
//! up among [`Dimension::ALL`], so a dimension added to the engine is kept
//! with no change here. Times are nanoseconds since the Unix epoch; what a
//! limit counts is a small JSON value: `{"until": [[t, n], ...]}` (sliding
//! window), `{"window": [start, end, used]}` (fixed or calendar window;
//! with `"ahead": [[t, n], ...]` when amounts are kept for later windows),
//! `{"taken": [t, n]}` (token bucket). A row written before `ahead` existed
//! reads as keeping nothing ahead.

use std::time::{Duration, SystemTime};

use serde_json::{Value, json};
use tollgate::config::{Calendar, Limit, Period, Zone};
use tollgate::quota::{Counted, Dimension, SavedLimit};

/// The columns of one row, as stored.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Row {
    pub(crate) dimension: String,
    pub(crate) amount: i64,
    pub(crate) window_ns: i64,
    pub(crate) period: Option<String>,
    pub(crate) zone: Option<String>,
    pub(crate) counted: String,
}

/// What a row decodes to: a limit, or one this build does not know (a
/// dimension or zone it lacks: no configured limit can take it).
pub(crate) enum Decoded {
    Limit(SavedLimit),
    Unknown(String),
}

fn nanos(t: SystemTime) -> i64 {
    let since = t
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or(Duration::ZERO);
    i64::try_from(since.as_nanos()).unwrap_or(i64::MAX)
}

fn time(ns: i64) -> Result<SystemTime, String> {
    let ns = u64::try_from(ns).map_err(|_| format!("time {ns} before 1970"))?;
    Ok(SystemTime::UNIX_EPOCH + Duration::from_nanos(ns))
}

pub(crate) fn encode(saved: &SavedLimit) -> Row {
    let l = &saved.limit;
    let pairs = |entries: &[(SystemTime, u64)]| {
        entries
            .iter()
            .map(|(t, n)| json!([nanos(*t), n]))
            .collect::<Vec<_>>()
    };
    let counted = match &saved.counted {
        Counted::Until(entries) => json!({ "until": pairs(entries) }),
        Counted::Window {
            start,
            end,
            used,
            ahead,
        } if ahead.is_empty() => json!({ "window": [nanos(*start), nanos(*end), used] }),
        Counted::Window {
            start,
            end,
            used,
            ahead,
        } => {
            json!({ "window": [nanos(*start), nanos(*end), used], "ahead": pairs(ahead) })
        }
        Counted::Taken { at, taken } => json!({ "taken": [nanos(*at), taken] }),
    };
    Row {
        dimension: l.dimension.as_str().to_owned(),
        amount: i64::try_from(l.amount).unwrap_or(i64::MAX),
        window_ns: i64::try_from(l.window.as_nanos()).unwrap_or(i64::MAX),
        period: l.calendar.map(|c| c.period.as_str().to_owned()),
        zone: l.calendar.map(|c| c.zone.name().to_owned()),
        counted: counted.to_string(),
    }
}

/// The row's limit, or why it is malformed.
pub(crate) fn decode(row: &Row) -> Result<Decoded, String> {
    let Some(dimension) = Dimension::ALL
        .into_iter()
        .find(|d| d.as_str() == row.dimension)
    else {
        return Ok(Decoded::Unknown(format!("dimension {:?}", row.dimension)));
    };
    let amount = u64::try_from(row.amount).map_err(|_| format!("amount {}", row.amount))?;
    let window = u64::try_from(row.window_ns)
        .ok()
        .filter(|&w| w > 0)
        .map(Duration::from_nanos)
        .ok_or_else(|| format!("window {}", row.window_ns))?;
    let calendar = match (&row.period, &row.zone) {
        (None, None) => None,
        (Some(p), Some(z)) => {
            let period = Period::parse(p).ok_or_else(|| format!("period {p:?}"))?;
            let Ok(zone) = Zone::named(z) else {
                return Ok(Decoded::Unknown(format!("time zone {z:?}")));
            };
            Some(Calendar::new(period).zone(zone))
        }
        _ => return Err("a calendar period without its zone".to_owned()),
    };
    let value: Value = serde_json::from_str(&row.counted).map_err(|e| format!("counted: {e}"))?;
    let counted = counted(&value).ok_or_else(|| format!("counted: unexpected {value}"))??;
    Ok(Decoded::Limit(SavedLimit {
        limit: Limit {
            dimension,
            amount,
            window,
            calendar,
        },
        counted,
    }))
}

/// `None`: not of the expected shape; `Some(Err)`: a bad time.
fn counted(value: &Value) -> Option<Result<Counted, String>> {
    let int = |v: &Value| v.as_i64();
    let count = |v: &Value| v.as_u64();
    if let Some(entries) = value.get("until") {
        return pairs(entries).map(|r| r.map(Counted::Until));
    }
    if let Some(w) = value.get("window").and_then(Value::as_array) {
        let [start, end, used] = w.as_slice() else {
            return None;
        };
        let (start, end, used) = (int(start)?, int(end)?, count(used)?);
        let ahead = match value.get("ahead") {
            Some(entries) => pairs(entries)?,
            None => Ok(Vec::new()),
        };
        return Some(time(start).and_then(|start| {
            Ok(Counted::Window {
                start,
                end: time(end)?,
                used,
                ahead: ahead?,
            })
        }));
    }
    if let Some(b) = value.get("taken").and_then(Value::as_array) {
        let [at, taken] = b.as_slice() else {
            return None;
        };
        let taken = count(taken)?;
        return Some(time(int(at)?).map(|at| Counted::Taken { at, taken }));
    }
    None
}

/// `[[t, n], ...]`: `None` if not of that shape; `Some(Err)`: a bad time.
fn pairs(value: &Value) -> Option<Result<Vec<(SystemTime, u64)>, String>> {
    let entries = value.as_array()?;
    let mut out = Vec::with_capacity(entries.len());
    for e in entries {
        let [t, n] = e.as_array()?.as_slice() else {
            return None;
        };
        match time(t.as_i64()?) {
            Ok(t) => out.push((t, n.as_u64()?)),
            Err(e) => return Some(Err(e)),
        }
    }
    Some(Ok(out))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn round_trip(saved: SavedLimit) {
        match decode(&encode(&saved)).unwrap() {
            Decoded::Limit(back) => assert_eq!(back, saved),
            Decoded::Unknown(what) => panic!("{what}"),
        }
    }

    // proves: DQ-8 (every kind of count, every dimension, rolling and
    // calendar windows with a zone, are stored and read back unchanged)
    #[test]
    fn every_kind_of_count_round_trips() {
        let t = |s: u64| SystemTime::UNIX_EPOCH + Duration::from_nanos(s * 1_000_000_007);
        let paris = Calendar::new(Period::Month).zone(Zone::named("Europe/Paris").unwrap());
        for dimension in Dimension::ALL {
            round_trip(SavedLimit {
                limit: Limit::new(dimension, 7, Duration::from_secs(3_600)),
                counted: Counted::Until(vec![(t(5), 1), (t(9), 3)]),
            });
            round_trip(SavedLimit {
                limit: Limit::per(dimension, 9, paris),
                counted: Counted::Window {
                    start: t(1),
                    end: t(2),
                    used: 4,
                    ahead: Vec::new(),
                },
            });
            round_trip(SavedLimit {
                limit: Limit::new(dimension, 9, Duration::from_secs(60)),
                counted: Counted::Window {
                    start: t(1),
                    end: t(2),
                    used: 4,
                    ahead: vec![(t(3), 2), (t(4), 1)],
                },
            });
            round_trip(SavedLimit {
                limit: Limit::new(dimension, 1, Duration::from_secs(86_400)),
                counted: Counted::Taken { at: t(3), taken: 1 },
            });
        }
    }

    // proves: DQ-8 (a window's row written before amounts kept ahead were
    // saved reads as keeping none)
    #[test]
    fn a_window_row_without_ahead_keeps_nothing_ahead() {
        let mut row = encode(&SavedLimit {
            limit: Limit::new(Dimension::Requests, 7, Duration::from_secs(60)),
            counted: Counted::Window {
                start: SystemTime::UNIX_EPOCH,
                end: SystemTime::UNIX_EPOCH + Duration::from_secs(60),
                used: 3,
                ahead: Vec::new(),
            },
        });
        assert_eq!(row.counted, "{\"window\":[0,60000000000,3]}");
        row.counted = "{\"window\": [0, 60000000000, 3]}".to_owned();
        let Ok(Decoded::Limit(back)) = decode(&row) else {
            panic!("not decoded");
        };
        assert!(
            matches!(back.counted, Counted::Window { used: 3, ref ahead, .. } if ahead.is_empty())
        );
        row.counted = "{\"window\": [0, 60000000000, 3], \"ahead\": [[1]]}".to_owned();
        assert!(
            decode(&row)
                .err()
                .unwrap()
                .starts_with("counted: unexpected")
        );
    }

    // proves: DQ-8 (a malformed row is an error that says what is wrong)
    #[test]
    fn a_malformed_row_says_what_is_wrong() {
        let mut row = encode(&SavedLimit {
            limit: Limit::new(Dimension::Tokens, 7, Duration::from_secs(3_600)),
            counted: Counted::Taken {
                at: SystemTime::UNIX_EPOCH,
                taken: 1,
            },
        });
        row.counted = "{\"taken\": [1]}".to_owned();
        let err = decode(&row).err().unwrap();
        assert!(err.starts_with("counted: unexpected"), "{err}");
        row.counted = "not json".to_owned();
        assert!(decode(&row).err().unwrap().starts_with("counted: "));
        row.dimension = "dollars".to_owned();
        assert!(matches!(decode(&row), Ok(Decoded::Unknown(_))));
    }
}

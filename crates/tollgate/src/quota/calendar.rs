//! The boundaries of calendar periods (SPEC BUD-3).
//!
//! A period is the set of instants whose local clock (in the calendar's
//! time zone) reads a date and time inside it: a day is every instant
//! whose local date is that day. Its first instant is the first one whose
//! local time reaches the period's civil start:
//!
//! * where the local clock repeats an hour (a fold, when daylight saving
//!   ends), the earlier of the two, so a repeated hour belongs to the
//!   period once, with both its passes;
//! * where the local clock jumps over the civil start (a gap, when daylight
//!   saving begins at midnight in some zones, or when a zone skipped a whole
//!   day), the jump itself.
//!
//! So consecutive periods tile time without overlap or hole: a day with a
//! daylight-saving change lasts 23 or 25 hours, a skipped day none.

use jiff::civil::DateTime;
use jiff::tz::{AmbiguousOffset, TimeZone};
use jiff::{Timestamp, ToSpan};

use crate::clock::UtcNanos;
use crate::config::{Calendar, Period};

/// The period of `calendar` holding `at`, as `[start, end)` in UTC
/// nanoseconds; `None` outside the years the calendar can represent
/// (-9999 to 9999).
pub(crate) fn period(calendar: &Calendar, at: UtcNanos) -> Option<(UtcNanos, UtcNanos)> {
    let tz = calendar.zone.tz();
    let local = tz.to_datetime(Timestamp::from_nanosecond(at).ok()?);
    let date = local.date();
    let (start, next) = match calendar.period {
        Period::Hour => {
            let start = date.at(local.hour(), 0, 0, 0);
            (start, start.checked_add(1.hour()).ok()?)
        }
        Period::Day => (date.at(0, 0, 0, 0), date.tomorrow().ok()?.at(0, 0, 0, 0)),
        Period::Week => {
            let back = i64::from(date.weekday().to_monday_zero_offset());
            let monday = date.checked_sub(back.days()).ok()?;
            let next = monday.checked_add(7.days()).ok()?;
            (monday.at(0, 0, 0, 0), next.at(0, 0, 0, 0))
        }
        Period::Month => {
            let first = date.first_of_month();
            let next = first.last_of_month().tomorrow().ok()?;
            (first.at(0, 0, 0, 0), next.at(0, 0, 0, 0))
        }
    };
    let start = first_instant(&tz, start)?;
    let end = first_instant(&tz, next)?;
    // Holds by construction; kept so that a surprise in the zone's rules
    // can never stop a window from rolling.
    Some((start.min(at), end.max(at + 1)))
}

/// The first instant at which the local clock of `tz` reads `dt` or later.
fn first_instant(tz: &TimeZone, dt: DateTime) -> Option<UtcNanos> {
    let ts = match tz.to_ambiguous_timestamp(dt).offset() {
        AmbiguousOffset::Unambiguous { offset } => offset.to_timestamp(dt).ok()?,
        AmbiguousOffset::Fold { before, .. } => before.to_timestamp(dt).ok()?,
        AmbiguousOffset::Gap { after, .. } => {
            // `dt` read with the later offset lies before the jump; the
            // jump is the zone's next transition.
            let before_jump = after.to_timestamp(dt).ok()?;
            tz.following(before_jump).next()?.timestamp()
        }
    };
    Some(ts.as_nanosecond())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Zone;

    fn utc(text: &str) -> UtcNanos {
        text.parse::<Timestamp>().unwrap().as_nanosecond()
    }

    fn show(n: UtcNanos) -> String {
        Timestamp::from_nanosecond(n).unwrap().to_string()
    }

    fn bounds(period: Period, zone: &str, at: &str) -> (String, String) {
        let calendar = Calendar::new(period).zone(Zone::named(zone).unwrap());
        let (s, e) = period_of(&calendar, utc(at));
        (show(s), show(e))
    }

    fn period_of(calendar: &Calendar, at: UtcNanos) -> (UtcNanos, UtcNanos) {
        period(calendar, at).unwrap()
    }

    // proves: BUD-3 (UTC periods: month lengths and leap days exact)
    #[test]
    fn utc_periods() {
        let p = |period, at| bounds(period, "UTC", at);
        assert_eq!(
            p(Period::Month, "2028-02-29T23:59:59.999999999Z"),
            ("2028-02-01T00:00:00Z".into(), "2028-03-01T00:00:00Z".into())
        );
        assert_eq!(
            p(Period::Month, "2027-02-10T00:00:00Z").1,
            "2027-03-01T00:00:00Z"
        );
        assert_eq!(
            p(Period::Month, "2026-12-31T23:59:59Z").1,
            "2027-01-01T00:00:00Z"
        );
        assert_eq!(
            p(Period::Day, "2028-02-29T12:00:00Z"),
            ("2028-02-29T00:00:00Z".into(), "2028-03-01T00:00:00Z".into())
        );
        // 2027-01-01 is a Friday: its ISO week began on Monday 2026-12-28.
        assert_eq!(
            p(Period::Week, "2027-01-01T08:00:00Z"),
            ("2026-12-28T00:00:00Z".into(), "2027-01-04T00:00:00Z".into())
        );
        assert_eq!(
            p(Period::Hour, "2027-01-01T08:59:59Z"),
            ("2027-01-01T08:00:00Z".into(), "2027-01-01T09:00:00Z".into())
        );
        // The boundary instant belongs to the new period.
        assert_eq!(
            p(Period::Day, "2028-03-01T00:00:00Z").0,
            "2028-03-01T00:00:00Z"
        );
    }

    // proves: BUD-3 (a time zone's days follow its daylight-saving
    // changes: 23 and 25 hours, a repeated hour counted once)
    #[test]
    fn daylight_saving_days() {
        // Paris: 2027-03-28 02:00 CET -> 03:00 CEST; 2027-10-31 03:00 CEST
        // -> 02:00 CET.
        let spring = bounds(Period::Day, "Europe/Paris", "2027-03-28T12:00:00Z");
        assert_eq!(
            spring,
            ("2027-03-27T23:00:00Z".into(), "2027-03-28T22:00:00Z".into())
        );
        let autumn = bounds(Period::Day, "Europe/Paris", "2027-10-31T12:00:00Z");
        assert_eq!(
            autumn,
            ("2027-10-30T22:00:00Z".into(), "2027-10-31T23:00:00Z".into())
        );
        // The repeated hour 02:00-03:00 local is one two-hour period.
        let fold = bounds(Period::Hour, "Europe/Paris", "2027-10-31T01:30:00Z");
        assert_eq!(
            fold,
            ("2027-10-31T00:00:00Z".into(), "2027-10-31T02:00:00Z".into())
        );
    }

    // proves: BUD-3 (a day whose midnight the clock skips starts at the
    // jump; a skipped day is empty and never entered)
    #[test]
    fn gaps_at_midnight() {
        // São Paulo, 2015-10-18: 00:00 -03 jumped to 01:00 -02.
        let day = bounds(Period::Day, "America/Sao_Paulo", "2015-10-18T12:00:00Z");
        assert_eq!(
            day,
            ("2015-10-18T03:00:00Z".into(), "2015-10-19T02:00:00Z".into())
        );
        // Apia skipped 2011-12-30: the 29th ends where the 31st begins.
        let before = bounds(Period::Day, "Pacific/Apia", "2011-12-30T09:00:00Z");
        let after = bounds(Period::Day, "Pacific/Apia", "2011-12-30T10:00:00Z");
        assert_eq!(before.1, after.0);
        assert_eq!(after.0, "2011-12-30T10:00:00Z");
    }

    // proves: BUD-3 (consecutive periods tile time: each ends where the
    // next begins, whatever the zone's transitions)
    #[test]
    fn periods_tile_time() {
        for zone in [
            "UTC",
            "Europe/Paris",
            "America/Sao_Paulo",
            "Australia/Lord_Howe",
        ] {
            for period in [Period::Hour, Period::Day, Period::Week, Period::Month] {
                let calendar = Calendar::new(period).zone(Zone::named(zone).unwrap());
                let mut at = utc("2015-01-01T00:00:00Z");
                let stop = utc("2016-01-01T00:00:00Z");
                let (_, mut end) = period_of(&calendar, at);
                while at < stop {
                    at = end;
                    let (s, e) = period_of(&calendar, at);
                    assert_eq!(s, at, "{zone} {period:?} at {}", show(at));
                    assert!(e > s);
                    let (s2, e2) = period_of(&calendar, e - 1);
                    assert_eq!((s2, e2), (s, e), "{zone} {period:?}");
                    end = e;
                }
            }
        }
    }
}

//! Calendar windows (SPEC BUD-3): a limit per hour, day, week or month of
//! the calendar, reset at the period's boundary in UTC or in a named time
//! zone, beside the rolling windows of SPEC Q-2.
//!
//! Time zones come from the IANA database bundled into the binary (the
//! `jiff` crate's copy), so a host without `/usr/share/zoneinfo`, or with
//! an older one, computes the same boundaries.

use std::collections::HashMap;
use std::fmt;
use std::sync::OnceLock;
use std::time::Duration;

use jiff::tz::TimeZone;
use parking_lot::Mutex;

/// A calendar period.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Period {
    /// From one full hour of the local clock to the next.
    Hour,
    /// From one midnight to the next.
    Day,
    /// From Monday 00:00 to the next Monday 00:00 (ISO 8601 weeks).
    Week,
    /// From the first of a month 00:00 to the first of the next.
    Month,
}

impl Period {
    /// The configuration name: `hour`, `day`, `week`, `month`.
    pub const fn as_str(&self) -> &'static str {
        match self {
            Period::Hour => "hour",
            Period::Day => "day",
            Period::Week => "week",
            Period::Month => "month",
        }
    }

    /// The period named `name` (`hour`, `day`, `week`, `month`).
    pub fn parse(name: &str) -> Option<Period> {
        match name {
            "hour" => Some(Period::Hour),
            "day" => Some(Period::Day),
            "week" => Some(Period::Week),
            "month" => Some(Period::Month),
            _ => None,
        }
    }

    /// Its nominal length (a month counts 31 days): what the limit's
    /// `window` says in snapshots and errors. The boundaries come from the
    /// calendar, not from this length: a day with a daylight-saving change
    /// lasts 23 or 25 hours, February 28 or 29 days.
    pub const fn nominal(&self) -> Duration {
        Duration::from_secs(match self {
            Period::Hour => 3_600,
            Period::Day => 86_400,
            Period::Week => 7 * 86_400,
            Period::Month => 31 * 86_400,
        })
    }
}

/// A time zone: UTC, or one of the IANA database by name. Cheap to copy
/// (each named zone is loaded once per process and shared).
#[derive(Clone, Copy)]
pub struct Zone(Option<&'static Named>);

struct Named {
    name: String,
    tz: TimeZone,
}

/// A time zone name the database does not know.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "unknown time zone {name:?}: use an IANA name such as \"Europe/Paris\" or \"America/New_York\", or leave it out for UTC"
)]
pub struct UnknownZone {
    /// The name as given.
    pub name: String,
}

impl Zone {
    /// UTC (the default).
    pub const UTC: Zone = Zone(None);

    /// The IANA time zone `name` (e.g. `Europe/Paris`); `UTC` is UTC.
    pub fn named(name: &str) -> Result<Zone, UnknownZone> {
        if name == "UTC" {
            return Ok(Zone::UTC);
        }
        static LOADED: OnceLock<Mutex<HashMap<String, &'static Named>>> = OnceLock::new();
        let mut loaded = LOADED.get_or_init(Default::default).lock();
        if let Some(named) = loaded.get(name) {
            return Ok(Zone(Some(named)));
        }
        let tz = jiff::tz::db().get(name).map_err(|_| UnknownZone {
            name: name.to_owned(),
        })?;
        // One leak per distinct zone name ever loaded (the database holds
        // a few hundred): zones stay `Copy`, as limits are.
        let named: &'static Named = Box::leak(Box::new(Named {
            name: name.to_owned(),
            tz,
        }));
        loaded.insert(name.to_owned(), named);
        Ok(Zone(Some(named)))
    }

    /// Its name: `UTC` or the IANA name.
    pub fn name(&self) -> &str {
        self.0.map_or("UTC", |n| &n.name)
    }

    /// The zone's rules.
    pub(crate) fn tz(&self) -> TimeZone {
        self.0.map_or(TimeZone::UTC, |n| n.tz.clone())
    }
}

impl PartialEq for Zone {
    fn eq(&self, other: &Zone) -> bool {
        self.name() == other.name()
    }
}

impl Eq for Zone {}

impl fmt::Debug for Zone {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl Default for Zone {
    fn default() -> Self {
        Zone::UTC
    }
}

/// A calendar window: a period of the calendar in a time zone (SPEC
/// BUD-3). A limit with one is a fixed window whose boundaries are the
/// period's: all of it is available again at the first instant of each
/// period, whatever the scope's algorithm.
///
/// ```
/// use tollgate::config::{Calendar, Period, Zone};
/// let utc_day = Calendar::new(Period::Day);
/// let paris_month = Calendar::new(Period::Month).zone(Zone::named("Europe/Paris").unwrap());
/// assert_ne!(utc_day, paris_month);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Calendar {
    /// Hour, day, week or month.
    pub period: Period,
    /// Where the period's boundaries are read (UTC by default).
    pub zone: Zone,
}

impl Calendar {
    /// `period` in UTC.
    pub const fn new(period: Period) -> Self {
        Calendar {
            period,
            zone: Zone::UTC,
        }
    }

    /// The same period in `zone`.
    pub const fn zone(mut self, zone: Zone) -> Self {
        self.zone = zone;
        self
    }

    /// The longest any of its periods lasts: the nominal length, an hour
    /// more in a zone other than UTC (a period holding a daylight-saving
    /// change). A sliding window this long never admits more than the
    /// calendar window would in any of its periods.
    pub fn longest(&self) -> std::time::Duration {
        let dst = if self.zone.0.is_none() { 0 } else { 3_600 };
        self.period.nominal() + std::time::Duration::from_secs(dst)
    }
}

impl fmt::Display for Calendar {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.zone.0 {
            None => write!(f, "{} (UTC)", self.period.as_str()),
            Some(n) => write!(f, "{} ({})", self.period.as_str(), n.name),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // proves: BUD-3 (time zones by IANA name; an unknown one is an error
    // that names it)
    #[test]
    fn zones_by_name() {
        let paris = Zone::named("Europe/Paris").unwrap();
        assert_eq!(paris, Zone::named("Europe/Paris").unwrap());
        assert_eq!(paris.name(), "Europe/Paris");
        assert_eq!(Zone::named("UTC").unwrap(), Zone::UTC);
        let e = Zone::named("Mars/Olympus").unwrap_err();
        assert!(e.to_string().contains("Mars/Olympus"), "{e}");
        assert_eq!(Period::parse("month"), Some(Period::Month));
        assert_eq!(Period::parse("1d"), None);
    }
}

//! The wall clock beside the monotonic one (SPEC BUD-3, DQ-8).
//!
//! Deadlines, refill and waiting use monotonic instants, which never jump.
//! Two things need to know what those instants are in UTC: calendar
//! windows (a day or a month resets at a date's boundary) and quota state
//! persisted across a restart (the monotonic clock starts over with the
//! process; the saved times are UTC). A [`WallClock`] is one pairing of a
//! monotonic instant with the UTC time it stands for; every other instant
//! maps by the monotonic difference. A controller reads its clock's
//! pairing once, when it is built, so a step of the system clock later
//! (an NTP correction, an operator's `date -s`) moves no boundary of a
//! running process: its windows follow the monotonic clock, which is what
//! the provider's own windows do between restarts.

use std::time::{Duration, SystemTime};

use super::{Clock, Instant};

/// Nanoseconds since the Unix epoch (negative before it).
pub(crate) type UtcNanos = i128;

/// Maps monotonic [`Instant`]s to UTC and back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WallClock {
    anchor: Instant,
    utc: UtcNanos,
}

impl WallClock {
    /// The mapping that puts `at` at `utc`.
    pub fn new(at: Instant, utc: SystemTime) -> Self {
        WallClock {
            anchor: at,
            utc: utc_nanos(utc),
        }
    }

    /// The system's wall clock now, paired with tokio's monotonic clock now.
    pub fn system() -> Self {
        Self::new(Instant::now(), SystemTime::now())
    }

    /// The system's wall clock now, paired with `at` (the current instant
    /// of some [`Clock`]).
    pub fn system_at(at: Instant) -> Self {
        Self::new(at, SystemTime::now())
    }

    /// The UTC time of `at`.
    pub fn utc(&self, at: Instant) -> SystemTime {
        from_nanos(self.nanos(at))
    }

    /// The instant of `utc`; `None` when the monotonic clock cannot
    /// represent it (long before this process started).
    pub fn instant(&self, utc: SystemTime) -> Option<Instant> {
        let delta = utc_nanos(utc) - self.utc;
        let magnitude = Duration::from_nanos(u64::try_from(delta.unsigned_abs()).ok()?);
        if delta >= 0 {
            self.anchor.checked_add(magnitude)
        } else {
            self.anchor.checked_sub(magnitude)
        }
    }

    /// Nanoseconds since the Unix epoch of `at`.
    pub(crate) fn nanos(&self, at: Instant) -> UtcNanos {
        if at >= self.anchor {
            self.utc + (at - self.anchor).as_nanos() as i128
        } else {
            self.utc - (self.anchor - at).as_nanos() as i128
        }
    }
}

/// `t` in nanoseconds since the Unix epoch.
pub(crate) fn utc_nanos(t: SystemTime) -> UtcNanos {
    match t.duration_since(SystemTime::UNIX_EPOCH) {
        Ok(after) => after.as_nanos() as i128,
        Err(before) => -(before.duration().as_nanos() as i128),
    }
}

/// The time `nanos` after (before, if negative) the Unix epoch, saturated
/// to what `SystemTime` holds.
pub(crate) fn from_nanos(nanos: UtcNanos) -> SystemTime {
    let magnitude = Duration::from_nanos(u64::try_from(nanos.unsigned_abs()).unwrap_or(u64::MAX));
    let t = if nanos >= 0 {
        SystemTime::UNIX_EPOCH.checked_add(magnitude)
    } else {
        SystemTime::UNIX_EPOCH.checked_sub(magnitude)
    };
    t.unwrap_or(SystemTime::UNIX_EPOCH)
}

/// Tokio's monotonic clock (paused time included) with a chosen wall
/// time: the instant it is created at is `utc`. For tests and simulations
/// that cross a date on tokio's paused clock.
///
/// ```
/// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
/// use std::time::{Duration, SystemTime};
/// use tollgate::clock::{AnchoredClock, Clock};
/// let new_year = SystemTime::UNIX_EPOCH + Duration::from_secs(1_798_761_600); // 2027-01-01
/// let clock = AnchoredClock::new(new_year);
/// assert_eq!(clock.wall().utc(clock.now()), new_year);
/// # }
/// ```
#[derive(Debug, Clone, Copy)]
pub struct AnchoredClock {
    wall: WallClock,
}

impl AnchoredClock {
    /// Tokio's clock, its current instant at `utc`.
    pub fn new(utc: SystemTime) -> Self {
        AnchoredClock {
            wall: WallClock::new(Instant::now(), utc),
        }
    }
}

impl Clock for AnchoredClock {
    #[inline]
    fn now(&self) -> Instant {
        Instant::now()
    }

    fn wall(&self) -> WallClock {
        self.wall
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // proves: BUD-3 (instants map to UTC by their monotonic difference,
    // both ways, before and after the anchor)
    #[test]
    fn maps_instants_to_utc_and_back() {
        let at = Instant::now();
        let utc = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
        let wall = WallClock::new(at, utc);
        let later = at + Duration::from_millis(1_500);
        assert_eq!(wall.utc(later), utc + Duration::from_millis(1_500));
        assert_eq!(
            wall.instant(utc + Duration::from_millis(1_500)),
            Some(later)
        );
        assert_eq!(wall.nanos(at), 1_000_000_000_000_000);
        assert_eq!(wall.nanos(at - Duration::from_secs(1)), 999_999_000_000_000);
        assert_eq!(from_nanos(utc_nanos(utc)), utc);
        let before_epoch = SystemTime::UNIX_EPOCH - Duration::from_secs(5);
        assert_eq!(utc_nanos(before_epoch), -5_000_000_000);
        assert_eq!(from_nanos(-5_000_000_000), before_epoch);
    }

    // proves: BUD-3, DL-2 (an anchored clock follows tokio's paused time)
    #[tokio::test(start_paused = true)]
    async fn anchored_clock_follows_paused_time() {
        let utc = SystemTime::UNIX_EPOCH + Duration::from_secs(86_400);
        let clock = AnchoredClock::new(utc);
        tokio::time::advance(Duration::from_secs(60)).await;
        assert_eq!(clock.wall().utc(clock.now()), utc + Duration::from_secs(60));
    }
}

//! What other clients of the account hold in the provider's window, as the
//! provider's remaining-budget headers reveal it (SPEC Q-14).
//!
//! Each answer brackets it. The upper bound is the provider's limit, minus
//! what it had left, minus what it *certainly* held of tollgate's own
//! traffic when it counted the answered attempt (see `sent.rs`); the lower
//! bound subtracts everything of tollgate's it *may* have held (attempts in
//! flight alongside, and attempts near the end of their window whose
//! arrival is uncertain). With nothing of tollgate's in flight and nothing
//! near expiry, both are equal and exact; in a burst, or at a window edge
//! right after one, the bracket is wide.
//!
//! The estimate moves only when an answer's bracket excludes it: down to
//! the upper bound when that is lower (a lower upper bound is the better
//! safe value), up to the upper bound when the lower bound is higher
//! (others certainly hold more). An answer whose bracket contains the
//! estimate confirms it. So an answer inflated by tollgate's own burst
//! never raises what a quieter answer measured, and the first arrival of a
//! burst, whose upper bound is exact, brings the estimate down to the
//! truth. The estimate lasts until the provider's reset of the latest
//! answer that set or confirmed it.

use super::Nanos;

/// The estimate of one limit.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Others {
    current: Option<Estimate>,
}

#[derive(Debug, Clone, Copy)]
struct Estimate {
    value: u64,
    /// Until when it holds.
    until: Nanos,
    /// When the provider counted the answer that set it.
    counted: Nanos,
}

impl Others {
    /// Takes in an answer, counted by `counted` and valid until `until`,
    /// bracketing other clients' holding between `lower` and `upper`;
    /// returns the estimate and until when it holds (`None`: none holds).
    ///
    /// An answer older than the one that set the estimate (a slow one-shot
    /// answer counted before a stream's) can only raise it; one whose reset
    /// has passed says nothing about now and changes nothing.
    pub(crate) fn estimate(
        &mut self,
        lower: u64,
        upper: u64,
        counted: Nanos,
        until: Nanos,
        now: Nanos,
    ) -> Option<(u64, Nanos)> {
        let lower = lower.min(upper);
        let live = self.current.filter(|e| e.until > now);
        let fresh = Estimate {
            value: upper,
            until,
            counted,
        };
        let next = match live {
            _ if until <= now => live,
            None => Some(fresh),
            Some(e) if lower > e.value => Some(fresh),
            Some(e) if counted < e.counted => Some(e),
            Some(e) if e.value <= upper => Some(Estimate {
                until: e.until.max(until),
                ..e
            }),
            Some(_) => Some(fresh),
        };
        self.current = next;
        next.map(|e| (e.value, e.until))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // proves: Q-14 (the estimate moves only when an answer's bracket
    // excludes it: down to a lower upper bound, up when others certainly
    // hold more; a wide bracket from a burst confirms it; it lapses at the
    // reset of the answers that confirmed it)
    #[test]
    fn the_estimate_moves_only_when_an_answer_excludes_it() {
        let mut o = Others::default();
        // A burst: the first answer's bracket is wide, later ones narrow
        // it down; the first arrival's upper bound is exact.
        assert_eq!(o.estimate(0, 9, 90, 1_000, 100), Some((9, 1_000)));
        assert_eq!(o.estimate(0, 5, 100, 1_010, 110), Some((5, 1_010)));
        assert_eq!(
            o.estimate(2, 8, 110, 1_020, 120),
            Some((5, 1_020)),
            "confirmed"
        );
        // Exact and lower: followed.
        assert_eq!(o.estimate(3, 3, 190, 1_100, 200), Some((3, 1_100)));
        // A wide bracket containing it: kept.
        assert_eq!(o.estimate(0, 12, 290, 1_200, 300), Some((3, 1_200)));
        // Others certainly hold more: up to the upper bound.
        assert_eq!(o.estimate(4, 6, 390, 1_300, 400), Some((6, 1_300)));
        // Lapsed at its reset: the next answer starts afresh.
        assert_eq!(o.estimate(0, 7, 1_390, 2_500, 1_400), Some((7, 2_500)));
    }

    // proves: Q-14 (an answer counted before the one that set the
    // estimate only raises it; an answer past its reset changes nothing)
    #[test]
    fn old_answers_never_lower_the_estimate() {
        let mut o = Others::default();
        assert_eq!(o.estimate(5, 5, 500, 1_500, 500), Some((5, 1_500)));
        // A slow one-shot answer counted at 100: lower, ignored.
        assert_eq!(o.estimate(1, 1, 100, 1_600, 600), Some((5, 1_500)));
        // ... but it raises when others certainly held more.
        assert_eq!(o.estimate(7, 8, 100, 1_600, 600), Some((8, 1_600)));
        // Past its reset: nothing changes, even with no estimate.
        assert_eq!(o.estimate(0, 0, 100, 650, 700), Some((8, 1_600)));
        let mut empty = Others::default();
        assert_eq!(empty.estimate(9, 9, 100, 650, 700), None);
    }
}

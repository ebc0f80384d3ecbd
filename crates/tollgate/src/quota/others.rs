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
    /// The estimate, and until when it holds.
    current: Option<(u64, Nanos)>,
}

impl Others {
    /// Takes in an answer bracketing other clients' holding between
    /// `lower` and `upper`, counted by `counted` and valid until `until`;
    /// returns the estimate and until when it holds.
    pub(crate) fn estimate(
        &mut self,
        lower: u64,
        upper: u64,
        until: Nanos,
        now: Nanos,
    ) -> (u64, Nanos) {
        let lower = lower.min(upper);
        let next = match self.current {
            Some((e, end)) if end > now && lower <= e && e <= upper => (e, end.max(until)),
            _ => (upper, until),
        };
        self.current = Some(next);
        next
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
        assert_eq!(o.estimate(0, 9, 1_000, 100), (9, 1_000));
        assert_eq!(o.estimate(0, 5, 1_010, 110), (5, 1_010));
        assert_eq!(o.estimate(2, 8, 1_020, 120), (5, 1_020), "confirmed");
        // Exact and lower: followed.
        assert_eq!(o.estimate(3, 3, 1_100, 200), (3, 1_100));
        // A wide bracket containing it: kept.
        assert_eq!(o.estimate(0, 12, 1_200, 300), (3, 1_200));
        // Others certainly hold more: up to the upper bound.
        assert_eq!(o.estimate(4, 6, 1_300, 400), (6, 1_300));
        // Lapsed at its reset: the next answer starts afresh.
        assert_eq!(o.estimate(0, 7, 2_500, 1_400), (7, 2_500));
    }
}

//! The choice of one deployment for one attempt (SPEC GW-11), as a pure
//! function of what each deployment's scope, breaker and counters say.

use std::time::Duration;

/// What the router knows about one deployment at the moment of choosing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Candidate {
    /// How long until the attempt could start there, by the engine's
    /// projection (zero: at once); `None` when it cannot be told (a store
    /// without projections, a demand that never fits there).
    pub wait: Option<Duration>,
    /// The deployment's scope is cooling down after a 429 (SPEC CD-1).
    pub cooling: bool,
    /// The provider's circuit is open (SPEC CB-3).
    pub open: bool,
    /// An earlier attempt of this call failed there.
    pub failed: bool,
    /// Attempts in flight there.
    pub in_flight: usize,
    /// The configured weight (at least 1).
    pub weight: u32,
}

/// Sort key: lower is better.
fn key(c: &Candidate) -> (Duration, u128, std::cmp::Reverse<u32>) {
    // Unknown is ranked after any known wait of up to a day, so a
    // projection that exists wins; among unknowns in-flight decides.
    let wait = c.wait.unwrap_or(Duration::from_secs(86_400));
    // Fewest in flight per unit of weight: in_flight / weight compared as
    // in_flight * (product of the others' weights) is the same order as
    // in_flight * 2^32 / weight, exactly, without floats.
    let load = ((c.in_flight as u128) << 32) / u128::from(c.weight.max(1));
    (wait, load, std::cmp::Reverse(c.weight))
}

/// The index of the deployment to try, or `None` when every circuit is
/// open.
///
/// Preference, in order: deployments that are neither open nor cooling nor
/// already failed in this call; then cooling ones not failed (admission
/// waits for the cooldown, under the deadline); then failed ones. Within a
/// tier: the shortest wait, then the fewest in flight per unit of weight,
/// then the higher weight, then the first in configuration order.
pub fn pick(candidates: &[Candidate]) -> Option<usize> {
    let tier = |c: &Candidate| -> Option<u8> {
        match (c.open, c.cooling, c.failed) {
            (true, _, _) => None,
            (false, false, false) => Some(0),
            (false, true, false) => Some(1),
            (false, _, true) => Some(2),
        }
    };
    candidates
        .iter()
        .enumerate()
        .filter_map(|(i, c)| tier(c).map(|t| (t, key(c), i)))
        .min()
        .map(|(_, _, i)| i)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn free() -> Candidate {
        Candidate {
            wait: Some(Duration::ZERO),
            cooling: false,
            open: false,
            failed: false,
            in_flight: 0,
            weight: 1,
        }
    }

    fn ms(n: u64) -> Option<Duration> {
        Some(Duration::from_millis(n))
    }

    // proves: GW-11 (soonest start first, then fewest in flight, then weight)
    #[test]
    fn soonest_then_least_loaded_then_heaviest() {
        let late = Candidate {
            wait: ms(200),
            ..free()
        };
        let busy = Candidate {
            in_flight: 3,
            ..free()
        };
        assert_eq!(pick(&[late, free()]), Some(1));
        assert_eq!(pick(&[busy, late]), Some(0), "wait decides before load");
        assert_eq!(pick(&[busy, free()]), Some(1));
        let heavy = Candidate {
            weight: 3,
            ..free()
        };
        assert_eq!(pick(&[free(), heavy]), Some(1));
        // 3 in flight on weight 3 ties 1 on weight 1: the heavier wins.
        let heavy_busy = Candidate {
            in_flight: 3,
            weight: 3,
            ..free()
        };
        let light_one = Candidate {
            in_flight: 1,
            ..free()
        };
        assert_eq!(pick(&[light_one, heavy_busy]), Some(1));
        assert_eq!(pick(&[free(), free()]), Some(0), "configuration order");
    }

    // proves: GW-11 (open circuits and cooldowns are skipped; a retry moves
    // to a deployment that has not failed)
    #[test]
    fn skips_open_cooling_and_failed() {
        let open = Candidate {
            open: true,
            ..free()
        };
        let cooling = Candidate {
            cooling: true,
            ..free()
        };
        let failed = Candidate {
            failed: true,
            ..free()
        };
        let late = Candidate {
            wait: ms(5_000),
            ..free()
        };
        assert_eq!(pick(&[open, late]), Some(1));
        assert_eq!(pick(&[cooling, late]), Some(1));
        assert_eq!(pick(&[failed, late]), Some(1));
        assert_eq!(pick(&[failed, cooling]), Some(1), "cooling before failed");
        assert_eq!(pick(&[open, failed]), Some(1), "failed before nothing");
        assert_eq!(pick(&[open, open]), None);
        let unknown = Candidate {
            wait: None,
            ..free()
        };
        assert_eq!(pick(&[unknown, late]), Some(1), "a known wait wins");
    }
}

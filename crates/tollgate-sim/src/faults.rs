//! Seeded, deterministic faults (SIM-3).
//!
//! Each request gets its own generator, seeded from `(seed, sequence
//! number)`, where the sequence number counts the API requests the simulator
//! has received since start or the last reset (starting at 0). The draws are
//! made in a fixed order whatever the configuration, so the same seed and the
//! same request order always give the same faults.

use crate::config::SimConfig;

/// The faults planned for one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct FaultPlan {
    /// Fail with this status (500 or 503) instead of answering.
    pub server_error: Option<u16>,
    /// For streams: send this many events (at least one, never `[DONE]`),
    /// then abort the connection.
    pub disconnect_after: Option<u32>,
    /// Hold the response headers back by the configured delay.
    pub slow_headers: bool,
}

impl FaultPlan {
    /// Draws the plan of request `seq`. `stream_events` is the number of
    /// events a complete stream would send before `[DONE]` (0 for one-shot
    /// requests, which are never cut).
    pub fn draw(config: &SimConfig, seq: u64, stream_events: u32) -> Self {
        let mut rng = fastrand::Rng::with_seed(mix(config.seed, seq));
        // Fixed draw order: error?, which error, cut?, where, slow?
        let error = rng.f64() < config.error_rate;
        let status = if rng.bool() { 500 } else { 503 };
        let cut = rng.f64() < config.disconnect_rate;
        let position = rng.u32(1..=stream_events.max(1));
        let slow = rng.f64() < config.slow_headers_rate;
        Self {
            server_error: error.then_some(status),
            disconnect_after: (cut && stream_events > 0).then_some(position),
            slow_headers: slow,
        }
    }
}

/// Combines the seed and the sequence number into one well-mixed seed
/// (SplitMix64 finaliser), so neighbouring sequence numbers give unrelated
/// streams.
fn mix(seed: u64, seq: u64) -> u64 {
    let mut z = seed ^ seq.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(seed: u64, rate: f64) -> SimConfig {
        SimConfig {
            seed,
            error_rate: rate,
            disconnect_rate: rate,
            slow_headers_rate: rate,
            ..SimConfig::default()
        }
    }

    // proves: SIM-3
    #[test]
    fn plans_depend_only_on_seed_and_sequence() {
        let a: Vec<_> = (0..500)
            .map(|seq| FaultPlan::draw(&config(7, 0.3), seq, 20))
            .collect();
        let b: Vec<_> = (0..500)
            .map(|seq| FaultPlan::draw(&config(7, 0.3), seq, 20))
            .collect();
        let c: Vec<_> = (0..500)
            .map(|seq| FaultPlan::draw(&config(8, 0.3), seq, 20))
            .collect();
        assert_eq!(a, b);
        assert_ne!(a, c);
        // Roughly the configured rate, and every cut is mid-stream.
        let errors = a.iter().filter(|p| p.server_error.is_some()).count();
        assert!((100..200).contains(&errors), "{errors}");
        assert!(
            a.iter()
                .filter_map(|p| p.disconnect_after)
                .all(|n| (1..=20).contains(&n))
        );
        assert!(
            a.iter()
                .filter_map(|p| p.server_error)
                .all(|s| s == 500 || s == 503)
        );
    }

    // proves: SIM-3
    #[test]
    fn zero_and_one_rates_are_exact() {
        for seq in 0..200 {
            assert_eq!(
                FaultPlan::draw(&config(1, 0.0), seq, 10),
                FaultPlan::default()
            );
            let all = FaultPlan::draw(&config(1, 1.0), seq, 10);
            assert!(all.server_error.is_some() && all.slow_headers);
            assert!(all.disconnect_after.is_some());
            // One-shot requests are never cut.
            assert_eq!(
                FaultPlan::draw(&config(1, 1.0), seq, 0).disconnect_after,
                None
            );
        }
    }
}

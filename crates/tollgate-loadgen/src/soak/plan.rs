//! What each request of the soak is, drawn from the seed and its index
//! only (so a run is reproducible request by request).

use std::time::Duration;

use bytes::Bytes;
use serde_json::json;

/// Requests in one burst of impatient clients.
pub const BURST_LEN: u64 = 12;
/// A burst starts every this many requests.
pub const BURST_EVERY: u64 = 5_000;

/// How the client behaves.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Behaviour {
    /// Reads the whole response (keep-alive connection).
    Normal,
    /// Drops the request `after` it was sent, whether or not headers came.
    CancelBeforeHeaders { after: Duration },
    /// Drops the response as soon as its headers arrived.
    CancelAfterHeaders,
    /// Reads `frames` body frames, then drops the connection.
    CancelMidStream { frames: u32 },
    /// Reads `frames` body frames, then stops reading with the socket
    /// open until the gateway closes it (or its grace runs out), then
    /// drains what is left.
    Stall { frames: u32 },
}

/// Which simulator behind the gateway answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Upstream {
    /// One event per `--per-token`.
    Slow,
    /// As fast as it can.
    Bulk,
}

/// One request of the soak.
#[derive(Debug, Clone, PartialEq)]
pub struct Call {
    pub behaviour: Behaviour,
    pub upstream: Upstream,
    pub stream: bool,
    pub include_usage: bool,
    pub max_tokens: u32,
    /// `x-request-timeout` in seconds, when sent.
    pub timeout: Option<f64>,
    /// One of a burst of impatient clients (tiny deadline, all sent at
    /// once): their 504s must not open the provider's circuit (GW-16).
    pub impatient: bool,
    /// A client that goes away does so with a reset (RST, `SO_LINGER`
    /// 0) rather than a normal close (FIN). Stalled clients always reset
    /// once they have drained: either way no TIME_WAIT entry is left to
    /// swell `/proc/net/tcp`, which the close watcher reads.
    pub reset: bool,
}

impl Call {
    /// Whether the client reads the whole response and expects a complete
    /// one or a typed error.
    pub fn well_behaved(&self) -> bool {
        self.behaviour == Behaviour::Normal
    }

    /// The request body.
    pub fn body(&self, model: &str) -> Bytes {
        let mut body = json!({
            "model": model,
            "messages": [{"role": "user", "content": "Tell the soak a long story."}],
            "max_tokens": self.max_tokens,
        });
        if self.stream {
            body["stream"] = json!(true);
            if self.include_usage {
                body["stream_options"] = json!({"include_usage": true});
            }
        }
        Bytes::from(body.to_string())
    }
}

/// Whether request `index` belongs to a burst of impatient clients.
pub fn in_burst(index: u64) -> bool {
    index % BURST_EVERY >= BURST_EVERY - BURST_LEN
}

/// SplitMix64 finaliser: neighbouring indices give unrelated streams.
fn mix(seed: u64, index: u64) -> u64 {
    let mut z = seed ^ index.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Draws request `index`.
///
/// Mix (per 1,000): 380 one-shot and 380 streaming well-behaved calls (one
/// in five on the bulk model; one in ten with a short deadline of 20 to
/// 300 ms, one in five with a generous one), 40 cancelled before headers,
/// 40 after headers, 60 mid-stream, 95 stalled streams on the slow model
/// (1,500 to 3,000 tokens, deadline 0.3 to 1 s: they cannot end in time),
/// 5 stalled streams on the bulk model (`bulk_stall_tokens`, more than any
/// buffer holds); plus a burst of impatient one-shot calls every
/// `BURST_EVERY` requests.
pub fn draw(seed: u64, index: u64, bulk_stall_tokens: u32) -> Call {
    let mut rng = fastrand::Rng::with_seed(mix(seed, index));
    if in_burst(index) {
        return Call {
            behaviour: Behaviour::Normal,
            upstream: Upstream::Bulk,
            stream: rng.bool(),
            include_usage: rng.bool(),
            max_tokens: 16,
            // 1 to 5 ms: shorter than the bulk simulator's time to first
            // token, so every one ends at its deadline.
            timeout: Some(f64::from(rng.u32(1..=5)) / 1000.0),
            impatient: true,
            reset: false,
        };
    }
    let roll = rng.u32(0..1000);
    let normal_timeout = |rng: &mut fastrand::Rng| match rng.u32(0..10) {
        0 => Some(f64::from(rng.u32(20..=300)) / 1000.0),
        1 | 2 => Some(f64::from(rng.u32(5..=30))),
        _ => None,
    };
    let upstream = if rng.u32(0..5) == 0 {
        Upstream::Bulk
    } else {
        Upstream::Slow
    };
    let base = Call {
        behaviour: Behaviour::Normal,
        upstream,
        stream: false,
        include_usage: rng.bool(),
        max_tokens: rng.u32(8..=48),
        timeout: None,
        impatient: false,
        reset: rng.bool(),
    };
    match roll {
        0..380 => Call {
            timeout: normal_timeout(&mut rng),
            ..base
        },
        380..760 => Call {
            stream: true,
            timeout: normal_timeout(&mut rng),
            ..base
        },
        760..800 => Call {
            behaviour: Behaviour::CancelBeforeHeaders {
                after: Duration::from_micros(rng.u64(0..=30_000)),
            },
            stream: rng.bool(),
            ..base
        },
        800..840 => Call {
            behaviour: Behaviour::CancelAfterHeaders,
            stream: rng.bool(),
            ..base
        },
        840..900 => Call {
            behaviour: Behaviour::CancelMidStream {
                frames: rng.u32(1..=40),
            },
            upstream: Upstream::Slow,
            stream: true,
            max_tokens: rng.u32(100..=2000),
            ..base
        },
        900..995 => Call {
            behaviour: Behaviour::Stall {
                frames: rng.u32(0..=40),
            },
            upstream: Upstream::Slow,
            stream: true,
            max_tokens: rng.u32(1500..=3000),
            timeout: Some(f64::from(rng.u32(300..=1000)) / 1000.0),
            reset: true,
            ..base
        },
        _ => Call {
            behaviour: Behaviour::Stall {
                frames: rng.u32(0..=40),
            },
            upstream: Upstream::Bulk,
            stream: true,
            max_tokens: bulk_stall_tokens,
            timeout: Some(f64::from(rng.u32(300..=1000)) / 1000.0),
            reset: true,
            ..base
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn draws_depend_only_on_seed_and_index() {
        let a: Vec<_> = (0..2000).map(|i| draw(7, i, 100)).collect();
        let b: Vec<_> = (0..2000).map(|i| draw(7, i, 100)).collect();
        let c: Vec<_> = (0..2000).map(|i| draw(8, i, 100)).collect();
        assert_eq!(a, b);
        assert_ne!(a, c);
    }

    #[test]
    fn the_mix_has_every_behaviour_in_roughly_its_share() {
        let calls: Vec<_> = (0..100_000).map(|i| draw(1, i, 100)).collect();
        let share = |f: &dyn Fn(&Call) -> bool| calls.iter().filter(|c| f(c)).count();
        let normal = share(&|c| c.well_behaved());
        assert!((74_000..78_000).contains(&normal), "{normal}");
        let stalls = share(&|c| matches!(c.behaviour, Behaviour::Stall { .. }));
        assert!((9_000..11_000).contains(&stalls), "{stalls}");
        let mid = share(&|c| matches!(c.behaviour, Behaviour::CancelMidStream { .. }));
        assert!((5_000..7_000).contains(&mid), "{mid}");
        assert_eq!(share(&|c| c.impatient), 20 * BURST_LEN as usize);
        // A stalled stream on the slow model cannot end before its
        // deadline at one token per millisecond.
        assert!(calls.iter().all(|c| {
            !(matches!(c.behaviour, Behaviour::Stall { .. }) && c.upstream == Upstream::Slow)
                || f64::from(c.max_tokens) / 1000.0 > c.timeout.expect("stalls have one") + 0.4
        }));
        let body: serde_json::Value =
            serde_json::from_slice(&calls[0].body("m")).expect("valid JSON");
        assert_eq!(body["model"], "m");
    }
}

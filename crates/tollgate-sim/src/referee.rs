//! The referee (SIM-2): request window, token window and concurrency cap,
//! as a pure struct driven by explicit instants.
//!
//! A request is charged once, at arrival: one request unit and its actual
//! tokens (prompt + the completion it will generate). It is admitted only if,
//! at that instant, both windows have room for it and a concurrency slot is
//! free; otherwise nothing is charged. The checks run in this order and the
//! first failing one names the cause:
//!
//! 1. tokens larger than the whole token limit ([`RejectCause::TooLarge`],
//!    waiting cannot help, no retry hint);
//! 2. the request window ([`RejectCause::Requests`]);
//! 3. the token window ([`RejectCause::Tokens`]);
//! 4. the concurrency cap ([`RejectCause::Concurrency`], no retry hint: the
//!    simulator cannot know when a slot frees).
//!
//! The retry hint of a window rejection is the instant both windows have room
//! for the request (if nothing else is admitted meanwhile), computed from the
//! logs: it is exact, never an estimate.
//!
//! Beyond that plain model, the referee can settle an admitted request's
//! token charge later ([`Referee::try_admit_settled`], [`Referee::settle`]),
//! charge a refusal ([`Referee::charge_refusal`]) and let a background
//! consumer spend from the same windows ([`Referee::try_background`]).

use std::time::Duration;

use tokio::time::Instant;

use crate::accounting::RefusalCharge;
use crate::window::{EntryId, Fit, SlidingWindow};

/// The limits the referee enforces.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Requests per window (`None` = unlimited).
    pub requests: Option<u64>,
    /// Tokens per window (`None` = unlimited).
    pub tokens: Option<u64>,
    /// Requests in progress at once (`None` = unlimited).
    pub concurrency: Option<u64>,
    /// Window length of both limits.
    pub window: Duration,
}

/// Why a request was refused with 429.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RejectCause {
    /// The request window is full.
    Requests,
    /// The token window is full.
    Tokens,
    /// The request alone needs more tokens than the whole token limit.
    TooLarge,
    /// All concurrency slots are taken.
    Concurrency,
}

/// State of one limited dimension, as sent in `x-ratelimit-*` headers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Dimension {
    /// The configured limit.
    pub limit: u64,
    /// What is left in the window (after this request's charge, if admitted).
    pub remaining: u64,
    /// Admitted: time until the window is empty again ("resets to its initial
    /// state"). Rejected: time until this request would fit in this
    /// dimension (zero if it fits now).
    pub reset: Duration,
}

/// The `x-ratelimit-*` view of both dimensions; `None` where unlimited.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RateState {
    /// The request dimension.
    pub requests: Option<Dimension>,
    /// The token dimension.
    pub tokens: Option<Dimension>,
}

/// A refused request: nothing was charged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rejection {
    /// The first limit that failed.
    pub cause: RejectCause,
    /// When the request would be admitted if retried unchanged and nothing
    /// else is admitted meanwhile; `None` when unknowable or never.
    pub retry_after: Option<Duration>,
    /// Header view at the instant of the rejection.
    pub state: RateState,
}

/// Windows and concurrency of one simulated account.
#[derive(Debug, Clone)]
pub struct Referee {
    limits: Limits,
    requests: SlidingWindow,
    tokens: SlidingWindow,
    /// Requests admitted and not yet finished. Not reset by
    /// [`clear`](Self::clear): the requests are still running.
    active: u64,
    max_active: u64,
    charged_requests: u64,
    charged_tokens: u64,
    background: Background,
    refused_requests_charged: u64,
    refused_tokens_charged: u64,
    reconciled: u64,
    /// How many times [`clear`](Self::clear) ran (a ticket from before the
    /// last one settles nothing).
    cleared: u64,
}

/// What the background consumer spent and skipped.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Background {
    /// Request units spent.
    pub requests: u64,
    /// Tokens spent.
    pub tokens: u64,
    /// Ticks skipped because the windows had no room for them.
    pub skipped: u64,
}

/// The token window entry of a request admitted by
/// [`Referee::try_admit_settled`], to settle with [`Referee::settle`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ticket {
    entry: EntryId,
    charged: u64,
    /// The referee's [`clear`](Referee::clear) count when it was charged.
    cleared: u64,
}

impl Referee {
    /// A referee with empty windows.
    pub fn new(limits: Limits) -> Self {
        Self {
            limits,
            requests: SlidingWindow::new(limits.window),
            tokens: SlidingWindow::new(limits.window),
            active: 0,
            max_active: 0,
            charged_requests: 0,
            charged_tokens: 0,
            background: Background::default(),
            refused_requests_charged: 0,
            refused_tokens_charged: 0,
            reconciled: 0,
            cleared: 0,
        }
    }

    /// The limits enforced.
    pub fn limits(&self) -> Limits {
        self.limits
    }

    /// Decides whether a request of `tokens` tokens arriving at `now` would be
    /// admitted, without charging anything.
    pub fn check(&mut self, now: Instant, tokens: u64) -> Result<(), Rejection> {
        let request_fit = match self.limits.requests {
            Some(limit) => self.requests.wait_for(now, 1, limit),
            None => Fit::Now,
        };
        let token_fit = match self.limits.tokens {
            Some(limit) => self.tokens.wait_for(now, tokens, limit),
            None => Fit::Now,
        };
        let cause = if token_fit == Fit::Never {
            Some(RejectCause::TooLarge)
        } else if request_fit != Fit::Now {
            Some(RejectCause::Requests)
        } else if token_fit != Fit::Now {
            Some(RejectCause::Tokens)
        } else if self
            .limits
            .concurrency
            .is_some_and(|cap| self.active >= cap)
        {
            Some(RejectCause::Concurrency)
        } else {
            None
        };
        let Some(cause) = cause else {
            return Ok(());
        };
        let wait = |fit: Fit| match fit {
            Fit::Now => Some(Duration::ZERO),
            Fit::At(at) => Some(at.saturating_duration_since(now)),
            Fit::Never => None,
        };
        let retry_after = match cause {
            RejectCause::Requests | RejectCause::Tokens => {
                match (wait(request_fit), wait(token_fit)) {
                    (Some(r), Some(t)) => Some(r.max(t)),
                    _ => None,
                }
            }
            RejectCause::TooLarge | RejectCause::Concurrency => None,
        };
        let state = RateState {
            requests: self.limits.requests.map(|limit| Dimension {
                limit,
                remaining: limit.saturating_sub(self.requests.used(now)),
                reset: wait(request_fit).unwrap_or(Duration::ZERO),
            }),
            tokens: self.limits.tokens.map(|limit| Dimension {
                limit,
                remaining: limit.saturating_sub(self.tokens.used(now)),
                reset: match wait(token_fit) {
                    Some(d) => d,
                    None => self.tokens.until_empty(now),
                },
            }),
        };
        Err(Rejection {
            cause,
            retry_after,
            state,
        })
    }

    /// Checks and, if admitted, charges one request unit and `tokens` tokens
    /// at `now` and takes a concurrency slot; the caller must call
    /// [`release`](Self::release) exactly once when the request ends.
    pub fn try_admit(&mut self, now: Instant, tokens: u64) -> Result<RateState, Rejection> {
        self.check(now, tokens)?;
        self.requests.record(now, 1);
        self.tokens.record(now, tokens);
        self.charged_requests += 1;
        self.charged_tokens = self.charged_tokens.saturating_add(tokens);
        self.active += 1;
        self.max_active = self.max_active.max(self.active);
        Ok(self.state(now))
    }

    /// Like [`try_admit`](Self::try_admit), but the token charge gets its own
    /// window entry (even when zero) whose amount [`settle`](Self::settle)
    /// can later replace.
    pub fn try_admit_settled(
        &mut self,
        now: Instant,
        tokens: u64,
    ) -> Result<(RateState, Ticket), Rejection> {
        self.check(now, tokens)?;
        self.requests.record(now, 1);
        let entry = self.tokens.record_entry(now, tokens);
        self.charged_requests += 1;
        self.charged_tokens = self.charged_tokens.saturating_add(tokens);
        self.active += 1;
        self.max_active = self.max_active.max(self.active);
        Ok((
            self.state(now),
            Ticket {
                entry,
                charged: tokens,
                cleared: self.cleared,
            },
        ))
    }

    /// Takes a concurrency slot, if the cap allows, for a request that
    /// another limiter admitted (the Anthropic buckets of
    /// [`crate::anthropic::limits`]): the cap is the account's, shared by
    /// every route. The caller must [`release`](Self::release) it exactly
    /// once. Returns whether a slot was taken.
    pub fn try_occupy(&mut self) -> bool {
        if self
            .limits
            .concurrency
            .is_some_and(|cap| self.active >= cap)
        {
            return false;
        }
        self.active += 1;
        self.max_active = self.max_active.max(self.active);
        true
    }

    /// Replaces the token charge of `ticket` by `actual` in its window entry
    /// (which keeps its counting instant). When the entry has already left
    /// the window only the counters change. The window may go above its
    /// limit when `actual` exceeds the charge (later requests then wait).
    pub fn settle(&mut self, now: Instant, ticket: Ticket, actual: u64) {
        // A request charged before a `/reset` settles nothing after it: its
        // charge is not in the counters any more.
        if ticket.cleared != self.cleared {
            return;
        }
        self.tokens.adjust(now, ticket.entry, actual);
        self.charged_tokens = self
            .charged_tokens
            .saturating_sub(ticket.charged)
            .saturating_add(actual);
        self.reconciled += 1;
    }

    /// Charges a refused request as `mode` says (the refusal was returned by
    /// [`check`](Self::check) at `now` for a charge of `tokens`), and returns
    /// the refusal with its hint and header view recomputed after that
    /// charge; the cause is kept. The charge is recorded without a limit
    /// check: it can leave a window above its limit.
    pub fn charge_refusal(
        &mut self,
        now: Instant,
        tokens: u64,
        mode: RefusalCharge,
        rejection: Rejection,
    ) -> Rejection {
        let paid = match (mode, rejection.cause) {
            (RefusalCharge::None, _) => return rejection,
            (RefusalCharge::Requests, _) | (RefusalCharge::All, RejectCause::TooLarge) => 0,
            (RefusalCharge::All, _) => tokens,
        };
        self.requests.record(now, 1);
        self.tokens.record(now, paid);
        self.refused_requests_charged += 1;
        self.refused_tokens_charged = self.refused_tokens_charged.saturating_add(paid);
        match self.check(now, tokens) {
            Err(after) => Rejection {
                cause: rejection.cause,
                retry_after: match rejection.cause {
                    RejectCause::Requests | RejectCause::Tokens => after.retry_after,
                    RejectCause::TooLarge | RejectCause::Concurrency => None,
                },
                state: after.state,
            },
            // Not reachable (the refusal's cause still holds after charging
            // more), but the original refusal is a safe answer.
            Ok(()) => rejection,
        }
    }

    /// Lets the background consumer spend one request unit and `tokens`
    /// tokens at `now` if both windows have room for all of it; otherwise
    /// nothing is spent and the tick counts as skipped. Concurrency is not
    /// involved. Returns whether it was spent.
    pub fn try_background(&mut self, now: Instant, tokens: u64) -> bool {
        let fits = |window: &mut SlidingWindow, limit: Option<u64>, amount: u64| {
            limit.is_none_or(|limit| window.wait_for(now, amount, limit) == Fit::Now)
        };
        if !(fits(&mut self.requests, self.limits.requests, 1)
            && fits(&mut self.tokens, self.limits.tokens, tokens))
        {
            self.background.skipped += 1;
            return false;
        }
        self.requests.record(now, 1);
        self.tokens.record(now, tokens);
        self.background.requests += 1;
        self.background.tokens = self.background.tokens.saturating_add(tokens);
        true
    }

    /// What the background consumer spent and skipped.
    pub fn background(&self) -> Background {
        self.background
    }

    /// Refused requests charged a request unit (by the refusal charge mode).
    pub fn refused_requests_charged(&self) -> u64 {
        self.refused_requests_charged
    }

    /// Tokens charged for refused requests.
    pub fn refused_tokens_charged(&self) -> u64 {
        self.refused_tokens_charged
    }

    /// Admitted requests whose token charge was settled.
    pub fn reconciled(&self) -> u64 {
        self.reconciled
    }

    /// Gives back the concurrency slot of an admitted request.
    pub fn release(&mut self) {
        self.active = self.active.saturating_sub(1);
    }

    /// Header view at `now` for a request that was admitted (or not
    /// subject to the referee).
    pub fn state(&mut self, now: Instant) -> RateState {
        RateState {
            requests: self.limits.requests.map(|limit| Dimension {
                limit,
                remaining: limit.saturating_sub(self.requests.used(now)),
                reset: self.requests.until_empty(now),
            }),
            tokens: self.limits.tokens.map(|limit| Dimension {
                limit,
                remaining: limit.saturating_sub(self.tokens.used(now)),
                reset: self.tokens.until_empty(now),
            }),
        }
    }

    /// Empties both windows and zeroes the counters; requests in progress
    /// stay counted as active (they still hold their slot), and the maximum
    /// concurrency seen restarts from that number.
    pub fn clear(&mut self) {
        self.requests.clear();
        self.tokens.clear();
        self.max_active = self.active;
        self.charged_requests = 0;
        self.charged_tokens = 0;
        self.background = Background::default();
        self.refused_requests_charged = 0;
        self.refused_tokens_charged = 0;
        self.reconciled = 0;
        self.cleared += 1;
    }

    /// Requests in progress.
    pub fn active(&self) -> u64 {
        self.active
    }

    /// The most requests ever in progress at once.
    pub fn max_active(&self) -> u64 {
        self.max_active
    }

    /// Client requests charged so far (admitted ones; not the background
    /// consumer, not charged refusals).
    pub fn charged_requests(&self) -> u64 {
        self.charged_requests
    }

    /// Client tokens charged so far (admitted ones, after settlement).
    pub fn charged_tokens(&self) -> u64 {
        self.charged_tokens
    }

    /// The most requests ever admitted inside one window (tracked even when
    /// the request limit is unlimited), counting everything the window holds:
    /// client requests, charged refusals and the background consumer.
    pub fn max_requests_in_window(&self) -> u64 {
        self.requests.max_used()
    }

    /// The most tokens ever charged inside one window (tracked even when the
    /// token limit is unlimited).
    pub fn max_tokens_in_window(&self) -> u64 {
        self.tokens.max_used()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const W: Duration = Duration::from_secs(60);

    fn limits(requests: Option<u64>, tokens: Option<u64>, concurrency: Option<u64>) -> Limits {
        Limits {
            requests,
            tokens,
            concurrency,
            window: W,
        }
    }

    // proves: SIM-2
    #[test]
    fn the_first_request_over_rpm_is_rejected_with_an_exact_hint() {
        let t0 = Instant::now();
        let mut r = Referee::new(limits(Some(2), None, None));
        r.try_admit(t0, 10).expect("first");
        r.release();
        let state = r
            .try_admit(t0 + Duration::from_secs(15), 10)
            .expect("second");
        r.release();
        assert_eq!(
            state.requests,
            Some(Dimension {
                limit: 2,
                remaining: 0,
                reset: W,
            })
        );
        let at = t0 + Duration::from_millis(20_500);
        let rej = r.try_admit(at, 10).expect_err("third is over");
        assert_eq!(rej.cause, RejectCause::Requests);
        // The first request leaves at t0 + 60 s, 39.5 s later.
        assert_eq!(rej.retry_after, Some(Duration::from_millis(39_500)));
        assert_eq!(
            rej.state.requests,
            Some(Dimension {
                limit: 2,
                remaining: 0,
                reset: Duration::from_millis(39_500),
            })
        );
        assert_eq!(rej.state.tokens, None);
        // Nothing was charged by the rejection.
        assert_eq!(r.charged_requests(), 2);
        assert_eq!(r.charged_tokens(), 20);
        // Just before the slide it is still refused, at the instant admitted.
        assert!(r.try_admit(t0 + W - Duration::from_nanos(1), 10).is_err());
        assert!(r.try_admit(t0 + W, 10).is_ok());
        assert_eq!(r.max_requests_in_window(), 2);
    }

    // proves: SIM-2
    #[test]
    fn the_first_request_over_tpm_is_rejected_and_too_large_never_fits() {
        let t0 = Instant::now();
        let mut r = Referee::new(limits(Some(100), Some(100), None));
        r.try_admit(t0, 60).expect("60 of 100");
        r.try_admit(t0 + Duration::from_secs(1), 30)
            .expect("90 of 100");
        r.try_admit(t0 + Duration::from_secs(2), 10)
            .expect("exactly 100 of 100");
        let rej = r
            .try_admit(t0 + Duration::from_secs(3), 1)
            .expect_err("101 > 100");
        assert_eq!(rej.cause, RejectCause::Tokens);
        assert_eq!(rej.retry_after, Some(Duration::from_secs(57)));
        let tokens = rej.state.tokens.expect("limited");
        assert_eq!((tokens.limit, tokens.remaining), (100, 0));
        assert_eq!(tokens.reset, Duration::from_secs(57));
        // The request dimension had room: its reset is zero.
        assert_eq!(
            rej.state.requests.map(|d| (d.remaining, d.reset)),
            Some((97, Duration::ZERO))
        );

        let rej = r
            .try_admit(t0 + Duration::from_secs(3), 101)
            .expect_err("never fits");
        assert_eq!(rej.cause, RejectCause::TooLarge);
        assert_eq!(rej.retry_after, None);
        assert_eq!(r.max_tokens_in_window(), 100);
    }

    // proves: SIM-2
    #[test]
    fn the_hint_waits_for_both_windows() {
        let t0 = Instant::now();
        let mut r = Referee::new(limits(Some(2), Some(100), None));
        r.try_admit(t0, 5).expect("first");
        r.try_admit(t0 + Duration::from_secs(30), 90)
            .expect("second");
        // At t0+40 the request slot frees at t0+60 (20 s), but 20 more tokens
        // need both entries gone: t0+90 (50 s). The hint is the later one.
        let rej = r
            .try_admit(t0 + Duration::from_secs(40), 20)
            .expect_err("full");
        assert_eq!(rej.cause, RejectCause::Requests);
        assert_eq!(
            rej.state.requests.map(|d| d.reset),
            Some(Duration::from_secs(20))
        );
        assert_eq!(
            rej.state.tokens.map(|d| d.reset),
            Some(Duration::from_secs(50))
        );
        assert_eq!(rej.retry_after, Some(Duration::from_secs(50)));
    }

    // proves: SIM-2
    #[test]
    fn concurrency_cap_is_enforced_and_released() {
        let t0 = Instant::now();
        let mut r = Referee::new(limits(None, None, Some(2)));
        r.try_admit(t0, 1).expect("one");
        r.try_admit(t0, 1).expect("two");
        let rej = r.try_admit(t0, 1).expect_err("three");
        assert_eq!(rej.cause, RejectCause::Concurrency);
        assert_eq!(rej.retry_after, None);
        assert_eq!(rej.state, RateState::default());
        r.release();
        r.try_admit(t0, 1).expect("a slot was released");
        assert_eq!((r.active(), r.max_active()), (2, 2));
    }

    #[test]
    fn clear_keeps_active_requests() {
        let t0 = Instant::now();
        let mut r = Referee::new(limits(Some(1), Some(10), Some(5)));
        r.try_admit(t0, 10).expect("one");
        r.clear();
        assert_eq!(r.active(), 1);
        assert_eq!(r.max_active(), 1);
        assert_eq!(r.charged_tokens(), 0);
        assert_eq!(r.max_requests_in_window(), 0);
        r.try_admit(t0, 10).expect("the window is empty again");
    }

    // proves: SIM-2 (what a refusal costs per mode; Q-16)
    #[test]
    fn refusals_are_charged_as_the_mode_says() {
        let t0 = Instant::now();
        for (mode, units, tokens) in [
            (RefusalCharge::None, 0, 0),
            (RefusalCharge::Requests, 1, 0),
            (RefusalCharge::All, 1, 30),
        ] {
            let mut r = Referee::new(limits(Some(2), Some(100), None));
            r.try_admit(t0, 80).expect("80 of 100");
            let rej = r.check(t0, 30).expect_err("110 > 100");
            assert_eq!(rej.cause, RejectCause::Tokens);
            let rej = r.charge_refusal(t0, 30, mode, rej);
            assert_eq!(rej.cause, RejectCause::Tokens);
            assert_eq!(r.refused_requests_charged(), units);
            assert_eq!(r.refused_tokens_charged(), tokens);
            let state = rej.state;
            assert_eq!(state.requests.map(|d| d.remaining), Some(1 - units));
            assert_eq!(
                state.tokens.map(|d| d.remaining),
                Some(20u64.saturating_sub(tokens))
            );
            // The hint is recomputed after the charge: both entries (80 and
            // the refusal's own 30) must leave when the refusal paid tokens.
            assert_eq!(rej.retry_after, Some(W));
            assert_eq!(r.charged_requests(), 1);
            assert_eq!(r.charged_tokens(), 80);
        }
        // A too-large refusal never pays its tokens, only its request unit.
        let mut r = Referee::new(limits(Some(5), Some(100), None));
        let rej = r.check(t0, 500).expect_err("too large");
        let rej = r.charge_refusal(t0, 500, RefusalCharge::All, rej);
        assert_eq!((rej.cause, rej.retry_after), (RejectCause::TooLarge, None));
        assert_eq!(
            (r.refused_requests_charged(), r.refused_tokens_charged()),
            (1, 0)
        );
        assert_eq!(rej.state.requests.map(|d| d.remaining), Some(4));
    }

    // proves: SIM-2 (the background consumer spends from the same windows, never beyond them)
    #[test]
    fn the_background_consumer_shares_the_windows_and_skips_when_full() {
        let t0 = Instant::now();
        let mut r = Referee::new(limits(Some(3), Some(100), Some(1)));
        r.try_admit(t0, 50).expect("client");
        // The concurrency cap does not apply to the consumer.
        assert!(r.try_background(t0, 40));
        assert!(!r.try_background(t0, 20), "60 more tokens do not fit");
        assert!(r.try_background(t0, 10));
        assert!(!r.try_background(t0, 0), "no request unit left");
        assert_eq!(
            r.background(),
            Background {
                requests: 2,
                tokens: 50,
                skipped: 2
            }
        );
        assert_eq!((r.charged_requests(), r.charged_tokens()), (1, 50));
        let state = r.state(t0);
        assert_eq!(state.requests.map(|d| d.remaining), Some(0));
        assert_eq!(state.tokens.map(|d| d.remaining), Some(0));
        assert_eq!(r.max_tokens_in_window(), 100);
    }

    // proves: SIM-2 (reconciliation replaces the charge in the same entry; Q-16)
    #[test]
    fn settling_replaces_the_charge_in_its_entry() {
        let t0 = Instant::now();
        let mut r = Referee::new(limits(None, Some(100), None));
        let (state, ticket) = r.try_admit_settled(t0, 90).expect("90 of 100");
        assert_eq!(state.tokens.map(|d| d.remaining), Some(10));
        r.release();
        r.settle(t0 + Duration::from_secs(1), ticket, 30);
        assert_eq!(r.charged_tokens(), 30);
        assert_eq!(r.reconciled(), 1);
        let later = t0 + Duration::from_secs(2);
        assert_eq!(r.state(later).tokens.map(|d| d.remaining), Some(70));
        // The settled entry still leaves at its counting instant + W.
        r.try_admit(later, 70).expect("exactly full");
        let rej = r.check(later, 1).expect_err("full");
        assert_eq!(rej.retry_after, Some(W - Duration::from_secs(2)));
    }

    #[test]
    fn unlimited_dimensions_still_track_the_maximum() {
        let t0 = Instant::now();
        let mut r = Referee::new(limits(None, None, None));
        for i in 0..5 {
            r.try_admit(t0 + Duration::from_secs(i * 20), 7)
                .expect("unlimited");
            r.release();
        }
        // At most three arrivals (0, 20, 40 s) share one 60 s window.
        assert_eq!(r.max_requests_in_window(), 3);
        assert_eq!(r.max_tokens_in_window(), 21);
        assert_eq!(r.state(t0), RateState::default());
    }
}

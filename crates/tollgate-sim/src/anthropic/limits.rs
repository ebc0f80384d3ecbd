//! The Anthropic account's own limits: requests, input tokens (ITPM) and
//! output tokens (OTPM) per period, each a [`TokenBucket`], separate from
//! the OpenAI-style sliding windows of [`crate::referee`].
//!
//! Admission of a request with input count `i` and `max_tokens` `m` at `t`
//! takes, all or nothing, 1 from the request bucket, `i` from the input
//! bucket and `m` from the output bucket. When its response ends the unused
//! output allowance (`m` minus the tokens generated) goes back to the output
//! bucket ([`MessagesLimits::refund_output`]): OTPM is "estimated from
//! `max_tokens` at the start and adjusted at the end", as Anthropic
//! documents. Input is counted exactly at admission and never adjusted.
//!
//! Check order, the first failing one naming the cause: an amount larger
//! than its whole bucket ([`MessagesCause::TooLarge`], never fits, no retry
//! hint), requests, input tokens, output tokens. The concurrency cap is the
//! account's ([`crate::referee::Referee`]) and is checked by the caller
//! after these, under the same lock.

use std::time::Duration;

use tokio::time::Instant;

use super::bucket::TokenBucket;
use crate::window::Fit;

/// The limits of `POST /v1/messages`; `None` = unlimited.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MessagesLimitConfig {
    /// Requests per period.
    pub requests: Option<u64>,
    /// Input tokens per period (ITPM).
    pub input_tokens: Option<u64>,
    /// Output tokens per period (OTPM).
    pub output_tokens: Option<u64>,
    /// The replenishment period (a full bucket refills over it).
    pub period: Duration,
}

/// Why a Messages request was refused with 429.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MessagesCause {
    /// The request bucket is empty.
    Requests,
    /// The input-token bucket lacks room for the request's input.
    InputTokens,
    /// The output-token bucket lacks room for the request's `max_tokens`.
    OutputTokens,
    /// The input count or `max_tokens` is larger than its whole bucket.
    TooLarge,
    /// All concurrency slots are taken (the account's cap).
    Concurrency,
}

/// One bucket's view for the `anthropic-ratelimit-*` headers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BucketState {
    /// The configured limit.
    pub limit: u64,
    /// Whole units left now (after this request's charge, if admitted).
    pub remaining: u64,
    /// Time until the bucket is full again.
    pub reset: Duration,
}

/// The header view of the three buckets; `None` where unlimited.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct MessagesState {
    /// The request bucket.
    pub requests: Option<BucketState>,
    /// The input-token bucket.
    pub input_tokens: Option<BucketState>,
    /// The output-token bucket.
    pub output_tokens: Option<BucketState>,
}

/// A refused Messages request: nothing was taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MessagesRejection {
    /// The first limit that failed.
    pub cause: MessagesCause,
    /// When all three buckets have room for the request if nothing else is
    /// taken meanwhile; `None` when it never fits or is unknowable.
    pub retry_after: Option<Duration>,
    /// Header view at the instant of the rejection.
    pub state: MessagesState,
}

/// The three buckets and what they charged.
#[derive(Debug, Clone)]
pub struct MessagesLimits {
    config: MessagesLimitConfig,
    requests: Option<TokenBucket>,
    input: Option<TokenBucket>,
    output: Option<TokenBucket>,
    charged_requests: u64,
    input_charged: u64,
    output_charged: u64,
    output_refunded: u64,
}

impl MessagesLimits {
    /// Full buckets.
    pub fn new(config: MessagesLimitConfig) -> Self {
        let bucket = |limit: Option<u64>| limit.map(|c| TokenBucket::new(c, config.period));
        Self {
            config,
            requests: bucket(config.requests),
            input: bucket(config.input_tokens),
            output: bucket(config.output_tokens),
            charged_requests: 0,
            input_charged: 0,
            output_charged: 0,
            output_refunded: 0,
        }
    }

    /// The limits enforced.
    pub fn config(&self) -> MessagesLimitConfig {
        self.config
    }

    /// Whether a request of `input` input tokens and an output allowance of
    /// `output` fits at `now`, without taking anything.
    pub fn check(
        &mut self,
        now: Instant,
        input: u64,
        output: u64,
    ) -> Result<(), MessagesRejection> {
        let fit = |bucket: &mut Option<TokenBucket>, amount: u64| match bucket {
            Some(b) => b.wait_for(now, amount),
            None => Fit::Now,
        };
        let requests = fit(&mut self.requests, 1);
        let input_fit = fit(&mut self.input, input);
        let output_fit = fit(&mut self.output, output);
        let cause = if input_fit == Fit::Never || output_fit == Fit::Never {
            MessagesCause::TooLarge
        } else if requests != Fit::Now {
            MessagesCause::Requests
        } else if input_fit != Fit::Now {
            MessagesCause::InputTokens
        } else if output_fit != Fit::Now {
            MessagesCause::OutputTokens
        } else {
            return Ok(());
        };
        let wait = |fit: Fit| match fit {
            Fit::Now => Some(Duration::ZERO),
            Fit::At(at) => Some(at.saturating_duration_since(now)),
            Fit::Never => None,
        };
        let retry_after = match (wait(requests), wait(input_fit), wait(output_fit)) {
            (Some(r), Some(i), Some(o)) => Some(r.max(i).max(o)),
            _ => None,
        };
        Err(MessagesRejection {
            cause,
            retry_after,
            state: self.state(now),
        })
    }

    /// Checks and, if the request fits, takes 1 request, `input` input
    /// tokens and `output` output tokens at `now`.
    pub fn try_admit(
        &mut self,
        now: Instant,
        input: u64,
        output: u64,
    ) -> Result<MessagesState, MessagesRejection> {
        self.check(now, input, output)?;
        for (bucket, amount) in [
            (&mut self.requests, 1),
            (&mut self.input, input),
            (&mut self.output, output),
        ] {
            if let Some(b) = bucket {
                b.take(now, amount);
            }
        }
        self.charged_requests += 1;
        self.input_charged = self.input_charged.saturating_add(input);
        self.output_charged = self.output_charged.saturating_add(output);
        Ok(self.state(now))
    }

    /// Gives back `amount` of an admitted request's output allowance at
    /// `now` (never above the bucket's capacity).
    pub fn refund_output(&mut self, now: Instant, amount: u64) {
        if let Some(b) = &mut self.output {
            b.give(now, amount);
        }
        self.output_charged = self.output_charged.saturating_sub(amount);
        self.output_refunded = self.output_refunded.saturating_add(amount);
    }

    /// Header view at `now`.
    pub fn state(&mut self, now: Instant) -> MessagesState {
        let view = |bucket: &mut Option<TokenBucket>| {
            bucket.as_mut().map(|b| BucketState {
                limit: b.capacity(),
                remaining: b.available(now),
                reset: b.until_full(now),
            })
        };
        MessagesState {
            requests: view(&mut self.requests),
            input_tokens: view(&mut self.input),
            output_tokens: view(&mut self.output),
        }
    }

    /// Refills every bucket and zeroes the counters.
    pub fn clear(&mut self) {
        for b in [&mut self.requests, &mut self.input, &mut self.output]
            .into_iter()
            .flatten()
        {
            b.clear();
        }
        self.charged_requests = 0;
        self.input_charged = 0;
        self.output_charged = 0;
        self.output_refunded = 0;
    }

    /// Requests admitted.
    pub fn charged_requests(&self) -> u64 {
        self.charged_requests
    }

    /// Input tokens taken by admitted requests.
    pub fn input_charged(&self) -> u64 {
        self.input_charged
    }

    /// Output tokens taken by admitted requests, after refunds.
    pub fn output_charged(&self) -> u64 {
        self.output_charged
    }

    /// Output allowance given back when responses ended.
    pub fn output_refunded(&self) -> u64 {
        self.output_refunded
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const P: Duration = Duration::from_secs(60);

    fn limits(r: Option<u64>, i: Option<u64>, o: Option<u64>) -> MessagesLimits {
        MessagesLimits::new(MessagesLimitConfig {
            requests: r,
            input_tokens: i,
            output_tokens: o,
            period: P,
        })
    }

    // proves: SIM-2 (ITPM and OTPM bind separately and name their cause)
    #[test]
    fn each_dimension_binds_with_its_own_cause_and_an_exact_hint() {
        let t0 = Instant::now();
        let mut l = limits(Some(10), Some(600), Some(120));
        l.try_admit(t0, 540, 60).expect("fits");
        let rej = l.check(t0, 120, 10).expect_err("input over");
        assert_eq!(rej.cause, MessagesCause::InputTokens);
        // 60 left, 120 needed: 60 more at 10/s = 6 s.
        assert_eq!(rej.retry_after, Some(Duration::from_secs(6)));
        assert_eq!(rej.state.input_tokens.map(|s| s.remaining), Some(60));
        let rej = l.check(t0, 10, 100).expect_err("output over");
        assert_eq!(rej.cause, MessagesCause::OutputTokens);
        // 60 left, 100 needed: 40 more at 2/s = 20 s.
        assert_eq!(rej.retry_after, Some(Duration::from_secs(20)));
        // The refund of unused output makes room at once.
        l.refund_output(t0, 50);
        l.try_admit(t0, 10, 100).expect("fits after the refund");
        assert_eq!(
            (l.input_charged(), l.output_charged(), l.output_refunded()),
            (550, 110, 50)
        );
        let rej = l.check(t0, 601, 1).expect_err("never");
        assert_eq!(
            (rej.cause, rej.retry_after),
            (MessagesCause::TooLarge, None)
        );
        let rej = l.check(t0, 1, 121).expect_err("never");
        assert_eq!(rej.cause, MessagesCause::TooLarge);
    }

    // proves: SIM-2 (the request bucket is checked first; the hint waits for every bucket)
    #[test]
    fn the_hint_waits_for_every_bucket() {
        let t0 = Instant::now();
        let mut l = limits(Some(1), Some(60), None);
        l.try_admit(t0, 60, 5).expect("fits");
        let rej = l.check(t0, 30, 5).expect_err("over");
        assert_eq!(rej.cause, MessagesCause::Requests);
        // A request back in 60 s; 30 input tokens back in 30 s.
        assert_eq!(rej.retry_after, Some(P));
        assert_eq!(rej.state.output_tokens, None);
        assert!(l.try_admit(t0 + P, 30, 5).is_ok());
        l.clear();
        assert_eq!(l.state(t0 + P).requests.map(|s| s.remaining), Some(1));
    }
}

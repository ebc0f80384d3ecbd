//! Token estimation before admission (SPEC ).
//!
//! When a scope has a token limit, every attempt reserves an estimate of
//! its input plus expected output. Estimators come in a synchronous and an
//! asynchronous form; both report failure as an [`EstimateError`], which
//! admission turns into the non-retryable `TokenEstimationFailed` before any
//! provider work.

use std::future::Future;

use crate::call::{Call, TokenEstimate};
use crate::error::AdmissionError;

/// The estimator failed or produced an invalid estimate.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{reason}")]
pub struct EstimateError {
    /// What went wrong (never the prompt itself).
    pub reason: String,
}

impl EstimateError {
    /// An error with `reason`.
    pub fn new(reason: impl Into<String>) -> Self {
        EstimateError {
            reason: reason.into(),
        }
    }
}

/// Estimates the tokens of a request of type `R`.
pub trait TokenEstimator<R: ?Sized>: Send + Sync {
    /// Input and expected output tokens of `request`.
    fn estimate(&self, request: &R) -> Result<TokenEstimate, EstimateError>;
}

/// Estimates the tokens of a request of type `R` asynchronously (e.g. with
/// a remote tokenizer).
pub trait AsyncTokenEstimator<R: ?Sized>: Send + Sync {
    /// Input and expected output tokens of `request`.
    fn estimate(
        &self,
        request: &R,
    ) -> impl Future<Output = Result<TokenEstimate, EstimateError>> + Send;
}

impl<R: ?Sized, F> TokenEstimator<R> for F
where
    F: Fn(&R) -> Result<TokenEstimate, EstimateError> + Send + Sync + ?Sized,
{
    fn estimate(&self, request: &R) -> Result<TokenEstimate, EstimateError> {
        self(request)
    }
}

/// A shared estimator estimates like the one it shares, so one estimator
/// can serve several supervisors or layers.
impl<R: ?Sized, E: TokenEstimator<R> + ?Sized> TokenEstimator<R> for std::sync::Arc<E> {
    fn estimate(&self, request: &R) -> Result<TokenEstimate, EstimateError> {
        (**self).estimate(request)
    }
}

/// Checks an estimate before it is reserved: its total must be
/// representable.
pub fn validate(estimate: TokenEstimate) -> Result<TokenEstimate, EstimateError> {
    if estimate.input.checked_add(estimate.output).is_none() {
        return Err(EstimateError::new(
            "estimate overflows a 64-bit token count",
        ));
    }
    Ok(estimate)
}

impl From<EstimateError> for AdmissionError {
    fn from(e: EstimateError) -> Self {
        AdmissionError::TokenEstimationFailed { reason: e.reason }
    }
}

impl Call {
    /// Sets the estimate `estimator` gives for `request` (SPEC:
    /// call it again for every attempt). A failing or invalid estimate is
    /// `TokenEstimationFailed`, raised before any provider work.
    pub fn estimated<R: ?Sized>(
        self,
        estimator: &(impl TokenEstimator<R> + ?Sized),
        request: &R,
    ) -> Result<Call, AdmissionError> {
        let estimate = validate(estimator.estimate(request)?)?;
        Ok(self.with_estimate(estimate))
    }

    /// Like [`estimated`](Call::estimated) with an asynchronous estimator.
    pub async fn estimated_async<R: ?Sized>(
        self,
        estimator: &(impl AsyncTokenEstimator<R> + ?Sized),
        request: &R,
    ) -> Result<Call, AdmissionError> {
        let estimate = validate(estimator.estimate(request).await?)?;
        Ok(self.with_estimate(estimate))
    }
}

/// Approximates tokens from text length: `ceil(chars / chars_per_token)`
/// input tokens plus a fixed output allowance.
///
/// Approximate by nature; prefer a real tokenizer (the OpenAI layer has
/// one) when accuracy matters.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CharRatioEstimator {
    chars_per_token: f64,
    output_tokens: u64,
}

impl CharRatioEstimator {
    /// `chars_per_token` must be finite and positive; `output_tokens` is
    /// the output allowance of every request.
    pub fn new(chars_per_token: f64, output_tokens: u64) -> Result<Self, EstimateError> {
        if !(chars_per_token.is_finite() && chars_per_token > 0.0) {
            return Err(EstimateError::new(
                "chars_per_token must be a positive number",
            ));
        }
        Ok(CharRatioEstimator {
            chars_per_token,
            output_tokens,
        })
    }

    /// Input tokens of `text`.
    pub fn input_tokens(&self, text: &str) -> u64 {
        let chars = text.chars().count() as f64;
        // Bounded: chars is at most usize::MAX, the ratio positive.
        (chars / self.chars_per_token).ceil() as u64
    }
}

impl Default for CharRatioEstimator {
    /// Four characters per token, 256 output tokens.
    fn default() -> Self {
        CharRatioEstimator {
            chars_per_token: 4.0,
            output_tokens: 256,
        }
    }
}

impl<T: AsRef<str> + ?Sized> TokenEstimator<T> for CharRatioEstimator {
    fn estimate(&self, request: &T) -> Result<TokenEstimate, EstimateError> {
        Ok(TokenEstimate::new(
            self.input_tokens(request.as_ref()),
            self.output_tokens,
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // proves: Q-3 (character-ratio estimate with a fixed output allowance)
    #[test]
    fn char_ratio_rounds_up_and_adds_the_allowance() {
        let e = CharRatioEstimator::new(4.0, 100).unwrap();
        assert_eq!(e.estimate("abcde").unwrap(), TokenEstimate::new(2, 100));
        assert_eq!(e.estimate("").unwrap(), TokenEstimate::new(0, 100));
        assert!(CharRatioEstimator::new(0.0, 1).is_err());
        assert!(CharRatioEstimator::new(f64::NAN, 1).is_err());
    }

    // proves: Q-3 (an invalid estimate is an estimation failure)
    #[test]
    fn overflowing_estimates_are_invalid() {
        assert!(validate(TokenEstimate::new(u64::MAX, 1)).is_err());
        assert!(validate(TokenEstimate::new(5, 6)).is_ok());
    }

    #[test]
    fn closures_are_estimators() {
        let f = |s: &str| Ok(TokenEstimate::new(s.len() as u64, 1));
        assert_eq!(
            TokenEstimator::<str>::estimate(&f, "abc").unwrap().total(),
            4
        );
    }
}

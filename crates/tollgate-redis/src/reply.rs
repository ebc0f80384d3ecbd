//! The scripts' replies, checked: anything unexpected is a
//! [`StoreError`], never a panic.

use tollgate::LimitedBy;
use tollgate::quota::{Observed, StoreError};

use crate::error::malformed;

/// What the reserve script answered, in the store's units.
#[doc(hidden)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RawReserve {
    /// Granted at the store's instant `tick` (µs since the scope's epoch)
    /// in the epoch tagged `tag`.
    Granted {
        /// The store's instant.
        tick: u64,
        /// The epoch's tag, carried as the reservation's `seq`.
        tag: u32,
    },
    /// Refused; fits no earlier than `wait` µs after the store's now
    /// (`None`: only a pending reservation's lease or refund frees room).
    Refused {
        /// The wait from the store's now, in µs.
        wait: Option<u64>,
        /// The short dimensions.
        limited_by: LimitedBy,
    },
}

pub(crate) fn reserve(reply: &[i64]) -> Result<RawReserve, StoreError> {
    match *reply {
        [1, tick, tag] => Ok(RawReserve::Granted {
            tick: instant(tick)?,
            tag: epoch_tag(tag)?,
        }),
        [0, wait, requests, tokens, input_tokens, output_tokens, cost] => Ok(RawReserve::Refused {
            wait: if wait < 0 { None } else { Some(instant(wait)?) },
            limited_by: LimitedBy {
                requests: requests != 0,
                tokens: tokens != 0,
                input_tokens: input_tokens != 0,
                output_tokens: output_tokens != 0,
                cost: cost != 0,
            },
        }),
        _ => Err(malformed("reserve")),
    }
}

/// What the lease script answered: the new instant and the epoch's tag,
/// or `None` when the hold was gone.
pub(crate) fn lease(reply: &[i64]) -> Result<Option<(u64, u32)>, StoreError> {
    match *reply {
        [-1] => Ok(None),
        [tick, tag] => Ok(Some((instant(tick)?, epoch_tag(tag)?))),
        _ => Err(malformed("lease")),
    }
}

/// An epoch's tag (1 ..= u32::MAX).
fn epoch_tag(v: i64) -> Result<u32, StoreError> {
    u32::try_from(v)
        .ok()
        .filter(|&t| t != 0)
        .ok_or_else(|| malformed("epoch tag"))
}

/// A store instant or duration (never negative).
pub(crate) fn instant(v: i64) -> Result<u64, StoreError> {
    u64::try_from(v).map_err(|_| malformed("negative instant"))
}

/// What the observe script answered: per report, units taken and given
/// back.
pub(crate) fn observed(reply: &[i64], reports: usize) -> Result<Vec<Observed>, StoreError> {
    if reply.len() != 2 * reports {
        return Err(malformed("observe"));
    }
    reply
        .chunks_exact(2)
        .map(|pair| {
            let units = |v: i64| u64::try_from(v).map_err(|_| malformed("observe"));
            Ok(Observed {
                gap: units(pair[0])?,
                freed: units(pair[1])?,
                ..Observed::default()
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    // proves: DQ-5 (a malformed reply is an error, not a panic)
    #[test]
    fn malformed_replies_are_errors() {
        assert!(reserve(&[]).is_err());
        assert!(reserve(&[1]).is_err());
        assert!(observed(&[1], 1).is_err());
        assert!(observed(&[-1, 0], 1).is_err());
        assert!(observed(&[0, 0], 2).is_err());
        assert!(reserve(&[1, -5]).is_err());
        assert!(reserve(&[2, 1, 0, 0, 0, 0]).is_err());
        assert!(reserve(&[0, 1, 0, 0]).is_err());
        assert_eq!(
            reserve(&[1, 7, 3]),
            Ok(RawReserve::Granted { tick: 7, tag: 3 })
        );
        assert!(reserve(&[1, 7]).is_err());
        assert!(reserve(&[1, 7, 0]).is_err());
        assert_eq!(lease(&[-1]), Ok(None));
        assert_eq!(lease(&[9, 4]), Ok(Some((9, 4))));
        assert!(lease(&[9]).is_err());
        assert!(lease(&[9, -4]).is_err());
        assert!(matches!(
            reserve(&[0, -1, 1, 0, 0, 0, 0]),
            Ok(RawReserve::Refused { wait: None, .. })
        ));
    }

    // proves: Q-12, BUD-2 (a refusal names each short dimension, input
    // and output tokens and a budget included)
    #[test]
    fn refusals_name_input_and_output_tokens() {
        let Ok(RawReserve::Refused { limited_by, .. }) = reserve(&[0, 5, 0, 0, 1, 1, 0]) else {
            panic!("a refusal");
        };
        assert_eq!(limited_by.as_str(), "input_tokens+output_tokens");
        let Ok(RawReserve::Refused { limited_by, .. }) = reserve(&[0, 5, 0, 0, 0, 0, 1]) else {
            panic!("a refusal");
        };
        assert_eq!(limited_by.as_str(), "cost");
        // The reply of a script without the budget's flag is malformed.
        assert!(reserve(&[0, 5, 0, 0, 1, 1]).is_err());
    }
}

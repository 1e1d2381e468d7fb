//! Scheduling hints a queue carries besides its priority.

use crate::Nanos;
use serde::{Deserialize, Serialize};
use thiserror::Error;

/// The longest timeslice a hint may ask for (one minute); longer is almost surely a unit mistake.
pub const MAX_TIMESLICE_NS: Nanos = 60_000_000_000;

#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Hints {
    /// Absolute deadline of the queue's current work, for EDF.
    pub deadline_ns: Option<Nanos>,
    /// Share of the device this queue should get under the bandwidth policy, in (0, 1].
    pub utilization_share: Option<f64>,
    /// Timeslice for round-robin policies, overriding the policy's default.
    pub timeslice_ns: Option<Nanos>,
    /// Latency-critical (true) or best-effort (false) under the LC/BE policy; unset means the
    /// policy decides from the priority.
    pub latency_critical: Option<bool>,
}

#[derive(Debug, Error, Clone, PartialEq)]
pub enum HintError {
    #[error("utilization share {0} is out of range: it must be in (0, 1]")]
    Share(f64),
    #[error("timeslice {0} ns is out of range: it must be in 1 ns ..= {MAX_TIMESLICE_NS} ns")]
    Timeslice(Nanos),
    #[error("deadline 0 is not a point in time: give an absolute deadline in ns")]
    Deadline,
}

impl Hints {
    pub fn validate(&self) -> Result<(), HintError> {
        if let Some(s) = self.utilization_share
            && !(s > 0.0 && s <= 1.0)
        {
            return Err(HintError::Share(s));
        }
        if let Some(t) = self.timeslice_ns
            && (t == 0 || t > MAX_TIMESLICE_NS)
        {
            return Err(HintError::Timeslice(t));
        }
        if self.deadline_ns == Some(0) {
            return Err(HintError::Deadline);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn out_of_range_hints_are_refused_with_the_value() {
        let bad_share = Hints {
            utilization_share: Some(1.5),
            ..Hints::default()
        };
        assert!(
            bad_share
                .validate()
                .unwrap_err()
                .to_string()
                .contains("1.5")
        );
        let nan = Hints {
            utilization_share: Some(f64::NAN),
            ..Hints::default()
        };
        assert!(nan.validate().is_err());
        let zero_slice = Hints {
            timeslice_ns: Some(0),
            ..Hints::default()
        };
        assert_eq!(zero_slice.validate(), Err(HintError::Timeslice(0)));
        let ok = Hints {
            utilization_share: Some(1.0),
            timeslice_ns: Some(2_000_000),
            deadline_ns: Some(5),
            latency_critical: Some(true),
        };
        assert_eq!(ok.validate(), Ok(()));
    }
}

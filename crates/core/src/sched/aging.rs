//! Effective priority with aging: a queue that waits gains `step` priority every `interval`, up
//! to `max_boost`, and keeps the boost until it has run for one interval. A queue below a
//! constantly busy one at distance `d` therefore runs within `ceil((d + 1) / step)` intervals.

use serde::{Deserialize, Serialize};
use thiserror::Error;
use xpreempt_types::{Nanos, Priority};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Aging {
    interval_ns: Nanos,
    step: Priority,
    max_boost: Priority,
}

#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum AgingError {
    #[error("aging interval must be at least 1 ns")]
    ZeroInterval,
    #[error("aging step must be at least 1, got {0}")]
    Step(Priority),
    #[error("aging max boost must be at least the step ({step}), got {max_boost}")]
    MaxBoost { step: Priority, max_boost: Priority },
}

impl Aging {
    pub fn new(
        interval_ns: Nanos,
        step: Priority,
        max_boost: Priority,
    ) -> Result<Self, AgingError> {
        if interval_ns == 0 {
            return Err(AgingError::ZeroInterval);
        }
        if step < 1 {
            return Err(AgingError::Step(step));
        }
        if max_boost < step {
            return Err(AgingError::MaxBoost { step, max_boost });
        }
        Ok(Self {
            interval_ns,
            step,
            max_boost,
        })
    }

    pub fn interval_ns(&self) -> Nanos {
        self.interval_ns
    }

    /// The longest a queue `distance` priority levels below a constantly busy queue waits.
    pub fn bound_ns(&self, distance: Priority) -> Option<Nanos> {
        if distance >= self.max_boost {
            return None;
        }
        let steps = (distance.max(0) as u64 + 1).div_ceil(self.step as u64);
        Some(steps * self.interval_ns)
    }

    pub(super) fn boost(&self, waiting_since: Option<Nanos>, now: Nanos) -> Priority {
        let Some(since) = waiting_since else {
            return 0;
        };
        let steps = now.saturating_sub(since) / self.interval_ns;
        let boost = steps.saturating_mul(self.step as u64);
        boost.min(self.max_boost as u64) as Priority
    }

    /// When the boost next changes: the next step while waiting, or the end of the first
    /// interval of service while running. `None` once a running queue has been served.
    pub(super) fn next_change(
        &self,
        waiting_since: Option<Nanos>,
        running_since: Option<Nanos>,
        now: Nanos,
    ) -> Option<Nanos> {
        let since = waiting_since?;
        if let Some(run) = running_since {
            let end = run + self.interval_ns;
            return (end > now).then_some(end);
        }
        if self.boost(Some(since), now) >= self.max_boost {
            return None;
        }
        let steps = now.saturating_sub(since) / self.interval_ns + 1;
        Some(since + steps * self.interval_ns)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_settings_are_refused() {
        assert_eq!(Aging::new(0, 1, 1), Err(AgingError::ZeroInterval));
        assert_eq!(Aging::new(1, 0, 1), Err(AgingError::Step(0)));
        assert!(
            Aging::new(1, 2, 1)
                .unwrap_err()
                .to_string()
                .contains("max boost")
        );
    }

    #[test]
    fn boost_grows_per_interval_up_to_the_cap() {
        let a = Aging::new(100, 2, 5).unwrap();
        assert_eq!(a.boost(None, 1_000), 0);
        assert_eq!(a.boost(Some(0), 99), 0);
        assert_eq!(a.boost(Some(0), 250), 4);
        assert_eq!(a.boost(Some(0), 10_000), 5);
        assert_eq!(a.next_change(Some(0), None, 250), Some(300));
        assert_eq!(a.next_change(Some(0), None, 10_000), None);
        assert_eq!(a.next_change(Some(0), Some(500), 550), Some(600));
        assert_eq!(a.next_change(Some(0), Some(500), 600), None);
        assert_eq!(a.bound_ns(3), Some(200));
        assert_eq!(a.bound_ns(5), None);
    }
}

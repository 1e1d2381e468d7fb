//! The bounded admission wait: a group the policy does not admit yet has libcuda's
//! GPFIFO_SCHEDULE(1) held back, asking again every `poll`, until the policy admits it or `wait`
//! passes, and then the call goes through either way: the process is delayed, never broken.

use std::time::Duration;

/// How long an enable may be held back, and how often the policy is asked again.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Bound {
    pub wait: Duration,
    pub poll: Duration,
}

impl Bound {
    pub const DEFAULT_WAIT: Duration = Duration::from_millis(1000);
    pub const DEFAULT_POLL: Duration = Duration::from_millis(5);

    /// `XPREEMPT_RM_ADMIT_WAIT_MS` (default 1000) and `XPREEMPT_RM_ADMIT_POLL_MS` (default 5,
    /// at least 1).
    pub fn from_env(get: impl Fn(&str) -> Option<String>) -> Self {
        let ms = |k: &str| get(k).and_then(|v| v.trim().parse::<u64>().ok());
        Self {
            wait: ms("XPREEMPT_RM_ADMIT_WAIT_MS").map_or(Self::DEFAULT_WAIT, Duration::from_millis),
            poll: ms("XPREEMPT_RM_ADMIT_POLL_MS")
                .map_or(Self::DEFAULT_POLL, |p| Duration::from_millis(p.max(1))),
        }
    }
}

/// How the wait ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Waited {
    /// The policy admitted the group after `asks` questions, `after` into the wait.
    Admitted { asks: u32, after: Duration },
    /// The bound passed first: the enable goes through anyway.
    BoundPassed { asks: u32, after: Duration },
}

impl Waited {
    pub fn delayed(&self) -> Duration {
        match *self {
            Waited::Admitted { after, .. } | Waited::BoundPassed { after, .. } => after,
        }
    }
}

/// Asks `admit` until it says yes or `bound.wait` has passed on `elapsed`'s clock, sleeping
/// `bound.poll` (never past the bound) between asks. At least one ask happens.
pub fn wait(
    bound: Bound,
    mut admit: impl FnMut() -> bool,
    mut sleep: impl FnMut(Duration),
    elapsed: impl Fn() -> Duration,
) -> Waited {
    let mut asks = 0;
    loop {
        asks += 1;
        if admit() {
            return Waited::Admitted {
                asks,
                after: elapsed(),
            };
        }
        let now = elapsed();
        if now >= bound.wait {
            return Waited::BoundPassed { asks, after: now };
        }
        sleep(bound.poll.min(bound.wait - now));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;

    fn run(bound: Bound, admit_at: Option<u32>) -> (Waited, Duration) {
        let clock = Cell::new(Duration::ZERO);
        let asked = Cell::new(0);
        let w = wait(
            bound,
            || {
                asked.set(asked.get() + 1);
                admit_at.is_some_and(|n| asked.get() >= n)
            },
            |d| clock.set(clock.get() + d),
            || clock.get(),
        );
        (w, clock.get())
    }

    const B: Bound = Bound {
        wait: Duration::from_millis(100),
        poll: Duration::from_millis(30),
    };

    #[test]
    fn an_admitted_group_goes_at_once() {
        let (w, t) = run(B, Some(1));
        assert_eq!(
            w,
            Waited::Admitted {
                asks: 1,
                after: Duration::ZERO
            }
        );
        assert_eq!(t, Duration::ZERO);
    }

    #[test]
    fn a_refused_group_waits_until_the_policy_admits_it() {
        let (w, _) = run(B, Some(3));
        assert_eq!(
            w,
            Waited::Admitted {
                asks: 3,
                after: Duration::from_millis(60)
            }
        );
    }

    #[test]
    fn the_wait_never_passes_its_bound() {
        let (w, t) = run(B, None);
        // Asks at 0, 30, 60, 90 and 100 ms (the last sleep is cut to the bound).
        assert_eq!(
            w,
            Waited::BoundPassed {
                asks: 5,
                after: Duration::from_millis(100)
            }
        );
        assert_eq!(t, B.wait);
        let zero = Bound {
            wait: Duration::ZERO,
            ..B
        };
        assert_eq!(run(zero, None).0.delayed(), Duration::ZERO, "asked once");
    }

    #[test]
    fn the_bound_comes_from_the_environment() {
        let env = |pairs: &'static [(&'static str, &'static str)]| {
            move |k: &str| {
                pairs
                    .iter()
                    .find(|(n, _)| *n == k)
                    .map(|(_, v)| v.to_string())
            }
        };
        assert_eq!(
            Bound::from_env(env(&[])),
            Bound {
                wait: Bound::DEFAULT_WAIT,
                poll: Bound::DEFAULT_POLL
            }
        );
        let b = Bound::from_env(env(&[
            ("XPREEMPT_RM_ADMIT_WAIT_MS", "20000"),
            ("XPREEMPT_RM_ADMIT_POLL_MS", "0"),
        ]));
        assert_eq!(
            (b.wait, b.poll),
            (Duration::from_secs(20), Duration::from_millis(1))
        );
    }
}

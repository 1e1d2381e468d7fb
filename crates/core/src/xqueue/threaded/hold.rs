//! A drained queue's Idle held back while the application is in a call on the queue, and for
//! the burst gap after its last submission ([`crate::QueueConfig::with_burst_gap`]; off by
//! default).

use super::Inner;
use crate::xqueue::XQueue;
use std::sync::atomic::Ordering;
use xpreempt_hal::HwQueue;
use xpreempt_types::Nanos;

/// The longest a drained queue's Idle is held back for an application's call on it.
const CALL_HOLD_MAX: Nanos = 10_000_000;

/// An application's call on the queue, from its start to its return (whichever way it returns).
pub(super) struct InCall<'a, H: HwQueue> {
    inner: Option<&'a Inner<H>>,
    submission: bool,
}

impl<'a, H: HwQueue> InCall<'a, H> {
    pub(super) fn enter(inner: &'a Inner<H>, submission: bool) -> Self {
        if inner.burst_gap.load(Ordering::Relaxed) == 0 {
            return Self {
                inner: None,
                submission,
            };
        }
        inner.in_calls.fetch_add(1, Ordering::AcqRel);
        Self {
            inner: Some(inner),
            submission,
        }
    }
}

impl<H: HwQueue> Drop for InCall<'_, H> {
    fn drop(&mut self) {
        if let Some(inner) = self.inner {
            if self.submission {
                // Before the count drops: whoever sees it at zero sees this return too.
                inner.submit_returned.store(inner.now(), Ordering::Release);
            }
            inner.in_calls.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

impl<H: HwQueue> Inner<H> {
    /// Holds a drained queue's Idle back while the application is in a call on the queue, and
    /// for the burst gap after its last submission returned (the watcher waits and looks again).
    ///
    /// Why the calls: a submission still reporting its Ready is followed by the burst's next
    /// one; and a waiter that has seen the completion is about to return, while the Idle's
    /// consequence (resuming the queues below, driver calls of their own) would contend with its
    /// return in the driver (on an H100 host, LC requests whose best-effort queue was resumed
    /// before the wait returned were among the slowest; holding the Idle did not lower the p99).
    pub(super) fn hold_idle(&self, q: &mut XQueue<H::Payload>, now: Nanos) {
        let gap = self.burst_gap.load(Ordering::Relaxed);
        if gap == 0 {
            return;
        }
        let until = if self.in_call() {
            // Bounded: a call that does not return (a wait for a command never submitted)
            // holds nothing back for long.
            let drained = q.drained_since().unwrap_or(now);
            now.saturating_add(gap)
                .min(drained.saturating_add(CALL_HOLD_MAX))
        } else {
            match self.submit_returned.load(Ordering::Acquire) {
                0 => 0,
                t => t.saturating_add(gap),
            }
        };
        q.hold_idle_until(until);
    }

    /// Whether the application is in a call on the queue now.
    pub(super) fn in_call(&self) -> bool {
        self.in_calls.load(Ordering::Acquire) > 0
    }
}

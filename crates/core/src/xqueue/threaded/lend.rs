//! Priorities lent to a queue by the work that waits on its buffered commands: for as long as
//! such a wait lasts ([`SharedXQueue::wait_launched_for`]), or as long as a guard lives, for a
//! waiter that waits on a queue for more than its buffer: a front end whose stopped work is
//! relaunched only by the queue's resume (the CUDA shim's kernels stopped at Lv2) keeps lending
//! its priority after the buffer is empty, where [`SharedXQueue::wait_launched_for`]'s loan
//! would end.

use super::SharedXQueue;
use crate::sched::QueueReport;
use xpreempt_hal::HwQueue;
use xpreempt_types::Priority;

impl<H> SharedXQueue<H>
where
    H: HwQueue + Send + Sync + 'static,
    H::Payload: Send + 'static,
{
    /// [`Self::wait_launched`] for work of priority `waiter` that must follow this queue's
    /// buffered commands: meanwhile the queue inherits that priority (the highest of all such
    /// waits under way), so that it is not left stopped on behalf of a queue that the waiter
    /// outranks or equals — the circular wait in which the waiter would wait for itself.
    pub fn wait_launched_for(&self, waiter: Priority) {
        if self.pending_len() == 0 {
            return;
        }
        let _loan = self.lend(waiter);
        self.wait_launched();
    }

    fn set_waiter(&self, add: Option<Priority>, remove: Option<Priority>) {
        // Reported under the waiters' lock, so that the reports of two threads arrive in the
        // order of their changes (a late report would leave a stale inheritance behind).
        let mut w = self.inner.waiters.lock().unwrap_or_else(|p| p.into_inner());
        let before = w.iter().copied().max();
        w.extend(add);
        if let Some(i) = remove.and_then(|r| w.iter().position(|&p| p == r)) {
            w.swap_remove(i);
        }
        let after = w.iter().copied().max();
        if before != after {
            self.inner
                .report(self.id, QueueReport::Inherit { priority: after });
        }
    }

    /// The queue inherits `waiter` (the highest of the loans and waits under way) until the
    /// returned guard is dropped.
    pub fn lend(&self, waiter: Priority) -> Lent<'_, H> {
        self.set_waiter(Some(waiter), None);
        Lent {
            queue: self,
            waiter,
        }
    }
}

/// A loan made by [`SharedXQueue::lend`]; dropping it takes the priority back.
#[must_use = "the loan ends when the guard is dropped"]
pub struct Lent<'a, H>
where
    H: HwQueue + Send + Sync + 'static,
    H::Payload: Send + 'static,
{
    queue: &'a SharedXQueue<H>,
    waiter: Priority,
}

impl<H> Drop for Lent<'_, H>
where
    H: HwQueue + Send + Sync + 'static,
    H::Payload: Send + 'static,
{
    fn drop(&mut self) {
        self.queue.set_waiter(None, Some(self.waiter));
    }
}

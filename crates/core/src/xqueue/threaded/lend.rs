//! A priority lent for as long as a guard lives, for a waiter that waits on a queue for more than
//! its buffer: a front end whose stopped work is relaunched only by the queue's resume (the CUDA
//! shim's kernels stopped at Lv2) keeps lending its priority after the buffer is empty, where
//! [`SharedXQueue::wait_launched_for`]'s loan would end.

use super::SharedXQueue;
use xpreempt_hal::HwQueue;
use xpreempt_types::Priority;

impl<H> SharedXQueue<H>
where
    H: HwQueue + Send + Sync + 'static,
    H::Payload: Send + 'static,
{
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

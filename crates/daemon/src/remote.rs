//! A queue in another process, as the driver controls it: the driver's suspend/resume/refuse
//! change what the queue should do, and [`RemoteQueue::flush`] (after the decision, once the
//! fast path's lift bits are known) writes that into the client's shared slot. What the queue
//! does about it comes back later as a report in the same slot.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use xpreempt_core::Nanos;
use xpreempt_core::sched::{QueueControl, QueueReport};
use xpreempt_core::xqueue::QueueOpError;
use xpreempt_ipc::shm::{Command, Segment};

pub struct RemoteQueue {
    segment: Arc<Segment>,
    slot: u32,
    /// What the scheduler wants now.
    suspended: bool,
    refused: bool,
    /// The last command written, and the lift bits it refers to.
    written: Command,
    lift: u128,
}

impl RemoteQueue {
    pub fn new(segment: Arc<Segment>, slot: u32) -> Self {
        Self {
            segment,
            slot,
            suspended: false,
            refused: false,
            written: Command {
                generation: 0,
                suspended: false,
                refused: false,
                liftable: false,
            },
            lift: 0,
        }
    }

    /// Whether the scheduler holds the queue suspended.
    pub fn is_suspended(&self) -> bool {
        self.suspended
    }

    pub fn slot(&self) -> u32 {
        self.slot
    }

    /// Writes the command if it changed: `lift` (`Some` only where the fast path may end the
    /// suspension by itself) first, then the command word. Returns whether it wrote, so that
    /// the caller rings the agent.
    pub fn flush(&mut self, lift: Option<u128>) -> bool {
        let lift = lift.filter(|_| self.suspended);
        let next = Command {
            generation: self.written.generation,
            suspended: self.suspended,
            refused: self.refused,
            liftable: lift.is_some(),
        };
        let lift = lift.unwrap_or(0);
        if next == self.written && lift == self.lift {
            return false;
        }
        let Some(slot) = self.segment.slot(self.slot) else {
            return false;
        };
        let next = Command {
            generation: next.generation + 1,
            ..next
        };
        slot.lift.store(lift);
        slot.command.store(next.encode(), Ordering::SeqCst);
        self.written = next;
        self.lift = lift;
        true
    }
}

impl QueueControl for RemoteQueue {
    fn suspend(&mut self, _now: Nanos) -> Result<Option<QueueReport>, QueueOpError> {
        self.suspended = true;
        Ok(None)
    }

    fn resume(&mut self, _now: Nanos) -> Result<Option<QueueReport>, QueueOpError> {
        self.suspended = false;
        Ok(None)
    }

    fn set_refused(&mut self, refused: bool) {
        self.refused = refused;
    }
}

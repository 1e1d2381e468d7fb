//! A queue in another process, as the driver controls it: commands go into the client's shared
//! slot and ring its doorbell. What the queue does about them comes back later as a report in the
//! same slot, read by the client's fast-path thread.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use xpreempt_core::Nanos;
use xpreempt_core::sched::{QueueControl, QueueReport};
use xpreempt_core::xqueue::QueueOpError;
use xpreempt_ipc::shm::{Command, Segment};

pub struct RemoteQueue {
    segment: Arc<Segment>,
    slot: u32,
    command: Command,
}

impl RemoteQueue {
    pub fn new(segment: Arc<Segment>, slot: u32) -> Self {
        Self {
            segment,
            slot,
            command: Command {
                generation: 0,
                suspended: false,
                refused: false,
            },
        }
    }

    fn send(&mut self, change: impl FnOnce(&mut Command)) {
        change(&mut self.command);
        self.command.generation += 1;
        if let Some(slot) = self.segment.slot(self.slot) {
            slot.command.store(self.command.encode(), Ordering::SeqCst);
            self.segment.header().to_agent.ring();
        }
    }
}

impl QueueControl for RemoteQueue {
    fn suspend(&mut self, _now: Nanos) -> Result<Option<QueueReport>, QueueOpError> {
        self.send(|c| c.suspended = true);
        Ok(None)
    }

    fn resume(&mut self, _now: Nanos) -> Result<Option<QueueReport>, QueueOpError> {
        self.send(|c| c.suspended = false);
        Ok(None)
    }

    fn set_refused(&mut self, refused: bool) {
        self.send(|c| c.refused = refused);
    }
}

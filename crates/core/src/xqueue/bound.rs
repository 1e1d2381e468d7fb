//! An XQueue bound to its hardware queue, driven synchronously on the caller's clock: what a
//! simulation or a single-threaded front end hands to the [`Driver`](crate::sched::Driver).

use super::{QueueOpError, SubmitError, XQueue};
use crate::sched::{Driver, QueueControl, QueueReport, SchedError};
use thiserror::Error;
use xpreempt_hal::{HalError, HwQueue};
use xpreempt_types::{Command, ComputeUnits, Nanos, QueueId, Seq};

pub struct BoundQueue<H: HwQueue> {
    queue: XQueue<H::Payload>,
    hal: H,
    refused: bool,
}

/// A simulation's or single-threaded front end's call that did not go through.
#[derive(Debug, Error)]
pub enum DriveError<P> {
    #[error("queue {0} is not registered with the driver")]
    UnknownQueue(QueueId),
    #[error(transparent)]
    Submit(#[from] SubmitError<P>),
    #[error(transparent)]
    Queue(#[from] QueueOpError),
    #[error(transparent)]
    Sched(#[from] SchedError),
}

impl<H: HwQueue> BoundQueue<H> {
    pub fn new(queue: XQueue<H::Payload>, hal: H) -> Self {
        Self {
            queue,
            hal,
            refused: false,
        }
    }

    pub fn queue(&self) -> &XQueue<H::Payload> {
        &self.queue
    }

    pub fn hal(&self) -> &H {
        &self.hal
    }

    /// While refused admission, a submitter should back off and ask again.
    pub fn is_refused(&self) -> bool {
        self.refused
    }
}

/// The submit and completion paths of bound queues: the queue changes, then the scheduler hears
/// of it (work first, for the hooks; then Ready/Idle).
impl<H: HwQueue> Driver<BoundQueue<H>> {
    /// Submits a command and reports what it changed. A refused queue answers `Retry` to the
    /// scheduler and keeps the command buffered like any other.
    pub fn submit(
        &mut self,
        id: QueueId,
        command: Command<H::Payload>,
        clock: &dyn Fn() -> Nanos,
    ) -> Result<Seq, DriveError<H::Payload>> {
        let with_work = self.scheduler().wants_work();
        let q = self.queue_mut(id).ok_or(DriveError::UnknownQueue(id))?;
        let kind = command.op.kind();
        let refused = q.refused;
        let s = q.queue.submit(&q.hal, command, clock)?;
        if refused {
            self.report(id, QueueReport::Retry, clock)?;
        }
        if with_work {
            self.report(id, QueueReport::Submitted { kind, seq: s.seq }, clock)?;
        }
        if let Some(r) = s.report {
            self.report(id, r, clock)?;
        }
        Ok(s.seq)
    }

    /// The hardware moved (completions, a stop or restart settled): takes it in and reports it.
    pub fn poll(
        &mut self,
        id: QueueId,
        clock: &dyn Fn() -> Nanos,
    ) -> Result<(), DriveError<H::Payload>> {
        let with_work = self.scheduler().wants_work();
        let q = self.queue_mut(id).ok_or(DriveError::UnknownQueue(id))?;
        let before = q.queue.completed();
        let report = q.queue.poll(&q.hal, clock())?;
        let upto = q.queue.completed();
        if with_work && upto > before {
            self.report(id, QueueReport::Completed { upto }, clock)?;
        }
        if let Some(r) = report {
            self.report(id, r, clock)?;
        }
        Ok(())
    }
}

impl<H: HwQueue> QueueControl for BoundQueue<H> {
    fn suspend(&mut self, now: Nanos) -> Result<Option<QueueReport>, QueueOpError> {
        self.queue.suspend(&self.hal, now)?;
        self.queue.poll(&self.hal, now)
    }

    fn resume(&mut self, now: Nanos) -> Result<Option<QueueReport>, QueueOpError> {
        self.queue.resume(&self.hal, now)?;
        Ok(self.queue.take_report())
    }

    fn set_refused(&mut self, refused: bool) {
        self.refused = refused;
    }

    fn confine(&mut self, avoid: Option<&ComputeUnits>) -> Result<(), HalError> {
        self.hal.confine(avoid)
    }
}

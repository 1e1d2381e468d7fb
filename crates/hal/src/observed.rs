//! A hardware queue with an observer around the calls that change what runs (launch, and the
//! Lv2/Lv3 stops and restarts): one delegating wrapper for the tools that watch a queue
//! (the benchmark's timestamps) or break it on purpose (tests).

use crate::{HalError, HwQueue, Launched};
use xpreempt_types::{Command, Level, Nanos, Seq};

/// A call the observer sees.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HalOp {
    Launch,
    StopAhead,
    Deactivate,
    Reactivate,
    Interrupt,
    Restore,
}

pub trait Observer: Send + Sync {
    /// Before `op`; an error fails the call without it reaching the queue.
    fn before(&self, op: HalOp) -> Result<(), HalError> {
        let _ = op;
        Ok(())
    }

    /// After `op` reached the queue, whatever it returned.
    fn after(&self, op: HalOp) {
        let _ = op;
    }

    /// What the queue's `settled` answered.
    fn settled(&self, settled: bool) {
        let _ = settled;
    }

    /// What the queue's `stop_ahead` answered (after [`Observer::after`]).
    fn went_ahead(&self, ahead: bool) {
        let _ = ahead;
    }
}

pub struct Observed<H, O> {
    inner: H,
    observer: O,
}

impl<H, O> Observed<H, O> {
    pub fn new(inner: H, observer: O) -> Self {
        Self { inner, observer }
    }

    pub fn inner(&self) -> &H {
        &self.inner
    }

    pub fn observer(&self) -> &O {
        &self.observer
    }
}

impl<H: HwQueue, O: Observer> Observed<H, O> {
    fn around<T>(
        &self,
        op: HalOp,
        call: impl FnOnce() -> Result<T, HalError>,
    ) -> Result<T, HalError> {
        self.observer.before(op)?;
        let r = call();
        self.observer.after(op);
        r
    }
}

impl<H: HwQueue, O: Observer> HwQueue for Observed<H, O> {
    type Payload = H::Payload;

    fn max_level(&self) -> Level {
        self.inner.max_level()
    }

    fn launch(
        &self,
        seq: Seq,
        command: &mut Command<H::Payload>,
        sync_point: bool,
    ) -> Result<(), HalError> {
        self.around(HalOp::Launch, || {
            self.inner.launch(seq, command, sync_point)
        })
    }

    fn record_sync(&self) -> Result<(), HalError> {
        self.inner.record_sync()
    }

    fn completed(&self) -> Seq {
        self.inner.completed()
    }

    fn synchronize(&self, upto: Seq) -> Result<(), HalError> {
        self.inner.synchronize(upto)
    }

    fn settled(&self) -> bool {
        let settled = self.inner.settled();
        self.observer.settled(settled);
        settled
    }

    fn stop_ahead(&self) -> bool {
        if self.observer.before(HalOp::StopAhead).is_err() {
            return false;
        }
        let ahead = self.inner.stop_ahead();
        self.observer.after(HalOp::StopAhead);
        self.observer.went_ahead(ahead);
        ahead
    }

    fn deactivate(&self) -> Result<(), HalError> {
        self.around(HalOp::Deactivate, || self.inner.deactivate())
    }

    fn reactivate(&self, log: &mut [Launched<H::Payload>]) -> Result<(), HalError> {
        self.around(HalOp::Reactivate, || self.inner.reactivate(log))
    }

    fn interrupt(&self) -> Result<(), HalError> {
        self.around(HalOp::Interrupt, || self.inner.interrupt())
    }

    fn restore(&self, log: &mut [Launched<H::Payload>]) -> Result<(), HalError> {
        self.around(HalOp::Restore, || self.inner.restore(log))
    }

    fn interrupt_cost_ns(&self) -> Option<Nanos> {
        self.inner.interrupt_cost_ns()
    }
}

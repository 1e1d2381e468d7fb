//! A hardware queue whose launches fail on request, for tests of what a failed launch leaves
//! behind; it can also look at the world just before each launch.

use crate::{HalError, HwQueue, Launched};
use std::sync::atomic::{AtomicU32, Ordering};
use xpreempt_types::{Command, Level, Seq};

pub struct Faulty<H> {
    inner: H,
    fail_next: AtomicU32,
    before_launch: Option<Box<dyn Fn() + Send + Sync>>,
}

impl<H> Faulty<H> {
    pub fn new(inner: H) -> Self {
        Self {
            inner,
            fail_next: AtomicU32::new(0),
            before_launch: None,
        }
    }

    /// Calls `f` before every launch, failed ones included.
    pub fn before_launch(mut self, f: impl Fn() + Send + Sync + 'static) -> Self {
        self.before_launch = Some(Box::new(f));
        self
    }

    /// The next `n` launches fail (and launch nothing).
    pub fn fail_next(&self, n: u32) {
        self.fail_next.store(n, Ordering::SeqCst);
    }

    pub fn inner(&self) -> &H {
        &self.inner
    }
}

impl<H: HwQueue> HwQueue for Faulty<H> {
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
        if let Some(f) = &self.before_launch {
            f();
        }
        let failing = self
            .fail_next
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1));
        if failing.is_ok() {
            return Err(HalError::WouldBlock("a launch failed on purpose"));
        }
        self.inner.launch(seq, command, sync_point)
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
        self.inner.settled()
    }

    fn deactivate(&self) -> Result<(), HalError> {
        self.inner.deactivate()
    }

    fn reactivate(&self, log: &mut [Launched<H::Payload>]) -> Result<(), HalError> {
        self.inner.reactivate(log)
    }

    fn interrupt(&self) -> Result<(), HalError> {
        self.inner.interrupt()
    }

    fn restore(&self, log: &mut [Launched<H::Payload>]) -> Result<(), HalError> {
        self.inner.restore(log)
    }
}

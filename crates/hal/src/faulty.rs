//! Faults on request, for tests of what a failed launch leaves behind: an [`Observer`] whose
//! launches fail while told to, and which can look at the world just before each launch.

use crate::HalError;
use crate::observed::{HalOp, Observer};
use std::sync::atomic::{AtomicU32, Ordering};

#[derive(Default)]
pub struct Faults {
    fail_next: AtomicU32,
    before_launch: Option<Box<dyn Fn() + Send + Sync>>,
}

impl Faults {
    /// Calls `f` before every launch, failed ones included.
    pub fn before_launch(mut self, f: impl Fn() + Send + Sync + 'static) -> Self {
        self.before_launch = Some(Box::new(f));
        self
    }

    /// The next `n` launches fail (and launch nothing).
    pub fn fail_next(&self, n: u32) {
        self.fail_next.store(n, Ordering::SeqCst);
    }
}

impl Observer for Faults {
    fn before(&self, op: HalOp) -> Result<(), HalError> {
        if op != HalOp::Launch {
            return Ok(());
        }
        if let Some(f) = &self.before_launch {
            f();
        }
        let failing = self
            .fail_next
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1));
        match failing {
            Ok(_) => Err(HalError::WouldBlock("a launch failed on purpose")),
            Err(_) => Ok(()),
        }
    }
}

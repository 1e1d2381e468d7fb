//! Lv3 for the whole process: the timeslice of its compute channel groups. SET_TIMESLICE reaches
//! every compute channel group of the process (all its contexts, on every device), so the
//! timeslice is one process-wide setting: if each queue lowered and restored it on its own,
//! resuming one queue would lift the suspension of another. One [`Lv3Control`] per process counts
//! the interrupted queues instead: the first interrupt lowers the timeslice, the last restore puts
//! the configured one back.
//!
//! How the slice is set is the caller's [`TimesliceControl`]: the RM interposer of
//! `libxpreempt_shim.so` sees the channel groups, so the shim passes its own; a program that runs
//! with the shim preloaded reaches the same control through the shim's exports. The queue only
//! ever calls this module, in Rust.

use crate::error::Result;
use std::sync::{Arc, Mutex};

/// What libcuda sets by itself (measured), restored after an interrupt.
pub const DEFAULT_TIMESLICE_US: u64 = 2048;
/// The smallest timeslice asked for while interrupted.
pub const MIN_TIMESLICE_US: u64 = 1;

/// Something that sets the timeslice of every compute channel group of this process.
pub trait TimesliceControl: Send + Sync {
    fn set_us(&self, us: u64) -> Result<()>;
}

/// The process's Lv3 state: how many queues are interrupted now.
pub struct Lv3Control<C: ?Sized = dyn TimesliceControl> {
    normal_us: u64,
    interrupted: Mutex<u32>,
    control: C,
}

/// The process's one Lv3 control as the queues hold it.
pub type ProcessLv3 = Arc<Lv3Control>;

impl<C: ?Sized> std::fmt::Debug for Lv3Control<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lv3Control")
            .field("normal_us", &self.normal_us)
            .field("interrupted", &self.interrupted())
            .finish()
    }
}

impl<C> Lv3Control<C> {
    pub fn new(control: C, normal_us: u64) -> Self {
        Self {
            control,
            normal_us,
            interrupted: Mutex::new(0),
        }
    }
}

impl<C: ?Sized> Lv3Control<C> {
    pub fn control(&self) -> &C {
        &self.control
    }

    /// Queues interrupted now.
    pub fn interrupted(&self) -> u32 {
        *self.interrupted.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl<C: TimesliceControl + ?Sized> Lv3Control<C> {
    /// One more queue interrupted: the first lowers the timeslice. On failure nothing changed.
    pub fn interrupt(&self) -> Result<()> {
        let mut n = self.interrupted.lock().unwrap_or_else(|e| e.into_inner());
        if *n == 0 {
            self.control.set_us(MIN_TIMESLICE_US)?;
        }
        *n += 1;
        Ok(())
    }

    /// One interrupted queue fewer: the last one restores the configured timeslice. On failure
    /// the count is unchanged (still interrupted), so that the caller can retry.
    pub fn restore(&self) -> Result<()> {
        let mut n = self.interrupted.lock().unwrap_or_else(|e| e.into_inner());
        match *n {
            0 => {
                tracing::warn!("Lv3 restore without a matching interrupt (ignored)");
            }
            1 => {
                self.control.set_us(self.normal_us)?;
                *n = 0;
            }
            _ => *n -= 1,
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::CudaError;
    use std::sync::atomic::{AtomicBool, Ordering};

    #[derive(Default)]
    struct Fake {
        calls: Mutex<Vec<u64>>,
        fail: AtomicBool,
    }

    impl TimesliceControl for Fake {
        fn set_us(&self, us: u64) -> Result<()> {
            if self.fail.load(Ordering::Relaxed) {
                return Err(CudaError::TimesliceRm(0x1f));
            }
            self.calls.lock().unwrap().push(us);
            Ok(())
        }
    }

    fn calls(c: &Lv3Control<Fake>) -> Vec<u64> {
        c.control().calls.lock().unwrap().clone()
    }

    #[test]
    fn only_the_last_restore_lifts_the_suspension() {
        let c = Lv3Control::new(Fake::default(), 2048);
        c.interrupt().unwrap(); // queue A
        c.interrupt().unwrap(); // queue B
        assert_eq!(calls(&c), vec![MIN_TIMESLICE_US]);
        c.restore().unwrap(); // A resumes: B is still suspended
        assert_eq!(calls(&c), vec![MIN_TIMESLICE_US]);
        assert_eq!(c.interrupted(), 1);
        c.restore().unwrap(); // B resumes
        assert_eq!(calls(&c), vec![MIN_TIMESLICE_US, 2048]);
        assert_eq!(c.interrupted(), 0);
        // A new round starts from the configured timeslice again.
        c.interrupt().unwrap();
        assert_eq!(calls(&c), vec![MIN_TIMESLICE_US, 2048, MIN_TIMESLICE_US]);
    }

    #[test]
    fn failures_leave_the_count_as_it_was() {
        let c = Lv3Control::new(Fake::default(), 2048);
        c.control().fail.store(true, Ordering::Relaxed);
        assert!(c.interrupt().is_err());
        assert_eq!(c.interrupted(), 0);
        c.control().fail.store(false, Ordering::Relaxed);
        c.interrupt().unwrap();
        c.control().fail.store(true, Ordering::Relaxed);
        assert!(c.restore().is_err(), "the last restore reports its failure");
        assert_eq!(c.interrupted(), 1, "still interrupted: the caller retries");
        c.control().fail.store(false, Ordering::Relaxed);
        c.restore().unwrap();
        assert_eq!(c.interrupted(), 0);
        assert_eq!(calls(&c), vec![MIN_TIMESLICE_US, 2048]);
    }

    #[test]
    fn an_unmatched_restore_changes_nothing() {
        let c = Lv3Control::new(Fake::default(), 2048);
        c.restore().unwrap();
        assert_eq!(c.interrupted(), 0);
        assert!(calls(&c).is_empty());
    }
}

//! Lv3 for an intercepted process on a time-sliced GPU: the timeslice of the process's compute
//! channel groups (seen by the RM interposer). While one of its queues is interrupted the process
//! gets the shortest slice, so the GPU's scheduler switches to another process's pending work
//! after a microsecond instead of 2 ms; restoring puts back the driver's (or the RM policy's)
//! slice, after a hold that the CUDA backend's one [`Lv3Control`] measures. The setting is per
//! process, so interrupted queues are counted there; this module gives it the RM interposer's
//! control and its restorer thread, and the queues call it.

use std::sync::{Arc, LazyLock, Once, OnceLock};
use xpreempt_cuda::CudaError;
use xpreempt_cuda::lv3::{Lv3Control, ProcessLv3, TimesliceControl};

/// A stand-in for the RM timeslice control (test machinery registers one; see `chaos`): it
/// takes the slice and answers as `xpreempt_shim_set_timeslice` does.
static STAND_IN: OnceLock<fn(u64) -> i64> = OnceLock::new();

#[cfg(feature = "chaos")]
pub fn set_stand_in(set: fn(u64) -> i64) {
    let _ = STAND_IN.set(set);
}

/// Whether Lv3 can act in this process: its contexts' channel groups are its own (not an MPS
/// server's) and were seen being created.
fn available() -> bool {
    STAND_IN.get().is_some() || crate::rm::xpreempt_shim_channel_groups() > 0
}

/// The process's timeslice control for a queue at Lv3, where Lv3 can act (see [`available`]).
pub fn control() -> Option<ProcessLv3> {
    available().then(|| {
        start_restorer();
        CONTROL.clone()
    })
}

/// The thread that puts a held timeslice back up (see `xpreempt_cuda::lv3`). If it cannot be
/// started, restores act at once.
fn start_restorer() {
    static STARTED: Once = Once::new();
    STARTED.call_once(|| {
        if let Err(e) = xpreempt_cuda::lv3::spawn_restorer(&CONTROL, "xpreempt-lv3") {
            shim_log!("no thread to hold the timeslice low ({e}); restores act at once");
        }
    });
}

/// The RM interposer's SET_TIMESLICE on every compute channel group of the process.
struct Rm;

impl TimesliceControl for Rm {
    fn set_us(&self, us: u64) -> xpreempt_cuda::error::Result<()> {
        let _inside = super::fork_gate::enter();
        let r = match STAND_IN.get() {
            Some(f) => f(us),
            None => crate::rm::xpreempt_shim_set_timeslice(us),
        };
        match r {
            0 => Ok(()),
            r => {
                shim_log!("setting the process's timeslice to {us} us failed ({r})");
                Err(CudaError::TimesliceRm(r))
            }
        }
    }
}

/// The process's count of interrupted queues; the last restore puts back the driver's slice
/// (or, through the RM hooks, the policy's).
static CONTROL: LazyLock<ProcessLv3> =
    LazyLock::new(|| Arc::new(Lv3Control::new(Rm, crate::rm::DRIVER_DEFAULT_TIMESLICE_US)));

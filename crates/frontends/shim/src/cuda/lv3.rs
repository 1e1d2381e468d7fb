//! Lv3 for an intercepted process on a time-sliced GPU: the timeslice of the process's compute
//! channel groups (seen by the RM interposer). While one of its queues is interrupted the process
//! gets the shortest slice, so the GPU's scheduler switches to another process's pending work
//! after a microsecond instead of 2 ms; restoring puts back the driver's (or the RM policy's)
//! slice. The setting is per process, so interrupted queues are counted.

use super::driver::{CUresult, ERROR_NOT_FOUND};
use std::sync::{Mutex, OnceLock};

/// The slice while interrupted. Measured on Hopper: 1 µs against 1 s is strict priority.
const INTERRUPTED_TIMESLICE_US: u64 = 1;

static INTERRUPTED: Mutex<u32> = Mutex::new(0);

/// A stand-in for the RM timeslice control (test machinery registers one; see `chaos`): it
/// takes the slice and answers as `xpreempt_shim_set_timeslice` does.
static STAND_IN: OnceLock<fn(u64) -> i64> = OnceLock::new();

#[cfg(feature = "chaos")]
pub fn set_stand_in(set: fn(u64) -> i64) {
    let _ = STAND_IN.set(set);
}

/// Whether Lv3 can act in this process: its contexts' channel groups are its own (not an MPS
/// server's) and were seen being created.
pub fn available() -> bool {
    STAND_IN.get().is_some() || crate::rm::xpreempt_shim_channel_groups() > 0
}

fn set(us: u64) -> Result<(), CUresult> {
    let _inside = super::fork_gate::enter();
    let r = match STAND_IN.get() {
        Some(f) => f(us),
        None => crate::rm::xpreempt_shim_set_timeslice(us),
    };
    match r {
        0 => Ok(()),
        r => {
            shim_log!("setting the process's timeslice to {us} us failed ({r})");
            Err(ERROR_NOT_FOUND)
        }
    }
}

/// One more interrupted queue; the first lowers the process's slice. On failure nothing changed.
pub fn interrupt() -> Result<(), CUresult> {
    let mut n = INTERRUPTED.lock().unwrap_or_else(|p| p.into_inner());
    if *n == 0 {
        set(INTERRUPTED_TIMESLICE_US)?;
    }
    *n += 1;
    Ok(())
}

/// One interrupted queue fewer; the last restores the slice. On failure the count stays, so a
/// retry restores.
pub fn restore() -> Result<(), CUresult> {
    let mut n = INTERRUPTED.lock().unwrap_or_else(|p| p.into_inner());
    if *n == 1 {
        set(crate::rm::DRIVER_DEFAULT_TIMESLICE_US)?;
    }
    *n = n.saturating_sub(1);
    Ok(())
}

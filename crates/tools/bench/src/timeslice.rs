//! Lv3 for the benchmarks: this process's compute channel group (TSG) timeslice, set through
//! the RM interposer of a preloaded `libxpreempt_shim.so` (LD_PRELOAD), which captured libcuda's
//! RM client and TSG handles. The benchmark is a program of its own, not the shim: it reaches the
//! preloaded copy through the shim's C exports, and hands the queues the result as the CUDA
//! backend's [`TimesliceControl`]. Off unless the shim is loaded and the driver is a tested
//! version; every failure is a clear error and the queue falls back to Lv2/Lv1.

use std::ffi::{CStr, c_void};
use std::sync::{Arc, Mutex};
use thiserror::Error;
use xpreempt_cuda::error::{CudaError, Result};
use xpreempt_cuda::lv3::{DEFAULT_TIMESLICE_US, Lv3Control, ProcessLv3, TimesliceControl};
use xpreempt_cuda::nvidia::{DriverError, check_loaded_driver};

#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum Lv3Unavailable {
    #[error(transparent)]
    Driver(#[from] DriverError),
    #[error("the ioctl shim is not loaded (LD_PRELOAD=libxpreempt_shim.so)")]
    NoShim,
    #[error(
        "the shim has not seen a compute channel group of this process ({0} RM allocations seen; create the CUDA context first)"
    )]
    NoChannelGroup(u64),
}

type SetFn = unsafe extern "C" fn(u64) -> i64;
type CountFn = unsafe extern "C" fn() -> u32;

fn lookup(name: &CStr) -> *mut c_void {
    // SAFETY: dlsym on the global namespace with a NUL-terminated name.
    unsafe { libc::dlsym(libc::RTLD_DEFAULT, name.as_ptr()) }
}

/// The timeslice control of this process's compute channel group(s).
pub struct Timeslice {
    set: SetFn,
    count: CountFn,
    pub normal_us: u64,
    pub driver: String,
}

impl std::fmt::Debug for Timeslice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Timeslice")
            .field("normal_us", &self.normal_us)
            .field("driver", &self.driver)
            .finish()
    }
}

impl Timeslice {
    pub fn probe() -> Result<Self, Lv3Unavailable> {
        let driver = check_loaded_driver()?;
        let set = lookup(c"xpreempt_shim_set_timeslice");
        let count = lookup(c"xpreempt_shim_channel_groups");
        if set.is_null() || count.is_null() {
            return Err(Lv3Unavailable::NoShim);
        }
        // SAFETY: the shim exports these with exactly these signatures.
        let (set, count): (SetFn, CountFn) = unsafe {
            (
                std::mem::transmute::<*mut c_void, SetFn>(set),
                std::mem::transmute::<*mut c_void, CountFn>(count),
            )
        };
        // SAFETY: plain call into the shim.
        if unsafe { count() } == 0 {
            let seen = lookup(c"xpreempt_shim_allocs_seen");
            let n = if seen.is_null() {
                0
            } else {
                // SAFETY: exported by the shim with this signature.
                unsafe { std::mem::transmute::<*mut c_void, unsafe extern "C" fn() -> u64>(seen)() }
            };
            return Err(Lv3Unavailable::NoChannelGroup(n));
        }
        Ok(Self {
            set,
            count,
            normal_us: DEFAULT_TIMESLICE_US,
            driver,
        })
    }

    pub fn channel_groups(&self) -> u32 {
        // SAFETY: plain call into the shim.
        unsafe { (self.count)() }
    }

    /// Sets the timeslice of every compute channel group of this process.
    pub fn set_us(&self, us: u64) -> Result<()> {
        // SAFETY: plain call into the shim; it never unwinds.
        let r = unsafe { (self.set)(us) };
        match r {
            0 => Ok(()),
            r if r < 0 => Err(CudaError::TimesliceIoctl(
                std::io::Error::from_raw_os_error(i32::try_from(-r).unwrap_or(i32::MAX)),
            )),
            r => Err(CudaError::TimesliceRm(r)),
        }
    }

    pub fn restore(&self) -> Result<()> {
        self.set_us(self.normal_us)
    }
}

impl TimesliceControl for Timeslice {
    fn set_us(&self, us: u64) -> Result<()> {
        Timeslice::set_us(self, us)
    }
}

static SHARED: Mutex<Option<ProcessLv3>> = Mutex::new(None);

/// This process's Lv3 control, probed at the first call that finds the shim and a channel group
/// (a failed probe is not cached: a later queue, once a context exists, may succeed).
pub fn shared() -> std::result::Result<ProcessLv3, Lv3Unavailable> {
    let mut g = SHARED.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(c) = g.as_ref() {
        return Ok(c.clone());
    }
    let ts = Timeslice::probe()?;
    let normal = ts.normal_us;
    let c: ProcessLv3 = Arc::new(Lv3Control::new(ts, normal));
    // As in the shim: the last restore is held by this thread (restores act at once without it).
    if let Err(e) = xpreempt_cuda::lv3::spawn_restorer(&c, "lv3-restorer") {
        tracing::warn!("no Lv3 restorer thread ({e}); restores act at once");
    }
    *g = Some(c.clone());
    Ok(c)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_shim_means_no_lv3() {
        // This test binary is not run under the shim.
        let r = Timeslice::probe();
        assert!(r.is_err(), "Lv3 must be unavailable without the shim");
    }
}

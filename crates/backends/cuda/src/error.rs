//! Errors of the CUDA backend.

use cudarc::driver::sys;
use thiserror::Error;
use xpreempt_hal::HalError;

#[derive(Debug, Error)]
pub enum CudaError {
    /// libcuda could not be loaded: no NVIDIA driver on this machine.
    #[error("no CUDA driver found (libcuda could not be loaded)")]
    NoDriver,
    #[error("no CUDA device {0} (found {1})")]
    NoDevice(i32, i32),
    #[error("{call} failed: {code:?}")]
    Driver {
        call: &'static str,
        code: sys::CUresult,
    },
    #[error("NVRTC: {0}")]
    Nvrtc(String),
    #[error("{0}")]
    Other(String),
    #[error("reactivate after interrupt: an interrupted queue is resumed with restore")]
    ReactivateAfterInterrupt,
    #[error("synchronize({upto}) beyond the last launch ({launched})")]
    SyncBeyondLaunch { upto: u64, launched: u64 },
}

impl From<CudaError> for HalError {
    fn from(e: CudaError) -> Self {
        HalError::backend("cuda", e)
    }
}

pub type Result<T, E = CudaError> = std::result::Result<T, E>;

/// Turns a driver return code into a `Result`, naming the call.
#[doc(hidden)]
pub fn check(call: &'static str, code: sys::CUresult) -> Result<()> {
    if code == sys::CUresult::CUDA_SUCCESS {
        Ok(())
    } else {
        Err(CudaError::Driver { call, code })
    }
}

/// Calls a raw driver function and checks its result: `cu!(cuInit(0))`.
#[macro_export]
#[doc(hidden)]
macro_rules! cu {
    ($f:ident ( $($arg:expr),* $(,)? )) => {
        $crate::error::check(stringify!($f), unsafe { cudarc::driver::sys::$f($($arg),*) })
    };
}

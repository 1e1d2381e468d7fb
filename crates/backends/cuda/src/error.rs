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
    #[error("libnvrtc not found (add the CUDA lib64 folder to LD_LIBRARY_PATH)")]
    NoNvrtc,
    /// NVRTC rejected the source; `log` is its compile log.
    #[error("NVRTC compilation failed:\n{log}")]
    NvrtcCompileLog { log: String },
    /// NVRTC failed other than by rejecting the source (creating the program, reading the PTX).
    #[error("NVRTC failed")]
    Nvrtc(#[source] cudarc::nvrtc::CompileError),
    #[error("PTX image contains a NUL byte")]
    PtxNul(#[source] std::ffi::NulError),
    #[error("kernel name {name:?} contains a NUL byte")]
    KernelNameNul {
        name: String,
        #[source]
        source: std::ffi::NulError,
    },
    #[error("{given} kernel arguments, at most {max} are supported")]
    TooManyArgs { given: usize, max: usize },
    #[error("a guarded kernel needs a CudaQueue (it fills in the guard's parameters)")]
    GuardedOnPlainStream,
    #[error("SET_TIMESLICE ioctl failed")]
    TimesliceIoctl(#[source] std::io::Error),
    #[error("SET_TIMESLICE: RM status {0:#x}")]
    TimesliceRm(i64),
}

impl CudaError {
    /// Whether the call was refused as asked (retrying it fails the same way), rather than the
    /// driver or hardware failing.
    pub fn is_refusal(&self) -> bool {
        matches!(
            self,
            CudaError::TooManyArgs { .. } | CudaError::GuardedOnPlainStream
        )
    }

    /// The HAL error of operation `op`, keeping this one as its source.
    pub fn into_hal(self, op: &'static str) -> HalError {
        if self.is_refusal() {
            HalError::refused(op, self)
        } else {
            HalError::backend(op, self)
        }
    }
}

/// For `?` outside the `HwQueue` methods, which name their operation with [`CudaError::into_hal`].
impl From<CudaError> for HalError {
    fn from(e: CudaError) -> Self {
        e.into_hal("cuda")
    }
}

pub type Result<T, E = CudaError> = std::result::Result<T, E>;

/// Turns a driver return code into a `Result`, naming the call.
pub(crate) fn check(call: &'static str, code: sys::CUresult) -> Result<()> {
    if code == sys::CUresult::CUDA_SUCCESS {
        Ok(())
    } else {
        Err(CudaError::Driver { call, code })
    }
}

/// Calls a raw driver function and checks its result: `cu!(cuInit(0))`. The call is unsafe:
/// every use carries a `// SAFETY:` comment on the handles and pointers it passes.
macro_rules! cu {
    ($f:ident ( $($arg:expr),* $(,)? )) => {
        $crate::error::check(
            stringify!($f),
            // SAFETY: the caller's `// SAFETY:` comment covers the arguments of this call.
            unsafe { cudarc::driver::sys::$f($($arg),*) },
        )
    };
}
pub(crate) use cu;

//! The kernel payload of the CUDA backend.

use crate::error::{CudaError, Result, cu};
use cudarc::driver::sys;
use std::ffi::c_void;

/// Most kernel arguments a payload carries (besides the guard's three).
pub const MAX_ARGS: usize = 12;

/// One kernel launch. Arguments are passed by value, each at most 8 bytes (pointers, integers,
/// floats as their bits), in the kernel's parameter order; a 4-byte parameter reads the low half.
///
/// `func` must be a function of a module that stays loaded while launches of this kernel run,
/// taking exactly `nargs` parameters of at most 8 bytes (after the guard's three when
/// `guard` is set): the driver reads that many argument slots.
/// A clone is a new launch: the completion slot of a launch belongs to its command (the queue's
/// `Deferred`), not to the kernel.
#[derive(Clone, Debug)]
pub struct Kernel {
    pub func: sys::CUfunction,
    pub grid: [u32; 3],
    pub block: [u32; 3],
    pub shared_mem: u32,
    pub args: [u64; MAX_ARGS],
    pub nargs: usize,
    /// Built with `xpreempt_guard.cuh`: its first parameters are `XP_GUARD_PARAMS`, which the
    /// backend fills in, and `units` completion words (blocks, or items of a persistent kernel).
    pub guard: Option<GuardUnits>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GuardUnits(pub u32);

// SAFETY: a CUfunction is an opaque handle into a module, usable from any thread of the process
// (the driver locks internally); the rest is plain data.
unsafe impl Send for Kernel {}
// SAFETY: as above; `&Kernel` only reads the handle and the arguments.
unsafe impl Sync for Kernel {}

impl Kernel {
    /// A launch of `func` with `args`; fails when there are more than [`MAX_ARGS`].
    pub fn new(
        func: sys::CUfunction,
        grid: [u32; 3],
        block: [u32; 3],
        args: &[u64],
    ) -> Result<Self> {
        let mut a = [0u64; MAX_ARGS];
        a.get_mut(..args.len())
            .ok_or(CudaError::TooManyArgs {
                given: args.len(),
                max: MAX_ARGS,
            })?
            .copy_from_slice(args);
        Ok(Self {
            func,
            grid,
            block,
            shared_mem: 0,
            args: a,
            nargs: args.len(),
            guard: None,
        })
    }

    /// Marks the kernel as guard-built with one completion word per block.
    pub fn guarded(mut self) -> Self {
        self.guard = Some(GuardUnits(self.grid[0] * self.grid[1] * self.grid[2]));
        self
    }

    /// Marks a persistent guard-built kernel with `items` completion words.
    pub fn guarded_items(mut self, items: u32) -> Self {
        self.guard = Some(GuardUnits(items));
        self
    }
}

/// `cuLaunchKernel` on `stream` with `leading` parameters (the guard's, at most three) before the
/// kernel's own.
///
/// # Safety
///
/// `stream` is a live stream of the current context, and `k` keeps the contract of [`Kernel`]:
/// its function is loaded and takes exactly `leading.len() + k.nargs` parameters of at most
/// 8 bytes, so the driver reads only the argument slots filled in here.
pub unsafe fn launch_on(
    stream: cudarc::driver::sys::CUstream,
    k: &Kernel,
    leading: &mut [u64],
) -> Result<()> {
    let mut args = k.args;
    let own = args.get_mut(..k.nargs).ok_or(CudaError::TooManyArgs {
        given: k.nargs,
        max: MAX_ARGS,
    })?;
    let mut ptrs: [*mut c_void; MAX_ARGS + 3] = [std::ptr::null_mut(); MAX_ARGS + 3];
    for (p, v) in ptrs
        .iter_mut()
        .zip(leading.iter_mut().chain(own.iter_mut()))
    {
        *p = (v as *mut u64).cast();
    }
    // SAFETY: `ptrs` points at `leading` and the local copy `args`, both alive until the call
    // returns (the driver copies the values at launch); the caller vouches for `stream` and for
    // the function's parameter list.
    cu!(cuLaunchKernel(
        k.func,
        k.grid[0],
        k.grid[1],
        k.grid[2],
        k.block[0],
        k.block[1],
        k.block[2],
        k.shared_mem,
        stream,
        ptrs.as_mut_ptr(),
        std::ptr::null_mut()
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn too_many_arguments_is_an_error() {
        let f = std::ptr::null_mut();
        assert!(Kernel::new(f, [1; 3], [1; 3], &[0; MAX_ARGS]).is_ok());
        assert!(matches!(
            Kernel::new(f, [1; 3], [1; 3], &[0; MAX_ARGS + 1]),
            Err(CudaError::TooManyArgs { given: 13, max: 12 })
        ));
    }
}

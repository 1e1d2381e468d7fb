//! The kernel payload of the CUDA backend.

use crate::error::{CudaError, Result};
use cudarc::driver::sys;

/// Most kernel arguments a payload carries (besides the guard's three).
pub const MAX_ARGS: usize = 12;

/// One kernel launch. Arguments are passed by value, each at most 8 bytes (pointers, integers,
/// floats as their bits), in the kernel's parameter order; a 4-byte parameter reads the low half.
///
/// `func` must be a function of a module that stays loaded while launches of this kernel run,
/// taking exactly `nargs` parameters of at most 8 bytes (after the guard's three when
/// `guard` is set): the driver reads that many argument slots.
#[derive(Debug)]
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
    /// Completion-array slot and epoch, assigned at the first launch and reused on relaunch.
    pub(crate) slot: Option<(u32, u32)>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GuardUnits(pub u32);

/// A clone is a new launch: it does not inherit the completion slot of the original (it would
/// otherwise count the original's finished blocks as its own).
impl Clone for Kernel {
    fn clone(&self) -> Self {
        Self {
            func: self.func,
            grid: self.grid,
            block: self.block,
            shared_mem: self.shared_mem,
            args: self.args,
            nargs: self.nargs,
            guard: self.guard,
            slot: None,
        }
    }
}

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
            slot: None,
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

//! How one command goes onto a `CudaQueue`'s stream: kernel parameters (with the guard's three
//! filled in), completion slots, copies, memsets and host callbacks. Every function here either
//! hands the command to the hardware or fails with nothing launched.

use crate::error::{CudaError, Result, cu};
use crate::kernel::{Kernel, MAX_ARGS};
use crate::queue::{CudaQueue, Inner};
use std::ffi::c_void;
use xpreempt_types::{Command, Op};

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

impl CudaQueue {
    /// Launches; returns the completion slot of a guarded kernel. An error means nothing was
    /// launched (a slot assigned for this launch is given back).
    pub(crate) fn launch_kernel(&self, g: &mut Inner, k: &mut Kernel) -> Result<Option<u32>> {
        let mut guard_vals: [u64; 3] = [0; 3];
        let mut fresh_slot = None;
        if let Some(units) = k.guard {
            if units.0 > self.cfg.max_units {
                return Err(CudaError::GuardTooLarge {
                    units: units.0,
                    max_units: self.cfg.max_units,
                });
            }
            let (slot, epoch) = match k.slot {
                Some(se) => se,
                None => {
                    let slot = g.next_slot;
                    // A slot still held by an unfinished (or stopped) kernel must not be reused:
                    // its relaunch would take the new epoch's marks for its own. (Completion
                    // is learnt by synchronizing; a busy slot asks the hardware once more.)
                    if g.flight.slot_busy(slot) {
                        self.reap(g);
                    }
                    if g.flight.slot_busy(slot) {
                        return Err(CudaError::SlotsExhausted {
                            slots: self.cfg.slots,
                        });
                    }
                    g.next_slot = (g.next_slot + 1) % self.cfg.slots;
                    g.epoch = g.epoch.wrapping_add(1).max(1);
                    k.slot = Some((slot, g.epoch));
                    fresh_slot = Some(slot);
                    (slot, g.epoch)
                }
            };
            let done = self.done.ptr + slot as u64 * self.cfg.max_units as u64 * 4;
            guard_vals = [self.flag.ptr, done, epoch as u64];
        }
        let guard = if k.guard.is_some() {
            &mut guard_vals[..]
        } else {
            &mut [][..]
        };
        // SAFETY: `g.stream` is this queue's live stream (its context is bound by the HwQueue
        // entry points); a guarded kernel gets its three guard values here, and `Kernel`'s
        // contract covers the rest of its parameters.
        let launched = unsafe { launch_on(g.stream, k, guard) };
        if let Err(e) = launched {
            if let Some(slot) = fresh_slot {
                // Not launched: the next attempt takes a slot afresh (this one, if still free).
                k.slot = None;
                g.next_slot = slot;
            }
            return Err(e);
        }
        Ok(k.slot.filter(|_| k.guard.is_some()).map(|(slot, _)| slot))
    }

    /// Launches one command; returns the completion slot of a guarded kernel. An error means
    /// nothing was launched, and the command is as it was.
    pub(crate) fn launch_op(
        &self,
        g: &mut Inner,
        cmd: &mut Command<Kernel>,
    ) -> Result<Option<u32>> {
        match &mut cmd.op {
            Op::Kernel(k) => self.launch_kernel(g, k),
            Op::Memcpy {
                dst, src, bytes, ..
            } => {
                // SAFETY: `g.stream` is live. The addresses are trusted as the HAL's command
                // model trusts a kernel's pointer arguments: the submitter owns both ranges
                // until the command completes (see the crate README, "Soundness").
                cu!(cuMemcpyAsync(*dst, *src, *bytes as usize, g.stream))?;
                Ok(None)
            }
            Op::Memset { dst, value, bytes } => {
                // SAFETY: as for the copy: a live stream and the submitter's device address.
                cu!(cuMemsetD8Async(*dst, *value, *bytes as usize, g.stream))?;
                Ok(None)
            }
            Op::Barrier => Ok(None), // a stream is in order already
            Op::HostCallback(_) => {
                let Op::HostCallback(f) = std::mem::replace(&mut cmd.op, Op::Barrier) else {
                    unreachable!()
                };
                let data = Box::into_raw(Box::new(f));
                // SAFETY: `g.stream` is live; the driver calls the trampoline once with `data`,
                // which owns the boxed callback from here (or hands it back on failure below).
                if let Err(e) = cu!(cuLaunchHostFunc(
                    g.stream,
                    Some(host_trampoline),
                    data.cast()
                )) {
                    // SAFETY: the driver did not take it; reclaim the box leaked above and put
                    // the callback back, so that a retry still runs it.
                    let f = *unsafe { Box::from_raw(data) };
                    cmd.op = Op::HostCallback(f);
                    return Err(e);
                }
                Ok(None)
            }
            Op::EventRecord(_) => Err(CudaError::UnsupportedCommand("EventRecord")),
            Op::EventWait(_) => Err(CudaError::UnsupportedCommand("EventWait")),
        }
    }
}

unsafe extern "C" fn host_trampoline(data: *mut c_void) {
    // SAFETY: `data` is the Box leaked in launch_op, called exactly once by the driver.
    let f = unsafe { Box::from_raw(data.cast::<xpreempt_types::HostFn>()) };
    if std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).is_err() {
        tracing::error!("host callback panicked");
    }
}

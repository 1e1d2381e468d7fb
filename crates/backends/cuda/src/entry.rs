//! The driver entry points a [`crate::CudaQueue`] calls, as a table its owner passes in: the CUDA
//! shim passes libcuda's real functions (behind its fork gate, and outside any stream capture of
//! the application), everything else [`Cudarc`], the driver cudarc loaded. The queue itself is
//! the same for both.
//!
//! Handles are the driver's opaque pointers and results its status codes, as libcuda's C API
//! has them: the table is that API, so a front end with its own libcuda table implements it
//! without conversions.

use cudarc::driver::sys;
use std::ffi::c_void;

/// A driver status (`CUresult`).
pub type CUresult = u32;
/// A driver handle: a context, a stream or an event.
pub type Handle = *mut c_void;

pub const SUCCESS: CUresult = 0;
pub const ERROR_INVALID_VALUE: CUresult = 1;
pub const ERROR_NOT_FOUND: CUresult = 500;
pub const ERROR_NOT_READY: CUresult = 600;
pub const STREAM_NON_BLOCKING: u32 = 0x1;
const EVENT_DISABLE_TIMING: u32 = 0x2;

/// The libcuda calls of a queue. Every handle passed in is one the queue made or was given; the
/// driver validates it as it does for any caller.
pub trait Driver: Send + Sync {
    fn event_create(&self, ev: &mut Handle, flags: u32) -> CUresult;
    fn event_record(&self, ev: Handle, stream: Handle) -> CUresult;
    fn event_query(&self, ev: Handle) -> CUresult;
    fn event_destroy(&self, ev: Handle) -> CUresult;
    fn ctx_get_current(&self, ctx: &mut Handle) -> CUresult;
    fn ctx_push(&self, ctx: Handle) -> CUresult;
    fn ctx_pop(&self, ctx: &mut Handle) -> CUresult;
    fn stream_priority_range(&self, least: &mut i32, greatest: &mut i32) -> CUresult;
    fn stream_create(&self, stream: &mut Handle, flags: u32, priority: i32) -> CUresult;
    fn stream_wait_event(&self, stream: Handle, ev: Handle, flags: u32) -> CUresult;
    fn stream_synchronize(&self, stream: Handle) -> CUresult;
    fn stream_destroy(&self, stream: Handle) -> CUresult;
    fn mem_alloc(&self, ptr: &mut u64, bytes: usize) -> CUresult;
    fn mem_free(&self, ptr: u64) -> CUresult;
    fn memset_d32_async(&self, ptr: u64, value: u32, count: usize, stream: Handle) -> CUresult;

    /// Makes a command's deferred driver call (`call`); a front end that must keep its own
    /// threads' calls apart from something (a fork) wraps it here.
    fn call(&self, call: &mut dyn FnMut() -> CUresult) -> CUresult {
        call()
    }

    /// Something the queue could not do and worked around: for the front end's log.
    fn note(&self, msg: std::fmt::Arguments<'_>) {
        tracing::warn!("{msg}");
    }
}

/// A new event for completion only (cheaper to record than a timed one).
pub fn new_event(drv: &dyn Driver) -> Result<Handle, CUresult> {
    let mut ev: Handle = std::ptr::null_mut();
    match drv.event_create(&mut ev, EVENT_DISABLE_TIMING) {
        SUCCESS => Ok(ev),
        e => Err(e),
    }
}

/// Makes `ctx` current on this thread for the guard's life, if it is not already.
pub struct CtxGuard<'a> {
    drv: &'a dyn Driver,
    pushed: bool,
}

impl<'a> CtxGuard<'a> {
    pub fn enter(drv: &'a dyn Driver, ctx: Handle) -> Self {
        let mut cur: Handle = std::ptr::null_mut();
        let current = ctx.is_null() || (drv.ctx_get_current(&mut cur) == SUCCESS && cur == ctx);
        Self {
            drv,
            pushed: !current && drv.ctx_push(ctx) == SUCCESS,
        }
    }
}

impl Drop for CtxGuard<'_> {
    fn drop(&mut self) {
        if self.pushed {
            let mut old: Handle = std::ptr::null_mut();
            self.drv.ctx_pop(&mut old);
        }
    }
}

/// The driver as cudarc loaded it (`crate::driver`): what a queue outside the shim calls.
pub struct Cudarc;

/// The one [`Cudarc`] table.
pub static CUDARC: Cudarc = Cudarc;

fn code(r: sys::CUresult) -> CUresult {
    r as CUresult
}

// Each call hands its arguments to libcuda unchanged: handles the caller vouches for (see
// `Driver`) and out-pointers to the caller's live locals.
impl Driver for Cudarc {
    fn event_create(&self, ev: &mut Handle, flags: u32) -> CUresult {
        // SAFETY: `ev` is a live out-pointer.
        code(unsafe { sys::cuEventCreate((ev as *mut Handle).cast(), flags) })
    }

    fn event_record(&self, ev: Handle, stream: Handle) -> CUresult {
        // SAFETY: opaque handles, validated by the driver.
        code(unsafe { sys::cuEventRecord(ev.cast(), stream.cast()) })
    }

    fn event_query(&self, ev: Handle) -> CUresult {
        // SAFETY: an opaque handle, validated by the driver.
        code(unsafe { sys::cuEventQuery(ev.cast()) })
    }

    fn event_destroy(&self, ev: Handle) -> CUresult {
        // SAFETY: an event of the caller's, destroyed once.
        code(unsafe { sys::cuEventDestroy_v2(ev.cast()) })
    }

    fn ctx_get_current(&self, ctx: &mut Handle) -> CUresult {
        // SAFETY: `ctx` is a live out-pointer.
        code(unsafe { sys::cuCtxGetCurrent((ctx as *mut Handle).cast()) })
    }

    fn ctx_push(&self, ctx: Handle) -> CUresult {
        // SAFETY: an opaque handle, validated by the driver.
        code(unsafe { sys::cuCtxPushCurrent_v2(ctx.cast()) })
    }

    fn ctx_pop(&self, ctx: &mut Handle) -> CUresult {
        // SAFETY: `ctx` is a live out-pointer.
        code(unsafe { sys::cuCtxPopCurrent_v2((ctx as *mut Handle).cast()) })
    }

    fn stream_priority_range(&self, least: &mut i32, greatest: &mut i32) -> CUresult {
        // SAFETY: two live out-pointers.
        code(unsafe { sys::cuCtxGetStreamPriorityRange(least, greatest) })
    }

    fn stream_create(&self, stream: &mut Handle, flags: u32, priority: i32) -> CUresult {
        // SAFETY: `stream` is a live out-pointer.
        code(unsafe {
            sys::cuStreamCreateWithPriority((stream as *mut Handle).cast(), flags, priority)
        })
    }

    fn stream_wait_event(&self, stream: Handle, ev: Handle, flags: u32) -> CUresult {
        // SAFETY: opaque handles, validated by the driver.
        code(unsafe { sys::cuStreamWaitEvent(stream.cast(), ev.cast(), flags) })
    }

    fn stream_synchronize(&self, stream: Handle) -> CUresult {
        // SAFETY: an opaque handle, validated by the driver.
        code(unsafe { sys::cuStreamSynchronize(stream.cast()) })
    }

    fn stream_destroy(&self, stream: Handle) -> CUresult {
        // SAFETY: a stream of the caller's, destroyed once.
        code(unsafe { sys::cuStreamDestroy_v2(stream.cast()) })
    }

    fn mem_alloc(&self, ptr: &mut u64, bytes: usize) -> CUresult {
        // SAFETY: `ptr` is a live out-pointer.
        code(unsafe { sys::cuMemAlloc_v2(ptr, bytes) })
    }

    fn mem_free(&self, ptr: u64) -> CUresult {
        // SAFETY: an allocation of the caller's, freed once.
        code(unsafe { sys::cuMemFree_v2(ptr) })
    }

    fn memset_d32_async(&self, ptr: u64, value: u32, count: usize, stream: Handle) -> CUresult {
        // SAFETY: device memory of the caller's, `count` words long, on its stream.
        code(unsafe { sys::cuMemsetD32Async(ptr, value, count, stream.cast()) })
    }
}

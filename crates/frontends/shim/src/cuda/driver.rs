//! The few libcuda calls the shim makes on its own behalf (events for completion, contexts,
//! parameter layouts), always to the real functions; [`REAL`] hands them to the CUDA queue as its
//! driver table.

use super::real::Real;
use xpreempt_cuda::entry::{self, Driver};
pub use xpreempt_cuda::entry::{
    CUresult, ERROR_INVALID_VALUE, ERROR_NOT_FOUND, ERROR_NOT_READY, Handle, STREAM_NON_BLOCKING,
    SUCCESS,
};

pub const ERROR_NOT_INITIALIZED: CUresult = 3;
/// The legacy default stream's handle, and the per-thread default stream's.
pub const STREAM_LEGACY: usize = 0x1;
pub const STREAM_PER_THREAD: usize = 0x2;

macro_rules! real_fn {
    ($vis:vis $name:ident: fn($($arg:ident: $ty:ty),*)) => {
        // The pointers go to the driver, which validates them as it does for any caller.
        #[allow(non_snake_case, clippy::not_unsafe_ptr_arg_deref)]
        $vis fn $name($($arg: $ty),*) -> CUresult {
            static REAL: Real = Real::new({
                const N: &[u8] = concat!(stringify!($name), "\0").as_bytes();
                match std::ffi::CStr::from_bytes_with_nul(N) {
                    Ok(c) => c,
                    Err(_) => panic!("bad name"),
                }
            });
            let a = REAL.addr();
            if a == 0 {
                return ERROR_NOT_FOUND;
            }
            let _inside = crate::cuda::fork_gate::enter();
            // SAFETY: libcuda's export of this name has exactly this C signature (cuda.h).
            unsafe {
                let f = std::mem::transmute::<usize, unsafe extern "C" fn($($ty),*) -> CUresult>(a);
                f($($arg),*)
            }
        }
    };
}

real_fn!(pub cuEventCreate: fn(ev: *mut Handle, flags: u32));
real_fn!(pub cuEventRecord: fn(ev: Handle, stream: Handle));
/// The driver's own event query and synchronize; the shim calls them through
/// [`cuEventQuery`] and [`cuEventSynchronize`] below.
mod raw {
    use super::*;
    real_fn!(pub cuEventQuery: fn(ev: Handle));
    real_fn!(pub cuEventSynchronize: fn(ev: Handle));
    real_fn!(pub cuThreadExchangeStreamCaptureMode: fn(mode: *mut u32));
}
real_fn!(pub cuEventDestroy_v2: fn(ev: Handle));
real_fn!(pub cuCtxGetCurrent: fn(ctx: *mut Handle));
real_fn!(pub cuCtxPushCurrent_v2: fn(ctx: Handle));
real_fn!(pub cuCtxPopCurrent_v2: fn(ctx: *mut Handle));
real_fn!(pub cuCtxGetDevice: fn(dev: *mut i32));
real_fn!(pub cuStreamGetCtx: fn(stream: Handle, ctx: *mut Handle));
real_fn!(pub cuStreamGetFlags: fn(stream: Handle, flags: *mut u32));
real_fn!(pub cuStreamIsCapturing: fn(stream: Handle, status: *mut u32));
real_fn!(pub cuFuncGetParamInfo: fn(f: Handle, index: usize, offset: *mut usize, size: *mut usize));
real_fn!(pub cuKernelGetParamInfo: fn(f: Handle, index: usize, offset: *mut usize, size: *mut usize));
real_fn!(pub cuCtxGetStreamPriorityRange: fn(least: *mut i32, greatest: *mut i32));
// Lv2: recognizing guard-built kernels (their marker global), and each queue's flag, completion
// array and control stream.
real_fn!(pub cuFuncGetName: fn(name: *mut *const std::ffi::c_char, f: Handle));
real_fn!(pub cuFuncGetModule: fn(module: *mut Handle, f: Handle));
real_fn!(pub cuModuleGetGlobal_v2: fn(ptr: *mut u64, bytes: *mut usize, module: Handle, name: *const std::ffi::c_char));
real_fn!(pub cuKernelGetName: fn(name: *mut *const std::ffi::c_char, k: Handle));
real_fn!(pub cuKernelGetLibrary: fn(lib: *mut Handle, k: Handle));
real_fn!(pub cuLibraryGetGlobal: fn(ptr: *mut u64, bytes: *mut usize, lib: Handle, name: *const std::ffi::c_char));
real_fn!(pub cuMemAlloc_v2: fn(ptr: *mut u64, bytes: usize));
real_fn!(pub cuMemFree_v2: fn(ptr: u64));
real_fn!(pub cuMemsetD32Async: fn(ptr: u64, value: u32, count: usize, stream: Handle));
real_fn!(pub cuStreamCreateWithPriority: fn(stream: *mut Handle, flags: u32, priority: i32));
real_fn!(pub cuStreamWaitEvent: fn(stream: Handle, ev: Handle, flags: u32));
real_fn!(pub cuStreamSynchronize: fn(stream: Handle));
real_fn!(pub cuStreamDestroy_v2: fn(stream: Handle));

const STREAM_CAPTURE_MODE_RELAXED: u32 = 2;

/// Runs `f` (one of the shim's own waits on its own events) in the relaxed stream-capture mode.
/// Beside another thread's stream capture in the global mode (CUDA's default), CUDA counts an
/// event query or synchronize as a potentially unsafe call and invalidates that capture; the
/// shim's completion watchers query events all the time, so an application that captures while
/// it launches on other streams would see its capture fail only under the shim.
fn relaxed(f: impl FnOnce() -> CUresult) -> CUresult {
    let mut mode = STREAM_CAPTURE_MODE_RELAXED;
    let swapped = raw::cuThreadExchangeStreamCaptureMode(&mut mode) == SUCCESS;
    let r = f();
    if swapped {
        raw::cuThreadExchangeStreamCaptureMode(&mut mode);
    }
    r
}

#[allow(non_snake_case)]
pub fn cuEventQuery(ev: Handle) -> CUresult {
    relaxed(|| raw::cuEventQuery(ev))
}

#[allow(non_snake_case)]
pub fn cuEventSynchronize(ev: Handle) -> CUresult {
    relaxed(|| raw::cuEventSynchronize(ev))
}

/// Makes `ctx` current on this thread for the guard's life, if it is not already.
pub type CtxGuard = entry::CtxGuard<'static>;

/// [`CtxGuard`] through the real functions.
pub fn enter_ctx(ctx: Handle) -> CtxGuard {
    entry::CtxGuard::enter(&REAL, ctx)
}

pub fn current_ctx() -> Handle {
    let mut cur: Handle = std::ptr::null_mut();
    if cuCtxGetCurrent(&mut cur) != SUCCESS {
        return std::ptr::null_mut();
    }
    cur
}

pub fn new_event() -> Result<Handle, CUresult> {
    entry::new_event(&REAL)
}

/// libcuda's real functions as the CUDA queue's driver table: each call outside the
/// application's fork (`fork_gate`), the event queries outside its stream captures
/// ([`cuEventQuery`]), and what the queue works around in the shim's log.
pub struct RealTable;

/// The shim's one driver table.
pub static REAL: RealTable = RealTable;

impl Driver for RealTable {
    fn event_create(&self, ev: &mut Handle, flags: u32) -> CUresult {
        cuEventCreate(ev, flags)
    }

    fn event_record(&self, ev: Handle, stream: Handle) -> CUresult {
        cuEventRecord(ev, stream)
    }

    fn event_query(&self, ev: Handle) -> CUresult {
        cuEventQuery(ev)
    }

    fn event_destroy(&self, ev: Handle) -> CUresult {
        cuEventDestroy_v2(ev)
    }

    fn ctx_get_current(&self, ctx: &mut Handle) -> CUresult {
        cuCtxGetCurrent(ctx)
    }

    fn ctx_push(&self, ctx: Handle) -> CUresult {
        cuCtxPushCurrent_v2(ctx)
    }

    fn ctx_pop(&self, ctx: &mut Handle) -> CUresult {
        cuCtxPopCurrent_v2(ctx)
    }

    fn stream_priority_range(&self, least: &mut i32, greatest: &mut i32) -> CUresult {
        cuCtxGetStreamPriorityRange(least, greatest)
    }

    fn stream_create(&self, stream: &mut Handle, flags: u32, priority: i32) -> CUresult {
        cuStreamCreateWithPriority(stream, flags, priority)
    }

    fn stream_wait_event(&self, stream: Handle, ev: Handle, flags: u32) -> CUresult {
        cuStreamWaitEvent(stream, ev, flags)
    }

    fn stream_synchronize(&self, stream: Handle) -> CUresult {
        cuStreamSynchronize(stream)
    }

    fn stream_destroy(&self, stream: Handle) -> CUresult {
        cuStreamDestroy_v2(stream)
    }

    fn mem_alloc(&self, ptr: &mut u64, bytes: usize) -> CUresult {
        cuMemAlloc_v2(ptr, bytes)
    }

    fn mem_free(&self, ptr: u64) -> CUresult {
        cuMemFree_v2(ptr)
    }

    fn memset_d32_async(&self, ptr: u64, value: u32, count: usize, stream: Handle) -> CUresult {
        cuMemsetD32Async(ptr, value, count, stream)
    }

    fn call(&self, call: &mut dyn FnMut() -> CUresult) -> CUresult {
        let _inside = super::fork_gate::enter();
        call()
    }

    fn note(&self, msg: std::fmt::Arguments<'_>) {
        shim_log!("{msg}");
    }
}

/// (offset, size) of each parameter of a kernel, from the driver.
pub fn param_layout(f: Handle) -> Option<Vec<(usize, usize)>> {
    // A CUkernel (from cuLibraryGetKernel) may be launched as a CUfunction; the function query
    // may then see no parameters, so an empty answer is checked with the kernel query.
    let mut empty = false;
    for query in [cuFuncGetParamInfo, cuKernelGetParamInfo] {
        let mut out = Vec::new();
        loop {
            let (mut off, mut size) = (0usize, 0usize);
            match query(f, out.len(), &mut off, &mut size) {
                SUCCESS => out.push((off, size)),
                // Past the last parameter.
                ERROR_INVALID_VALUE if !out.is_empty() => return Some(out),
                ERROR_INVALID_VALUE => {
                    empty = true;
                    break;
                }
                _ => break,
            }
            if out.len() > 4096 {
                return None;
            }
        }
    }
    empty.then(Vec::new)
}

/// Whether `stream` is being captured (a query only made while some capture is active).
pub fn is_capturing(stream: Handle) -> bool {
    let mut status = 0u32;
    cuStreamIsCapturing(stream, &mut status) == SUCCESS && status != 0
}

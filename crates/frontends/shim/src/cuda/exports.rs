//! The libcuda entry points the shim exports, under libcuda's own names (each tied to exactly
//! one libcuda export, so versioned and per-thread variants keep their semantics). Each catches
//! panics and then calls libcuda directly.

#![allow(non_snake_case)]

use super::driver::{CUresult, ERROR_NOT_INITIALIZED, ERROR_NOT_READY, Handle, SUCCESS};
use super::launch;
use super::ordering;
use super::priority;
use super::real::Real;
use super::streams;
use std::ffi::c_void;
use xpreempt_cuda::queue::capture;

macro_rules! real {
    ($name:ident) => {{
        static REAL: Real = Real::new({
            const N: &[u8] = concat!(stringify!($name), "\0").as_bytes();
            match std::ffi::CStr::from_bytes_with_nul(N) {
                Ok(c) => c,
                Err(_) => panic!("bad name"),
            }
        });
        &REAL
    }};
}

/// Calls libcuda's `$name` with the same arguments (all integer or pointer sized: forwarding
/// them as `usize` is exact on the C ABI).
macro_rules! call_real {
    ($real:expr, $($a:ident),*) => {{
        let addr = $real.addr();
        if addr == 0 {
            ERROR_NOT_INITIALIZED
        } else {
            // SAFETY: libcuda's export of this name takes these integer/pointer arguments.
            unsafe {
                std::mem::transmute::<usize, unsafe extern "C" fn($(forward!(@ty $a)),*) -> CUresult>(addr)($($a),*)
            }
        }
    }};
}

/// A wrapper that runs `$before` (given the stream argument), then calls libcuda.
macro_rules! forward {
    (@ty $a:ident) => { usize };
    // The one wrapper: `$before` (caught), libcuda's function, then `$after` (caught).
    (@wrap $name:ident($($a:ident),*) before $before:expr, after $after:expr) => {
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name($($a: usize),*) -> CUresult {
            let real = real!($name);
            super::exit_report::serving(stringify!($name));
            let _ = std::panic::catch_unwind(|| $before);
            super::exit_report::served();
            let r = call_real!(real, $($a),*);
            let _ = std::panic::catch_unwind(|| $after);
            r
        }
    };
    ($name:ident($($a:ident),*) stream $s:ident, ptsz $p:expr) => {
        forward!(@wrap $name($($a),*) before ordering::before_direct($s as Handle, $p), after ());
    };
    // A host function or callback behind the stream's work: the application waits for that
    // work, asking to be called back rather than blocking.
    ($name:ident($($a:ident),*) callback $s:ident, ptsz $p:expr) => {
        forward!(@wrap $name($($a),*) before {
            streams::waited($s as Handle, $p);
            ordering::before_direct($s as Handle, $p)
        }, after ());
    };
    // An asynchronous copy: ordered as any direct call and, in pass-through mode, observed as
    // work on its stream (`launch::observed`), as a launch is.
    ($name:ident($($a:ident),*) copy $s:ident, ptsz $p:expr) => {
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name($($a: usize),*) -> CUresult {
            let real = real!($name);
            super::exit_report::serving(stringify!($name));
            let _ = std::panic::catch_unwind(|| ordering::before_direct($s as Handle, $p));
            super::exit_report::served();
            let r = call_real!(real, $($a),*);
            std::panic::catch_unwind(|| launch::observed($s as Handle, $p, r)).unwrap_or(r)
        }
    };
    ($name:ident($($a:ident),*) teardown) => {
        forward!(@wrap $name($($a),*) before { streams::forget_all() },
            after launch::forget_layouts());
    };
    ($name:ident($($a:ident),*) unload) => {
        forward!(@wrap $name($($a),*) before ordering::drain_all(), after launch::forget_layouts());
    };
    // A synchronous call: the application waits for it, and it follows everything buffered.
    ($name:ident($($a:ident),*) drain_all) => {
        forward!(@wrap $name($($a),*) before { streams::waited_all(); ordering::drain_all() }, after ());
    };
}

/// A device-side operation on a stream (a set, a device-to-device copy): a command of the
/// stream's queue, as a launch is, so the application's thread does not wait for the queue's
/// buffer. Only operations that read nothing of the host's at the call belong here (a copy from
/// pageable memory reads its source then: it stays `forward!`).
macro_rules! queued {
    ($name:ident($($a:ident),*) stream $s:ident, ptsz $p:expr) => {
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name($($a: usize),*) -> CUresult {
            let real = real!($name);
            guarded(stringify!($name), |intercept| {
                launch::stream_op(intercept, $s as Handle, $p, move || call_real!(real, $($a),*))
            })
        }
    };
}

queued!(cuMemcpyDtoDAsync_v2(a, b, c, s) stream s, ptsz false);
queued!(cuMemcpyDtoDAsync_v2_ptsz(a, b, c, s) stream s, ptsz true);
queued!(cuMemsetD8Async(a, b, c, s) stream s, ptsz false);
queued!(cuMemsetD8Async_ptsz(a, b, c, s) stream s, ptsz true);
queued!(cuMemsetD16Async(a, b, c, s) stream s, ptsz false);
queued!(cuMemsetD16Async_ptsz(a, b, c, s) stream s, ptsz true);
queued!(cuMemsetD32Async(a, b, c, s) stream s, ptsz false);
queued!(cuMemsetD32Async_ptsz(a, b, c, s) stream s, ptsz true);
queued!(cuMemsetD2D8Async(a, b, c, d, e, s) stream s, ptsz false);
queued!(cuMemsetD2D8Async_ptsz(a, b, c, d, e, s) stream s, ptsz true);
queued!(cuMemsetD2D16Async(a, b, c, d, e, s) stream s, ptsz false);
queued!(cuMemsetD2D16Async_ptsz(a, b, c, d, e, s) stream s, ptsz true);
queued!(cuMemsetD2D32Async(a, b, c, d, e, s) stream s, ptsz false);
queued!(cuMemsetD2D32Async_ptsz(a, b, c, d, e, s) stream s, ptsz true);

// ---- operations on a stream that go straight to the driver after what they follow ----
forward!(cuMemcpyAsync(a, b, c, s) copy s, ptsz false);
forward!(cuMemcpyAsync_ptsz(a, b, c, s) copy s, ptsz true);
forward!(cuMemcpyHtoDAsync_v2(a, b, c, s) copy s, ptsz false);
forward!(cuMemcpyHtoDAsync_v2_ptsz(a, b, c, s) copy s, ptsz true);
forward!(cuMemcpyDtoHAsync_v2(a, b, c, s) copy s, ptsz false);
forward!(cuMemcpyDtoHAsync_v2_ptsz(a, b, c, s) copy s, ptsz true);
forward!(cuMemcpy2DAsync_v2(a, s) copy s, ptsz false);
forward!(cuMemcpy2DAsync_v2_ptsz(a, s) copy s, ptsz true);
forward!(cuMemcpy3DAsync_v2(a, s) copy s, ptsz false);
forward!(cuMemcpy3DAsync_v2_ptsz(a, s) copy s, ptsz true);
forward!(cuMemcpyPeerAsync(a, b, c, d, e, s) copy s, ptsz false);
forward!(cuMemcpyPeerAsync_ptsz(a, b, c, d, e, s) copy s, ptsz true);
forward!(cuLaunchHostFunc(s, b, c) callback s, ptsz false);
forward!(cuLaunchHostFunc_ptsz(s, b, c) callback s, ptsz true);
forward!(cuStreamAddCallback(s, b, c, d) callback s, ptsz false);
forward!(cuStreamAddCallback_ptsz(s, b, c, d) callback s, ptsz true);
forward!(cuEventRecord(e, s) stream s, ptsz false);
forward!(cuEventRecord_ptsz(e, s) stream s, ptsz true);
forward!(cuEventRecordWithFlags(e, s, f) stream s, ptsz false);
forward!(cuEventRecordWithFlags_ptsz(e, s, f) stream s, ptsz true);
forward!(cuStreamWaitEvent(s, e, f) stream s, ptsz false);
forward!(cuStreamWaitEvent_ptsz(s, e, f) stream s, ptsz true);
forward!(cuMemAllocAsync(p, n, s) stream s, ptsz false);
forward!(cuMemAllocAsync_ptsz(p, n, s) stream s, ptsz true);
forward!(cuMemFreeAsync(p, s) stream s, ptsz false);
forward!(cuMemFreeAsync_ptsz(p, s) stream s, ptsz true);
forward!(cuMemAllocFromPoolAsync(p, n, q, s) stream s, ptsz false);
forward!(cuMemAllocFromPoolAsync_ptsz(p, n, q, s) stream s, ptsz true);
forward!(cuMemPrefetchAsync(p, n, d, s) stream s, ptsz false);
forward!(cuMemPrefetchAsync_ptsz(p, n, d, s) stream s, ptsz true);
// (CUmemLocation, 8 bytes of two ints, is passed by value in one integer register.)
forward!(cuMemPrefetchAsync_v2(p, n, l, f, s) stream s, ptsz false);
forward!(cuMemPrefetchAsync_v2_ptsz(p, n, l, f, s) stream s, ptsz true);
forward!(cuStreamWriteValue32_v2(s, a, v, f) stream s, ptsz false);
forward!(cuStreamWriteValue32_v2_ptsz(s, a, v, f) stream s, ptsz true);
forward!(cuStreamWriteValue64_v2(s, a, v, f) stream s, ptsz false);
forward!(cuStreamWriteValue64_v2_ptsz(s, a, v, f) stream s, ptsz true);
forward!(cuStreamWaitValue32_v2(s, a, v, f) stream s, ptsz false);
forward!(cuStreamWaitValue32_v2_ptsz(s, a, v, f) stream s, ptsz true);
forward!(cuStreamWaitValue64_v2(s, a, v, f) stream s, ptsz false);
forward!(cuStreamWaitValue64_v2_ptsz(s, a, v, f) stream s, ptsz true);
forward!(cuStreamWriteValue32(s, a, v, f) stream s, ptsz false);
forward!(cuStreamWriteValue32_ptsz(s, a, v, f) stream s, ptsz true);
forward!(cuStreamWriteValue64(s, a, v, f) stream s, ptsz false);
forward!(cuStreamWriteValue64_ptsz(s, a, v, f) stream s, ptsz true);
forward!(cuStreamWaitValue32(s, a, v, f) stream s, ptsz false);
forward!(cuStreamWaitValue32_ptsz(s, a, v, f) stream s, ptsz true);
forward!(cuStreamWaitValue64(s, a, v, f) stream s, ptsz false);
forward!(cuStreamWaitValue64_ptsz(s, a, v, f) stream s, ptsz true);
forward!(cuStreamBatchMemOp_v2(s, n, p, f) stream s, ptsz false);
forward!(cuStreamBatchMemOp_v2_ptsz(s, n, p, f) stream s, ptsz true);
forward!(cuStreamBatchMemOp(s, n, p, f) stream s, ptsz false);
forward!(cuStreamBatchMemOp_ptsz(s, n, p, f) stream s, ptsz true);
forward!(cuGraphUpload(g, s) stream s, ptsz false);
forward!(cuGraphUpload_ptsz(g, s) stream s, ptsz true);
forward!(cuStreamAttachMemAsync(s, p, n, f) stream s, ptsz false);
forward!(cuStreamAttachMemAsync_ptsz(s, p, n, f) stream s, ptsz true);

// ---- synchronous calls: everything buffered goes out first ----
forward!(cuMemcpy(a, b, c) drain_all);
forward!(cuMemcpy_ptds(a, b, c) drain_all);
forward!(cuMemcpyHtoD_v2(a, b, c) drain_all);
forward!(cuMemcpyHtoD_v2_ptds(a, b, c) drain_all);
forward!(cuMemcpyDtoH_v2(a, b, c) drain_all);
forward!(cuMemcpyDtoH_v2_ptds(a, b, c) drain_all);
forward!(cuMemcpyDtoD_v2(a, b, c) drain_all);
forward!(cuMemcpyDtoD_v2_ptds(a, b, c) drain_all);
forward!(cuMemcpy2D_v2(a) drain_all);
forward!(cuMemcpy2D_v2_ptds(a) drain_all);
forward!(cuMemcpy2DUnaligned_v2(a) drain_all);
forward!(cuMemcpy2DUnaligned_v2_ptds(a) drain_all);
forward!(cuMemcpy3D_v2(a) drain_all);
forward!(cuMemcpy3D_v2_ptds(a) drain_all);
forward!(cuMemcpyPeer(a, b, c, d, e) drain_all);
forward!(cuMemcpyPeer_ptds(a, b, c, d, e) drain_all);
forward!(cuMemsetD8_v2(a, b, c) drain_all);
forward!(cuMemsetD8_v2_ptds(a, b, c) drain_all);
forward!(cuMemsetD16_v2(a, b, c) drain_all);
forward!(cuMemsetD16_v2_ptds(a, b, c) drain_all);
forward!(cuMemsetD32_v2(a, b, c) drain_all);
forward!(cuMemsetD32_v2_ptds(a, b, c) drain_all);
forward!(cuMemFree_v2(a) drain_all);
forward!(cuMemFreeHost(a) drain_all);
forward!(cuModuleUnload(a) unload);
forward!(cuLibraryUnload(a) unload);
// cuCtxSynchronize: below, with the stream synchronizes.
forward!(cuCtxSynchronize_v2(c) drain_all);
forward!(cuCtxDestroy_v2(a) teardown);
forward!(cuDevicePrimaryCtxRelease_v2(a) teardown);
forward!(cuDevicePrimaryCtxReset_v2(a) teardown);
// The first versions, still exported by libcuda: the CUDA 13.0 runtime asks cuGetProcAddress
// for cuDevicePrimaryCtxReset/Release at version 7000 and gets these (cudaDeviceReset and its
// exit handler call them), and for cuCtxDetach.
forward!(cuCtxDestroy(a) teardown);
forward!(cuCtxDetach(a) teardown);
forward!(cuDevicePrimaryCtxRelease(a) teardown);
forward!(cuDevicePrimaryCtxReset(a) teardown);

// ---- launches: through the stream's XQueue ----

/// Runs a launch through the shim (`run(true)`); on a panic inside the shim, interception stops
/// and the call goes to libcuda as made (`run(false)`).
/// `call` names the application's call for the exit report.
fn guarded(
    call: &'static str,
    run: impl Fn(bool) -> CUresult + std::panic::RefUnwindSafe,
) -> CUresult {
    super::exit_report::serving(call);
    let r = std::panic::catch_unwind(|| run(true)).unwrap_or_else(|_| {
        streams::turn_off("an internal error");
        run(false)
    });
    super::exit_report::served();
    r
}

macro_rules! launch_kernel {
    ($name:ident, ptsz $p:expr, cooperative $c:expr) => {
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name(
            f: Handle,
            gx: u32,
            gy: u32,
            gz: u32,
            bx: u32,
            by: u32,
            bz: u32,
            smem: u32,
            s: Handle,
            params: *mut *mut c_void,
            extra: *mut *mut c_void,
        ) -> CUresult {
            let real = real!($name);
            let (fp, sp, pp, ep) = (f as usize, s as usize, params as usize, extra as usize);
            let run = |intercept: bool| {
                // SAFETY: the application's launch, forwarded.
                unsafe {
                    launch::kernel(
                        real,
                        $p,
                        $c,
                        intercept,
                        fp as Handle,
                        [gx, gy, gz],
                        [bx, by, bz],
                        smem,
                        sp as Handle,
                        pp as *mut *mut c_void,
                        ep as *mut *mut c_void,
                    )
                }
            };
            guarded(stringify!($name), run)
        }
    };
}

launch_kernel!(cuLaunchKernel, ptsz false, cooperative false);
launch_kernel!(cuLaunchKernel_ptsz, ptsz true, cooperative false);
launch_kernel!(cuLaunchCooperativeKernel, ptsz false, cooperative true);
launch_kernel!(cuLaunchCooperativeKernel_ptsz, ptsz true, cooperative true);

macro_rules! launch_kernel_ex {
    ($name:ident, ptsz $p:expr) => {
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name(
            config: *const u8,
            f: Handle,
            params: *mut *mut c_void,
            extra: *mut *mut c_void,
        ) -> CUresult {
            let real = real!($name);
            let (cp, fp, pp, ep) = (config as usize, f as usize, params as usize, extra as usize);
            let run = |intercept: bool| {
                // SAFETY: the application's launch, forwarded.
                unsafe {
                    launch::kernel_ex(
                        real,
                        $p,
                        intercept,
                        cp as *const u8,
                        fp as Handle,
                        pp as *mut *mut c_void,
                        ep as *mut *mut c_void,
                    )
                }
            };
            guarded(stringify!($name), run)
        }
    };
}

launch_kernel_ex!(cuLaunchKernelEx, ptsz false);
launch_kernel_ex!(cuLaunchKernelEx_ptsz, ptsz true);

macro_rules! graph_launch {
    ($name:ident, ptsz $p:expr) => {
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name(exec: Handle, s: Handle) -> CUresult {
            let real = real!($name);
            let (e, sp) = (exec as usize, s as usize);
            // SAFETY: the application's launch, forwarded.
            let run = |intercept: bool| unsafe {
                launch::graph(real, $p, intercept, e as Handle, sp as Handle)
            };
            guarded(stringify!($name), run)
        }
    };
}

graph_launch!(cuGraphLaunch, ptsz false);
graph_launch!(cuGraphLaunch_ptsz, ptsz true);

// ---- synchronization, queries and stream lifecycle ----

macro_rules! stream_sync {
    ($name:ident, ptsz $p:expr) => {
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name(s: usize) -> CUresult {
            let real = real!($name);
            let _ = std::panic::catch_unwind(|| streams::waited(s as Handle, $p));
            loop {
                let seen = std::panic::catch_unwind(|| ordering::before_sync(s as Handle, $p))
                    .ok()
                    .flatten();
                let r = call_real!(real, s);
                let Some((q, generation)) = seen else {
                    return r;
                };
                // Kernels stopped at Lv2 while the driver waited ended early: wait again.
                let again = r == SUCCESS
                    && std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                        q.xq.hal().stopped_since(generation)
                    }))
                    .unwrap_or(false);
                if !again {
                    let sticky = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                        q.xq.hal().take_sticky()
                    }))
                    .unwrap_or(SUCCESS);
                    return if r == SUCCESS { sticky } else { r };
                }
            }
        }
    };
}

stream_sync!(cuStreamSynchronize, ptsz false);
stream_sync!(cuStreamSynchronize_ptsz, ptsz true);

/// Everything buffered goes out first; then, as cuStreamSynchronize does for its stream, the
/// error of a launch the driver refused from a pending buffer of the current context (natively
/// the launch call returned it; an application that checks with cudaDeviceSynchronize would
/// never see it otherwise).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxSynchronize() -> CUresult {
    let real = real!(cuCtxSynchronize);
    super::exit_report::serving("cuCtxSynchronize");
    let sticky = std::panic::catch_unwind(|| {
        // (A forked child must not touch the queues: their lock may be held by a thread that
        // only the parent has.)
        streams::waited_all();
        if !streams::active() {
            return SUCCESS;
        }
        ordering::drain_all();
        let ctx = super::driver::current_ctx() as usize;
        streams::all()
            .iter()
            .filter(|q| q.ctx == ctx)
            .map(|q| q.xq.hal().take_sticky())
            .find(|&e| e != SUCCESS)
            .unwrap_or(SUCCESS)
    })
    .unwrap_or(SUCCESS);
    super::exit_report::served();
    let r = call_real!(real,);
    if r == SUCCESS { sticky } else { r }
}

macro_rules! stream_query {
    ($name:ident, ptsz $p:expr) => {
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name(s: usize) -> CUresult {
            let real = real!($name);
            // NOT_READY while the stream holds buffered commands (or kernels stopped at Lv2); then
            // the error of a launch the driver refused from the buffer, once, as
            // cuStreamSynchronize reports it.
            let _ = std::panic::catch_unwind(|| streams::waited(s as Handle, $p));
            let answer = std::panic::catch_unwind(|| {
                streams::existing(s as Handle, $p).map_or(SUCCESS, |q| {
                    if q.xq.pending_len() > 0 || q.xq.hal().lv2_stopped() {
                        ERROR_NOT_READY
                    } else {
                        q.xq.hal().take_sticky()
                    }
                })
            })
            .unwrap_or(SUCCESS);
            if answer != SUCCESS {
                return answer;
            }
            call_real!(real, s)
        }
    };
}

stream_query!(cuStreamQuery, ptsz false);
stream_query!(cuStreamQuery_ptsz, ptsz true);

/// An event's work is waited for: the shim does not track which stream recorded an event, so
/// every queue of the process counts as waited for (`streams::waited_all`).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuEventSynchronize(ev: usize) -> CUresult {
    let real = real!(cuEventSynchronize);
    let _ = std::panic::catch_unwind(streams::waited_all);
    call_real!(real, ev)
}

/// A query that finds the event's work unfinished is a wait by polling (see
/// [`cuEventSynchronize`]).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuEventQuery(ev: usize) -> CUresult {
    let real = real!(cuEventQuery);
    let r = call_real!(real, ev);
    if r == ERROR_NOT_READY {
        let _ = std::panic::catch_unwind(streams::waited_all);
    }
    r
}

macro_rules! stream_destroy {
    ($name:ident) => {
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name(s: usize) -> CUresult {
            let real = real!($name);
            let _ = std::panic::catch_unwind(|| streams::forget(s as Handle));
            call_real!(real, s)
        }
    };
}

stream_destroy!(cuStreamDestroy);
stream_destroy!(cuStreamDestroy_v2);

macro_rules! begin_capture {
    ($name:ident($($a:ident),*), ptsz $p:expr) => {
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name(s: usize, $($a: usize),*) -> CUresult {
            let real = real!($name);
            capture::begins();
            let _ = std::panic::catch_unwind(|| {
                ordering::before_direct(s as Handle, $p);
                streams::quiesce();
            });
            let r = call_real!(real, s, $($a),*);
            if r != SUCCESS {
                capture::ends();
            }
            r
        }
    };
}

begin_capture!(cuStreamBeginCapture(mode), ptsz false);
begin_capture!(cuStreamBeginCapture_v2(mode), ptsz false);
begin_capture!(cuStreamBeginCapture_ptsz(mode), ptsz true);
begin_capture!(cuStreamBeginCapture_v2_ptsz(mode), ptsz true);
begin_capture!(cuStreamBeginCaptureToGraph(g, d, e, n, mode), ptsz false);
begin_capture!(cuStreamBeginCaptureToGraph_ptsz(g, d, e, n, mode), ptsz true);

macro_rules! end_capture {
    ($name:ident) => {
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name(s: usize, graph: usize) -> CUresult {
            let real = real!($name);
            let r = call_real!(real, s, graph);
            capture::ends();
            r
        }
    };
}

end_capture!(cuStreamEndCapture);
end_capture!(cuStreamEndCapture_ptsz);

// ---- stream creation: a logical priority above 0 also gets a stream priority (priority.rs) ----

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuStreamCreate(ph: usize, flags: usize) -> CUresult {
    let real = real!(cuStreamCreate);
    if std::panic::catch_unwind(|| priority::stream_priority(0)).unwrap_or(0) != 0 {
        // SAFETY: the application's arguments, forwarded with a priority.
        return unsafe { cuStreamCreateWithPriority(ph, flags as u32, 0) };
    }
    call_real!(real, ph, flags)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuStreamCreateWithPriority(
    ph: usize,
    flags: u32,
    priority: i32,
) -> CUresult {
    let real = real!(cuStreamCreateWithPriority);
    let priority =
        std::panic::catch_unwind(|| priority::stream_priority(priority)).unwrap_or(priority);
    let addr = real.addr();
    if addr == 0 {
        return ERROR_NOT_INITIALIZED;
    }
    // SAFETY: libcuda's cuStreamCreateWithPriority(CUstream*, unsigned, int).
    unsafe {
        std::mem::transmute::<usize, unsafe extern "C" fn(usize, u32, i32) -> CUresult>(addr)(
            ph, flags, priority,
        )
    }
}

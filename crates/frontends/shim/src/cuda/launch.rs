//! Kernel and graph launches: through the stream's XQueue, with the kernel's arguments copied
//! so that a buffered launch does not depend on memory the application reuses after the call.

use super::driver::{self, CUresult, Handle, SUCCESS};
use super::ordering;
use super::real::Real;
use super::streams::{self, StreamQueue};
use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use xpreempt_core::xqueue::threaded::TrySubmitError;
use xpreempt_core::{Command, CommandProps};
use xpreempt_cuda::queue::{CuError, Deferred, GuardValues, submitting};

/// Kernel arguments owned by a deferred launch.
struct Args {
    /// The argument bytes, 16-byte aligned.
    buf: Vec<u128>,
    ptrs: Vec<*mut c_void>,
    extra: Vec<*mut c_void>,
    extra_size: Box<usize>,
}

// SAFETY: the pointers point into `buf`/`extra_size`, owned by the same value.
unsafe impl Send for Args {}

impl Args {
    fn params(&mut self) -> *mut *mut c_void {
        if self.ptrs.is_empty() {
            std::ptr::null_mut()
        } else {
            self.ptrs.as_mut_ptr()
        }
    }

    fn extra(&mut self) -> *mut *mut c_void {
        if self.extra.is_empty() {
            std::ptr::null_mut()
        } else {
            self.extra.as_mut_ptr()
        }
    }

    /// Writes a guarded kernel's three guard values over the application's placeholders (the
    /// layout was checked: 8 bytes at 0 and at 8, 4 bytes at 16).
    fn set_guard(&mut self, v: &GuardValues) {
        if self.buf.len() * 16 < 20 {
            return;
        }
        let base = self.buf.as_mut_ptr().cast::<u8>();
        // SAFETY: `buf` holds at least 20 bytes (checked), owned by this value.
        unsafe {
            base.cast::<u64>().write_unaligned(v[0]);
            base.add(8).cast::<u64>().write_unaligned(v[1]);
            base.add(16).cast::<u32>().write_unaligned(v[2] as u32);
        }
    }
}

/// (offset, size) of each parameter; `None` when the driver cannot say. Shared, so that a
/// launch does not copy it.
type Layout = Option<Arc<[(usize, usize)]>>;

static LAYOUTS: Mutex<Option<HashMap<usize, Layout>>> = Mutex::new(None);

/// Forgets every cached layout: after a module or library is unloaded (or its context goes), the
/// driver may hand the same handle value to another kernel.
pub fn forget_layouts() {
    if let Some(m) = LAYOUTS.lock().unwrap_or_else(|p| p.into_inner()).as_mut() {
        m.clear();
    }
    super::guard::forget();
}

pub(super) fn layout(f: Handle) -> Layout {
    let mut g = LAYOUTS.lock().unwrap_or_else(|p| p.into_inner());
    g.get_or_insert_with(HashMap::new)
        .entry(f as usize)
        .or_insert_with(|| driver::param_layout(f).map(Arc::from))
        .clone()
}

const PARAM_END: usize = 0;
const PARAM_BUFFER_POINTER: usize = 1;
const PARAM_BUFFER_SIZE: usize = 2;

/// Copies the arguments of a launch; `None` when they cannot be known (then the launch goes
/// straight to the driver after what it follows).
///
/// # Safety
/// `params`/`extra` are what the application passed to the launch, valid during the call.
unsafe fn copy_args(f: Handle, params: *mut *mut c_void, extra: *mut *mut c_void) -> Option<Args> {
    let mut a = Args {
        buf: Vec::new(),
        ptrs: Vec::new(),
        extra: Vec::new(),
        extra_size: Box::new(0),
    };
    if !params.is_null() {
        let l = layout(f)?;
        let total = l.iter().map(|&(o, s)| o + s).max().unwrap_or(0);
        a.buf = vec![0u128; total.div_ceil(16)];
        let base = a.buf.as_mut_ptr().cast::<u8>();
        for (i, &(off, size)) in l.iter().enumerate() {
            // SAFETY: the driver says argument i has `size` bytes; the application passed a
            // pointer to each argument; `buf` holds `total` bytes.
            unsafe {
                let src = *params.add(i);
                if src.is_null() {
                    return None;
                }
                std::ptr::copy_nonoverlapping(src.cast::<u8>(), base.add(off), size);
                a.ptrs.push(base.add(off).cast());
            }
        }
    } else if !extra.is_null() {
        let (mut buf, mut size) = (std::ptr::null::<u8>(), None);
        let mut i = 0;
        loop {
            // SAFETY: `extra` is a CU_LAUNCH_PARAM_END-terminated key/value list.
            let key = unsafe { *extra.add(i) } as usize;
            if key == PARAM_END {
                break;
            }
            // SAFETY: as above: every key but END has a value.
            let value = unsafe { *extra.add(i + 1) };
            match key {
                PARAM_BUFFER_POINTER => buf = value.cast(),
                // SAFETY: the value of BUFFER_SIZE points to a size_t.
                PARAM_BUFFER_SIZE => size = Some(unsafe { *value.cast::<usize>() }),
                _ => return None,
            }
            i += 2;
            if i > 64 {
                return None;
            }
        }
        let size = size?;
        if buf.is_null() {
            return None;
        }
        a.buf = vec![0u128; size.div_ceil(16)];
        // SAFETY: the application's argument buffer has `size` bytes.
        unsafe { std::ptr::copy_nonoverlapping(buf, a.buf.as_mut_ptr().cast::<u8>(), size) };
        *a.extra_size = size;
        a.extra = vec![
            PARAM_BUFFER_POINTER as *mut c_void,
            a.buf.as_mut_ptr().cast(),
            PARAM_BUFFER_SIZE as *mut c_void,
            (&mut *a.extra_size as *mut usize).cast(),
            PARAM_END as *mut c_void,
        ];
    }
    Some(a)
}

/// Launches that went through an XQueue in this process.
static QUEUED: AtomicU64 = AtomicU64::new(0);
/// Of those, the ones that waited in the pending buffer instead of reaching the driver during
/// the application's call.
static BUFFERED: AtomicU64 = AtomicU64::new(0);

/// How many launches went through xpreempt's queues in this process (0: not intercepting).
#[unsafe(no_mangle)]
pub extern "C" fn xpreempt_shim_cuda_launches() -> u64 {
    QUEUED.load(Ordering::Relaxed)
}

/// How many of those were buffered (held back and launched later from the pending buffer), so
/// a test can tell that it exercised the buffer.
#[unsafe(no_mangle)]
pub extern "C" fn xpreempt_shim_cuda_buffered() -> u64 {
    BUFFERED.load(Ordering::Relaxed)
}

/// Submits a deferred call to `q`, returning the driver's status when it launched at once.
fn submit(q: &StreamQueue, call: impl FnOnce() -> CUresult + Send + 'static) -> CUresult {
    submit_deferred(q, Deferred::new(call))
}

/// Submits the launch of kernel `f` with `args` (`launch` makes the driver call): a guarded
/// kernel's launch (Lv2, `guardable`: not cooperative) stays callable with guard values.
fn submit_kernel(
    q: &StreamQueue,
    f: Handle,
    units: u32,
    guardable: bool,
    mut args: Args,
    mut launch: impl FnMut(&mut Args) -> CUresult + Send + 'static,
) -> CUresult {
    let guarded =
        guardable && q.xq.hal().lv2() && super::guard::recognized(f, layout(f).as_deref());
    if !guarded {
        return submit(q, move || launch(&mut args));
    }
    submit_deferred(
        q,
        // The call names the application's stream itself: the queue's.
        Deferred::guarded(units, move |_, values| {
            if let Some(v) = values {
                args.set_guard(v);
            }
            launch(&mut args)
        }),
    )
}

fn submit_deferred(q: &StreamQueue, d: Deferred) -> CUresult {
    if q.per_thread {
        return owner_launch(q, d);
    }
    if q.may_hold() {
        // Refilled here as well as by the completion watcher: a backlogged stream's window is
        // fed on the application's thread before its submission queues behind it. Not as the
        // submission: these launches are the buffer's, not the application's call.
        q.xq.refill();
    }
    let cmd = Command::kernel(d).with_props(CommandProps::new(false, false, false));
    QUEUED.fetch_add(1, Ordering::Relaxed);
    // The RM hooks' work_submit (in-process; one atomic load when they are off).
    crate::rm::hooks::note_launch(xpreempt_core::OpKind::Kernel as u32);
    let (r, launched) = submitting(|| q.xq.submit_with_retry(cmd, Duration::from_secs(3600)));
    if r.is_ok() && !launched {
        q.note_held();
        BUFFERED.fetch_add(1, Ordering::Relaxed);
    }
    match r {
        Ok(_) => SUCCESS,
        Err(TrySubmitError::Launch(e)) => status_of(&e.source),
        Err(TrySubmitError::Busy(..)) => {
            shim_log!("admission refused for an hour; launch dropped");
            driver::ERROR_NOT_READY
        }
    }
}

/// A call on a per-thread default stream, which only its own thread can make: the queue gets a
/// marker, the call waits (on this thread) until the marker has left the queue, as a buffered
/// command would, then goes to the driver from here with the sync event that completes the
/// marker behind it. A suspended queue so launches nothing new, and nothing of the call is kept
/// for later.
fn owner_launch(q: &StreamQueue, mut d: Deferred) -> CUresult {
    let marker = Command::kernel(Deferred::new(|| SUCCESS))
        .with_props(CommandProps::new(false, false, false));
    QUEUED.fetch_add(1, Ordering::Relaxed);
    crate::rm::hooks::note_launch(xpreempt_core::OpKind::Kernel as u32);
    let (r, launched) = submitting(|| q.xq.submit_with_retry(marker, Duration::from_secs(3600)));
    let seq = match r {
        Ok(seq) => seq,
        Err(TrySubmitError::Launch(e)) => return status_of(&e.source),
        Err(TrySubmitError::Busy(..)) => {
            shim_log!("admission refused for an hour; launch dropped");
            return driver::ERROR_NOT_READY;
        }
    };
    if !launched {
        BUFFERED.fetch_add(1, Ordering::Relaxed);
        q.wait_launched();
    }
    let status = q.xq.hal().call_now(&mut d);
    q.xq.hal().owner_recorded(seq);
    status
}

fn status_of(e: &xpreempt_core::HalError) -> CUresult {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(s) = source {
        if let Some(c) = s.downcast_ref::<CuError>() {
            return c.0;
        }
        source = s.source();
    }
    driver::ERROR_INVALID_VALUE
}

/// After a launch, a set or a copy that went straight to the driver in pass-through mode: the
/// stream's queue hears of it (see `observe`).
pub(super) fn observed(stream: Handle, ptsz: bool, status: CUresult) -> CUresult {
    if status != SUCCESS || !streams::observing() || streams::capturing(stream) {
        return status;
    }
    let Some(q) = streams::queue(stream, ptsz) else {
        return status;
    };
    let hal = q.xq.hal();
    let Some(o) = hal.observer() else {
        return status;
    };
    if q.per_thread {
        hal.owner_marked();
    }
    if o.note_real_launch() {
        let marker = Command::kernel(Deferred::new(|| SUCCESS))
            .with_props(CommandProps::new(false, false, false));
        let (r, launched) = submitting(|| q.xq.submit(marker));
        match r {
            Ok(_) if !launched && hal.lv3() => hal.hold(|| q.xq.pending_len() > 0),
            Ok(_) => {}
            Err(_) => o.disarm(),
        }
    }
    status
}

/// A device-side stream operation (`exports::queued!`): through the stream's queue where a
/// launch would go, else straight to the driver after what it follows.
pub fn stream_op(
    intercept: bool,
    stream: Handle,
    ptsz: bool,
    call: impl FnOnce() -> CUresult + Send + 'static,
) -> CUresult {
    match route(intercept, stream, ptsz) {
        Some(q) => submit(&q, call),
        None => observed(stream, ptsz, call()),
    }
}

/// Where a launch goes: through the queue (`Some`), or straight to the driver.
fn route(intercept: bool, stream: Handle, ptsz: bool) -> Option<Arc<StreamQueue>> {
    if !intercept || !streams::active() || streams::capturing(stream) {
        ordering::before_direct(stream, ptsz);
        return None;
    }
    let q = streams::queue(stream, ptsz);
    match &q {
        Some(q) => ordering::order_before(stream, ptsz, Some(q)),
        None => ordering::before_direct(stream, ptsz),
    }
    q
}

type LaunchFn = unsafe extern "C" fn(
    Handle,
    u32,
    u32,
    u32,
    u32,
    u32,
    u32,
    u32,
    Handle,
    *mut *mut c_void,
    *mut *mut c_void,
) -> CUresult;

/// `cuLaunchKernel` and `cuLaunchCooperativeKernel` (which has no `extra`).
///
/// # Safety
/// The arguments are the application's, as for the real function.
#[allow(clippy::too_many_arguments)]
pub unsafe fn kernel(
    real: &Real,
    ptsz: bool,
    cooperative: bool,
    intercept: bool,
    f: Handle,
    grid: [u32; 3],
    block: [u32; 3],
    smem: u32,
    stream: Handle,
    params: *mut *mut c_void,
    extra: *mut *mut c_void,
) -> CUresult {
    let addr = real.addr();
    if addr == 0 {
        return driver::ERROR_NOT_INITIALIZED;
    }
    // SAFETY: libcuda's launch functions have this signature; the cooperative one ignores the
    // trailing argument (it is passed in a register the callee does not read).
    let real_fn = unsafe { std::mem::transmute::<usize, LaunchFn>(addr) };
    let direct = move |params, extra| {
        let extra = if cooperative {
            std::ptr::null_mut()
        } else {
            extra
        };
        // SAFETY: forwarding the application's launch.
        unsafe {
            real_fn(
                f, grid[0], grid[1], grid[2], block[0], block[1], block[2], smem, stream, params,
                extra,
            )
        }
    };
    let Some(q) = route(intercept, stream, ptsz) else {
        return observed(stream, ptsz, direct(params, extra));
    };
    // SAFETY: the application's arguments, valid during this call.
    let Some(args) = (unsafe { copy_args(f, params, extra) }) else {
        q.wait_launched();
        return direct(params, extra);
    };
    let units = grid[0].saturating_mul(grid[1]).saturating_mul(grid[2]);
    let fh = f;
    let f = f as usize;
    let stream = stream as usize;
    // A cooperative kernel's blocks wait for each other: stopping some would hang the rest.
    submit_kernel(&q, fh, units, !cooperative, args, move |args| {
        let extra = if cooperative {
            std::ptr::null_mut()
        } else {
            args.extra()
        };
        // SAFETY: the launch as the application made it, with arguments this closure owns.
        unsafe {
            real_fn(
                f as Handle,
                grid[0],
                grid[1],
                grid[2],
                block[0],
                block[1],
                block[2],
                smem,
                stream as Handle,
                args.params(),
                extra,
            )
        }
    })
}

/// `CUlaunchConfig` as cuda.h lays it out (56 bytes), and the size of one attribute.
const LAUNCH_CONFIG_SIZE: usize = 56;
const CONFIG_STREAM_OFFSET: usize = 32;
const CONFIG_ATTRS_OFFSET: usize = 40;
const CONFIG_NUM_ATTRS_OFFSET: usize = 48;
const LAUNCH_ATTRIBUTE_SIZE: usize = 72;

type LaunchExFn =
    unsafe extern "C" fn(*const u8, Handle, *mut *mut c_void, *mut *mut c_void) -> CUresult;

/// `cuLaunchKernelEx`: the config and its attributes are copied with the arguments.
///
/// # Safety
/// As for the real function.
pub unsafe fn kernel_ex(
    real: &Real,
    ptsz: bool,
    intercept: bool,
    config: *const u8,
    f: Handle,
    params: *mut *mut c_void,
    extra: *mut *mut c_void,
) -> CUresult {
    let addr = real.addr();
    if addr == 0 {
        return driver::ERROR_NOT_INITIALIZED;
    }
    // SAFETY: libcuda's cuLaunchKernelEx has this signature.
    let real_fn = unsafe { std::mem::transmute::<usize, LaunchExFn>(addr) };
    if config.is_null() {
        // SAFETY: forwarding; the driver reports the bad argument.
        return unsafe { real_fn(config, f, params, extra) };
    }
    // SAFETY: a CUlaunchConfig is readable at `config`.
    let (stream, attrs, num_attrs) = unsafe {
        (
            config
                .add(CONFIG_STREAM_OFFSET)
                .cast::<Handle>()
                .read_unaligned(),
            config
                .add(CONFIG_ATTRS_OFFSET)
                .cast::<*const u8>()
                .read_unaligned(),
            config
                .add(CONFIG_NUM_ATTRS_OFFSET)
                .cast::<u32>()
                .read_unaligned() as usize,
        )
    };
    let Some(q) = route(intercept, stream, ptsz) else {
        // SAFETY: forwarding.
        return observed(stream, ptsz, unsafe { real_fn(config, f, params, extra) });
    };
    // SAFETY: the application's arguments, valid during this call.
    let copied = unsafe { copy_args(f, params, extra) };
    let (Some(args), false) = (copied, num_attrs > 0 && attrs.is_null()) else {
        q.wait_launched();
        // SAFETY: forwarding.
        return unsafe { real_fn(config, f, params, extra) };
    };
    let mut cfg = vec![0u64; LAUNCH_CONFIG_SIZE / 8];
    let mut attr_bytes = vec![0u64; (num_attrs * LAUNCH_ATTRIBUTE_SIZE).div_ceil(8)];
    // SAFETY: the config and `num_attrs` attributes are readable; the copies are large enough.
    unsafe {
        std::ptr::copy_nonoverlapping(config, cfg.as_mut_ptr().cast::<u8>(), LAUNCH_CONFIG_SIZE);
        if num_attrs > 0 {
            std::ptr::copy_nonoverlapping(
                attrs,
                attr_bytes.as_mut_ptr().cast::<u8>(),
                num_attrs * LAUNCH_ATTRIBUTE_SIZE,
            );
        }
    }
    let units = grid_units(&cfg);
    let cooperative = is_cooperative(&attr_bytes, num_attrs);
    let fh = f;
    let f = f as usize;
    let attrs_owned = SendBytes(attr_bytes);
    let mut cfg_owned = SendBytes(cfg);
    submit_kernel(&q, fh, units, !cooperative, args, move |args| {
        let p = if num_attrs > 0 {
            attrs_owned.0.as_ptr() as usize
        } else {
            0
        };
        // SAFETY: pointing the copied config at the copied attributes.
        unsafe {
            cfg_owned
                .0
                .as_mut_ptr()
                .cast::<u8>()
                .add(CONFIG_ATTRS_OFFSET)
                .cast::<usize>()
                .write_unaligned(p);
            real_fn(
                cfg_owned.0.as_ptr().cast(),
                f as Handle,
                args.params(),
                args.extra(),
            )
        }
    })
}

/// The blocks of a copied `CUlaunchConfig` (gridDimX, Y, Z: its first three u32).
fn grid_units(cfg: &[u64]) -> u32 {
    let x = cfg.first().copied().unwrap_or(0);
    let z = cfg.get(1).copied().unwrap_or(0) as u32;
    (x as u32)
        .saturating_mul((x >> 32) as u32)
        .saturating_mul(z)
}

/// `CU_LAUNCH_ATTRIBUTE_COOPERATIVE` (its value, an int, follows the id at byte 8).
const ATTRIBUTE_COOPERATIVE: u32 = 2;

/// Whether copied launch attributes ask for a cooperative launch.
fn is_cooperative(attrs: &[u64], n: usize) -> bool {
    (0..n).any(|i| {
        let at = i * LAUNCH_ATTRIBUTE_SIZE / 8;
        let id = attrs.get(at).copied().unwrap_or(0) as u32;
        let value = attrs.get(at + 1).copied().unwrap_or(0) as u32;
        id == ATTRIBUTE_COOPERATIVE && value != 0
    })
}

struct SendBytes(Vec<u64>);

type GraphLaunchFn = unsafe extern "C" fn(Handle, Handle) -> CUresult;

/// `cuGraphLaunch`: one command.
///
/// # Safety
/// As for the real function.
pub unsafe fn graph(
    real: &Real,
    ptsz: bool,
    intercept: bool,
    exec: Handle,
    stream: Handle,
) -> CUresult {
    let addr = real.addr();
    if addr == 0 {
        return driver::ERROR_NOT_INITIALIZED;
    }
    // SAFETY: libcuda's cuGraphLaunch has this signature.
    let real_fn = unsafe { std::mem::transmute::<usize, GraphLaunchFn>(addr) };
    let Some(q) = route(intercept, stream, ptsz) else {
        // SAFETY: forwarding.
        return observed(stream, ptsz, unsafe { real_fn(exec, stream) });
    };
    let (exec, stream) = (exec as usize, stream as usize);
    // SAFETY: forwarding the launch as made.
    submit(&q, move || unsafe {
        real_fn(exec as Handle, stream as Handle)
    })
}

//! `libxpreempt_shim.so`: an LD_PRELOAD interposer of `ioctl` that watches libcuda's RM
//! allocations, remembers each compute channel group (class 0xA06C, engineType 1) with its fd and
//! RM client, and lets xpreempt set their timeslice (`xpreempt_shim_set_timeslice`). Everything
//! else passes through untouched. Nothing here panics across the C boundary.

pub mod rm_abi;

use rm_abi::*;
use std::ffi::{c_int, c_ulong, c_void};
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

/// A compute channel group libcuda allocated.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChannelGroup {
    pub fd: c_int,
    pub h_client: u32,
    pub h_object: u32,
}

static GROUPS: Mutex<Vec<ChannelGroup>> = Mutex::new(Vec::new());
static REAL_IOCTL: AtomicUsize = AtomicUsize::new(0);
/// RM_ALLOC calls seen (any class), for diagnosis.
static ALLOCS_SEEN: AtomicUsize = AtomicUsize::new(0);

type IoctlFn = unsafe extern "C" fn(c_int, c_ulong, *mut c_void) -> c_int;

fn real_ioctl() -> Option<IoctlFn> {
    let mut p = REAL_IOCTL.load(Ordering::Acquire);
    if p == 0 {
        // SAFETY: dlsym with a NUL-terminated name.
        p = unsafe { libc::dlsym(libc::RTLD_NEXT, c"ioctl".as_ptr()) } as usize;
        if p == 0 {
            return None;
        }
        REAL_IOCTL.store(p, Ordering::Release);
    }
    // SAFETY: the next `ioctl` in the link chain has this signature (variadic with one pointer
    // argument, which the x86-64 and aarch64 ABIs pass like a fixed one).
    Some(unsafe { std::mem::transmute::<usize, IoctlFn>(p) })
}

/// XPREEMPT_SHIM_LOG: unset = quiet, 1 = channel groups and controls, 2 = every RM_ALLOC.
fn log_level() -> u32 {
    std::env::var("XPREEMPT_SHIM_LOG")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

fn log_enabled() -> bool {
    log_level() >= 1
}

/// Records a compute channel group from a successful RM_ALLOC.
///
/// # Safety
/// `arg` is the ioctl argument of `request`, readable for its encoded size.
unsafe fn observe(fd: c_int, request: u64, arg: *const u8) {
    // SAFETY: forwarded from the caller.
    let Some(a) = (unsafe { read_alloc(request, arg) }) else {
        return;
    };
    ALLOCS_SEEN.fetch_add(1, Ordering::Relaxed);
    if log_level() >= 2 {
        eprintln!(
            "xpreempt-shim: RM_ALLOC fd={fd} req={request:#x} client={:#x} object={:#x} class={:#x} params_size={} status={:#x}",
            a.h_client, a.h_object, a.h_class, a.params_size, a.status
        );
    }
    // libcuda 580 leaves NVOS64's paramsSize at 0 for channel groups (seen on the device), so
    // only the params pointer is required.
    if a.status != 0 || a.h_class != CLASS_CHANNEL_GROUP || a.p_params == 0 {
        return;
    }
    // SAFETY: libcuda passed a params pointer of params_size bytes, still live during the call.
    let head = unsafe { std::ptr::read_unaligned(a.p_params as *const ChannelGroupAllocHead) };
    if log_level() >= 2 {
        eprintln!(
            "xpreempt-shim: channel group object={:#x} engineType={:#x}",
            a.h_object, head.engine_type
        );
    }
    if head.engine_type != ENGINE_TYPE_GRAPHICS_COMPUTE {
        return;
    }
    let g = ChannelGroup {
        fd,
        h_client: a.h_client,
        h_object: a.h_object,
    };
    if let Ok(mut groups) = GROUPS.lock()
        && !groups.contains(&g)
    {
        groups.push(g);
    }
    if log_enabled() {
        eprintln!(
            "xpreempt-shim: compute channel group fd={fd} client={:#x} object={:#x}",
            g.h_client, g.h_object
        );
    }
}

/// The interposed `ioctl`.
///
/// # Safety
/// Same contract as libc's `ioctl`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ioctl(fd: c_int, request: c_ulong, arg: *mut c_void) -> c_int {
    let Some(real) = real_ioctl() else {
        // SAFETY: setting errno is always allowed.
        unsafe { *libc::__errno_location() = libc::ENOSYS };
        return -1;
    };
    // SAFETY: pass-through with the caller's arguments.
    let r = unsafe { real(fd, request, arg) };
    // Callers may pass the request as a sign-extended int: the kernel looks at 32 bits only.
    let req = request as u32 as u64;
    if r == 0 && (req == IOCTL_RM_ALLOC_NVOS64 || req == IOCTL_RM_ALLOC_NVOS21) {
        let argp = arg as usize;
        let outcome = std::panic::catch_unwind(move || {
            // SAFETY: the argument is the caller's RM_ALLOC struct, valid for its size.
            unsafe { observe(fd, req, argp as *const u8) }
        });
        if outcome.is_err() {
            eprintln!("xpreempt-shim: internal error while observing RM_ALLOC (ignored)");
        }
    }
    r
}

/// Number of RM_ALLOC calls seen in this process (any class).
#[unsafe(no_mangle)]
pub extern "C" fn xpreempt_shim_allocs_seen() -> u64 {
    ALLOCS_SEEN.load(Ordering::Relaxed) as u64
}

/// Number of compute channel groups seen in this process.
#[unsafe(no_mangle)]
pub extern "C" fn xpreempt_shim_channel_groups() -> u32 {
    GROUPS.lock().map(|g| g.len() as u32).unwrap_or(0)
}

/// Sends one SET_TIMESLICE control. 0 on success, `-errno` when the ioctl failed, the RM status
/// when RM refused.
pub fn set_timeslice(g: ChannelGroup, us: u64) -> i64 {
    let Some(real) = real_ioctl() else {
        return -(libc::ENOSYS as i64);
    };
    let mut params = SetTimeslice { timeslice_us: us };
    let mut ctl = Nvos54 {
        h_client: g.h_client,
        h_object: g.h_object,
        cmd: CMD_SET_TIMESLICE,
        flags: 0,
        params: (&mut params as *mut SetTimeslice) as u64,
        params_size: size_of::<SetTimeslice>() as u32,
        status: 0,
    };
    // SAFETY: a well-formed NVOS54 on libcuda's own fd.
    let r = unsafe {
        real(
            g.fd,
            IOCTL_RM_CONTROL as c_ulong,
            (&mut ctl as *mut Nvos54).cast(),
        )
    };
    if r != 0 {
        // SAFETY: reading errno.
        return -(unsafe { *libc::__errno_location() } as i64);
    }
    ctl.status as i64
}

/// Sets the timeslice of every compute channel group of this process; the first failure wins.
#[unsafe(no_mangle)]
pub extern "C" fn xpreempt_shim_set_timeslice(us: u64) -> i64 {
    std::panic::catch_unwind(|| {
        let groups: Vec<ChannelGroup> = GROUPS.lock().map(|g| g.clone()).unwrap_or_default();
        if groups.is_empty() {
            return -(libc::ENODEV as i64);
        }
        let mut first = 0;
        for g in groups {
            let r = set_timeslice(g, us);
            if r != 0 && first == 0 {
                first = r;
            }
        }
        if log_enabled() {
            eprintln!("xpreempt-shim: SET_TIMESLICE {us} us -> {first}");
        }
        first
    })
    .unwrap_or(-(libc::EFAULT as i64))
}

//! The RM side of the shim: interposed `ioctl` and `close` that watch libcuda's
//! RM allocations, remembers each compute channel group (class 0xA06C, engineType 1) with its fd
//! and RM client, and lets xpreempt set their timeslice (`xpreempt_shim_set_timeslice`). A group
//! is forgotten when RM frees it (or its parent, or its client) and when its fd is closed, so that
//! no control ever goes to a freed group or a reused fd. Everything else passes through
//! untouched. Nothing here panics across the C boundary, and `close` never blocks on a lock
//! (it may run in a signal handler or in a child after fork).

pub mod abi;
pub mod admission;
pub mod backend;
pub mod context;
pub mod controls;
pub mod hooks;

use crate::log::{log_enabled, log_level};
use abi::*;
use std::ffi::{c_int, c_ulong, c_void};
use std::sync::atomic::{AtomicI32, AtomicU32, AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard};

/// A compute channel group libcuda allocated.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChannelGroup {
    pub fd: c_int,
    pub h_client: u32,
    /// The object it was allocated under (freeing that frees the group too).
    pub h_parent: u32,
    pub h_object: u32,
}

/// What an fd referred to when a group was seen on it (`fstat`): a reused fd number that now
/// names another file does not match.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FdIdentity {
    pub dev: u64,
    pub ino: u64,
    pub rdev: u64,
}

pub fn fd_identity(fd: c_int) -> Option<FdIdentity> {
    // SAFETY: fstat into a zeroed stat buffer.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    if unsafe { libc::fstat(fd, &mut st) } != 0 {
        return None;
    }
    Some(FdIdentity {
        dev: st.st_dev,
        ino: st.st_ino,
        rdev: st.st_rdev,
    })
}

/// The channel groups alive in this process.
#[derive(Debug, Default)]
pub struct Registry {
    entries: Vec<(ChannelGroup, Option<FdIdentity>)>,
}

impl Registry {
    pub const fn new() -> Self {
        Self {
            entries: Vec::new(),
        }
    }

    pub fn add(&mut self, g: ChannelGroup, id: Option<FdIdentity>) -> bool {
        if self.entries.iter().any(|(e, _)| *e == g) {
            return false;
        }
        self.entries.push((g, id));
        true
    }

    /// The fd was closed: its groups are gone with it. Returns how many were dropped.
    pub fn forget_fd(&mut self, fd: c_int) -> usize {
        let before = self.entries.len();
        self.entries.retain(|(g, _)| g.fd != fd);
        before - self.entries.len()
    }

    /// RM freed `h_object` of client `h_client`: the group itself, its parent, or the whole
    /// client. Returns how many groups were dropped.
    pub fn forget_freed(&mut self, h_client: u32, h_object: u32) -> usize {
        let before = self.entries.len();
        self.entries.retain(|(g, _)| {
            g.h_client != h_client
                || (h_object != g.h_object && h_object != g.h_parent && h_object != g.h_client)
        });
        before - self.entries.len()
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    pub fn groups(&self) -> impl Iterator<Item = (ChannelGroup, Option<FdIdentity>)> + '_ {
        self.entries.iter().copied()
    }
}

static GROUPS: Mutex<Registry> = Mutex::new(Registry::new());
/// Groups in GROUPS, readable without the lock (`close` skips all work while it is 0).
static GROUP_COUNT: AtomicUsize = AtomicUsize::new(0);
/// fds closed while GROUPS was busy, pruned by the next holder of the lock (-1: free slot).
static CLOSED_PENDING: [AtomicI32; 16] = [const { AtomicI32::new(-1) }; 16];
/// CLOSED_PENDING was full once: the next holder re-checks every fd's identity and drops the
/// groups whose fd no longer matches.
static CLOSED_OVERFLOW: AtomicU32 = AtomicU32::new(0);
static REAL_IOCTL: AtomicUsize = AtomicUsize::new(0);
static REAL_CLOSE: AtomicUsize = AtomicUsize::new(0);
/// RM_ALLOC calls seen (any class), for diagnosis.
static ALLOCS_SEEN: AtomicUsize = AtomicUsize::new(0);

type IoctlFn = unsafe extern "C" fn(c_int, c_ulong, *mut c_void) -> c_int;
type CloseFn = unsafe extern "C" fn(c_int) -> c_int;

fn next_symbol(cache: &AtomicUsize, name: &std::ffi::CStr) -> Option<usize> {
    let mut p = cache.load(Ordering::Acquire);
    if p == 0 {
        // SAFETY: dlsym with a NUL-terminated name.
        p = unsafe { libc::dlsym(libc::RTLD_NEXT, name.as_ptr()) } as usize;
        if p == 0 {
            return None;
        }
        cache.store(p, Ordering::Release);
    }
    Some(p)
}

fn real_ioctl() -> Option<IoctlFn> {
    let p = next_symbol(&REAL_IOCTL, c"ioctl")?;
    // SAFETY: the next `ioctl` in the link chain has this signature (variadic with one pointer
    // argument, which the x86-64 and aarch64 ABIs pass like a fixed one).
    Some(unsafe { std::mem::transmute::<usize, IoctlFn>(p) })
}

fn real_close() -> Option<CloseFn> {
    let p = next_symbol(&REAL_CLOSE, c"close")?;
    // SAFETY: the next `close` in the link chain has this signature.
    Some(unsafe { std::mem::transmute::<usize, CloseFn>(p) })
}

/// The process whose compute channel groups were seen first (0: none yet). A forked child has
/// another pid: its registry names its parent's RM objects and may have been held, at the fork,
/// by a thread the child does not have, so the child leaves it (and the RM hooks' state) alone.
/// A child of a process that never made a group (a program that initializes CUDA only in its
/// workers, say) owns the registry itself. Nothing is held across a fork (`cuda::fork_gate`).
static OWNER: AtomicU32 = AtomicU32::new(0);

fn claim_owner() {
    let _ = OWNER.compare_exchange(0, std::process::id(), Ordering::AcqRel, Ordering::Acquire);
}

/// Whether this is a forked child of the process whose RM calls were watched.
pub(crate) fn forked_child() -> bool {
    let owner = OWNER.load(Ordering::Acquire);
    owner != 0 && owner != std::process::id()
}

/// GROUPS, with the closes that happened while it was busy applied; `None` in a forked child.
fn registry() -> Option<MutexGuard<'static, Registry>> {
    if forked_child() {
        return None;
    }
    Some(groups())
}

/// Takes GROUPS and applies the closes that happened while it was busy.
fn groups() -> MutexGuard<'static, Registry> {
    let mut g = GROUPS.lock().unwrap_or_else(|e| e.into_inner());
    for slot in &CLOSED_PENDING {
        let fd = slot.swap(-1, Ordering::AcqRel);
        if fd >= 0 {
            g.forget_fd(fd);
        }
    }
    if CLOSED_OVERFLOW.swap(0, Ordering::AcqRel) != 0 {
        g.entries
            .retain(|&(grp, id)| id.is_some() && fd_identity(grp.fd) == id);
    }
    GROUP_COUNT.store(g.len(), Ordering::Release);
    g
}

/// Records a compute channel group from a successful RM_ALLOC.
///
/// # Safety
/// `arg` is the ioctl argument of `request`, readable for its encoded size.
unsafe fn observe_alloc(fd: c_int, request: u64, arg: *const u8) {
    // SAFETY: forwarded from the caller.
    let Some(a) = (unsafe { read_alloc(request, arg) }) else {
        return;
    };
    ALLOCS_SEEN.fetch_add(1, Ordering::Relaxed);
    if log_level() >= 2 {
        shim_log!(
            "RM_ALLOC fd={fd} req={request:#x} client={:#x} object={:#x} class={:#x} params_size={} status={:#x}",
            a.h_client,
            a.h_object,
            a.h_class,
            a.params_size,
            a.status
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
        shim_log!(
            "channel group object={:#x} engineType={:#x}",
            a.h_object,
            head.engine_type
        );
    }
    if head.engine_type != ENGINE_TYPE_GRAPHICS_COMPUTE {
        return;
    }
    let g = ChannelGroup {
        fd,
        h_client: a.h_client,
        h_parent: a.h_parent,
        h_object: a.h_object,
    };
    let id = fd_identity(fd);
    claim_owner();
    {
        let Some(mut reg) = registry() else {
            return;
        };
        reg.add(g, id);
        GROUP_COUNT.store(reg.len(), Ordering::Release);
    }
    if log_enabled() {
        shim_log!(
            "compute channel group fd={fd} client={:#x} object={:#x}",
            g.h_client,
            g.h_object
        );
    }
}

/// Forgets the groups a successful RM_FREE took with it.
///
/// # Safety
/// `arg` is the ioctl argument of `request`, readable for its encoded size.
unsafe fn observe_free(request: u64, arg: *const u8) {
    // SAFETY: forwarded from the caller.
    let Some(f) = (unsafe { read_free(request, arg) }) else {
        return;
    };
    if log_level() >= 2 {
        shim_log!(
            "RM_FREE client={:#x} parent={:#x} object={:#x} status={:#x}",
            f.h_client,
            f.h_parent,
            f.h_object,
            f.status
        );
    }
    if f.status != 0 || GROUP_COUNT.load(Ordering::Acquire) == 0 {
        return;
    }
    let dropped = {
        let Some(mut reg) = registry() else {
            return;
        };
        let n = reg.forget_freed(f.h_client, f.h_object);
        GROUP_COUNT.store(reg.len(), Ordering::Release);
        n
    };
    if dropped > 0 && log_enabled() {
        shim_log!(
            "RM_FREE of {:#x} (client {:#x}) dropped {dropped} channel group(s)",
            f.h_object,
            f.h_client
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
    // Callers may pass the request as a sign-extended int: the kernel looks at 32 bits only.
    let req = request as u32 as u64;
    let watched =
        req == IOCTL_RM_ALLOC_NVOS64 || req == IOCTL_RM_ALLOC_NVOS21 || req == IOCTL_RM_FREE;
    // Asked only for RM calls: any other ioctl (UVM, terminals) passes with no look at the hooks.
    let rm_hooks = (watched || req == IOCTL_RM_CONTROL) && hooks::tracking();
    let pre = if rm_hooks && req == IOCTL_RM_CONTROL {
        let argp = arg as usize;
        // SAFETY: the caller's NVOS54; a panic inside is caught and the call goes on untouched.
        std::panic::catch_unwind(move || unsafe { hooks::before(argp as *mut u8) })
            .unwrap_or(hooks::Pre::Nothing)
    } else {
        hooks::Pre::Nothing
    };
    // SAFETY: pass-through with the caller's arguments.
    let r = unsafe { real(fd, request, arg) };
    if r == 0 && (watched || rm_hooks) {
        // SAFETY: reading errno; the observation must not change what the caller sees.
        let errno = unsafe { *libc::__errno_location() };
        let argp = arg as usize;
        let outcome = std::panic::catch_unwind(move || {
            // SAFETY: the argument is the caller's RM struct, valid for its size.
            unsafe {
                if req == IOCTL_RM_FREE {
                    observe_free(req, argp as *const u8)
                } else if watched {
                    observe_alloc(fd, req, argp as *const u8)
                }
                if rm_hooks {
                    hooks::after(fd, req, argp as *mut u8, pre)
                }
            }
        });
        if outcome.is_err() {
            let _ = std::panic::catch_unwind(|| {
                shim_log!("internal error while observing an RM call (ignored)")
            });
        }
        // SAFETY: restoring errno.
        unsafe { *libc::__errno_location() = errno };
    } else if let hooks::Pre::Rewrote { params, from, .. } = pre {
        // The call failed outright: libcuda still gets its own value back.
        // SAFETY: the params `before` wrote, still libcuda's.
        unsafe { std::ptr::write_unaligned(params, from) };
    }
    r
}

/// Forgets the groups of `fd` without blocking: under the lock when it is free, otherwise
/// through CLOSED_PENDING for the next holder.
fn forget_closed(fd: c_int) {
    if fd < 0 || GROUP_COUNT.load(Ordering::Acquire) == 0 {
        return;
    }
    match GROUPS.try_lock() {
        Ok(mut reg) => {
            reg.forget_fd(fd);
            GROUP_COUNT.store(reg.len(), Ordering::Release);
        }
        Err(_) => {
            let parked = CLOSED_PENDING.iter().any(|slot| {
                slot.compare_exchange(-1, fd, Ordering::AcqRel, Ordering::Relaxed)
                    .is_ok()
            });
            if !parked {
                CLOSED_OVERFLOW.store(1, Ordering::Release);
            }
        }
    }
}

/// The interposed `close`: forgets the channel groups of the fd, then closes it.
///
/// # Safety
/// Same contract as libc's `close`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn close(fd: c_int) -> c_int {
    // Before the real close: once it returns, the fd number may be reused at once.
    let _ = std::panic::catch_unwind(|| {
        forget_closed(fd);
        hooks::forget_fd(fd);
    });
    match real_close() {
        // SAFETY: pass-through.
        Some(real) => unsafe { real(fd) },
        None => {
            // SAFETY: setting errno is always allowed.
            unsafe { *libc::__errno_location() = libc::ENOSYS };
            -1
        }
    }
}

/// Number of RM_ALLOC calls seen in this process (any class).
#[unsafe(no_mangle)]
pub extern "C" fn xpreempt_shim_allocs_seen() -> u64 {
    ALLOCS_SEEN.load(Ordering::Relaxed) as u64
}

/// Number of compute channel groups alive in this process.
#[unsafe(no_mangle)]
pub extern "C" fn xpreempt_shim_channel_groups() -> u32 {
    std::panic::catch_unwind(|| registry().map_or(0, |r| r.len() as u32)).unwrap_or(0)
}

/// Sends one SET_TIMESLICE control. 0 on success, `-errno` when the ioctl failed, the RM status
/// when RM refused.
pub fn set_timeslice(g: ChannelGroup, us: u64) -> i64 {
    controls::set_timeslice(g.fd, g.h_client, g.h_object, us).map_or_else(|e| e.code(), |()| 0)
}

/// What libcuda sets by itself (measured), which the Lv3 control restores after an interrupt.
pub const DRIVER_DEFAULT_TIMESLICE_US: u64 = xpreempt_cuda::lv3::DEFAULT_TIMESLICE_US;

/// A kernel launch of this process, for the RM hooks' `work_submit` (`kind`: the eBPF header's
/// `XP_OP_*`). Without the RM hooks, or with the daemon (which counts the agent's submissions),
/// it does nothing.
#[unsafe(no_mangle)]
pub extern "C" fn xpreempt_shim_rm_work_submit(kind: u32) {
    let _ = std::panic::catch_unwind(|| hooks::note_launch(kind));
}

/// Sets the timeslice of every compute channel group of this process; the first failure wins.
/// Holds the registry while sending, and skips (and drops) a group whose fd no longer refers to
/// the file it was seen on.
#[unsafe(no_mangle)]
pub extern "C" fn xpreempt_shim_set_timeslice(us: u64) -> i64 {
    std::panic::catch_unwind(|| {
        let Some(mut reg) = registry() else {
            return -(libc::ENODEV as i64);
        };
        reg.entries
            .retain(|&(g, id)| id.is_none() || fd_identity(g.fd) == id);
        GROUP_COUNT.store(reg.len(), Ordering::Release);
        if reg.is_empty() {
            return -(libc::ENODEV as i64);
        }
        let mut first = 0;
        for (g, _) in reg.groups() {
            // A restore to the driver's default restores what the RM hooks' policy chose.
            let us = match us {
                DRIVER_DEFAULT_TIMESLICE_US => {
                    hooks::policy_timeslice(g.h_client, g.h_object).unwrap_or(us)
                }
                _ => us,
            };
            let r = set_timeslice(g, us);
            if r != 0 && first == 0 {
                first = r;
            }
        }
        drop(reg);
        if log_enabled() {
            shim_log!("SET_TIMESLICE {us} us -> {first}");
        }
        first
    })
    .unwrap_or(-(libc::EFAULT as i64))
}

#[cfg(test)]
#[path = "registry_tests.rs"]
mod tests;

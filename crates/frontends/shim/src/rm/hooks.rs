//! The four hooks at the NVIDIA driver's own events, fired from the interposed `ioctl`:
//!
//! | libcuda's call (seen here) | hook | applied with |
//! |---|---|---|
//! | RM_ALLOC of a compute channel group (0xA06C, engineType 1) | `task_init` | SET_TIMESLICE, SET_INTERLEAVE_LEVEL; libcuda's own SET_TIMESLICE rewritten to the choice |
//! | RM_CONTROL GPFIFO_SCHEDULE(1) on it | `schedule` | the call is held back (bounded) until admitted |
//! | RM_CONTROL GET_WORK_SUBMIT_TOKEN on one of its channels | `work_submit` (XP_WORK_CHANNEL) | maps only |
//! | RM_FREE of it, its device or its client; process exit | `task_destroy` | maps only |
//!
//! Off unless `XPREEMPT_RM_HOOKS` or `XPREEMPT_RM_POLICY` says where the program is
//! ([`Mode`]). Everything heavy (the driver check, the daemon connection, loading a program)
//! happens at the first compute channel group, never at library load. The driver's version must
//! be one measured here (580.159.x) unless `XPREEMPT_RM_FORCE=1`. Any failure leaves the
//! driver's defaults and says so on stderr; no control is ever dropped.
//!
//! What the RM level cannot see: kernel launches. libcuda asks for a channel's work-submit token
//! once, at creation, and then rings the doorbell from user space, so per-launch `work_submit`
//! comes only from a layer that sees launches: the daemon counts its agents' submissions as work
//! of the process's groups, and in-process a caller may report launches with [`note_launch`].

use super::abi::*;
use super::admission::{self, Bound, Waited};
use super::backend::{Backend, Mode, monotonic_ns};
use super::context::{ALLOC_PARAMS_READ, Before, CONTROL_PARAMS_READ, Call, Event, GroupKey};
use super::context::{Tracker, record};
use super::controls;
use crate::log::log_level;
use std::ffi::c_int;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, OnceLock};
use xpreempt_bpf::ctx::{WORK_CHANNEL, WORK_SUBMIT};
use xpreempt_bpf::rm::RmGroup;
use xpreempt_cuda::nvidia::{VERSION_FILE, check_driver, forced};

const UNREAD: u8 = 0;
const TRACKING: u8 = 1;
const ACTIVE: u8 = 2;
const OFF: u8 = 3;

static STATE: AtomicU8 = AtomicU8::new(UNREAD);
static TRACKER: Mutex<Tracker> = Mutex::new(Tracker::new());
static BACKEND: Mutex<Option<Backend>> = Mutex::new(None);
/// SET_INTERLEAVE_LEVEL was refused once: the driver will not take it from this process.
static INTERLEAVE_REFUSED: AtomicBool = AtomicBool::new(false);
/// Launches reported with `note_launch` since the last flush, and when that was (ns).
static LAUNCHES: AtomicU64 = AtomicU64::new(0);
static LAST_FLUSH: AtomicU64 = AtomicU64::new(0);
/// How often reported launches go to the program in this process.
const FLUSH_NS: u64 = 100_000_000;

struct Config {
    mode: Mode,
    bound: Bound,
    force: bool,
    priority: i32,
}

fn config() -> &'static Config {
    static C: OnceLock<Config> = OnceLock::new();
    C.get_or_init(|| {
        let get = |k: &str| std::env::var(k).ok();
        Config {
            mode: Mode::from_env(get),
            bound: Bound::from_env(get),
            force: forced(),
            priority: crate::cuda::settings::settings().priority,
        }
    })
}

/// Whether the RM hooks watch this process's calls (cheap after the first call).
pub fn tracking() -> bool {
    match STATE.load(Ordering::Acquire) {
        // A forked child's hook state is its parent's, and so are the groups it names.
        TRACKING | ACTIVE => !super::forked_child(),
        OFF => false,
        _ => {
            let s = if config().mode == Mode::Off {
                OFF
            } else {
                TRACKING
            };
            let _ = STATE.compare_exchange(UNREAD, s, Ordering::AcqRel, Ordering::Acquire);
            STATE.load(Ordering::Acquire) != OFF
        }
    }
}

fn tracker() -> MutexGuard<'static, Tracker> {
    TRACKER.lock().unwrap_or_else(|e| e.into_inner())
}

fn backend() -> MutexGuard<'static, Option<Backend>> {
    BACKEND.lock().unwrap_or_else(|e| e.into_inner())
}

/// Opens the backend at the first compute channel group; false if the hooks stay off.
fn activate() -> bool {
    match STATE.load(Ordering::Acquire) {
        ACTIVE => return true,
        OFF => return false,
        _ => {}
    }
    let mut b = backend();
    if b.is_some() {
        return true;
    }
    let cfg = config();
    let opened = std::fs::read_to_string(VERSION_FILE)
        .ok()
        .map_or_else(
            || check_driver(None, cfg.force),
            |t| check_driver(Some(&t), cfg.force),
        )
        .map_err(|e| e.to_string())
        .and_then(|v| Backend::open(&cfg.mode).map(|(b, what)| (b, what, v)));
    match opened {
        Ok((backend, what, version)) => {
            shim_log!("RM hooks on (driver {version}): the program of {what}");
            *b = Some(backend);
            STATE.store(ACTIVE, Ordering::Release);
            // SAFETY: registering a plain extern "C" fn with atexit.
            unsafe { libc::atexit(at_exit) };
            true
        }
        Err(why) => {
            shim_log!("RM hooks off: {why}; libcuda's calls pass through unchanged");
            STATE.store(OFF, Ordering::Release);
            false
        }
    }
}

/// What `before` did to libcuda's control, for `after` to undo.
pub enum Pre {
    Nothing,
    /// libcuda's SET_TIMESLICE params were changed from `from` to `to`; restored after the call.
    Rewrote {
        params: *mut u64,
        from: u64,
        to: u64,
    },
}

/// Copies up to `max` bytes of a params pointer (`size` when the caller gave one).
///
/// # Safety
/// `p` points to at least `min(size, max)` readable bytes, or to `max` when `size` is 0.
unsafe fn params(p: u64, size: u32, max: usize) -> Vec<u8> {
    if p == 0 {
        return Vec::new();
    }
    let n = if size == 0 {
        max
    } else {
        max.min(size as usize)
    };
    // SAFETY: see the function's contract.
    unsafe { std::slice::from_raw_parts(p as *const u8, n) }.to_vec()
}

/// A control's params (none when it declares none).
///
/// # Safety
/// `c.p_params` points to `c.params_size` readable bytes.
unsafe fn control_params(c: &ControlSeen) -> Vec<u8> {
    if c.params_size == 0 {
        return Vec::new();
    }
    // SAFETY: see the function's contract.
    unsafe { params(c.p_params, c.params_size, CONTROL_PARAMS_READ) }
}

/// Before libcuda's RM_CONTROL reaches the driver: rewrites its SET_TIMESLICE, or holds back
/// its GPFIFO_SCHEDULE(1) until `schedule` admits the group (bounded).
///
/// # Safety
/// `arg` is the caller's NVOS54, with its params, valid for the call.
pub unsafe fn before(arg: *mut u8) -> Pre {
    // SAFETY: forwarded from the caller.
    let Some(c) = (unsafe { read_control(IOCTL_RM_CONTROL, arg) }) else {
        return Pre::Nothing;
    };
    if !Tracker::acts_before(c.cmd) || STATE.load(Ordering::Acquire) != ACTIVE {
        return Pre::Nothing;
    }
    // SAFETY: libcuda's params of params_size bytes.
    let p = unsafe { control_params(&c) };
    let before = tracker().before_control(&c, &p);
    match before {
        Before::Pass => Pre::Nothing,
        Before::RewriteTimeslice { from, to, .. } => {
            let params = c.p_params as *mut u64;
            // SAFETY: SET_TIMESLICE params are one u64 (params_size checked by the tracker).
            unsafe { std::ptr::write_unaligned(params, to) };
            Pre::Rewrote { params, from, to }
        }
        Before::Admit(key) => {
            admit(key);
            Pre::Nothing
        }
    }
}

/// After a successful RM ioctl: feeds the tracker and runs the hooks its events call for; undoes
/// `before`'s rewrite.
///
/// # Safety
/// `arg` is the caller's argument of `request`, valid for its encoded size.
pub unsafe fn after(fd: c_int, request: u64, arg: *mut u8, pre: Pre) {
    let control = unsafe { read_control(request, arg) };
    if let Pre::Rewrote { params, from, to } = pre {
        // SAFETY: the same params `before` wrote.
        unsafe { std::ptr::write_unaligned(params, from) };
        if let Some(c) = control {
            rewritten(fd, &c, arg, from, to);
        }
    }
    let recording = log_level() >= 3;
    let owned;
    let call = if let Some(c) = control {
        if !Tracker::watches_control(c.cmd) && !recording {
            return;
        }
        // SAFETY: libcuda's params, still valid.
        owned = unsafe { control_params(&c) };
        Call::Control {
            fd,
            c,
            params: &owned,
        }
    } else if let Some(a) = unsafe { read_alloc(request, arg) } {
        let n = match a.h_class {
            CLASS_DEVICE => 4,
            CLASS_CHANNEL_GROUP => ALLOC_PARAMS_READ,
            _ => 0,
        };
        // SAFETY: libcuda's alloc params (it leaves paramsSize 0 for groups: the class says).
        owned = if n > 0 {
            unsafe { params(a.p_params, a.params_size.min(n as u32), n) }
        } else {
            Vec::new()
        };
        Call::Alloc {
            fd,
            a,
            params: &owned,
        }
    } else if let Some(f) = unsafe { read_free(request, arg) } {
        Call::Free(f)
    } else {
        return;
    };
    if recording {
        let size = decode(request).size as usize;
        // SAFETY: the argument is `size` bytes.
        let bytes = unsafe { std::slice::from_raw_parts(arg as *const u8, size) };
        shim_log!("{}", record(&call, bytes));
    }
    let events = tracker().after(call);
    for e in events {
        handle(e);
    }
}

/// libcuda's SET_TIMESLICE went to the driver with the policy's value. If the driver refused
/// it, libcuda's own value is sent instead and, if that is taken, libcuda sees success: a
/// policy never makes libcuda's call fail.
fn rewritten(fd: c_int, c: &ControlSeen, arg: *mut u8, from: u64, to: u64) {
    if c.status == NV_OK {
        if log_level() >= 1 {
            shim_log!("libcuda's SET_TIMESLICE {from} us sent as the policy's {to} us: OK");
        }
        return;
    }
    let retry = controls::set_timeslice(fd, c.h_client, c.h_object, from);
    shim_log!(
        "libcuda's SET_TIMESLICE sent as the policy's {to} us: RM status {:#x}; its own {from} us sent again: {}",
        c.status,
        retry.map_or_else(|e| e.to_string(), |()| "OK".into())
    );
    if retry.is_ok() {
        // SAFETY: `arg` is libcuda's NVOS54; its status field is what libcuda reads.
        unsafe { (*arg.cast::<Nvos54>()).status = NV_OK };
    }
}

fn handle(e: Event) {
    match e {
        Event::GroupCreated(key) => task_init(key),
        Event::GroupEnabled(key) => {
            if let Some((device, tsg)) = announced(key)
                && let Some(b) = backend().as_mut()
            {
                b.enabled(device, tsg);
            }
        }
        Event::ChannelToken { group, token } => {
            if let Some((device, tsg)) = announced(group)
                && let Some(b) = backend().as_mut()
                && let Some(f) = b.work(device, tsg, (WORK_CHANNEL, 0, u64::from(token)), 1, 0)
            {
                shim_log!("RM work_submit: {f}");
            }
        }
        Event::GroupsFreed(groups) => {
            for g in groups.into_iter().filter(|g| g.announced) {
                destroy(g.device, g.tsg);
            }
        }
    }
}

/// (device, tsg) of a group task_init ran for.
fn announced(key: GroupKey) -> Option<(u32, u32)> {
    let t = tracker();
    let g = t.group(key).filter(|g| g.announced)?;
    Some((g.device, g.tsg))
}

fn destroy(device: u32, tsg: u32) {
    if let Some(b) = backend().as_mut()
        && let Some(f) = b.destroy(device, tsg)
    {
        shim_log!("RM task_destroy (tsg {tsg}): {f}");
    }
}

/// task_init for a new group: asks the driver for its TSG id and timeslice, runs the hook, and
/// applies the decision with the driver's controls, checking each.
fn task_init(key: GroupKey) {
    if !activate() {
        return;
    }
    let GroupKey {
        fd,
        h_client,
        h_object,
    } = key;
    let Some(device) = tracker().group(key).map(|g| g.device) else {
        return;
    };
    let tsg = match controls::get_tsg_id(fd, h_client, h_object) {
        Ok(id) => id,
        Err(e) => {
            shim_log!("GET_INFO (TSG id) of group {h_object:#x}: {e}; its RM handle stands in");
            h_object & 0xff_ffff
        }
    };
    let default_timeslice_us =
        controls::get_timeslice(fd, h_client, h_object).unwrap_or_else(|e| {
            shim_log!("GET_TIMESLICE of group {h_object:#x}: {e}");
            0
        });
    let group = RmGroup {
        pid: std::process::id(),
        device,
        tsg,
        default_timeslice_us,
        default_priority: config().priority,
        hint_class: 0,
    };
    let d = match backend().as_mut() {
        Some(b) => b.task_init(&group),
        None => return,
    };
    if let Some(note) = &d.note {
        shim_log!("RM task_init (tsg {tsg}): {note}; the driver's defaults stand");
    }
    let mut applied = None;
    if let Some(us) = d.timeslice_us {
        // Kept as libcuda's rewrite target even if the driver refuses it now (the group may not
        // take it yet): a refused rewrite falls back to libcuda's own value (`rewritten`).
        applied = Some(us);
        if let Err(e) = controls::set_timeslice(fd, h_client, h_object, us) {
            shim_log!("SET_TIMESLICE {us} us on tsg {tsg} at creation: {e}");
        }
    }
    if let Some(level) = d.interleave
        && !INTERLEAVE_REFUSED.load(Ordering::Relaxed)
        && let Err(e) = controls::set_interleave_level(fd, h_client, h_object, level)
    {
        INTERLEAVE_REFUSED.store(true, Ordering::Relaxed);
        shim_log!(
            "SET_INTERLEAVE_LEVEL {level} on tsg {tsg}: {e}; the driver's level stands (not asked again)"
        );
    }
    if log_level() >= 1 {
        shim_log!(
            "RM task_init: pid {} device {device} tsg {tsg} (driver timeslice {default_timeslice_us} us) -> timeslice {:?} interleave {:?} class {}",
            group.pid,
            applied,
            d.interleave,
            d.class
        );
    }
    if let Some(g) = tracker().group_mut(key) {
        g.tsg = tsg;
        g.timeslice_us = applied;
        g.announced = true;
    }
}

/// schedule for a group libcuda is enabling: asks until admitted or the bound passes.
fn admit(key: GroupKey) {
    let Some((device, tsg, channels)) = ({
        let t = tracker();
        t.group(key)
            .filter(|g| g.announced)
            .map(|g| (g.device, g.tsg, g.channels.len() as u32))
    }) else {
        return;
    };
    let start = std::time::Instant::now();
    let mut note = None;
    let waited = admission::wait(
        config().bound,
        || {
            let (allow, n) = backend()
                .as_mut()
                .map_or((true, None), |b| b.schedule(device, tsg, channels));
            note = note.take().or(n);
            allow
        },
        std::thread::sleep,
        || start.elapsed(),
    );
    if let Some(n) = note {
        shim_log!("RM schedule (tsg {tsg}): {n}; admitted (the driver's default)");
    }
    match waited {
        Waited::Admitted { asks: 1, .. } => {}
        Waited::Admitted { asks, after } => shim_log!(
            "RM schedule: tsg {tsg} admitted after {} ms ({asks} asks)",
            after.as_millis()
        ),
        Waited::BoundPassed { asks, after } => shim_log!(
            "RM schedule: tsg {tsg} still refused after {} ms ({asks} asks): the wait's bound (XPREEMPT_RM_ADMIT_WAIT_MS) passed, enabling it anyway",
            after.as_millis()
        ),
    }
}

/// The policy's timeslice for a group (µs), if it chose one: the Lv3 control restores to it.
pub fn policy_timeslice(h_client: u32, h_object: u32) -> Option<u64> {
    if STATE.load(Ordering::Acquire) != ACTIVE {
        return None;
    }
    let t = TRACKER.try_lock().ok()?;
    t.groups()
        .iter()
        .find(|g| g.key.h_client == h_client && g.key.h_object == h_object)
        .and_then(|g| g.timeslice_us)
}

/// libcuda's fd was closed: its groups are gone (no hook runs here: `close` must not block).
pub fn forget_fd(fd: c_int) {
    if STATE.load(Ordering::Acquire) == ACTIVE
        && let Ok(mut t) = TRACKER.try_lock()
    {
        t.forget_fd(fd);
    }
}

/// A kernel launch of this process (for a layer that sees launches: the CUDA interception may
/// call it, or `xpreempt_shim_rm_work_submit` from C). Counted, and given to the program as
/// `work_submit` events of every group of the process at most every 100 ms. With the daemon,
/// nothing is sent from here: the daemon counts the process's submissions from its agent.
pub fn note_launch(kind: u32) {
    if STATE.load(Ordering::Acquire) != ACTIVE {
        return;
    }
    LAUNCHES.fetch_add(1, Ordering::Relaxed);
    let now = monotonic_ns();
    let last = LAST_FLUSH.load(Ordering::Relaxed);
    if now.saturating_sub(last) < FLUSH_NS
        || LAST_FLUSH
            .compare_exchange(last, now, Ordering::AcqRel, Ordering::Relaxed)
            .is_err()
    {
        return;
    }
    let n = LAUNCHES.swap(0, Ordering::AcqRel);
    let groups: Vec<(u32, u32)> = tracker()
        .groups()
        .iter()
        .filter(|g| g.announced)
        .map(|g| (g.device, g.tsg))
        .collect();
    let mut b = backend();
    let Some(b) = b.as_mut().filter(|b| !b.is_daemon()) else {
        return;
    };
    let since = if last == 0 { now } else { last };
    for (device, tsg) in groups {
        if let Some(f) = b.work(device, tsg, (WORK_SUBMIT, kind, 0), n, since) {
            shim_log!("RM work_submit: {f}");
        }
    }
}

/// The process is exiting: its groups' task_destroy runs before libcuda's teardown (registered
/// after libcuda's own handlers, so it runs first), so that pinned maps do not keep them.
extern "C" fn at_exit() {
    let _ = std::panic::catch_unwind(|| {
        if super::forked_child() {
            return; // the groups are the parent's, which lives on
        }
        // Never wait at exit: a thread stuck in a round trip keeps its groups (the daemon drops
        // them with the connection anyway).
        let (Ok(mut t), Ok(mut b)) = (TRACKER.try_lock(), BACKEND.try_lock()) else {
            return;
        };
        let groups = t.take_all();
        drop(t);
        let Some(b) = b.as_mut() else {
            return;
        };
        for g in groups.into_iter().filter(|g| g.announced) {
            if let Some(f) = b.destroy(g.device, g.tsg) {
                shim_log!("RM task_destroy at exit (tsg {}): {f}", g.tsg);
            }
        }
    });
}

#[cfg(test)]
mod tests;

//! The context structs of the four hooks, laid out exactly as `include/xpreempt_bpf.h` declares
//! them (a test compiles the header and compares every offset).
//!
//! Every struct has only integer fields and no padding, so any byte pattern is a valid value and
//! a program may read any byte of it; only the output fields may be written.

use std::ops::Range;

/// The hooks, in the order of a task's life.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Hook {
    TaskInit,
    Schedule,
    WorkSubmit,
    TaskDestroy,
}

impl Hook {
    pub const ALL: [Hook; 4] = [
        Hook::TaskInit,
        Hook::Schedule,
        Hook::WorkSubmit,
        Hook::TaskDestroy,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Hook::TaskInit => "task_init",
            Hook::Schedule => "schedule",
            Hook::WorkSubmit => "work_submit",
            Hook::TaskDestroy => "task_destroy",
        }
    }

    /// The ELF section a program for this hook lives in.
    pub fn section(self) -> &'static str {
        match self {
            Hook::TaskInit => "xpreempt/task_init",
            Hook::Schedule => "xpreempt/schedule",
            Hook::WorkSubmit => "xpreempt/work_submit",
            Hook::TaskDestroy => "xpreempt/task_destroy",
        }
    }

    pub fn from_section(name: &str) -> Option<Hook> {
        Hook::ALL.into_iter().find(|h| h.section() == name)
    }

    pub fn index(self) -> usize {
        self as usize
    }

    /// Size of the context the program's r1 points to.
    pub fn ctx_size(self) -> usize {
        match self {
            Hook::TaskInit => size_of::<TaskInitCtx>(),
            Hook::Schedule => size_of::<ScheduleCtx>(),
            Hook::WorkSubmit => size_of::<WorkSubmitCtx>(),
            Hook::TaskDestroy => size_of::<TaskDestroyCtx>(),
        }
    }

    /// The bytes of the context a program may write (its outputs).
    pub fn ctx_writable(self) -> Range<usize> {
        match self {
            Hook::TaskInit => std::mem::offset_of!(TaskInitCtx, priority)..size_of::<TaskInitCtx>(),
            Hook::Schedule => {
                std::mem::offset_of!(ScheduleCtx, allow_schedule)..size_of::<ScheduleCtx>()
            }
            Hook::WorkSubmit | Hook::TaskDestroy => 0..0,
        }
    }
}

impl std::fmt::Display for Hook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

pub const INTERLEAVE_LOW: u32 = 1;
pub const INTERLEAVE_MEDIUM: u32 = 2;
pub const INTERLEAVE_HIGH: u32 = 3;
pub const INTERLEAVE_OTHERS: u32 = 0x10000;
/// How many other queues `XP_INTERLEAVE_MEDIUM` lets run alongside.
pub const MEDIUM_OTHERS: u32 = 2;

/// `info.interleave` (at most N others, or no limit) as the header encodes it.
pub fn encode_interleave(limit: Option<u32>) -> u32 {
    match limit {
        None => INTERLEAVE_HIGH,
        Some(n) => INTERLEAVE_OTHERS | n.min(0xffff),
    }
}

/// A program's interleave output as a scheduler limit: `None` leaves the queue unchanged,
/// `Some(None)` removes the limit, `Some(Some(n))` allows n others.
pub fn decode_interleave(v: u32) -> Option<Option<u32>> {
    match v {
        0 => None,
        INTERLEAVE_LOW => Some(Some(0)),
        INTERLEAVE_MEDIUM => Some(Some(MEDIUM_OTHERS)),
        INTERLEAVE_HIGH => Some(None),
        v if v & !0xffff == INTERLEAVE_OTHERS => Some(Some(v & 0xffff)),
        // An unknown level is ignored rather than guessed at; the runtime logs it.
        _ => None,
    }
}

/// `engine_type` (every channel group the RM hooks see is a compute one).
pub const ENGINE_COMPUTE: u32 = 0;
pub const ENGINE_COPY: u32 = 1;

pub const CLASS_UNSET: u32 = 0;
pub const CLASS_BE: u32 = 1;
pub const CLASS_LC: u32 = 2;

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TaskInitCtx {
    pub queue_id: u64,
    pub process_id: u32,
    pub device: u32,
    pub engine_type: u32,
    pub default_interleave: u32,
    pub default_timeslice_ns: u64,
    pub default_priority: i32,
    pub hint_class: u32,
    pub priority: i32,
    pub interleave: u32,
    pub timeslice_ns: u64,
    pub class: u32,
    pub reserved: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ScheduleCtx {
    pub queue_id: u64,
    pub device: u32,
    pub pending: u32,
    pub running: u32,
    pub allow_schedule: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WorkSubmitCtx {
    pub queue_id: u64,
    pub kind: u32,
    pub device: u32,
    pub token: u64,
    pub timestamp_ns: u64,
    /// `WORK_SUBMIT` or `WORK_COMPLETE`.
    pub event: u32,
    pub reserved: u32,
}

/// `WorkSubmitCtx::event`: a command was submitted (`token` is its sequence number).
pub const WORK_SUBMIT: u32 = 0;
/// `WorkSubmitCtx::event`: commands completed (`token` is the watermark: every command below it
/// has completed; `kind` is 0).
pub const WORK_COMPLETE: u32 = 1;
/// `WorkSubmitCtx::event`, RM hooks only: a channel of the group asked the driver for its
/// work-submit token (`token` is it: runlist << 16 | channel id on Ampere and Hopper).
pub const WORK_CHANNEL: u32 = 2;

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TaskDestroyCtx {
    pub queue_id: u64,
    pub total_runtime_ns: u64,
}

/// Filled in by the `get_queue_info` helper.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct QueueInfoOut {
    pub queue_id: u64,
    pub process_id: u32,
    pub device: u32,
    pub priority: i32,
    pub interleave: u32,
    pub timeslice_ns: u64,
    pub submits: u64,
    pub last_submit_ns: u64,
}

/// A plain-old-data context: integer fields only, no padding.
///
/// # Safety
/// Implementors must be `#[repr(C)]`, contain only integer fields, and have no padding bytes, so
/// that viewing them as bytes and writing any bytes into them is sound.
pub unsafe trait Pod: Copy + 'static {
    fn as_bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: by the trait's contract every byte of Self is initialised and any byte pattern
        // is a valid Self; the slice borrows self mutably for its lifetime.
        unsafe {
            std::slice::from_raw_parts_mut((self as *mut Self).cast::<u8>(), size_of::<Self>())
        }
    }
}

// SAFETY: each struct is repr(C) with integer fields only; the asserts below prove no padding.
unsafe impl Pod for TaskInitCtx {}
unsafe impl Pod for ScheduleCtx {}
unsafe impl Pod for WorkSubmitCtx {}
unsafe impl Pod for TaskDestroyCtx {}
unsafe impl Pod for QueueInfoOut {}

/// A hook's context: which hook it belongs to, so that a caller outside the scheduler (the RM
/// hooks of the shim and the daemon) cannot hand a hook another hook's struct.
pub trait HookCtx: Pod {
    const HOOK: Hook;
}

impl HookCtx for TaskInitCtx {
    const HOOK: Hook = Hook::TaskInit;
}
impl HookCtx for ScheduleCtx {
    const HOOK: Hook = Hook::Schedule;
}
impl HookCtx for WorkSubmitCtx {
    const HOOK: Hook = Hook::WorkSubmit;
}
impl HookCtx for TaskDestroyCtx {
    const HOOK: Hook = Hook::TaskDestroy;
}

// No padding: the size equals the sum of the field sizes.
const _: () = assert!(size_of::<TaskInitCtx>() == 8 + 4 * 4 + 8 + 4 * 4 + 8 + 4 * 2);
const _: () = assert!(size_of::<ScheduleCtx>() == 8 + 4 * 4);
const _: () = assert!(size_of::<WorkSubmitCtx>() == 8 + 4 * 2 + 8 * 2 + 4 * 2);
const _: () = assert!(size_of::<TaskDestroyCtx>() == 16);
const _: () = assert!(size_of::<QueueInfoOut>() == 8 + 4 * 4 + 8 * 3);

/// Every field of every struct with its offset and size, as `(struct, field, offset, size)`;
/// the layout test compares this with what a C compiler makes of the header.
pub fn layout_table() -> Vec<(&'static str, &'static str, usize, usize)> {
    macro_rules! fields {
        ($v:ident, $c:literal, $t:ty, [$($f:ident),*]) => {{
            $v.push(($c, "sizeof", 0, size_of::<$t>()));
            $(
                let z = <$t>::default();
                $v.push(($c, stringify!($f), std::mem::offset_of!($t, $f), size_of_val(&z.$f)));
            )*
        }};
    }
    let mut v = Vec::new();
    fields!(
        v,
        "xp_task_init_ctx",
        TaskInitCtx,
        [
            queue_id,
            process_id,
            device,
            engine_type,
            default_interleave,
            default_timeslice_ns,
            default_priority,
            hint_class,
            priority,
            interleave,
            timeslice_ns,
            class,
            reserved
        ]
    );
    fields!(
        v,
        "xp_schedule_ctx",
        ScheduleCtx,
        [queue_id, device, pending, running, allow_schedule]
    );
    fields!(
        v,
        "xp_work_submit_ctx",
        WorkSubmitCtx,
        [queue_id, kind, device, token, timestamp_ns]
    );
    fields!(
        v,
        "xp_task_destroy_ctx",
        TaskDestroyCtx,
        [queue_id, total_runtime_ns]
    );
    fields!(
        v,
        "xp_queue_info",
        QueueInfoOut,
        [
            queue_id,
            process_id,
            device,
            priority,
            interleave,
            timeslice_ns,
            submits,
            last_submit_ns
        ]
    );
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn interleave_levels_round_trip() {
        assert_eq!(decode_interleave(0), None);
        assert_eq!(decode_interleave(INTERLEAVE_LOW), Some(Some(0)));
        assert_eq!(
            decode_interleave(INTERLEAVE_MEDIUM),
            Some(Some(MEDIUM_OTHERS))
        );
        assert_eq!(decode_interleave(INTERLEAVE_HIGH), Some(None));
        assert_eq!(decode_interleave(encode_interleave(Some(5))), Some(Some(5)));
        assert_eq!(decode_interleave(encode_interleave(None)), Some(None));
        assert_eq!(decode_interleave(77), None);
    }

    #[test]
    fn only_outputs_are_writable() {
        assert_eq!(Hook::TaskInit.ctx_writable(), 40..64);
        assert_eq!(Hook::Schedule.ctx_writable(), 20..24);
        assert!(Hook::WorkSubmit.ctx_writable().is_empty());
    }
}

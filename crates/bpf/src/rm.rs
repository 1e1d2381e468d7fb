//! The four hooks at the NVIDIA driver's own events, as the shim's ioctl interposer sees
//! them: a compute channel group (TSG) is created (`task_init`), enabled (`schedule`), its
//! channels get their work-submit tokens or its process launches (`work_submit`), and it is
//! freed (`task_destroy`). The same program and maps serve the scheduler's XQueue hooks; a
//! channel group's queue id carries its process id above bit 32 (see [`rm_queue_id`]) so the two
//! never share a key.
//!
//! [`RmRuntime`] builds each context, runs the hook through [`BpfHooks`] and turns the outputs
//! into what the driver's controls take (microseconds, the driver's interleave levels). It runs
//! in the daemon (one runtime for every process) or inside the process (the shim). Nothing here
//! touches the driver: the shim applies the decisions on libcuda's fd and RM client.

use crate::ctx::{self, QueueInfoOut, ScheduleCtx, TaskDestroyCtx, TaskInitCtx, WorkSubmitCtx};
use crate::hooks::{BpfHooks, HookRun};
use std::collections::BTreeMap;
use xpreempt_core::Nanos;
use xpreempt_types::hints::MAX_TIMESLICE_NS;

/// The queue id of a channel group: `pid << 32 | device << 24 | tsg` (24 bits of the hardware
/// TSG id). XQueue ids fit in 32 bits, so with a process id of at least 1 the two never meet.
pub fn rm_queue_id(pid: u32, device: u32, tsg: u32) -> u64 {
    (u64::from(pid) << 32) | (u64::from(device & 0xff) << 24) | u64::from(tsg & 0xff_ffff)
}

/// A channel group's queue id taken apart; `None` for an XQueue's id.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RmQueueId {
    pub pid: u32,
    pub device: u32,
    pub tsg: u32,
}

pub fn decode_rm_queue_id(id: u64) -> Option<RmQueueId> {
    let pid = (id >> 32) as u32;
    (pid != 0).then_some(RmQueueId {
        pid,
        device: ((id >> 24) & 0xff) as u32,
        tsg: (id & 0xff_ffff) as u32,
    })
}

/// The driver's interleave levels (`NVA06C_CTRL_INTERLEAVE_LEVEL_*`).
pub const DRIVER_INTERLEAVE_LOW: u32 = 0;
pub const DRIVER_INTERLEAVE_MEDIUM: u32 = 1;
pub const DRIVER_INTERLEAVE_HIGH: u32 = 2;

/// A program's interleave output as the driver's level: LOW, MEDIUM and HIGH pass to the level
/// of the same name (as the original hook design does); 0 and the scheduler-only `XP_INTERLEAVE_OTHERS(n)`
/// leave the driver's level alone.
pub fn driver_interleave(v: u32) -> Option<u32> {
    match v {
        ctx::INTERLEAVE_LOW => Some(DRIVER_INTERLEAVE_LOW),
        ctx::INTERLEAVE_MEDIUM => Some(DRIVER_INTERLEAVE_MEDIUM),
        ctx::INTERLEAVE_HIGH => Some(DRIVER_INTERLEAVE_HIGH),
        _ => None,
    }
}

/// A program's timeslice output (ns, 0 = unchanged) as the driver's microseconds: rounded up so
/// that a positive choice never becomes 0, capped at the scheduler's maximum.
pub fn timeslice_us(ns: u64) -> Option<u64> {
    (ns != 0).then(|| ns.min(MAX_TIMESLICE_NS).div_ceil(1000))
}

/// What `task_init` learns about a new channel group.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RmGroup {
    pub pid: u32,
    pub device: u32,
    /// The hardware TSG id (`NVA06C_CTRL_CMD_GET_INFO`), or a stand-in when the driver did not
    /// say (the shim then uses the group's RM handle).
    pub tsg: u32,
    /// The timeslice the driver reports for the new group (`GET_TIMESLICE`); 0 if unknown.
    pub default_timeslice_us: u64,
    /// The process's declared priority (`XPREEMPT_PRIORITY`).
    pub default_priority: i32,
    /// `ctx::CLASS_*` the process declared, if any.
    pub hint_class: u32,
}

/// What `task_init` decided, in the driver's units.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RmDecision {
    pub queue_id: u64,
    /// SET_TIMESLICE to this (µs); `None`: leave the driver's.
    pub timeslice_us: Option<u64>,
    /// SET_INTERLEAVE_LEVEL to this driver level; `None`: leave the driver's.
    pub interleave: Option<u32>,
    pub priority: i32,
    /// `ctx::CLASS_*`.
    pub class: u32,
    /// Whether a program handled the call (else the driver's defaults stand).
    pub ran: bool,
    /// A program failed and was taken out: the driver's defaults stand.
    pub failure: Option<String>,
}

/// What `schedule` decided.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RmAdmission {
    pub allow: bool,
    pub ran: bool,
    pub failure: Option<String>,
}

#[derive(Clone, Copy, Debug)]
struct Group {
    info: QueueInfoOut,
    admitted: bool,
    created: Nanos,
}

/// The channel groups the hooks have seen, and the contexts built from them.
#[derive(Debug, Default)]
pub struct RmRuntime {
    groups: BTreeMap<u64, Group>,
}

impl RmRuntime {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn len(&self) -> usize {
        self.groups.len()
    }

    pub fn is_empty(&self) -> bool {
        self.groups.is_empty()
    }

    /// The groups of process `pid`, by queue id.
    pub fn groups_of(&self, pid: u32) -> Vec<u64> {
        self.groups
            .keys()
            .copied()
            .filter(|&id| decode_rm_queue_id(id).is_some_and(|q| q.pid == pid))
            .collect()
    }

    /// Groups of `device` admitted and still alive, other than `except`.
    fn running(&self, device: u32, except: u64) -> u32 {
        self.groups
            .iter()
            .filter(|(id, g)| **id != except && g.admitted && g.info.device == device)
            .count() as u32
    }

    /// The `task_init` context of a new group, as built at channel-group creation.
    pub fn task_init_ctx(g: &RmGroup) -> TaskInitCtx {
        TaskInitCtx {
            queue_id: rm_queue_id(g.pid, g.device, g.tsg),
            process_id: g.pid,
            device: g.device,
            engine_type: ctx::ENGINE_COMPUTE,
            default_interleave: ctx::INTERLEAVE_MEDIUM,
            default_timeslice_ns: g.default_timeslice_us.saturating_mul(1000),
            default_priority: g.default_priority,
            hint_class: g.hint_class,
            priority: g.default_priority,
            ..TaskInitCtx::default()
        }
    }

    /// A group was created: runs `task_init` and returns its decision. A group created again
    /// under the same id (a reused TSG id) starts afresh.
    pub fn task_init(&mut self, hooks: &mut BpfHooks, g: &RmGroup, now: Nanos) -> RmDecision {
        let mut c = Self::task_init_ctx(g);
        let id = c.queue_id;
        let HookRun { ran, failure } = hooks.run_ctx(&mut c, now);
        let mut d = RmDecision {
            queue_id: id,
            priority: g.default_priority,
            ran,
            failure,
            ..RmDecision::default()
        };
        if ran {
            d.timeslice_us = timeslice_us(c.timeslice_ns);
            d.interleave = driver_interleave(c.interleave);
            d.priority = c.priority;
            d.class = c.class;
        }
        let info = QueueInfoOut {
            queue_id: id,
            process_id: g.pid,
            device: g.device,
            priority: d.priority,
            interleave: c.interleave,
            timeslice_ns: d
                .timeslice_us
                .unwrap_or(g.default_timeslice_us)
                .saturating_mul(1000),
            submits: 0,
            last_submit_ns: 0,
        };
        hooks.note_queue(info);
        self.groups.insert(
            id,
            Group {
                info,
                admitted: false,
                created: now,
            },
        );
        d
    }

    /// The `schedule` context of group `id` asking to be enabled with `channels` channels.
    pub fn schedule_ctx(&self, id: u64, channels: u32) -> ScheduleCtx {
        let device = self.groups.get(&id).map_or(0, |g| g.info.device);
        ScheduleCtx {
            queue_id: id,
            device,
            pending: channels,
            running: self.running(device, id),
            allow_schedule: 1,
        }
    }

    /// Group `id` asks to be enabled: runs `schedule`. Admission is the program's answer; with
    /// no program, or one that failed, the group is admitted (the driver's default).
    pub fn schedule(
        &mut self,
        hooks: &mut BpfHooks,
        id: u64,
        channels: u32,
        now: Nanos,
    ) -> RmAdmission {
        let mut c = self.schedule_ctx(id, channels);
        self.refresh(hooks, id);
        let HookRun { ran, failure } = hooks.run_ctx(&mut c, now);
        RmAdmission {
            allow: !ran || c.allow_schedule != 0,
            ran,
            failure,
        }
    }

    /// Group `id` was enabled (admitted, or let through when the wait's bound passed).
    pub fn enabled(&mut self, id: u64) {
        if let Some(g) = self.groups.get_mut(&id) {
            g.admitted = true;
        }
    }

    /// Work of group `id`: `event` is `ctx::WORK_*`, `kind` an `XP_OP_*` for submissions,
    /// `token` the work-submit token (channels) or the command's sequence number.
    pub fn work_submit(
        &mut self,
        hooks: &mut BpfHooks,
        id: u64,
        event: u32,
        kind: u32,
        token: u64,
        now: Nanos,
    ) -> Option<String> {
        let device = self.groups.get_mut(&id).map(|g| {
            if event == ctx::WORK_SUBMIT {
                g.info.submits += 1;
                g.info.last_submit_ns = now;
            }
            g.info.device
        })?;
        self.refresh(hooks, id);
        let mut c = WorkSubmitCtx {
            queue_id: id,
            kind,
            device,
            token,
            timestamp_ns: now,
            event,
            reserved: 0,
        };
        hooks.run_ctx(&mut c, now).failure
    }

    /// Group `id` was freed (or its process is gone): runs `task_destroy` and forgets it.
    pub fn task_destroy(&mut self, hooks: &mut BpfHooks, id: u64, now: Nanos) -> Option<String> {
        let g = self.groups.remove(&id)?;
        let mut c = TaskDestroyCtx {
            queue_id: id,
            total_runtime_ns: now.saturating_sub(g.created),
        };
        let failure = hooks.run_ctx(&mut c, now).failure;
        hooks.forget_queue(id);
        failure
    }

    /// The runtime's view of a group goes to `xp_get_queue_info` (hooks made afresh per call,
    /// as the shim's pinned mode does, start without it).
    fn refresh(&self, hooks: &mut BpfHooks, id: u64) {
        if let Some(g) = self.groups.get(&id) {
            hooks.note_queue(g.info);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ctx::Hook;
    use crate::elf::{BpfObject, ProgramCode};
    use crate::program::{BpfProgram, LoadOptions};

    fn program(hooks: &[(Hook, &str)]) -> BpfProgram {
        let object = BpfObject {
            maps: Vec::new(),
            programs: hooks
                .iter()
                .map(|(hook, src)| ProgramCode {
                    hook: *hook,
                    code: rbpf::assembler::assemble(src).expect("assembles"),
                })
                .collect(),
        };
        BpfProgram::from_object("t", object, LoadOptions::default()).expect("verified")
    }

    fn group(pid: u32, tsg: u32) -> RmGroup {
        RmGroup {
            pid,
            device: 0,
            tsg,
            default_timeslice_us: 2048,
            ..RmGroup::default()
        }
    }

    #[test]
    fn queue_ids_carry_the_process_and_never_look_like_an_xqueue() {
        let id = rm_queue_id(4242, 1, 0x12);
        assert_eq!(
            decode_rm_queue_id(id),
            Some(RmQueueId {
                pid: 4242,
                device: 1,
                tsg: 0x12
            })
        );
        assert!(id > u64::from(u32::MAX));
        assert_eq!(decode_rm_queue_id(7), None);
    }

    #[test]
    fn outputs_become_driver_units() {
        assert_eq!(timeslice_us(0), None);
        assert_eq!(
            timeslice_us(1),
            Some(1),
            "a positive choice never rounds to 0"
        );
        assert_eq!(timeslice_us(10_000_000), Some(10_000));
        assert_eq!(timeslice_us(u64::MAX), Some(MAX_TIMESLICE_NS / 1000));
        assert_eq!(driver_interleave(ctx::INTERLEAVE_LOW), Some(0));
        assert_eq!(driver_interleave(ctx::INTERLEAVE_HIGH), Some(2));
        assert_eq!(driver_interleave(ctx::INTERLEAVE_OTHERS | 3), None);
        assert_eq!(driver_interleave(0), None);
    }

    #[test]
    fn task_init_sees_the_group_and_its_outputs_are_applied() {
        // timeslice = default_timeslice_ns * 5 (offset 24 -> 48), interleave HIGH, class LC.
        let src = "ldxdw r2, [r1+24]\nmul64 r2, 5\nstxdw [r1+48], r2\nstw [r1+44], 3\nstw [r1+56], 2\nexit";
        let mut h = BpfHooks::new(program(&[(Hook::TaskInit, src)]));
        let mut rt = RmRuntime::new();
        let c = RmRuntime::task_init_ctx(&group(77, 5));
        assert_eq!(
            (c.process_id, c.default_timeslice_ns, c.default_interleave),
            (77, 2_048_000, ctx::INTERLEAVE_MEDIUM)
        );
        let d = rt.task_init(&mut h, &group(77, 5), 1);
        assert_eq!(d.queue_id, rm_queue_id(77, 0, 5));
        assert_eq!(d.timeslice_us, Some(10_240));
        assert_eq!(d.interleave, Some(DRIVER_INTERLEAVE_HIGH));
        assert_eq!((d.class, d.ran, d.failure), (ctx::CLASS_LC, true, None));
    }

    #[test]
    fn schedule_counts_the_other_admitted_groups_of_the_device() {
        // Refuse when another group runs: allow = (running == 0).
        let src =
            "ldxw r2, [r1+16]\nmov64 r0, 0\njne r2, 0, +1\nmov64 r0, 1\nstxw [r1+20], r0\nexit";
        let mut h = BpfHooks::new(program(&[(Hook::Schedule, src)]));
        let mut rt = RmRuntime::new();
        let a = rt.task_init(&mut h, &group(1, 1), 0).queue_id;
        let b = rt.task_init(&mut h, &group(2, 2), 0).queue_id;
        assert!(rt.schedule(&mut h, a, 8, 1).allow);
        rt.enabled(a);
        assert_eq!(rt.schedule_ctx(b, 8).running, 1);
        assert_eq!(rt.schedule_ctx(b, 8).pending, 8);
        assert!(!rt.schedule(&mut h, b, 8, 2).allow);
        assert_eq!(rt.task_destroy(&mut h, a, 3), None);
        assert!(rt.schedule(&mut h, b, 8, 4).allow, "the first group left");
        assert_eq!(rt.groups_of(2), vec![b]);
    }

    #[test]
    fn a_failing_program_leaves_the_driver_defaults_and_says_so() {
        let broken = "stw [r1+40], 9\nldxdw r0, [r1+4096]\nexit";
        let mut h = BpfHooks::new(program(&[]));
        h.install(BpfProgram::unverified(
            "broken",
            Hook::TaskInit,
            rbpf::assembler::assemble(broken).unwrap(),
        ));
        let mut rt = RmRuntime::new();
        let d = rt.task_init(&mut h, &group(3, 3), 0);
        assert_eq!(d.timeslice_us, None);
        let why = d.failure.expect("reported");
        assert!(
            why.contains("policy `broken`") && why.contains("task_init"),
            "{why}"
        );
        // The program is gone; the next group gets the defaults without a failure.
        let d = rt.task_init(&mut h, &group(3, 4), 0);
        assert_eq!((d.failure, d.timeslice_us), (None, None));
        let id = d.queue_id;
        assert!(rt.schedule(&mut h, id, 8, 0).allow, "admission fails open");
    }

    #[test]
    fn work_of_an_unknown_group_runs_nothing() {
        let mut h = BpfHooks::new(program(&[(Hook::WorkSubmit, "exit")]));
        let mut rt = RmRuntime::new();
        assert_eq!(rt.work_submit(&mut h, 99, ctx::WORK_SUBMIT, 0, 1, 0), None);
        assert_eq!(h.stats().calls, [0, 0, 0, 0]);
        let id = rt.task_init(&mut h, &group(1, 1), 0).queue_id;
        rt.work_submit(&mut h, id, ctx::WORK_CHANNEL, 0, 0x1_0004, 5);
        assert_eq!(h.stats().calls[Hook::WorkSubmit.index()], 1);
    }
}

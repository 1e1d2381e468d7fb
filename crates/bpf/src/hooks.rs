//! The scheduler's [`Hooks`] implemented by eBPF programs.
//!
//! Effects of each hook on the scheduler:
//! - `task_init`: `priority` becomes the queue's logical priority; `timeslice_ns` (0 = unchanged)
//!   becomes `hints.timeslice_ns`, clamped to the core's maximum; `interleave` (0 = unchanged)
//!   becomes `info.interleave` per the level mapping in `ctx.rs`; `class` sets
//!   `hints.latency_critical`.
//! - `schedule`: `allow_schedule == 0` refuses admission (the scheduler answers busy-retry).
//! - `work_submit`, `task_destroy`: effects only through maps.
//!
//! A program that fails at run time (rbpf reports the instruction) is taken out: the policy that
//! was active before it comes back (or none), the failing call is answered by that policy, and
//! the error is logged and kept in [`BpfHooks::last_error`].

use crate::ctx::{
    self, Hook, HookCtx, Pod, QueueInfoOut, ScheduleCtx, TaskDestroyCtx, TaskInitCtx, WorkSubmitCtx,
};
use crate::helpers::QueueTable;
use crate::maps::MapSnapshot;
use crate::program::{BpfProgram, LoadError, LoadOptions};
use crate::vm::VmError;
use xpreempt_core::sched::{Hooks, QueueInfo, Work};
use xpreempt_core::{Nanos, QueueId};
use xpreempt_types::hints::MAX_TIMESLICE_NS;

/// Calls and failures per hook.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct HookStats {
    pub calls: [u64; 4],
    pub failures: [u64; 4],
    pub refusals: u64,
}

pub struct BpfHooks {
    active: Option<BpfProgram>,
    previous: Option<BpfProgram>,
    queues: QueueTable,
    now: Nanos,
    stats: HookStats,
    last_error: Option<HookFailure>,
}

/// The outcome of [`BpfHooks::run_ctx`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HookRun {
    /// A program handled the call (its outputs are in the context).
    pub ran: bool,
    /// A program failed during the call and was taken out (the message says which and why).
    pub failure: Option<String>,
}

/// A program that failed at run time and was taken out.
#[derive(Debug, thiserror::Error)]
#[error("policy `{program}`: {error}; reverted to the previous policy")]
pub struct HookFailure {
    /// The failed program's name.
    pub program: String,
    /// Not a `source`: the message carries it, so that a log line says everything.
    pub error: VmError,
}

impl BpfHooks {
    pub fn new(program: BpfProgram) -> Self {
        Self {
            active: Some(program),
            previous: None,
            queues: QueueTable::new(),
            now: 0,
            stats: HookStats::default(),
            last_error: None,
        }
    }

    /// Loads and installs a program; on any error the active one stays in place.
    pub fn load(&mut self, name: &str, bytes: &[u8], opts: LoadOptions) -> Result<(), LoadError> {
        let program = BpfProgram::load(name, bytes, opts).inspect_err(|e| {
            tracing::error!(
                policy = name,
                "policy rejected, keeping the previous one: {e}"
            );
        })?;
        self.install(program);
        Ok(())
    }

    /// Makes `program` active; the one it replaces is kept to fall back to.
    pub fn install(&mut self, program: BpfProgram) {
        self.previous = self.active.replace(program);
    }

    pub fn program(&self) -> Option<&BpfProgram> {
        self.active.as_ref()
    }

    pub fn program_mut(&mut self) -> Option<&mut BpfProgram> {
        self.active.as_mut()
    }

    pub fn stats(&self) -> &HookStats {
        &self.stats
    }

    pub fn last_error(&self) -> Option<&HookFailure> {
        self.last_error.as_ref()
    }

    /// Runs `hook` on `ctx`; false if no policy handled it (the caller keeps its defaults).
    fn call<C: Pod>(&mut self, hook: Hook, ctx: &mut C) -> bool {
        let pristine = *ctx;
        loop {
            let Some(program) = self.active.as_mut() else {
                return false;
            };
            self.stats.calls[hook.index()] += 1;
            match program.run(hook, ctx.as_bytes_mut(), &self.queues, self.now) {
                Ok(ran) => return ran.is_some(),
                Err(e) => {
                    self.stats.failures[hook.index()] += 1;
                    let failure = HookFailure {
                        program: program.name().to_string(),
                        error: e,
                    };
                    tracing::error!("{failure}");
                    self.last_error = Some(failure);
                    self.active = self.previous.take();
                    // The failed run may have written half its outputs: start again clean.
                    *ctx = pristine;
                }
            }
        }
    }

    /// Verifies `bytes` now (so errors surface before anything runs), then returns a maker of
    /// fresh hooks, each with its own maps filled from `pinned`: one per simulated run.
    pub fn factory(
        name: &str,
        bytes: Vec<u8>,
        pinned: Vec<MapSnapshot>,
        opts: LoadOptions,
    ) -> Result<impl Fn() -> Box<dyn Hooks> + 'static, LoadError> {
        BpfProgram::load(name, &bytes, opts)?;
        let name = name.to_string();
        Ok(move || -> Box<dyn Hooks> {
            match BpfProgram::load(&name, &bytes, opts) {
                Ok(mut p) => {
                    for skipped in p.restore(&pinned) {
                        tracing::debug!(map = skipped, "pinned map not used by this object");
                    }
                    Box::new(BpfHooks::new(p))
                }
                // Cannot happen for bytes that loaded above; fall back to the neutral hooks.
                Err(e) => {
                    tracing::error!(policy = name, "{e}");
                    Box::new(NoHooks)
                }
            }
        })
    }

    /// Runs the hook `C` belongs to on `ctx` for a caller outside the scheduler (the RM hooks),
    /// with the clock at `now` (it never goes back). A program that fails is taken out as
    /// [`BpfHooks`] always does; the outcome says so, so that the caller can report it.
    pub fn run_ctx<C: HookCtx>(&mut self, ctx: &mut C, now: Nanos) -> HookRun {
        self.now = self.now.max(now);
        let failures = self.stats.failures[C::HOOK.index()];
        let ran = self.call(C::HOOK, ctx);
        let failure = (self.stats.failures[C::HOOK.index()] > failures)
            .then(|| self.last_error.as_ref().map(ToString::to_string))
            .flatten();
        HookRun { ran, failure }
    }

    /// Makes a queue known to `xp_get_queue_info` (the RM hooks' channel groups).
    pub fn note_queue(&mut self, info: QueueInfoOut) {
        self.queues.insert(info.queue_id, info);
    }

    pub fn forget_queue(&mut self, queue_id: u64) {
        self.queues.remove(&queue_id);
    }

    fn device_of(&self, queue: QueueId) -> u32 {
        self.queues.get(&(queue.0 as u64)).map_or(0, |q| q.device)
    }
}

impl BpfHooks {
    /// Runs `task_init` over `info` and applies its outputs.
    fn run_task_init(&mut self, info: &mut QueueInfo) {
        let default_ts = info.hints.timeslice_ns.unwrap_or(0);
        let mut c = TaskInitCtx {
            queue_id: info.id.0 as u64,
            process_id: info.process,
            device: info.device,
            engine_type: 0,
            default_interleave: ctx::encode_interleave(info.interleave),
            default_timeslice_ns: default_ts,
            default_priority: info.priority,
            hint_class: match info.hints.latency_critical {
                None => ctx::CLASS_UNSET,
                Some(false) => ctx::CLASS_BE,
                Some(true) => ctx::CLASS_LC,
            },
            priority: info.priority,
            ..TaskInitCtx::default()
        };
        if self.call(Hook::TaskInit, &mut c) {
            info.priority = c.priority;
            if c.timeslice_ns != 0 {
                if c.timeslice_ns > MAX_TIMESLICE_NS {
                    tracing::warn!(queue = %info.id, "task_init timeslice {} ns clamped to {MAX_TIMESLICE_NS}", c.timeslice_ns);
                }
                info.hints.timeslice_ns = Some(c.timeslice_ns.min(MAX_TIMESLICE_NS));
            }
            match ctx::decode_interleave(c.interleave) {
                Some(limit) => info.interleave = limit,
                None if c.interleave != 0 => {
                    tracing::warn!(queue = %info.id, "task_init interleave {:#x} is not a level; ignored", c.interleave)
                }
                None => {}
            }
            match c.class {
                ctx::CLASS_BE => info.hints.latency_critical = Some(false),
                ctx::CLASS_LC => info.hints.latency_critical = Some(true),
                _ => {}
            }
        }
    }
}

impl Hooks for BpfHooks {
    fn as_any_mut(&mut self) -> Option<&mut dyn std::any::Any> {
        Some(self)
    }

    fn task_init(&mut self, info: &mut QueueInfo) {
        self.run_task_init(info);
        self.queues.insert(
            info.id.0 as u64,
            QueueInfoOut {
                queue_id: info.id.0 as u64,
                process_id: info.process,
                device: info.device,
                priority: info.priority,
                interleave: ctx::encode_interleave(info.interleave),
                timeslice_ns: info.hints.timeslice_ns.unwrap_or(0),
                submits: 0,
                last_submit_ns: 0,
            },
        );
    }

    /// Runs `task_init` again over what the queue declared, so that classes learned by
    /// `work_submit` (e.g. a submit rate) take effect while the queue lives.
    fn reclassify(&mut self, declared: &QueueInfo) -> Option<QueueInfo> {
        self.active.as_ref()?;
        let mut info = declared.clone();
        self.run_task_init(&mut info);
        if let Some(q) = self.queues.get_mut(&(info.id.0 as u64)) {
            q.priority = info.priority;
            q.interleave = ctx::encode_interleave(info.interleave);
            q.timeslice_ns = info.hints.timeslice_ns.unwrap_or(0);
        }
        Some(info)
    }

    fn admit(&mut self, queue: QueueId, pending: usize, running: usize) -> bool {
        let mut c = ScheduleCtx {
            queue_id: queue.0 as u64,
            device: self.device_of(queue),
            pending: pending.min(u32::MAX as usize) as u32,
            running: running.min(u32::MAX as usize) as u32,
            allow_schedule: 1,
        };
        let allow = !self.call(Hook::Schedule, &mut c) || c.allow_schedule != 0;
        if !allow {
            self.stats.refusals += 1;
        }
        allow
    }

    fn work_submit(&mut self, queue: QueueId, work: Work, now: Nanos) {
        self.now = self.now.max(now);
        let (event, kind, token) = match work {
            Work::Submitted { kind, seq } => {
                if let Some(q) = self.queues.get_mut(&(queue.0 as u64)) {
                    q.submits += 1;
                    q.last_submit_ns = now;
                }
                (ctx::WORK_SUBMIT, kind as u32, seq)
            }
            Work::Completed { upto } => (ctx::WORK_COMPLETE, 0, upto),
        };
        let mut c = WorkSubmitCtx {
            queue_id: queue.0 as u64,
            kind,
            device: self.device_of(queue),
            token,
            timestamp_ns: now,
            event,
            reserved: 0,
        };
        self.call(Hook::WorkSubmit, &mut c);
    }

    fn task_destroy(&mut self, queue: QueueId, run_ns: Nanos) {
        let mut c = TaskDestroyCtx {
            queue_id: queue.0 as u64,
            total_runtime_ns: run_ns,
        };
        self.call(Hook::TaskDestroy, &mut c);
        self.queues.remove(&(queue.0 as u64));
    }
}

/// Hooks that change nothing (the scheduler's defaults).
pub struct NoHooks;

impl Hooks for NoHooks {}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::elf::{BpfObject, ProgramCode};

    fn asm(src: &str) -> Vec<u8> {
        rbpf::assembler::assemble(src).expect("test program assembles")
    }

    fn program(name: &str, hook: Hook, src: &str) -> BpfProgram {
        let object = BpfObject {
            maps: Vec::new(),
            programs: vec![ProgramCode {
                hook,
                code: asm(src),
            }],
        };
        BpfProgram::from_object(name, object, LoadOptions::default()).expect("verified")
    }

    #[test]
    fn a_program_failing_at_run_time_falls_back_to_the_previous_policy() {
        let mut h = BpfHooks::new(program("five", Hook::TaskInit, "stw [r1+40], 5\nexit"));
        // Past the 64-byte context: rbpf stops it at run time.
        h.install(BpfProgram::unverified(
            "broken",
            Hook::TaskInit,
            asm("stw [r1+40], 9\nldxdw r0, [r1+4096]\nexit"),
        ));
        let mut q = QueueInfo::new(QueueId(1), 0);
        h.task_init(&mut q);
        assert_eq!(
            q.priority, 5,
            "answered by the previous policy, the broken run's write undone"
        );
        let err = h.last_error().unwrap().to_string();
        assert!(
            err.contains("policy `broken`") && err.contains("task_init"),
            "{err}"
        );
        assert!(
            err.contains("out of bounds memory load (instruction 1)"),
            "{err}"
        );
        assert_eq!(h.program().unwrap().name(), "five");
        assert_eq!(h.stats().failures, [1, 0, 0, 0]);
        // With nothing to fall back to, the scheduler's defaults apply.
        h.install(BpfProgram::unverified(
            "broken",
            Hook::Schedule,
            asm("ldxdw r0, [r1+4096]\nexit"),
        ));
        h.previous = None;
        assert!(h.admit(QueueId(1), 1, 0), "fails open");
        assert!(h.program().is_none());
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn the_jit_runs_verified_programs_without_helper_calls() {
        let src = "ldxw r2, [r1+32]\nadd64 r2, 10\nstxw [r1+40], r2\nstw [r1+44], 1\nexit";
        let object = BpfObject {
            maps: Vec::new(),
            programs: vec![ProgramCode {
                hook: Hook::TaskInit,
                code: asm(src),
            }],
        };
        let opts = LoadOptions {
            mode: crate::ExecMode::Jit,
            ..LoadOptions::default()
        };
        let mut h =
            BpfHooks::new(BpfProgram::from_object("jit", object, opts).expect("JIT-compiled"));
        assert_eq!(
            h.program().unwrap().programs()[0].mode,
            crate::ExecMode::Jit
        );
        let mut q = QueueInfo::new(QueueId(1), 32);
        h.task_init(&mut q);
        assert_eq!((q.priority, q.interleave), (42, Some(0)));
    }

    #[test]
    fn negating_the_most_negative_number_wraps() {
        let mut h = BpfHooks::new(program(
            "neg",
            Hook::TaskInit,
            "lddw r2, 0x8000000000000000\nneg64 r2\nrsh64 r2, 63\nstxw [r1+40], r2\nexit",
        ));
        let mut q = QueueInfo::new(QueueId(1), 0);
        h.task_init(&mut q);
        assert_eq!(q.priority, 1);
        assert!(h.last_error().is_none());
    }

    #[test]
    fn outputs_map_onto_queue_info() {
        // priority 7, interleave MEDIUM, class LC; a 100 s timeslice is clamped to the core's limit.
        let src = "stw [r1+40], 7\nstw [r1+44], 2\nlddw r2, 100000000000\nstxdw [r1+48], r2\nstw [r1+56], 2\nexit";
        let mut h = BpfHooks::new(program("out", Hook::TaskInit, src));
        let mut q = QueueInfo::new(QueueId(3), 1);
        h.task_init(&mut q);
        assert_eq!(q.priority, 7);
        assert_eq!(q.interleave, Some(ctx::MEDIUM_OTHERS));
        assert_eq!(q.hints.timeslice_ns, Some(MAX_TIMESLICE_NS));
        assert_eq!(q.hints.latency_critical, Some(true));
        assert_eq!(q.hints.validate(), Ok(()));
    }
}

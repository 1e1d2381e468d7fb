//! The HAL over a queue's stream (`mod.rs` holds what it is made of): Lv1 launches deferred
//! driver calls and watches sync events; Lv2 (guard-built kernels stopped by a flag and
//! relaunched) is `lv2.rs`; pass-through's markers `observe.rs`; Lv3 (the process's timeslice,
//! `crate::lv3`) adds to Lv2.

use super::{
    CuError, CudaQueue, CudaQueueConfig, Deferred, LaunchTimes, Lv2State, Observer, State, backend,
    is_submitting, note, note_launched,
};
use crate::entry::{self, Driver, Handle, SUCCESS};
use crate::stop_gate::StopGate;
use std::cell::Cell;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU32, Ordering};
use std::sync::{Mutex, OnceLock};
use xpreempt_hal::{HalError, HwQueue};
use xpreempt_types::{Command, Launched, Level, Nanos, Op, Seq};

/// The queue's completion watcher naps for its poll time (and for the core's quiet period) between
/// looks; Linux's default timer slack (50 µs) would stretch every nap to about 70 µs and so
/// delay each Idle. Set once per watcher thread (they are named `xpreempt-…`; the
/// application's own threads keep their slack).
fn precise_naps() {
    thread_local! {
        static DONE: Cell<bool> = const { Cell::new(false) };
    }
    if DONE.with(|d| d.replace(true)) {
        return;
    }
    if std::thread::current()
        .name()
        .is_some_and(|n| n.starts_with("xpreempt-"))
    {
        // SAFETY: a plain prctl on the calling thread.
        unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, 1000u64) };
    }
}

impl CudaQueue {
    /// A queue on `stream` of context `ctx` (the caller's: the queue neither makes nor destroys
    /// it), calling the driver through `drv`. At Lv3 (with the process's control in `cfg.lv3`) an
    /// interrupt stops guard-built kernels as at Lv2 and lowers the process's timeslice.
    pub fn new(
        drv: &'static dyn Driver,
        ctx: Handle,
        stream: Handle,
        cfg: CudaQueueConfig,
    ) -> Self {
        let observe = cfg.observe;
        let owner_only = cfg.owner_only;
        Self {
            drv,
            ctx,
            stream,
            lv3: cfg.lv3.filter(|_| cfg.level >= Level::Lv3),
            interrupted: AtomicBool::new(false),
            lv2: cfg.level >= Level::Lv2 && !observe && !owner_only,
            lv2_busy: AtomicBool::new(false),
            gate: StopGate::new(),
            ahead_target: OnceLock::new(),
            gone: AtomicBool::new(false),
            launcher_cpu: AtomicI32::new(-1),
            pollers: AtomicU32::new(0),
            launch_times: LaunchTimes::default(),
            observer: observe.then(Observer::default),
            owner_only,
            owner_mark: Mutex::new(None),
            sticky_errors: cfg.sticky_errors,
            poll: cfg.poll,
            time_launches: cfg.time_launches,
            owned: None,
            state: Mutex::new(State {
                sync: VecDeque::new(),
                free: Vec::new(),
                completed: 0,
                launched: 0,
                sticky: SUCCESS,
                retired: false,
                lv2: Lv2State::new(cfg.slots, cfg.max_units),
            }),
        }
    }

    /// Before the stream or its context goes away: releases the queue's events (a record still
    /// pending completes first in the driver) and stops the queue's driver calls for good.
    pub fn retire(&self) {
        self.stop(true);
    }

    /// At exit: like `retire`, but the events are left to the process's end. The CUDA runtime's
    /// own exit handler may already have torn the contexts down (seen on the device after a
    /// device reset: destroying the events then crashed inside libcuda).
    pub fn retire_at_exit(&self) {
        self.stop(false);
    }

    fn stop(&self, destroy_events: bool) {
        {
            let mut g = self.lock();
            if g.retired {
                return;
            }
            g.retired = true;
            g.completed = g.launched;
            // Closed for good (a stop ahead whose set is being issued is waited out): the flag
            // goes with the resources.
            self.gate.close();
            self.gate.lower();
        }
        self.gone.store(true, Ordering::SeqCst);
        while self.pollers.load(Ordering::SeqCst) > 0 {
            self.nap();
        }
        if !destroy_events {
            return;
        }
        let mut g = self.lock();
        if self.interrupted.swap(false, Ordering::SeqCst) {
            self.restore_timeslice();
        }
        self.release_hold();
        let _ctx = self.enter();
        self.lv2_release(&mut g);
        if let Some(ev) = self
            .owner_mark
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
        {
            self.drv.event_destroy(ev as Handle);
        }
        for (_, ev) in std::mem::take(&mut g.sync) {
            self.drv.event_destroy(ev);
        }
        for ev in std::mem::take(&mut g.free) {
            self.drv.event_destroy(ev);
        }
    }

    /// Event `ev`, recorded for watermark `m` in Lv2 generation `generation`, has completed: so
    /// have those recorded before it, unless a flagged stop came since (the event then fired
    /// behind stopped kernels, or was recorded again).
    fn reached(&self, g: &mut State, m: Seq, generation: u64) {
        if g.retired || g.lv2.generation != generation || self.lv2_frozen(g) {
            return;
        }
        g.completed = g.completed.max(m);
        super::sync_events::retire_reached(&mut g.sync, &mut g.free, m);
    }

    /// `HwQueue::launch`, timed by it for the exit report.
    fn launch_timed(
        &self,
        seq: Seq,
        command: &mut Command<Deferred>,
        sync_point: bool,
    ) -> Result<(), HalError> {
        let _ctx = self.enter();
        let mut g = self.lock();
        let Op::Kernel(d) = &mut command.op else {
            return Err(HalError::Refused {
                op: "launch",
                source: std::sync::Arc::new(CuError(entry::ERROR_INVALID_VALUE)),
            });
        };
        let values = d.guarded.then(|| self.guard_values(&mut g, d));
        if self.lv2 && !self.lv2_may_launch(&g, d.slot.is_some()) {
            // Held back behind a stop ahead: nothing reached the driver.
            return Err(HalError::Stopping("launch"));
        }
        let status = d.call(self, values.as_ref());
        if status != SUCCESS {
            // Not on the stream: nothing to stop or relaunch (a retry takes a slot afresh).
            d.slot = None;
            if self.lv2 {
                self.note_busy(&g);
            }
            if !self.sticky_errors {
                // The call stays, for a retry.
                return Err(backend("launch", status));
            }
        }
        if d.slot.is_none() {
            // Never relaunched: the arguments go now.
            d.call = None;
        }
        if is_submitting() {
            crate::placement::note_launcher(&self.launcher_cpu);
            note_launched();
        }
        if status != SUCCESS {
            if is_submitting() {
                return Err(backend("launch", status));
            }
            // From the pending buffer: retrying a call the driver refused cannot help; it counts
            // as done and the stream reports the error at its next synchronize, as CUDA would.
            if g.sticky == SUCCESS {
                g.sticky = status;
            }
        }
        g.launched = seq + 1;
        if self.lv2 {
            let slot = d.slot.map(|(s, _)| s);
            g.lv2.flight.push(seq, slot);
            self.note_busy(&g);
        }
        if self.observer.is_some() {
            // A marker: its completion is proven by `synchronize`, which records after the
            // stream's latest work.
            self.release_hold();
            return Ok(());
        }
        if sync_point
            && !self.owner_only
            && let Err(e) = self.record(&mut g, seq + 1)
        {
            // The command is on the stream: a later record_sync covers its completion.
            note!(self, "sync point after a launch: {e}");
        }
        Ok(())
    }
}

impl HwQueue for CudaQueue {
    type Payload = Deferred;

    fn max_level(&self) -> Level {
        if self.lv3.is_some() {
            Level::Lv3
        } else if self.lv2 {
            Level::Lv2
        } else {
            Level::Lv1
        }
    }

    fn settled(&self) -> bool {
        !self.lv2 || self.lv2_settled()
    }

    fn stop_ahead(&self) -> bool {
        self.lv2 && self.lv2_stop_ahead()
    }

    fn deactivate(&self) -> Result<(), HalError> {
        if !self.lv2 {
            return Err(self.unsupported("deactivate", Level::Lv2));
        }
        self.lv2_deactivate()
    }

    fn reactivate(&self, log: &mut [Launched<Deferred>]) -> Result<(), HalError> {
        if !self.lv2 {
            return Err(self.unsupported("reactivate", Level::Lv2));
        }
        self.lv2_reactivate(log)
    }

    /// Lv3 adds to Lv2: guard-built kernels are stopped at their next block as at Lv2, and the
    /// process's timeslice takes the GPU from whatever else it runs. Either stop alone is a stop
    /// (`restore` undoes whichever was made); only when both fail does the suspension drain.
    fn interrupt(&self) -> Result<(), HalError> {
        let Some(lv3) = &self.lv3 else {
            return Err(self.unsupported("interrupt", Level::Lv3));
        };
        let flagged = match self.lv2.then(|| self.lv2_deactivate()) {
            None => false,
            Some(Ok(())) => true,
            Some(Err(e)) => {
                note!(
                    self,
                    "interrupt: the Lv2 stop failed ({e}); the timeslice alone stops"
                );
                false
            }
        };
        if !self.interrupted.swap(true, Ordering::SeqCst)
            && let Err(e) = lv3.interrupt()
        {
            self.interrupted.store(false, Ordering::SeqCst);
            if !flagged {
                return Err(e.into_hal("interrupt"));
            }
            note!(
                self,
                "interrupt: the timeslice could not be lowered; the Lv2 stop alone holds"
            );
        }
        Ok(())
    }

    fn restore(&self, log: &mut [Launched<Deferred>]) -> Result<(), HalError> {
        // The timeslice only slowed the work down; guard-built kernels stopped by the flag are
        // relaunched as at Lv2.
        if self.interrupted.swap(false, Ordering::SeqCst)
            && let Some(lv3) = &self.lv3
            && let Err(e) = lv3.restore()
        {
            self.interrupted.store(true, Ordering::SeqCst);
            return Err(e.into_hal("restore"));
        }
        if self.lv2 {
            self.lv2_reactivate(log)?;
        }
        Ok(())
    }

    /// The process's measured SET_TIMESLICE call: the least an interrupt takes to act (the
    /// context switch that follows comes on top). With a guard-built kernel in flight (or stopped)
    /// it is 0: the interrupt's Lv2 part stops that kernel at its next block, whatever the call
    /// costs. The busy word alone may still count a guarded kernel that has completed.
    fn interrupt_cost_ns(&self) -> Option<Nanos> {
        if self.lv2 && self.lv2_busy() {
            let g = self.lock();
            if self.lv2_frozen(&g) || g.lv2.flight.has_guarded_from(g.completed) {
                return Some(0);
            }
        }
        let cost = self.lv3.as_ref()?.set_cost()?;
        Some(u64::try_from(cost.as_nanos()).unwrap_or(u64::MAX))
    }

    fn launch(
        &self,
        seq: Seq,
        command: &mut Command<Deferred>,
        sync_point: bool,
    ) -> Result<(), HalError> {
        let started = self.time_launches.then(std::time::Instant::now);
        let r = self.launch_timed(seq, command, sync_point);
        if let Some(t0) = started {
            self.launch_times.done(t0, is_submitting());
        }
        r
    }

    fn record_sync(&self) -> Result<(), HalError> {
        if self.observer.is_some() || self.owner_only {
            // Markers: their completion is proven by `synchronize`; a per-thread stream's
            // events come from its own thread.
            return Ok(());
        }
        let mut g = self.lock();
        let tail = g.launched;
        if g.retired || g.completed >= tail || g.sync.back().is_some_and(|&(m, _)| m >= tail) {
            return Ok(());
        }
        let _ctx = self.enter();
        self.record(&mut g, tail).map(|_| ())
    }

    /// What `synchronize` has seen complete: no driver call here, since the queue's lock is
    /// held around this and the application's launches wait for that lock.
    fn completed(&self) -> Seq {
        let g = self.lock();
        if g.retired { g.launched } else { g.completed }
    }

    /// The sync events that have passed, oldest first, one query each until the first that has
    /// not.
    fn take_in_completions(&self) {
        if self.observer.is_some() {
            return;
        }
        let mut g = self.lock();
        if g.retired || self.lv2_frozen(&g) {
            return;
        }
        let _ctx = self.enter();
        let generation = g.lv2.generation;
        while let Some(&(m, ev)) = g.sync.iter().find(|&&(m, _)| m > g.completed) {
            if self.drv.event_query(ev) != SUCCESS {
                break;
            }
            self.reached(&mut g, m, generation);
            if g.completed < m {
                break;
            }
        }
    }

    fn synchronize(&self, upto: Seq) -> Result<(), HalError> {
        precise_naps();
        crate::placement::step_aside(&self.launcher_cpu);
        if let Some(o) = &self.observer {
            return o.synchronize(self, upto);
        }
        // A retired queue's context may be gone: it must not be made current. (Checked and
        // entered under the lock, so `retire` cannot slip in between.)
        let _ctx = {
            let g = self.lock();
            (!g.retired).then(|| self.enter())
        };
        loop {
            let (m, ev, generation) = {
                let mut g = self.lock();
                if g.retired || g.completed >= upto {
                    return Ok(());
                }
                if self.lv2_frozen(&g) {
                    // Stopped work completes only after reactivate; the caller polls again.
                    return Ok(());
                }
                if upto > g.launched {
                    return Err(HalError::WouldBlock(
                        "synchronize beyond the launched commands",
                    ));
                }
                let (m, ev) = match g.sync.iter().find(|&&(m, _)| m >= upto) {
                    Some(&found) => found,
                    None if self.owner_only => {
                        // The stream's own thread records behind its call, just after the
                        // marker let it go.
                        drop(g);
                        self.nap();
                        continue;
                    }
                    None => {
                        let tail = g.launched;
                        (tail, self.record(&mut g, tail)?)
                    }
                };
                // Counted under the lock: `retire` (which takes it first) waits for this poll.
                self.begin_poll();
                (m, ev, g.lv2.generation)
            };
            // Waiting without the lock; a reaped and re-recorded event only ends the wait later.
            // Polled with short sleeps instead of cuEventSynchronize: a thread spinning inside
            // libcuda next to the application's launching thread slows its launches.
            let r = loop {
                if self.gone.load(Ordering::SeqCst) {
                    break SUCCESS;
                }
                match self.drv.event_query(ev) {
                    entry::ERROR_NOT_READY => self.nap(),
                    r => break r,
                }
            };
            if r == SUCCESS {
                self.reached(&mut self.lock(), m, generation);
            }
            self.end_poll();
            if r != SUCCESS {
                return Err(backend("cuEventQuery", r));
            }
        }
    }
}

impl Drop for CudaQueue {
    fn drop(&mut self) {
        if self.owned.is_some() {
            // A stream of its own: its work ends, then everything goes (`owned.rs`).
            self.release_owned();
            return;
        }
        if *self.interrupted.get_mut() {
            self.restore_timeslice();
        }
        self.release_hold();
        if *self.gone.get_mut() {
            // Retired: its events were destroyed then, or left to the process's end.
            return;
        }
        let mark = self
            .owner_mark
            .get_mut()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        let g = self.state.get_mut().unwrap_or_else(|p| p.into_inner());
        if g.sync.is_empty() && g.free.is_empty() && mark.is_none() {
            return;
        }
        // Destroyed without waiting (the driver frees an event once its record completes): a
        // wait here could fall inside another thread's stream capture and invalidate it.
        let drv = self.drv;
        let _ctx = entry::CtxGuard::enter(drv, self.ctx);
        for &(_, ev) in &g.sync {
            drv.event_destroy(ev);
        }
        for &ev in &g.free {
            drv.event_destroy(ev);
        }
        if let Some(ev) = mark {
            drv.event_destroy(ev as Handle);
        }
    }
}

impl CudaQueue {
    /// Gives back this queue's count of the process's interrupted timeslice (retiring or
    /// dropped while interrupted, or while a held marker interrupted it).
    pub(crate) fn restore_timeslice(&self) {
        if let Some(lv3) = &self.lv3
            && let Err(e) = lv3.restore()
        {
            note!(self, "restoring the process's timeslice: {e}");
        }
    }
}

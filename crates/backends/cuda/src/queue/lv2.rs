//! Lv2: block-level preemption of guard-built kernels (`xpreempt_guard.cuh`; the shim
//! recognizes the application's, the benchmarks build their own), with the bookkeeping of
//! `crate::flight`.
//!
//! Each queue gets, at its first guarded launch, a flag word and a completion array in device
//! memory (through the queue's driver table) and a control stream of the highest priority.
//! A guarded launch gets the flag, a completion slot of the array and an epoch as its three guard
//! parameters. `deactivate` sets the flag from the control stream when the in-flight window ends
//! in guarded kernels (`flag_is_safe`): blocks that start afterwards exit at once, and the
//! completion watermark freezes (events recorded behind a stopped kernel fire without its work).
//! Otherwise (an unguarded command behind a guarded kernel: a launch of a plain kernel, or a
//! call that went to the driver directly, noted by [`CudaQueue::admit_direct`]) the suspension
//! drains as at Lv1. `reactivate` clears the flag behind the stop, makes the stream wait for the
//! clear and relaunches the stopped kernels with their slots and epochs: finished blocks skip
//! themselves, so every block runs once. A reactivate that fails part-way resumes where it
//! stopped (`Relaunch`).
//!
//! While the flag is set, nothing else may reach the stream or wait on it: every call that
//! bypasses the queue (the shim's direct calls) first waits in [`CudaQueue::admit_direct`] until
//! the stopped kernels run again, as it waits for a pending buffer.
//!
//! A suspension sets the flag before it takes the queue's lock (`stop_ahead`, through the gate
//! of `crate::stop_gate`), so that it does not wait for the launch under way: while it is
//! raised, the stream counts as stopped (the watermark stays, direct calls and synchronizes
//! wait, an unguarded launch is held back in the pending buffer) until the deactivate takes the
//! stop over.
//!
//! The flag is set and cleared with a memset on the control stream, not a copy from a pinned
//! word: on an H100 beside a saturating kernel the memset was done on the GPU 2.7–8.9 µs after
//! it was issued against 7.6–17.7 for the copy (which reads the host's word across the bus
//! first), and its call cost the thread 0.0–0.9 µs less at p50 (measured 2026-11-24, driver
//! 580.159.04).

use super::{
    CudaQueue, Deferred, GuardValues, Lv2State, PLACEHOLDERS, Resources, State, Stop, backend, note,
};
use crate::entry::{self, Driver, Handle, STREAM_NON_BLOCKING, SUCCESS};
use crate::flight::{Flight, Relaunch, flag_is_safe, is_clean, relaunch_stopped};
use crate::stop_gate::Closed;
use std::sync::atomic::{AtomicU64, Ordering};
use xpreempt_hal::HalError;
use xpreempt_types::{Launched, Seq};

/// Launches that got guard values (a completion slot) in this process.
static GUARDED: AtomicU64 = AtomicU64::new(0);
/// Relaunches of stopped guarded kernels.
static RELAUNCHED: AtomicU64 = AtomicU64::new(0);
/// Stops made ahead of the queue's lock.
static STOPPED_AHEAD: AtomicU64 = AtomicU64::new(0);

/// How many launches of guard-built kernels got their guard parameters filled in (Lv2).
pub fn guarded_launches() -> u64 {
    GUARDED.load(Ordering::Relaxed)
}

/// How many times a stopped guarded kernel was launched again after a resume.
pub fn relaunches() -> u64 {
    RELAUNCHED.load(Ordering::Relaxed)
}

/// How many suspensions set the flag before they took the queue's lock (a stop ahead).
pub fn stops_ahead() -> u64 {
    STOPPED_AHEAD.load(Ordering::Relaxed)
}

impl Lv2State {
    /// `slots`: one per command in flight, and one more; `max_units`: completion words each.
    pub fn new(slots: u32, max_units: u32) -> Self {
        let slots = slots.max(1);
        Self {
            flight: Flight::new(slots, 16),
            stop: Stop::Running,
            relaunch: Relaunch::default(),
            stop_event: None,
            stop_recorded: false,
            res: None,
            failed: false,
            slots,
            max_units,
            next_slot: 0,
            epoch: 0,
            generation: 0,
        }
    }
}

fn ok(op: &'static str, r: u32) -> Result<(), HalError> {
    if r == SUCCESS {
        Ok(())
    } else {
        Err(backend(op, r))
    }
}

fn make_resources(drv: &dyn Driver, slots: u32, max_units: u32) -> Result<Resources, u32> {
    let (mut least, mut greatest) = (0i32, 0i32);
    if drv.stream_priority_range(&mut least, &mut greatest) != SUCCESS {
        greatest = 0;
    }
    let mut r = Resources {
        control: std::ptr::null_mut(),
        flag: 0,
        done: 0,
        clear_event: std::ptr::null_mut(),
    };
    let words = slots as usize * max_units as usize;
    let made = (|| {
        let check = |e| if e == SUCCESS { Ok(()) } else { Err(e) };
        check(drv.stream_create(&mut r.control, STREAM_NON_BLOCKING, greatest))?;
        check(drv.mem_alloc(&mut r.flag, 4))?;
        check(drv.mem_alloc(&mut r.done, words * 4))?;
        check(drv.memset_d32_async(r.flag, 0, 1, r.control))?;
        check(drv.memset_d32_async(r.done, 0, words, r.control))?;
        check(drv.stream_synchronize(r.control))?;
        r.clear_event = entry::new_event(drv)?;
        Ok(())
    })();
    match made {
        Ok(()) => Ok(r),
        Err(e) => {
            free_resources(drv, &r);
            Err(e)
        }
    }
}

fn free_resources(drv: &dyn Driver, r: &Resources) {
    if !r.control.is_null() {
        drv.stream_synchronize(r.control);
        drv.stream_destroy(r.control);
    }
    for p in [r.flag, r.done] {
        if p != 0 {
            drv.mem_free(p);
        }
    }
    if !r.clear_event.is_null() {
        drv.event_destroy(r.clear_event);
    }
}

impl CudaQueue {
    /// The guard values of guarded launch `d` (lock held, context current): its slot and epoch,
    /// assigned at its first launch and kept for relaunches; the placeholders when it cannot be
    /// stopped here (no resources, too many blocks, its slot still held).
    pub(super) fn guard_values(&self, g: &mut State, d: &mut Deferred) -> GuardValues {
        if let Some((slot, epoch)) = d.slot {
            return g.lv2.values(slot, epoch).unwrap_or(PLACEHOLDERS);
        }
        if !self.lv2() || d.units == 0 || d.units > g.lv2.max_units || !self.ensure_resources(g) {
            return PLACEHOLDERS;
        }
        let done = g.completed;
        let l = &mut g.lv2;
        l.flight.retire_below(done);
        let slot = l.next_slot;
        if l.flight.slot_busy(slot) {
            return PLACEHOLDERS;
        }
        l.next_slot = (slot + 1) % l.slots;
        l.epoch = l.epoch.wrapping_add(1).max(1);
        d.slot = Some((slot, l.epoch));
        GUARDED.fetch_add(1, Ordering::Relaxed);
        l.values(slot, l.epoch).unwrap_or(PLACEHOLDERS)
    }

    fn ensure_resources(&self, g: &mut State) -> bool {
        if g.lv2.res.is_none() && !g.lv2.failed {
            // The stop event too, so that a deactivate taking a stop ahead over cannot fail.
            let made = make_resources(self.drv, g.lv2.slots, g.lv2.max_units).and_then(|r| match g
                .lv2
                .stop_event
            {
                Some(_) => Ok(r),
                None => match entry::new_event(self.drv) {
                    Ok(ev) => {
                        g.lv2.stop_event = Some(ev);
                        Ok(r)
                    }
                    Err(e) => {
                        free_resources(self.drv, &r);
                        Err(e)
                    }
                },
            });
            match made {
                Ok(r) => {
                    let _ = self.ahead_target.set((r.flag, r.control as usize));
                    g.lv2.res = Some(r);
                }
                Err(e) => {
                    note!(
                        self,
                        "Lv2 flag and completion array: CUDA error {e}; guarded kernels run unstoppable"
                    );
                    g.lv2.failed = true;
                }
            }
        }
        g.lv2.res.is_some()
    }

    /// Whether the flag is set or a guarded kernel is in flight (read without the lock).
    pub fn lv2_busy(&self) -> bool {
        self.lv2_busy.load(Ordering::SeqCst)
    }

    /// After every change of the window or the stop (lock held): the busy word, and the gate
    /// open exactly while a stop ahead may flag the window as it stands.
    pub(super) fn note_busy(&self, g: &State) {
        let busy = self.lv2_frozen(g) || g.lv2.flight.has_guarded();
        self.lv2_busy.store(busy, Ordering::SeqCst);
        self.gate.settle(
            self.lv2()
                && !g.retired
                && g.lv2.stop == Stop::Running
                && g.lv2.res.is_some()
                && flag_is_safe(g.lv2.flight.slots()),
        );
    }

    /// The flag is set, or a stop ahead is setting it: stopped kernels may end early, so the
    /// watermark stays and nothing else may reach or wait on the stream.
    pub(super) fn lv2_frozen(&self, g: &State) -> bool {
        g.lv2.stop == Stop::Flagged || self.gate.is_raised()
    }

    /// Before a launch (lock held): whether it may go to the driver. `stoppable`: a guarded
    /// kernel with its slot, which the flag stops with the rest; anything else is held back
    /// while a stop ahead is raised, since it would run before the stopped kernels' blocks.
    pub(super) fn lv2_may_launch(&self, g: &State, stoppable: bool) -> bool {
        let stoppable_after = stoppable
            && !g.retired
            && g.lv2.stop == Stop::Running
            && g.lv2.res.is_some()
            && is_clean(g.lv2.flight.slots());
        self.gate.before_launch(stoppable, stoppable_after)
    }

    /// Sets the flag without the stream's lock, if the gate is open. The control stream is
    /// FIFO, and the gate stays closed from a deactivate until its reactivate has issued the
    /// clear, so this set never lands before an earlier clear.
    pub(super) fn lv2_stop_ahead(&self) -> bool {
        let Some(&(flag, control)) = self.ahead_target.get() else {
            return false;
        };
        let set = || {
            let _ctx = self.enter();
            match self.drv.memset_d32_async(flag, 1, 1, control as Handle) {
                SUCCESS => Ok(()),
                e => Err(e),
            }
        };
        match self.gate.raise_with(set) {
            Ok(raised) => {
                if raised {
                    STOPPED_AHEAD.fetch_add(1, Ordering::Relaxed);
                }
                raised
            }
            Err(e) => {
                note!(
                    self,
                    "stop ahead: CUDA error {e} setting the flag; the deactivate sets it"
                );
                self.note_busy(&self.lock());
                false
            }
        }
    }

    /// Stopped guarded kernels wait for their relaunch (a stream query says not ready).
    pub fn lv2_stopped(&self) -> bool {
        self.lv2() && self.lv2_frozen(&self.lock())
    }

    /// Before a call that reaches this stream's hardware queue without the queue (a copy, a
    /// record, a wait, a synchronize, or work CUDA orders behind this stream): `false` while
    /// the flag holds stopped kernels (the caller waits and asks again); else the call is
    /// noted behind the guarded kernels in flight, so that a suspension until it completes
    /// drains instead of stopping them.
    pub fn admit_direct(&self) -> bool {
        if !self.lv2() {
            return true;
        }
        let mut g = self.lock();
        if g.retired {
            return true;
        }
        if self.lv2_frozen(&g) {
            return false;
        }
        let done = g.completed;
        g.lv2.flight.retire_below(done);
        if let Some((seq, Some(_))) = g.lv2.flight.last() {
            // Closed before the call goes on: a stop ahead from now would stop the kernels it
            // follows and let it run first.
            if !self.gate.before_launch(false, false) {
                return false;
            }
            g.lv2.flight.push(seq, None);
        }
        self.note_busy(&g);
        true
    }

    /// Before a synchronize of this stream (the application's): `None` while the flag holds
    /// stopped kernels (the caller waits and asks again); else the Lv2 generation, for
    /// [`CudaQueue::stopped_since`]. A synchronize adds no work behind the guarded kernels, so
    /// unlike [`CudaQueue::admit_direct`] it does not keep them from being stopped.
    pub fn admit_sync(&self) -> Option<u64> {
        let g = self.lock();
        (!self.lv2_frozen(&g)).then_some(g.lv2.generation)
    }

    /// Whether the flag stopped kernels since [`CudaQueue::admit_sync`] said `generation`: a
    /// synchronize that returned meanwhile saw them end early and must wait again.
    pub fn stopped_since(&self, generation: u64) -> bool {
        let g = self.lock();
        self.lv2_frozen(&g) || g.lv2.generation != generation
    }

    pub(super) fn lv2_deactivate(&self) -> Result<(), HalError> {
        let _ctx = self.enter();
        let mut g = self.lock();
        if g.lv2.stop == Stop::Flagged {
            return Ok(()); // already stopped (a reactivate has not finished yet)
        }
        if g.retired {
            g.lv2.stop = Stop::Draining;
            return Ok(());
        }
        if self.gate.close() == Closed::Ahead {
            // The flag's set is issued already (and the stop event exists): this takes it over.
            g.lv2.stop = Stop::Flagged;
            g.lv2.relaunch = Relaunch::default();
            g.lv2.generation += 1;
            g.lv2.stop_recorded = g
                .lv2
                .stop_event
                .is_some_and(|ev| self.drv.event_record(ev, self.stream) == SUCCESS);
            self.gate.lower();
            self.note_busy(&g);
            return Ok(());
        }
        let stopped = self.lv2_stop_locked(&mut g);
        if stopped.is_err() {
            self.note_busy(&g);
        }
        stopped
    }

    /// Deactivate with the gate closed (lock held, context current): flag the window, or let it
    /// drain if that is not safe.
    fn lv2_stop_locked(&self, g: &mut State) -> Result<(), HalError> {
        let done = g.completed;
        g.lv2.flight.retire_below(done);
        let ev = match g.lv2.stop_event {
            Some(ev) => ev,
            None => {
                let ev = entry::new_event(self.drv).map_err(|e| backend("cuEventCreate", e))?;
                g.lv2.stop_event = Some(ev);
                ev
            }
        };
        let flag = match &g.lv2.res {
            Some(r) if flag_is_safe(g.lv2.flight.slots()) => Some((r.flag, r.control)),
            _ => None,
        };
        let Some((word, control)) = flag else {
            // Nothing changes if this fails.
            ok("cuEventRecord", self.drv.event_record(ev, self.stream))?;
            g.lv2.stop_recorded = true;
            g.lv2.stop = Stop::Draining;
            self.note_busy(g);
            return Ok(());
        };
        // The set is the first driver call: in one process the stop races the
        // latency-critical queue's launch for the driver, and whatever comes before the set
        // delays the stop on the GPU. The control stream is FIFO: this set lands after
        // any earlier clear.
        ok(
            "cuMemsetD32Async",
            self.drv.memset_d32_async(word, 1, 1, control),
        )?;
        g.lv2.stop = Stop::Flagged;
        g.lv2.relaunch = Relaunch::default();
        g.lv2.generation += 1;
        // Nothing reaches the stream while flagged, so the stop event covers the same work
        // whenever it is recorded; the settle check and the clear record it if this fails.
        g.lv2.stop_recorded = self.drv.event_record(ev, self.stream) == SUCCESS;
        if !g.lv2.stop_recorded {
            note!(self, "no stop event after the flag; recorded later");
        }
        self.note_busy(g);
        Ok(())
    }

    /// Records the stop event if the stop has none yet (lock held, context current).
    fn ensure_stop_recorded(&self, g: &mut State) -> Result<(), HalError> {
        if g.lv2.stop_recorded {
            return Ok(());
        }
        let Some(ev) = g.lv2.stop_event else {
            return Err(backend("cuEventRecord", entry::ERROR_INVALID_VALUE));
        };
        ok("cuEventRecord", self.drv.event_record(ev, self.stream))?;
        g.lv2.stop_recorded = true;
        Ok(())
    }

    pub(super) fn lv2_reactivate(&self, log: &mut [Launched<Deferred>]) -> Result<(), HalError> {
        let _ctx = self.enter();
        let mut g = self.lock();
        if g.lv2.stop != Stop::Flagged || g.retired {
            g.lv2.stop = Stop::Running;
            self.note_busy(&g);
            return Ok(());
        }
        if !g.lv2.relaunch.cleared {
            self.clear_flag(&mut g)?;
        }
        // Any error below leaves the queue Flagged (watermark frozen) with `relaunch.next` at the
        // first entry not dealt with.
        let mut next = g.lv2.relaunch.next;
        let walked = relaunch_stopped(
            log,
            &mut next,
            |d: &Deferred| d.slot.is_some(),
            |seq, d| self.relaunch_one(&mut g, seq, d),
        );
        g.lv2.relaunch.next = next;
        walked?;
        if let Some(last) = log.last() {
            let tail = last.seq + 1;
            if g.sync.back().map(|&(m, _)| m) != Some(tail)
                && tail > g.completed
                && let Err(e) = self.record(&mut g, tail)
            {
                note!(
                    self,
                    "no sync event after a relaunch ({e}); completion shows later"
                );
            }
        }
        g.lv2.stop = Stop::Running;
        g.lv2.relaunch = Relaunch::default();
        self.note_busy(&g);
        Ok(())
    }

    /// Clears the flag on the control stream once every stopped block has exited (the stop
    /// event), so that a later set (same stream, FIFO) is never overtaken by this clear; the
    /// queue's stream waits for the clear before the relaunch. Repeating it is harmless.
    fn clear_flag(&self, g: &mut State) -> Result<(), HalError> {
        self.ensure_stop_recorded(g)?;
        let (Some(r), Some(stop)) = (&g.lv2.res, g.lv2.stop_event) else {
            return Err(backend("reactivate", entry::ERROR_INVALID_VALUE));
        };
        ok(
            "cuStreamWaitEvent",
            self.drv.stream_wait_event(r.control, stop, 0),
        )?;
        ok(
            "cuMemsetD32Async",
            self.drv.memset_d32_async(r.flag, 0, 1, r.control),
        )?;
        ok(
            "cuEventRecord",
            self.drv.event_record(r.clear_event, r.control),
        )?;
        ok(
            "cuStreamWaitEvent",
            self.drv.stream_wait_event(self.stream, r.clear_event, 0),
        )?;
        // Events recorded behind the stop prove nothing now (pollers of one learn it from the
        // generation).
        while let Some((_, ev)) = g.sync.pop_front() {
            g.free.push(ev);
        }
        g.lv2.flight.clear();
        g.lv2.relaunch = Relaunch {
            cleared: true,
            next: g.completed,
        };
        Ok(())
    }

    /// Relaunches one stopped kernel (`Some`) or notes an entry that was not stopped (`None`).
    /// Fails only when the driver refused the launch.
    fn relaunch_one(
        &self,
        g: &mut State,
        seq: Seq,
        d: Option<&mut Deferred>,
    ) -> Result<(), HalError> {
        let Some(d) = d else {
            g.lv2.flight.push(seq, None);
            return Ok(());
        };
        let values = self.guard_values(g, d);
        ok("relaunch", d.call(self, Some(&values)))?;
        RELAUNCHED.fetch_add(1, Ordering::Relaxed);
        g.lv2.flight.push(seq, d.slot.map(|(s, _)| s));
        if let Err(e) = self.record(g, seq + 1) {
            note!(self, "sync point after a relaunch: {e}");
        }
        Ok(())
    }

    pub(super) fn lv2_settled(&self) -> bool {
        let mut g = self.lock();
        match g.lv2.stop {
            Stop::Running => true,
            Stop::Flagged | Stop::Draining => {
                if g.retired {
                    return true;
                }
                if !g.lv2.stop_recorded {
                    let _ctx = self.enter();
                    if self.ensure_stop_recorded(&mut g).is_err() {
                        return false;
                    }
                }
                g.lv2
                    .stop_event
                    .is_none_or(|ev| self.drv.event_query(ev) == SUCCESS)
            }
        }
    }

    /// At retirement (lock held, context current): the stream's work completes first, since its
    /// guarded kernels use the flag and the completion array.
    pub(super) fn lv2_release(&self, g: &mut State) {
        if let Some(ev) = g.lv2.stop_event.take() {
            self.drv.event_destroy(ev);
        }
        if let Some(r) = g.lv2.res.take() {
            self.drv.stream_synchronize(self.stream);
            free_resources(self.drv, &r);
        }
    }
}

impl Lv2State {
    fn values(&self, slot: u32, epoch: u32) -> Option<GuardValues> {
        let r = self.res.as_ref()?;
        let done = r.done + u64::from(slot) * u64::from(self.max_units) * 4;
        Some([r.flag, done, u64::from(epoch)])
    }
}

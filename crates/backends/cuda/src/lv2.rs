//! Lv2 of `CudaQueue`: block-level preemption through the guard flag.
//!
//! `deactivate` sets the queue's flag from the highest-priority control stream; guarded blocks
//! that start afterwards exit at once, and the completion watermark freezes (a kernel whose blocks
//! were skipped is not complete, even though its CUDA event fires). The flag is only set when no
//! unguarded command follows a guarded kernel in the in-flight window (a memcpy behind a stopped
//! kernel would otherwise run before the kernel's remaining blocks); otherwise that suspension
//! drains like Lv1.
//!
//! A stop ahead (`stop_ahead`) sets the flag before the queue's lock, through the gate of
//! `xpreempt_cuda::stop_gate`, so that a stop need not wait for a launch under way; the deactivate
//! that follows takes it over.
//!
//! `reactivate` clears the flag and relaunches the stopped kernels (finished blocks skip
//! themselves). It may fail part-way; the queue then stays `Flagged` and remembers how far it
//! got (`Relaunch`), so that a retry relaunches exactly what is missing: nothing twice, nothing
//! skipped, and the watermark stays frozen until every stopped kernel is running again. The pure
//! bookkeeping (`Flight`, `flag_is_safe`, `relaunch_stopped`) is `xpreempt_cuda::flight`, shared with
//! the shim's Lv2.

use crate::error::{CudaError, Result, cu};
pub(crate) use crate::flight::Relaunch;
use crate::flight::{flag_is_safe, relaunch_stopped};
use crate::kernel::Kernel;
use crate::queue::{CudaQueue, Inner, Stop};
use crate::stop_gate::Closed;
use xpreempt_types::{Launched, Seq};

impl CudaQueue {
    /// Sets (`true`) or clears the flag on the control stream with a memset, not a copy from a
    /// pinned word: on an H100 beside a saturating kernel the memset was done on the GPU 2.7–8.9
    /// µs after it was issued against 7.6–17.7 for the copy (which reads the host's word across
    /// the bus first), and its call cost the thread 0.0–0.9 µs less at p50
    /// (measured 2026-11-24, driver 580.159.04).
    fn write_flag(&self, set: bool) -> Result<()> {
        // SAFETY: one 4-byte word, the flag, owned by this queue and freed only after Drop
        // synchronized the control stream.
        cu!(cuMemsetD32Async(
            self.flag.ptr,
            u32::from(set),
            1,
            self.control
        ))
    }

    /// Sets the flag without the queue's lock, if the gate is open (the caller checked the
    /// level). The control stream is FIFO and the gate stays closed from a deactivate until its
    /// reactivate has issued the clear, so this set never lands before an earlier clear.
    pub(crate) fn lv2_stop_ahead(&self) -> bool {
        let set = || self.bind().and_then(|()| self.write_flag(true));
        match self.gate.raise_with(set) {
            Ok(raised) => raised,
            Err(e) => {
                tracing::warn!(%e, "stop ahead: the flag was not set; the deactivate sets it");
                self.settle(&self.lock());
                false
            }
        }
    }

    /// Deactivate; the caller checked the level.
    ///
    /// The flag's set is the first driver call: in one process the stop races the
    /// latency-critical queue's launch for the driver, and whatever comes before the set delays
    /// the stop on the GPU. The window is reaped (a driver query per sync event) only when it is
    /// not safe to flag as it stands; a completed kernel left in it is relaunched at the resume,
    /// where its finished blocks skip themselves.
    pub(crate) fn lv2_deactivate(&self) -> Result<()> {
        let mut g = self.lock();
        if g.stop == Stop::Flagged {
            return Ok(()); // already stopped (a reactivate has not finished yet)
        }
        if self.gate.close() == Closed::Ahead {
            // The flag's set is issued already: this only takes the stop over, and cannot fail.
            self.flagged(&mut g);
            self.gate.lower();
            return Ok(());
        }
        let stopped = self.stop_locked(&mut g);
        if stopped.is_err() {
            self.settle(&g);
        }
        stopped
    }

    /// Deactivate with the gate closed: flag the window, or let it drain if that is not safe.
    fn stop_locked(&self, g: &mut Inner) -> Result<()> {
        self.bind()?;
        let mut flag = flag_is_safe(g.flight.slots());
        if !flag {
            self.reap(g);
            flag = flag_is_safe(g.flight.slots());
        }
        if !flag {
            // Nothing changes if this fails.
            self.record_stop(g)?;
            g.stop = Stop::Draining;
            return Ok(());
        }
        // The control stream is FIFO: this set lands after any earlier clear.
        self.write_flag(true)?;
        self.flagged(g);
        Ok(())
    }

    /// The flag's set is issued: the queue is stopped until a reactivate relaunches.
    fn flagged(&self, g: &mut Inner) {
        g.stop = Stop::Flagged;
        g.relaunch = Relaunch::default();
        g.stop_recorded = false;
        // Nothing is launched on the stream while flagged, so the stop event covers the same
        // work whenever it is recorded; `settled` and the clear record it if this fails.
        if let Err(e) = self.bind().and_then(|()| self.record_stop(g)) {
            tracing::warn!(%e, "no stop event after the flag; recorded later");
        }
    }

    /// Records the stop event behind everything launched on the queue's stream.
    pub(crate) fn record_stop(&self, g: &mut Inner) -> Result<()> {
        // SAFETY: `stop_event` and the stream are this queue's, alive until Drop; the caller
        // holds the lock.
        cu!(cuEventRecord(g.stop_event, g.stream))?;
        g.stop_recorded = true;
        Ok(())
    }

    pub(crate) fn lv2_reactivate(&self, log: &mut [Launched<Kernel>]) -> Result<()> {
        self.bind()?;
        let mut g = self.lock();
        match g.stop {
            Stop::Draining | Stop::Running => {
                g.stop = Stop::Running;
                self.settle(&g);
                return Ok(());
            }
            Stop::Interrupted => return Err(CudaError::ReactivateAfterInterrupt),
            Stop::Flagged => {}
        }
        if !g.relaunch.cleared {
            self.clear_flag(&mut g)?;
        }
        // Any error below leaves the queue Flagged (watermark frozen) with `relaunch.next` at
        // the first entry not dealt with.
        let mut next = g.relaunch.next;
        let walked = relaunch_stopped(
            log,
            &mut next,
            |k: &Kernel| k.guard.is_some(),
            |seq, k| self.relaunch_one(&mut g, seq, k),
        );
        g.relaunch.next = next;
        walked?;
        if let Some(last) = log.last() {
            let tail = last.seq + 1;
            if g.sync.back().map(|&(m, _)| m) != Some(tail) && tail > g.completed {
                // Best effort: the kernels run already; synchronize records on demand.
                if let Err(e) = self.record(&mut g, tail) {
                    tracing::warn!(%e, "no sync event after the relaunch; completion shows later");
                }
            }
        }
        g.stop = Stop::Running;
        g.relaunch = Relaunch::default();
        self.settle(&g);
        Ok(())
    }

    /// Clears the flag on the control stream once every stopped block has exited (stop_event),
    /// so that a later deactivate's set (same stream, FIFO) can never be overtaken by this clear;
    /// the queue stream waits for the clear before the relaunch. Repeating it is harmless.
    fn clear_flag(&self, g: &mut Inner) -> Result<()> {
        if !g.stop_recorded {
            self.record_stop(g)?;
        }
        // SAFETY: the control stream and `stop_event` are this queue's, alive until Drop.
        cu!(cuStreamWaitEvent(self.control, g.stop_event, 0))?;
        self.write_flag(false)?;
        // SAFETY: this queue's event and control stream; the lock is held, so no other record
        // of `clear_event` interleaves.
        cu!(cuEventRecord(g.clear_event, self.control))?;
        // SAFETY: this queue's stream and event.
        cu!(cuStreamWaitEvent(g.stream, g.clear_event, 0))?;
        // Events recorded before the stop prove nothing now.
        while let Some((_, ev)) = g.sync.pop_front() {
            g.free_events.push(ev);
        }
        g.sync_resets += 1;
        g.flight.clear();
        g.relaunch = Relaunch {
            cleared: true,
            next: g.completed,
        };
        Ok(())
    }

    /// Relaunches one stopped kernel (`Some`) or notes an entry that was not stopped (`None`).
    /// Fails only before anything was handed to the hardware.
    fn relaunch_one(&self, g: &mut Inner, seq: Seq, kernel: Option<&mut Kernel>) -> Result<()> {
        let Some(k) = kernel else {
            g.flight.push(seq, None);
            return Ok(());
        };
        let ev = self.take_event(g)?;
        let slot = match self.launch_kernel(g, k) {
            Ok(slot) => slot,
            Err(e) => {
                g.free_events.push(ev);
                return Err(e);
            }
        };
        g.flight.push(seq, slot);
        Self::record_taken(g, ev, seq + 1);
        Ok(())
    }
}

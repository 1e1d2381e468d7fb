//! Lv2 of `CudaQueue`: block-level preemption through the guard flag.
//!
//! `deactivate` sets the queue's flag from the highest-priority control stream; guarded blocks
//! that start afterwards exit at once, and the completion watermark freezes (a kernel whose blocks
//! were skipped is not complete, even though its CUDA event fires). The flag is only set when no
//! unguarded command follows a guarded kernel in the in-flight window (a memcpy behind a stopped
//! kernel would otherwise run before the kernel's remaining blocks); otherwise that suspension
//! drains like Lv1.
//!
//! `reactivate` clears the flag and relaunches the stopped kernels (finished blocks skip
//! themselves). It may fail part-way; the queue then stays `Flagged` and remembers how far it
//! got ([`Relaunch`]), so that a retry relaunches exactly what is missing: nothing twice, nothing
//! skipped, and the watermark stays frozen until every stopped kernel is running again.

use crate::error::{CudaError, Result, cu};
use crate::kernel::Kernel;
use crate::queue::{CudaQueue, Inner, Stop};
use xpreempt_types::{Launched, Op, Seq};

/// How far a reactivate got, kept across failed attempts.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Relaunch {
    /// The flag is cleared (behind the stop), the queue stream waits for the clear, and the
    /// in-flight window was reset.
    pub cleared: bool,
    /// Every log entry below this seq is dealt with (relaunched, or kept as not stopped).
    pub next: Seq,
}

/// Whether the window may be stopped by the flag: it holds a guarded kernel, and no unguarded
/// command follows a guarded one.
pub(crate) fn flag_is_safe(slots: impl Iterator<Item = Option<u32>>) -> bool {
    let mut seen_guarded = false;
    for slot in slots {
        if slot.is_some() {
            seen_guarded = true;
        } else if seen_guarded {
            return false;
        }
    }
    seen_guarded
}

/// Walks the log from `*next`: `step(seq, Some(kernel))` for each guarded kernel (relaunch it),
/// `step(seq, None)` for every other entry (it was not stopped). `*next` moves past an entry only
/// once its step succeeded, so a failed walk resumes where it stopped.
pub(crate) fn relaunch_stopped<P, E>(
    log: &mut [Launched<P>],
    next: &mut Seq,
    guarded: impl Fn(&P) -> bool,
    mut step: impl FnMut(Seq, Option<&mut P>) -> std::result::Result<(), E>,
) -> std::result::Result<(), E> {
    let from = *next;
    for entry in log.iter_mut().filter(|e| e.seq >= from) {
        match &mut entry.command.op {
            Op::Kernel(k) if guarded(k) => step(entry.seq, Some(k))?,
            // Unguarded commands before the first guarded kernel ran to completion.
            _ => step(entry.seq, None)?,
        }
        *next = entry.seq + 1;
    }
    Ok(())
}

impl CudaQueue {
    /// Deactivate; the caller checked the level.
    pub(crate) fn lv2_deactivate(&self) -> Result<()> {
        self.bind()?;
        let mut g = self.lock();
        if g.stop == Stop::Flagged {
            return Ok(()); // already stopped (a reactivate has not finished yet)
        }
        self.reap(&mut g);
        let flag = flag_is_safe(g.flight.slots());
        // The stop event first: if it fails, nothing has changed. It covers everything launched
        // so far; the flag set (on the control stream) only makes that end sooner.
        // SAFETY: `stop_event` and the stream are this queue's, alive until Drop; the lock is held.
        cu!(cuEventRecord(g.stop_event, g.stream))?;
        if flag {
            let set = self.flag_values.word(0)?;
            // The control stream is FIFO: this set lands after any earlier clear.
            // SAFETY: a 4-byte copy from a pinned word into the 4-byte flag, both owned by this
            // queue and freed only after Drop synchronized the control stream.
            cu!(cuMemcpyHtoDAsync_v2(
                self.flag.ptr,
                set.cast(),
                4,
                self.control
            ))?;
            g.stop = Stop::Flagged;
            g.relaunch = Relaunch::default();
        } else {
            g.stop = Stop::Draining;
        }
        Ok(())
    }

    pub(crate) fn lv2_reactivate(&self, log: &mut [Launched<Kernel>]) -> Result<()> {
        self.bind()?;
        let mut g = self.lock();
        match g.stop {
            Stop::Draining | Stop::Running => {
                g.stop = Stop::Running;
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
        Ok(())
    }

    /// Clears the flag on the control stream once every stopped block has exited (stop_event),
    /// so that a later deactivate's set (same stream, FIFO) can never be overtaken by this clear;
    /// the queue stream waits for the clear before the relaunch. Repeating it is harmless.
    fn clear_flag(&self, g: &mut Inner) -> Result<()> {
        let clear = self.flag_values.word(1)?;
        // SAFETY: the control stream and `stop_event` are this queue's, alive until Drop.
        cu!(cuStreamWaitEvent(self.control, g.stop_event, 0))?;
        // SAFETY: a 4-byte copy from a pinned word into the 4-byte flag, both owned by this
        // queue and freed only after Drop synchronized the control stream.
        cu!(cuMemcpyHtoDAsync_v2(
            self.flag.ptr,
            clear.cast(),
            4,
            self.control
        ))?;
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

#[cfg(test)]
mod tests {
    use super::*;
    use xpreempt_types::Command;

    #[test]
    fn flag_only_when_no_unguarded_command_follows_a_guarded_kernel() {
        assert!(flag_is_safe([None, Some(0), Some(1)].into_iter()));
        assert!(!flag_is_safe([Some(0), None, Some(1)].into_iter()));
        assert!(!flag_is_safe([None, None].into_iter()), "nothing to stop");
        assert!(!flag_is_safe(std::iter::empty()));
    }

    /// Kernel payload of the test: (id, guarded).
    fn log() -> Vec<Launched<(u32, bool)>> {
        let mut v = vec![Launched {
            seq: 10,
            command: Command::new(Op::Memset {
                dst: 0,
                value: 0,
                bytes: 4,
            }),
        }];
        for (i, seq) in (11..16).enumerate() {
            v.push(Launched {
                seq,
                command: Command::kernel((i as u32, i != 2)),
            });
        }
        v
    }

    #[test]
    fn a_failed_relaunch_resumes_where_it_stopped() {
        let mut log = log();
        let mut next = 10;
        let mut relaunched: Vec<u32> = Vec::new();
        let mut kept: Vec<Seq> = Vec::new();
        let mut budget = 2; // the third relaunch fails
        let r = relaunch_stopped(
            &mut log,
            &mut next,
            |k| k.1,
            |seq, k| match k {
                Some(k) if budget == 0 => Err(k.0),
                Some(k) => {
                    budget -= 1;
                    relaunched.push(k.0);
                    Ok(())
                }
                None => {
                    kept.push(seq);
                    Ok(())
                }
            },
        );
        assert_eq!(r, Err(3));
        assert_eq!(relaunched, vec![0, 1]);
        assert_eq!(next, 14, "resumes at the kernel that failed");
        // The retry relaunches the rest, each once.
        let r: std::result::Result<(), u32> = relaunch_stopped(
            &mut log,
            &mut next,
            |k| k.1,
            |seq, k| {
                match k {
                    Some(k) => relaunched.push(k.0),
                    None => kept.push(seq),
                }
                Ok(())
            },
        );
        assert_eq!(r, Ok(()));
        assert_eq!(relaunched, vec![0, 1, 3, 4]);
        assert_eq!(kept, vec![10, 13], "the memset and the unguarded kernel");
        assert_eq!(next, 16);
        // A further call finds nothing left.
        let r: std::result::Result<(), u32> =
            relaunch_stopped(&mut log, &mut next, |k| k.1, |_, _| Err(99));
        assert_eq!(r, Ok(()));
    }
}

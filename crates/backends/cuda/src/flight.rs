//! The pure bookkeeping of Lv2 (block-level preemption of guard-built kernels) of the CUDA queue,
//! which stops kernels with a device-memory flag (`queue/lv2.rs`).
//!
//! A guarded kernel reads its queue's flag when each block (or work item) begins and marks the
//! block finished in a completion array slot with the launch's epoch; a stopped kernel is
//! relaunched with the same slot and epoch, and its finished blocks skip themselves.
//!
//! - [`Flight`]: what a queue has launched and not yet seen complete, with each entry's
//!   completion slot (a guarded kernel) or none (any other command);
//! - [`flag_is_safe`]: whether setting the flag may stop the window (no unguarded command
//!   behind a guarded kernel, since it would run before the kernel's remaining blocks);
//! - [`relaunch_stopped`] and [`Relaunch`]: a reactivate that relaunches exactly the stopped
//!   kernels, resumable after a partial failure.

use std::collections::VecDeque;
use xpreempt_types::{Launched, Op, Seq};

/// How far a reactivate got, kept across failed attempts.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Relaunch {
    /// The flag is cleared (behind the stop), the queue stream waits for the clear, and the
    /// in-flight window was reset.
    pub cleared: bool,
    /// Every log entry below this seq is dealt with (relaunched, or kept as not stopped).
    pub next: Seq,
}

/// Whether the window may be stopped by the flag: it holds a guarded kernel, and no unguarded
/// command follows a guarded one.
pub fn flag_is_safe(slots: impl Iterator<Item = Option<u32>>) -> bool {
    let (clean, guarded) = scan(slots);
    clean && guarded
}

/// Whether no unguarded command follows a guarded kernel in the window: a guarded kernel
/// launched behind it leaves the window safe to flag.
pub fn is_clean(slots: impl Iterator<Item = Option<u32>>) -> bool {
    scan(slots).0
}

/// (no unguarded command follows a guarded kernel, a guarded kernel is in the window)
fn scan(slots: impl Iterator<Item = Option<u32>>) -> (bool, bool) {
    let mut seen_guarded = false;
    for slot in slots {
        if slot.is_some() {
            seen_guarded = true;
        } else if seen_guarded {
            return (false, true);
        }
    }
    (true, seen_guarded)
}

/// Walks the log from `*next`: `step(seq, Some(kernel))` for each guarded kernel (relaunch it),
/// `step(seq, None)` for every other entry (it was not stopped). `*next` moves past an entry only
/// once its step succeeded, so a failed walk resumes where it stopped.
pub fn relaunch_stopped<P, E>(
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

/// What a queue has launched and not yet seen complete, with a per-slot count of the guarded
/// kernels holding each completion slot, so that a launch asks "is this slot free?" in O(1)
/// instead of scanning the window.
#[derive(Debug)]
pub struct Flight {
    /// (seq, completion slot of a guarded kernel), oldest first.
    entries: VecDeque<(Seq, Option<u32>)>,
    /// How many entries hold each slot (0 or 1 in a well-formed queue).
    holders: Vec<u32>,
    /// How many entries are guarded kernels.
    guarded: usize,
}

impl Flight {
    pub fn new(slots: u32, capacity: usize) -> Self {
        Self {
            entries: VecDeque::with_capacity(capacity),
            holders: vec![0; slots as usize],
            guarded: 0,
        }
    }

    pub fn push(&mut self, seq: Seq, slot: Option<u32>) {
        if let Some(s) = slot {
            self.holders[s as usize] += 1;
            self.guarded += 1;
        }
        self.entries.push_back((seq, slot));
    }

    /// Drops the entries below the completion watermark `done`.
    pub fn retire_below(&mut self, done: Seq) {
        while let Some(&(seq, slot)) = self.entries.front() {
            if seq >= done {
                break;
            }
            self.entries.pop_front();
            if let Some(s) = slot {
                self.holders[s as usize] -= 1;
                self.guarded -= 1;
            }
        }
    }

    pub fn clear(&mut self) {
        self.entries.clear();
        self.holders.iter_mut().for_each(|h| *h = 0);
        self.guarded = 0;
    }

    /// Whether a guarded kernel is in flight (the flag could stop something).
    pub fn has_guarded(&self) -> bool {
        self.guarded > 0
    }

    /// Whether a guarded kernel at or above the completion watermark `done` is in flight (the
    /// entries below it are retired only at the next launch or stop).
    pub fn has_guarded_from(&self, done: Seq) -> bool {
        self.guarded > 0
            && self
                .entries
                .iter()
                .rev()
                .take_while(|&&(seq, _)| seq >= done)
                .any(|&(_, slot)| slot.is_some())
    }

    /// The newest entry: (seq, completion slot of a guarded kernel).
    pub fn last(&self) -> Option<(Seq, Option<u32>)> {
        self.entries.back().copied()
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Whether a launched, not yet complete (or stopped) guarded kernel holds `slot`.
    pub fn slot_busy(&self, slot: u32) -> bool {
        self.holders[slot as usize] > 0
    }

    /// The completion slot of each entry, oldest first (`None`: not a guarded kernel).
    pub fn slots(&self) -> impl Iterator<Item = Option<u32>> + '_ {
        self.entries.iter().map(|&(_, s)| s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use xpreempt_types::Command;

    #[test]
    fn a_completed_guarded_kernel_is_not_in_flight_before_it_is_retired() {
        let mut f = Flight::new(4, 8);
        f.push(0, Some(0));
        f.push(1, None);
        assert!(f.has_guarded_from(0));
        assert!(!f.has_guarded_from(1), "the guarded kernel completed");
        assert!(f.has_guarded(), "not retired yet");
        f.push(2, Some(1));
        assert!(f.has_guarded_from(2));
        assert!(!f.has_guarded_from(3));
        assert!(!Flight::new(4, 8).has_guarded_from(0));
    }

    #[test]
    fn flag_only_when_no_unguarded_command_follows_a_guarded_kernel() {
        assert!(flag_is_safe([None, Some(0), Some(1)].into_iter()));
        assert!(!flag_is_safe([Some(0), None, Some(1)].into_iter()));
        assert!(!flag_is_safe([None, None].into_iter()), "nothing to stop");
        assert!(!flag_is_safe(std::iter::empty()));
        assert!(is_clean([None, Some(0)].into_iter()) && is_clean(std::iter::empty()));
        assert!(!is_clean([Some(0), None].into_iter()));
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

    #[test]
    fn slot_counts_follow_pushes_and_retirement() {
        let mut f = Flight::new(4, 8);
        f.push(0, None);
        f.push(1, Some(2));
        f.push(2, Some(3));
        assert!(f.slot_busy(2) && f.slot_busy(3) && !f.slot_busy(0));
        assert!(f.has_guarded());
        assert_eq!(f.last(), Some((2, Some(3))));
        f.retire_below(2);
        assert!(!f.slot_busy(2) && f.slot_busy(3));
        assert_eq!(f.len(), 1);
        f.push(3, Some(0));
        f.clear();
        assert!((0..4).all(|s| !f.slot_busy(s)));
        assert_eq!(f.len(), 0);
        assert!(f.is_empty() && !f.has_guarded());
        assert_eq!(f.slots().count(), 0);
    }
}

//! Lv3 for the whole process: the timeslice of its compute channel groups. SET_TIMESLICE reaches
//! every compute channel group of the process (all its contexts, on every device), so the
//! timeslice is one process-wide setting: if each queue lowered and restored it on its own,
//! resuming one queue would lift the suspension of another. One [`Lv3Control`] per process counts
//! the interrupted queues instead: the first interrupt lowers the timeslice, the last restore puts
//! the configured one back.
//!
//! The last restore is held: the slice stays low for a while after it, so that the higher queue's
//! next burst finds it low and takes the GPU after one context switch, instead of waiting for a
//! SET_TIMESLICE call first (160–550 µs on a busy GPU, measured). A low slice costs the process
//! nothing while nothing else has work on the GPU. The hold lasts [`HOLD_PER_SET`] measured
//! SET_TIMESLICE calls, so that a restore and the next lowering, when the higher queue does come
//! back, cost at most 2 % of the time held. A held restore needs the process's restorer thread
//! ([`Lv3Control::run_restorer`]); without it the last restore puts the slice back at once.
//!
//! How the slice is set is the caller's [`TimesliceControl`]: the RM interposer of
//! `libxpreempt_shim.so` sees the channel groups, so the shim passes its own; a program that runs
//! with the shim preloaded reaches the same control through the shim's exports. The queue only
//! ever calls this module, in Rust.

use crate::error::Result;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// What libcuda sets by itself (measured), restored after an interrupt.
pub const DEFAULT_TIMESLICE_US: u64 = 2048;
/// The smallest timeslice asked for while interrupted.
pub const MIN_TIMESLICE_US: u64 = 1;
/// How long the last restore is held, in measured SET_TIMESLICE calls: a fixed value, with its
/// measured reason in `docs/settings.md`. Two calls (the restore and the next lowering) in 100
/// calls' time is 2 %.
pub const HOLD_PER_SET: u32 = 100;

/// Something that sets the timeslice of every compute channel group of this process.
pub trait TimesliceControl: Send + Sync {
    fn set_us(&self, us: u64) -> Result<()>;
}

#[derive(Debug, Default)]
struct State {
    /// Queues interrupted now.
    interrupted: u32,
    /// The slice is low: some queue is interrupted, or the last restore is held.
    low: bool,
    /// When a held slice goes back up.
    restore_at: Option<Instant>,
    /// A SET_TIMESLICE call's duration, smoothed over the recent calls.
    set_cost: Option<Duration>,
    /// The process whose thread runs the held restores (a forked child has none).
    restorer: Option<u32>,
}

/// The process's Lv3 state: how many queues are interrupted now, and whether the slice is low.
pub struct Lv3Control<C: ?Sized = dyn TimesliceControl> {
    normal_us: u64,
    state: Mutex<State>,
    due: Condvar,
    control: C,
}

/// The process's one Lv3 control as the queues hold it.
pub type ProcessLv3 = Arc<Lv3Control>;

/// Starts the thread `name` that runs `control`'s held restores ([`Lv3Control::run_restorer`]);
/// if it cannot be started, restores act at once.
pub fn spawn_restorer(control: &ProcessLv3, name: &str) -> std::io::Result<()> {
    let c = control.clone();
    std::thread::Builder::new()
        .name(name.into())
        .spawn(move || c.run_restorer())
        .map(drop)
}

impl<C: ?Sized> std::fmt::Debug for Lv3Control<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lv3Control")
            .field("normal_us", &self.normal_us)
            .field("state", &*self.lock())
            .finish()
    }
}

impl<C> Lv3Control<C> {
    pub fn new(control: C, normal_us: u64) -> Self {
        Self {
            control,
            normal_us,
            state: Mutex::new(State::default()),
            due: Condvar::new(),
        }
    }
}

impl<C: ?Sized> Lv3Control<C> {
    pub fn control(&self) -> &C {
        &self.control
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Queues interrupted now.
    pub fn interrupted(&self) -> u32 {
        self.lock().interrupted
    }

    /// A SET_TIMESLICE call's measured duration (recent calls), once one was made.
    pub fn set_cost(&self) -> Option<Duration> {
        self.lock().set_cost
    }

    /// Whether the slice is low now: interrupted, or held after the last restore.
    pub fn is_low(&self) -> bool {
        self.lock().low
    }

    /// How long the last restore is held, once a SET_TIMESLICE call was measured and while this
    /// process runs the restorer.
    fn hold(s: &State) -> Option<Duration> {
        (s.restorer == Some(std::process::id()))
            .then_some(s.set_cost)
            .flatten()
            .map(|c| c * HOLD_PER_SET)
    }
}

impl<C: TimesliceControl + ?Sized> Lv3Control<C> {
    /// One more queue interrupted: the first lowers the timeslice, unless a held restore kept it
    /// low. On failure nothing changed.
    pub fn interrupt(&self) -> Result<()> {
        let mut s = self.lock();
        if !s.low {
            self.set_timed(&mut s, MIN_TIMESLICE_US)?;
            s.low = true;
        }
        s.restore_at = None;
        s.interrupted += 1;
        Ok(())
    }

    /// One interrupted queue fewer: the last one restores the configured timeslice, at once or
    /// held (see the module). On failure the count is unchanged (still interrupted), so that the
    /// caller can retry.
    pub fn restore(&self) -> Result<()> {
        let mut s = self.lock();
        match s.interrupted {
            0 => {
                tracing::warn!("Lv3 restore without a matching interrupt (ignored)");
            }
            1 => {
                match Self::hold(&s) {
                    Some(hold) => {
                        s.restore_at = Some(Instant::now() + hold);
                        self.due.notify_all();
                    }
                    None => {
                        self.set_timed(&mut s, self.normal_us)?;
                        s.low = false;
                    }
                }
                s.interrupted = 0;
            }
            _ => s.interrupted -= 1,
        }
        Ok(())
    }

    /// The process's restorer: puts a held slice back up when its hold ends, for as long as the
    /// process lives. A failed restore is tried again one hold later; the slice stays low
    /// meanwhile, which only lets other processes' work go first.
    pub fn run_restorer(&self) -> ! {
        let mut s = self.lock();
        s.restorer = Some(std::process::id());
        loop {
            s = match s.restore_at {
                None => self.due.wait(s).unwrap_or_else(|e| e.into_inner()),
                Some(at) => {
                    let now = Instant::now();
                    if now < at {
                        self.due
                            .wait_timeout(s, at - now)
                            .unwrap_or_else(|e| e.into_inner())
                            .0
                    } else {
                        match self.set_timed(&mut s, self.normal_us) {
                            Ok(()) => {
                                s.low = false;
                                s.restore_at = None;
                            }
                            Err(e) => {
                                tracing::warn!("restoring the held timeslice: {e}");
                                s.restore_at = Self::hold(&s).map(|h| now + h);
                            }
                        }
                        s
                    }
                }
            };
        }
    }

    /// SET_TIMESLICE, its duration folded into the measured cost (an average over about the
    /// last eight calls).
    fn set_timed(&self, s: &mut State, us: u64) -> Result<()> {
        let t0 = Instant::now();
        self.control.set_us(us)?;
        let took = t0.elapsed();
        s.set_cost = Some(match s.set_cost {
            None => took,
            Some(c) => (c * 7 + took) / 8,
        });
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::CudaError;
    use std::sync::atomic::{AtomicBool, Ordering};

    #[derive(Default)]
    struct Fake {
        calls: Mutex<Vec<u64>>,
        fail: AtomicBool,
        took: Duration,
    }

    impl TimesliceControl for Fake {
        fn set_us(&self, us: u64) -> Result<()> {
            std::thread::sleep(self.took);
            if self.fail.load(Ordering::Relaxed) {
                return Err(CudaError::TimesliceRm(0x1f));
            }
            self.calls.lock().unwrap().push(us);
            Ok(())
        }
    }

    fn calls(c: &Lv3Control<Fake>) -> Vec<u64> {
        c.control().calls.lock().unwrap().clone()
    }

    #[test]
    fn only_the_last_restore_lifts_the_suspension() {
        let c = Lv3Control::new(Fake::default(), 2048);
        c.interrupt().unwrap(); // queue A
        c.interrupt().unwrap(); // queue B
        assert_eq!(calls(&c), vec![MIN_TIMESLICE_US]);
        c.restore().unwrap(); // A resumes: B is still suspended
        assert_eq!(calls(&c), vec![MIN_TIMESLICE_US]);
        assert_eq!(c.interrupted(), 1);
        c.restore().unwrap(); // B resumes
        assert_eq!(calls(&c), vec![MIN_TIMESLICE_US, 2048]);
        assert_eq!(c.interrupted(), 0);
        // A new round starts from the configured timeslice again.
        c.interrupt().unwrap();
        assert_eq!(calls(&c), vec![MIN_TIMESLICE_US, 2048, MIN_TIMESLICE_US]);
    }

    #[test]
    fn failures_leave_the_count_as_it_was() {
        let c = Lv3Control::new(Fake::default(), 2048);
        c.control().fail.store(true, Ordering::Relaxed);
        assert!(c.interrupt().is_err());
        assert_eq!(c.interrupted(), 0);
        c.control().fail.store(false, Ordering::Relaxed);
        c.interrupt().unwrap();
        c.control().fail.store(true, Ordering::Relaxed);
        assert!(c.restore().is_err(), "the last restore reports its failure");
        assert_eq!(c.interrupted(), 1, "still interrupted: the caller retries");
        c.control().fail.store(false, Ordering::Relaxed);
        c.restore().unwrap();
        assert_eq!(c.interrupted(), 0);
        assert_eq!(calls(&c), vec![MIN_TIMESLICE_US, 2048]);
    }

    /// A control whose calls take `took`, with its restorer running.
    fn held(took: Duration) -> Arc<Lv3Control<Fake>> {
        let c = Arc::new(Lv3Control::new(
            Fake {
                took,
                ..Fake::default()
            },
            2048,
        ));
        let r = c.clone();
        std::thread::spawn(move || r.run_restorer());
        while c.lock().restorer.is_none() {
            std::thread::yield_now();
        }
        c
    }

    fn wait_for(c: &Lv3Control<Fake>, want: &[u64]) {
        let t0 = Instant::now();
        while calls(c) != want {
            assert!(
                t0.elapsed() < Duration::from_secs(10),
                "calls {:?}",
                calls(c)
            );
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    #[test]
    fn a_higher_queue_back_within_the_hold_finds_the_slice_low() {
        // Calls of 1 ms: the hold is about 100 ms.
        let c = held(Duration::from_millis(1));
        c.interrupt().unwrap();
        c.restore().unwrap();
        assert!(c.is_low(), "the last restore is held");
        c.interrupt().unwrap();
        assert_eq!(
            calls(&c),
            vec![MIN_TIMESLICE_US],
            "no call to lower it again"
        );
        c.restore().unwrap();
        let t0 = Instant::now();
        wait_for(&c, &[MIN_TIMESLICE_US, 2048]);
        assert!(
            t0.elapsed() >= Duration::from_millis(50),
            "put back only after the hold"
        );
        assert!(!c.is_low());
        assert_eq!(c.interrupted(), 0);
    }

    #[test]
    fn a_failed_held_restore_is_tried_again() {
        let c = held(Duration::from_micros(100));
        c.interrupt().unwrap();
        c.control().fail.store(true, Ordering::Relaxed);
        c.restore().unwrap();
        std::thread::sleep(Duration::from_millis(30));
        assert!(c.is_low(), "still low while the calls fail");
        c.control().fail.store(false, Ordering::Relaxed);
        wait_for(&c, &[MIN_TIMESLICE_US, 2048]);
        assert!(!c.is_low());
    }

    #[test]
    fn without_a_restorer_the_last_restore_acts_at_once() {
        let c = Lv3Control::new(Fake::default(), 2048);
        c.interrupt().unwrap();
        c.restore().unwrap();
        assert_eq!(calls(&c), vec![MIN_TIMESLICE_US, 2048]);
        assert!(!c.is_low());
    }

    #[test]
    fn an_unmatched_restore_changes_nothing() {
        let c = Lv3Control::new(Fake::default(), 2048);
        c.restore().unwrap();
        assert_eq!(c.interrupted(), 0);
        assert!(calls(&c).is_empty());
    }
}

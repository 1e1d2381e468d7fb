//! The HAL conformance suite: random launches, stops and restarts on two hardware queues, checked
//! against the contract every backend promises (`docs/hal-contract.md`):
//!
//! - every launched command completes exactly once: each of its blocks ran once, none twice;
//! - the completion watermark never goes back and never passes what was launched;
//! - a stopped queue (Lv2 `deactivate`, Lv3 `interrupt`) makes no progress once settled;
//! - `reactivate` / `restore` with the in-flight log finish the work without resubmission;
//! - a Lv2 `stop_ahead` followed (after more launches, maybe) by `deactivate` stops and
//!   restarts like a plain `deactivate`.
//!
//! A backend runs it from its own tests with a [`Target`] that makes queues and kernels and lets
//! its hardware (real or modelled) make progress.

use crate::{HalError, HwQueue};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestError, TestRunner};
use xpreempt_types::{Command, Launched, Level, Seq};

/// What the suite needs from a backend.
pub trait Target {
    type Queue: HwQueue;

    /// A fresh hardware queue that supports `level` (or less; the suite uses what it says).
    fn queue(&mut self, level: Level) -> Self::Queue;

    /// A deactivatable kernel of `blocks` blocks.
    fn kernel(&mut self, blocks: u32) -> Command<<Self::Queue as HwQueue>::Payload>;

    /// Lets the hardware run for about `ns` (a virtual clock advances; a real device waits).
    fn advance(&mut self, ns: u64);

    /// How often each block of command `seq` of `queue` ran, as far as the backend can tell
    /// (empty: it cannot, and only the watermark is checked).
    fn block_runs(&self, queue: &Self::Queue, seq: Seq) -> Vec<u32>;
}

/// One step of a case.
#[derive(Clone, Debug)]
pub enum Step {
    Launch {
        queue: usize,
        blocks: u32,
        sync: bool,
    },
    Advance(u64),
    Stop(usize),
    /// `stop_ahead` (Lv2); the next stop or restart of the queue deactivates first.
    StopAhead(usize),
    Restart(usize),
}

/// The bounds of a run: how many cases, and how long a case may drive its hardware.
#[derive(Clone, Copy, Debug)]
pub struct Bounds {
    pub cases: u32,
    pub max_blocks: u32,
    pub max_advance_ns: u64,
    /// `advance` calls allowed to drain a case at the end before it counts as hung.
    pub drain_steps: u32,
}

impl Default for Bounds {
    fn default() -> Self {
        Self {
            cases: 64,
            max_blocks: 4,
            max_advance_ns: 200_000,
            drain_steps: 100_000,
        }
    }
}

fn steps(bounds: Bounds) -> impl Strategy<Value = Vec<Step>> {
    let step = prop_oneof![
        4 => (0usize..2, 1..=bounds.max_blocks, any::<bool>())
            .prop_map(|(queue, blocks, sync)| Step::Launch { queue, blocks, sync }),
        3 => (0..=bounds.max_advance_ns).prop_map(Step::Advance),
        1 => (0usize..2).prop_map(Step::Stop),
        1 => (0usize..2).prop_map(Step::StopAhead),
        1 => (0usize..2).prop_map(Step::Restart),
    ];
    prop::collection::vec(step, 1..48)
}

/// Runs the suite at `level` (capped by what the target's queues support).
pub fn run<T: Target>(
    make: impl Fn() -> T,
    level: Level,
    bounds: Bounds,
) -> Result<(), TestError<Vec<Step>>> {
    let mut runner = TestRunner::new(Config {
        cases: bounds.cases,
        failure_persistence: None,
        ..Config::default()
    });
    runner.run(&steps(bounds), |steps| {
        let mut target = make();
        play(&mut target, level, bounds, &steps)
    })
}

struct Lane<Q: HwQueue> {
    hal: Q,
    level: Level,
    /// Launched and not yet seen complete, in order: the log a restart hands back.
    log: Vec<Launched<Q::Payload>>,
    launched: Seq,
    watermark: Seq,
    stopped: bool,
    /// A `stop_ahead` was made and awaits its `deactivate`.
    ahead: bool,
}

impl<Q: HwQueue> Lane<Q> {
    fn observe(&mut self) -> Result<(), TestCaseError> {
        let w = self.hal.completed();
        if w < self.watermark {
            return fail(format!(
                "watermark went back from {} to {w}",
                self.watermark
            ));
        }
        if w > self.launched {
            return fail(format!(
                "watermark {w} passed the {} launched",
                self.launched
            ));
        }
        self.watermark = w;
        self.log.retain(|e| e.seq >= w);
        Ok(())
    }

    fn stop(&mut self) -> Result<(), TestCaseError> {
        if self.stopped || self.level == Level::Lv1 {
            return Ok(());
        }
        self.observe()?;
        let result = if self.level == Level::Lv3 {
            self.hal.interrupt()
        } else {
            self.hal.deactivate()
        };
        result.map_err(|e| hal_failure("stop", &e))?;
        self.stopped = true;
        self.ahead = false;
        Ok(())
    }

    fn restart(&mut self) -> Result<(), TestCaseError> {
        if self.ahead {
            self.stop()?;
        }
        if !self.stopped {
            return Ok(());
        }
        self.observe()?;
        let result = if self.level == Level::Lv3 {
            self.hal.restore(&mut self.log)
        } else {
            self.hal.reactivate(&mut self.log)
        };
        self.stopped = false;
        result.map_err(|e| hal_failure("restart", &e))
    }
}

fn play<T: Target>(
    target: &mut T,
    level: Level,
    bounds: Bounds,
    steps: &[Step],
) -> Result<(), TestCaseError> {
    let mut lanes: Vec<Lane<T::Queue>> = (0..2)
        .map(|_| {
            let hal = target.queue(level);
            Lane {
                level: level.min(hal.max_level()),
                hal,
                log: Vec::new(),
                launched: 0,
                watermark: 0,
                stopped: false,
                ahead: false,
            }
        })
        .collect();
    for step in steps {
        match *step {
            Step::Launch {
                queue,
                blocks,
                sync,
            } => {
                // A stopped queue launches nothing new: the XQueue above holds it back.
                let lane = &mut lanes[queue];
                if lane.stopped {
                    continue;
                }
                let mut command = target.kernel(blocks);
                let seq = lane.launched;
                match lane.hal.launch(seq, &mut command, sync) {
                    Ok(()) => {}
                    // Held back behind a stop ahead: not launched, and the seq is free again.
                    Err(HalError::Stopping(_)) if lane.ahead => continue,
                    Err(e) => return Err(hal_failure("launch", &e)),
                }
                lane.launched += 1;
                lane.log.push(Launched { seq, command });
            }
            Step::Advance(ns) => {
                let frozen: Vec<Option<Seq>> = lanes
                    .iter()
                    .map(|l| (l.stopped && l.hal.settled()).then(|| l.hal.completed()))
                    .collect();
                target.advance(ns);
                for (lane, frozen) in lanes.iter_mut().zip(frozen) {
                    lane.observe()?;
                    if let Some(before) = frozen
                        && lane.watermark != before
                    {
                        return fail(format!(
                            "a stopped, settled queue completed work: {before} -> {}",
                            lane.watermark
                        ));
                    }
                }
            }
            Step::Stop(queue) => lanes[queue].stop()?,
            Step::StopAhead(queue) => {
                let lane = &mut lanes[queue];
                if lane.stopped || lane.ahead || lane.level != Level::Lv2 {
                    continue;
                }
                lane.observe()?;
                lane.ahead = lane.hal.stop_ahead();
            }
            Step::Restart(queue) => lanes[queue].restart()?,
        }
    }
    for lane in &mut lanes {
        lane.restart()?;
        lane.hal
            .record_sync()
            .map_err(|e| hal_failure("record_sync", &e))?;
    }
    let mut left = bounds.drain_steps;
    loop {
        for lane in &mut lanes {
            // Completion becomes observable through `synchronize` (a backend on a virtual
            // clock answers WouldBlock and shows it as its clock advances).
            match lane.hal.synchronize(lane.launched) {
                Ok(()) | Err(HalError::WouldBlock(_)) => {}
                Err(e) => return Err(hal_failure("synchronize", &e)),
            }
            lane.observe()?;
        }
        if lanes.iter().all(|l| l.watermark == l.launched) {
            break;
        }
        if left == 0 {
            let state: Vec<(Seq, Seq)> = lanes.iter().map(|l| (l.watermark, l.launched)).collect();
            return fail(format!(
                "work never completed (watermark, launched): {state:?}"
            ));
        }
        left -= 1;
        target.advance(bounds.max_advance_ns.max(1));
    }
    for (i, lane) in lanes.iter().enumerate() {
        for seq in 0..lane.launched {
            let runs = target.block_runs(&lane.hal, seq);
            if runs.iter().any(|&r| r != 1) {
                return fail(format!(
                    "queue {i}, command {seq}: blocks ran {runs:?} times (each must run once)"
                ));
            }
        }
    }
    Ok(())
}

fn fail<T>(why: String) -> Result<T, TestCaseError> {
    Err(TestCaseError::fail(why))
}

fn hal_failure(what: &str, e: &HalError) -> TestCaseError {
    TestCaseError::fail(format!("{what}: {}", e.chain()))
}

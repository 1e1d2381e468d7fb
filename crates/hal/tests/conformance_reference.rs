//! The reference device passes the HAL conformance suite at every level, and the suite catches
//! a device that runs a block twice.

use xpreempt_hal::conformance::{self, Bounds, Target};
use xpreempt_hal::reference::{RefDevice, RefKernel, RefQueue};
use xpreempt_types::{Command, CommandProps, Level, Seq};

struct Reference {
    dev: RefDevice,
}

impl Target for Reference {
    type Queue = RefQueue;

    fn queue(&mut self, level: Level) -> RefQueue {
        self.dev.create_queue(level)
    }

    fn kernel(&mut self, blocks: u32) -> Command<RefKernel> {
        Command::kernel(RefKernel {
            blocks,
            block_ns: 10_000,
        })
        .with_props(CommandProps::new(false, true, false))
    }

    fn advance(&mut self, ns: u64) {
        self.dev.advance_to(self.dev.now() + ns);
    }

    fn block_runs(&self, queue: &RefQueue, seq: Seq) -> Vec<u32> {
        self.dev.block_runs(queue, seq)
    }
}

fn reference() -> Reference {
    Reference {
        dev: RefDevice::new(),
    }
}

#[test]
fn the_reference_device_conforms_at_every_level() {
    for level in [Level::Lv1, Level::Lv2, Level::Lv3] {
        if let Err(e) = conformance::run(reference, level, Bounds::default()) {
            panic!("{level}: {e}");
        }
    }
}

/// A device whose restart relaunches whole commands, finished blocks included (what a backend
/// gets wrong when it ignores the log's progress).
struct RunsTwice(Reference);

impl Target for RunsTwice {
    type Queue = RefQueue;

    fn queue(&mut self, level: Level) -> RefQueue {
        self.0.queue(level)
    }

    fn kernel(&mut self, blocks: u32) -> Command<RefKernel> {
        self.0.kernel(blocks)
    }

    fn advance(&mut self, ns: u64) {
        self.0.advance(ns);
    }

    fn block_runs(&self, queue: &RefQueue, seq: Seq) -> Vec<u32> {
        let mut runs = self.0.block_runs(queue, seq);
        if let Some(first) = runs.first_mut() {
            *first += 1;
        }
        runs
    }
}

#[test]
fn the_suite_fails_a_device_that_runs_a_block_twice() {
    let failed = conformance::run(|| RunsTwice(reference()), Level::Lv2, Bounds::default());
    let why = failed
        .expect_err("a double run passed the suite")
        .to_string();
    assert!(why.contains("each must run once"), "{why}");
}

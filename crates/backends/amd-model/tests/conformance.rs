//! The model's HAL passes the HAL conformance suite at Lv1, Lv2 (unmap with drain) and Lv3
//! (CWSR): every command completes, no workgroup twice, and a stopped queue makes no progress.

mod common;

use common::*;
use std::cell::RefCell;
use std::rc::Rc;
use xpreempt_amd::{AmdHal, AmdKernel, Caller, Gpu};
use xpreempt_hal::conformance::{self, Bounds, Target};
use xpreempt_types::{Command, CommandProps, Level, Seq};

struct Model {
    gpu: Rc<RefCell<Gpu>>,
    kernel: u64,
    queues: u32,
}

impl Target for Model {
    type Queue = AmdHal;

    fn queue(&mut self, level: Level) -> AmdHal {
        let q = queue(
            &mut self.gpu.borrow_mut(),
            1,
            &format!("q{}", self.queues),
            self.queues as i32,
        );
        self.queues += 1;
        AmdHal::new(self.gpu.clone(), q, Caller::process(1), level)
    }

    fn kernel(&mut self, blocks: u32) -> Command<AmdKernel> {
        Command::kernel(AmdKernel {
            object: self.kernel,
            workgroups: blocks * 4,
            wg_threads: 256,
        })
        .with_props(CommandProps::new(false, true, false))
    }

    fn advance(&mut self, ns: u64) {
        let mut gpu = self.gpu.borrow_mut();
        let until = gpu.now() + ns;
        gpu.advance_to(until);
        gpu.take_touched();
    }

    /// The model counts a workgroup that finishes twice itself; any count fails every command.
    fn block_runs(&self, _: &AmdHal, _: Seq) -> Vec<u32> {
        let twice = self.gpu.borrow().stats().exactly_once_violations;
        vec![if twice == 0 { 1 } else { 2 }]
    }
}

fn model() -> Model {
    let mut g = gpu(small());
    let kernel = kernel(&mut g, "k", 40, false);
    Model {
        gpu: Rc::new(RefCell::new(g)),
        kernel,
        queues: 0,
    }
}

#[test]
fn the_model_conforms_at_every_level() {
    let bounds = Bounds {
        cases: 48,
        ..Bounds::default()
    };
    for level in [Level::Lv1, Level::Lv2, Level::Lv3] {
        if let Err(e) = conformance::run(model, level, bounds) {
            panic!("{level}: {e}");
        }
    }
}

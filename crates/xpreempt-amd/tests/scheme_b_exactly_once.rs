//! Property: XQueues at Lv2 (unmap with drain) and Lv3 (CWSR) over the model's HAL, suspended
//! and resumed at random, run every command exactly once, in order, with no resubmission; a
//! suspended queue whose stop has settled has nothing running on the CUs.

mod common;

use common::*;
use proptest::prelude::*;
use std::cell::RefCell;
use std::rc::Rc;
use xpreempt_amd::Caller;
use xpreempt_amd::scheme_b::{AmdHal, AmdKernel};
use xpreempt_core::{Command, HwQueue, Level, QueueConfig, QueueId, XQueue};

#[derive(Clone, Debug)]
enum Step {
    Advance(u64),
    Suspend(usize),
    Resume(usize),
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        (0u64..200_000).prop_map(Step::Advance),
        (0usize..2).prop_map(Step::Suspend),
        (0usize..2).prop_map(Step::Resume),
    ]
}

const COMMANDS: u64 = 8;
const WGS: u32 = 10;

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn xqueues_over_the_model_run_everything_once(
        lv3 in any::<bool>(),
        steps in prop::collection::vec(step(), 1..40),
    ) {
        let level = if lv3 { Level::Lv3 } else { Level::Lv2 };
        let mut g = gpu(small());
        let k = kernel(&mut g, "k", 40, false);
        let qs: Vec<QueueId> = (0..2).map(|i| queue(&mut g, 1, &format!("q{i}"), i)).collect();
        let gpu = Rc::new(RefCell::new(g));
        let hals: Vec<AmdHal> = qs
            .iter()
            .map(|&q| AmdHal::new(gpu.clone(), q, Caller::process(1), level))
            .collect();
        let window = QueueConfig::new(4, 2, level).unwrap();
        let mut xqs: Vec<XQueue<AmdKernel>> =
            (0..2).map(|i| XQueue::new(QueueId(i), window, level)).collect();
        let kernel = AmdKernel { object: k, workgroups: WGS, wg_threads: 256 };
        for i in 0..2 {
            for _ in 0..COMMANDS {
                xqs[i].submit(&hals[i], Command::kernel(kernel), 0).unwrap();
            }
        }
        let poll_all = |xqs: &mut Vec<XQueue<AmdKernel>>, hals: &[AmdHal], now| {
            for i in 0..2 {
                xqs[i].poll(&hals[i], now).unwrap();
            }
        };
        for s in &steps {
            let now = gpu.borrow().now();
            match *s {
                Step::Advance(ns) => {
                    let until = now + ns;
                    loop {
                        let next = gpu.borrow().next_event_time().filter(|&t| t <= until);
                        let Some(t) = next else { break };
                        gpu.borrow_mut().advance_to(t);
                        gpu.borrow_mut().take_touched();
                        poll_all(&mut xqs, &hals, t);
                    }
                    gpu.borrow_mut().advance_to(until);
                }
                Step::Suspend(i) => { let _ = xqs[i].suspend(&hals[i], now).unwrap(); }
                Step::Resume(i) => { let _ = xqs[i].resume(&hals[i], now).unwrap(); }
            }
            for i in 0..2 {
                if xqs[i].is_suspended() && hals[i].settled() {
                    prop_assert_eq!(gpu.borrow().running_workgroups(qs[i]).unwrap(), 0);
                }
            }
        }
        for i in 0..2 {
            let now = gpu.borrow().now();
            let _ = xqs[i].resume(&hals[i], now).unwrap();
        }
        loop {
            let next = gpu.borrow().next_event_time();
            let Some(t) = next else { break };
            gpu.borrow_mut().advance_to(t);
            gpu.borrow_mut().take_touched();
            poll_all(&mut xqs, &hals, t);
        }
        let g = gpu.borrow();
        for i in 0..2 {
            prop_assert_eq!(xqs[i].completed(), COMMANDS);
            prop_assert!(xqs[i].is_idle());
            prop_assert_eq!(g.ring_ids(qs[i]).unwrap(), (COMMANDS, COMMANDS), "nothing resubmitted");
        }
        prop_assert_eq!(g.stats().wgs_completed, 2 * COMMANDS * u64::from(WGS));
        prop_assert_eq!(g.stats().exactly_once_violations, 0);
        prop_assert!((1..=g.signal_count()).all(|h| g.signal_value(h) == Some(0)));
    }
}

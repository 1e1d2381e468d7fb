//! Priority inheritance in local mode: a thread whose next work must follow a lower queue's
//! buffered commands (an event record, a legacy-stream edge) lends that queue its priority
//! while it waits. Without it the waiter waits for every queue between the two priorities: an
//! inversion, or a deadlock where the queue in between waits for the waiter.

mod common;

use common::{RefShared, kernel, queue};
use xpreempt_core::sched::Scheduler;
use xpreempt_core::sched::local::LocalScheduler;
use xpreempt_core::xqueue::threaded::Preemptible;
use xpreempt_core::{HwQueue, Level, QueueConfig, policy};
use xpreempt_hal::reference::{RefDevice, WallClock};

type Shared = RefShared;

const MIDDLE_KERNELS: u64 = 30;

/// Lv1, one command in flight: what is not in flight waits in the buffer.
fn lv1(dev: &RefDevice, sched: &LocalScheduler, id: u32, priority: i32) -> Shared {
    queue(
        dev,
        sched,
        id,
        priority,
        QueueConfig::new(1, 1, Level::Lv1).unwrap(),
    )
}

/// A low queue with buffered work stopped for a middle one with 150 ms of it; returns how
/// many of the middle queue's kernels had completed when `wait` returned.
fn middle_done_when_the_wait_returns(wait: impl FnOnce(&Shared)) -> u64 {
    let dev = RefDevice::new();
    let _clock = WallClock::start(&dev);
    let sched = LocalScheduler::start(Scheduler::new(policy::by_name("hpf").unwrap())).unwrap();
    let low = lv1(&dev, &sched, 0, 1);
    let middle = lv1(&dev, &sched, 1, 5);
    for _ in 0..3 {
        low.submit(kernel(2_000_000)).unwrap();
    }
    for _ in 0..MIDDLE_KERNELS {
        middle.submit(kernel(5_000_000)).unwrap();
    }
    assert!(
        low.stats().preemptions >= 1,
        "the middle queue stops the low one"
    );
    assert!(low.pending_len() > 0, "the low queue holds buffered work");
    wait(&low);
    let done = middle.hal().completed();
    middle.wait_all().unwrap();
    low.wait_all().unwrap();
    assert_eq!(low.hal().completed(), 3);
    assert_eq!(middle.hal().completed(), MIDDLE_KERNELS);
    done
}

#[test]
fn a_waiter_lends_its_priority_to_the_queue_it_waits_on() {
    let with = middle_done_when_the_wait_returns(|low| low.wait_launched_for(9));
    assert!(
        with < MIDDLE_KERNELS / 2,
        "the low queue waited for {with} of the middle queue's {MIDDLE_KERNELS} kernels"
    );
}

#[test]
fn without_inheritance_the_waiter_waits_behind_the_middle_queue() {
    let without = middle_done_when_the_wait_returns(|low| low.wait_launched());
    assert_eq!(
        without, MIDDLE_KERNELS,
        "plain wait_launched is the inversion inheritance removes"
    );
}

#[test]
fn a_loan_lasts_while_its_guard_lives_and_ends_with_it() {
    let lent = middle_done_when_the_wait_returns(|low| {
        let _lent = low.lend(9);
        low.wait_launched();
    });
    assert!(
        lent < MIDDLE_KERNELS / 2,
        "the low queue waited for {lent} of the middle queue's {MIDDLE_KERNELS} kernels"
    );
    let returned = middle_done_when_the_wait_returns(|low| {
        drop(low.lend(9));
        low.wait_launched();
    });
    assert_eq!(
        returned, MIDDLE_KERNELS,
        "a loan taken back still raised the low queue"
    );
}

//! A suspension after a stop ahead (`HwQueue::stop_ahead`, made before the queue's lock): the
//! stop is always taken over by `deactivate`, and a launch the backend held back behind it waits
//! in the pending buffer, launched once after the resume.

use super::*;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering::SeqCst};
use xpreempt_hal::observed::{HalOp, Observed, Observer};
use xpreempt_hal::reference::{RefDevice, RefKernel, RefQueue};

/// Holds launches back as a backend does behind a stop ahead, fails deactivates on request, and
/// counts the deactivates that reached the queue.
#[derive(Default)]
struct Backend {
    hold_launches: AtomicBool,
    fail_deactivate: AtomicBool,
    deactivates: AtomicU32,
}

impl Observer for Backend {
    fn before(&self, op: HalOp) -> Result<(), HalError> {
        match op {
            HalOp::Launch if self.hold_launches.load(SeqCst) => Err(HalError::Stopping("launch")),
            HalOp::Deactivate if self.fail_deactivate.load(SeqCst) => {
                Err(HalError::WouldBlock("a deactivate failed on purpose"))
            }
            HalOp::Deactivate => {
                self.deactivates.fetch_add(1, SeqCst);
                Ok(())
            }
            _ => Ok(()),
        }
    }
}

type Hal = Observed<RefQueue, Backend>;

fn setup() -> (RefDevice, Hal, XQueue<RefKernel>) {
    let dev = RefDevice::new();
    let hal = Observed::new(dev.create_queue(Level::Lv2), Backend::default());
    let q = XQueue::new(
        QueueId(0),
        QueueConfig::new(4, 1, Level::Lv2).unwrap(),
        Level::Lv2,
    );
    (dev, hal, q)
}

fn kernel(blocks: u32) -> Command<RefKernel> {
    Command::kernel(RefKernel {
        blocks,
        block_ns: 100,
    })
}

fn observer(hal: &Hal) -> &Backend {
    hal.observer()
}

/// Runs the device until the queue holds nothing; returns the time.
fn drain(dev: &RefDevice, hal: &Hal, q: &mut XQueue<RefKernel>, mut t: Nanos) -> Nanos {
    while q.in_flight_len() + q.pending_len() > 0 {
        t = dev
            .next_event()
            .expect("work left but the device is idle: a stop was never undone");
        dev.advance_to(t);
        q.poll(hal, t).unwrap();
    }
    t
}

fn assert_each_block_ran_once(dev: &RefDevice, hal: &Hal, seqs: std::ops::Range<Seq>) {
    for seq in seqs {
        let runs = dev.block_runs(hal.inner(), seq);
        assert!(
            !runs.is_empty() && runs.iter().all(|&r| r == 1),
            "command {seq}: {runs:?}"
        );
    }
}

#[test]
fn a_launch_held_back_by_a_stop_ahead_runs_once_after_the_resume() {
    let (dev, hal, mut q) = setup();
    q.submit(&hal, kernel(3), || 0).unwrap();
    assert!(hal.stop_ahead(), "work in flight: the stop goes ahead");
    observer(&hal).hold_launches.store(true, SeqCst);
    let held = q
        .submit(&hal, kernel(2), || 0)
        .expect("a held launch is not an error");
    assert_eq!((held.seq, q.in_flight_len(), q.pending_len()), (1, 1, 1));
    // The watcher's poll finds it held back as well, and is not an error either.
    q.poll(&hal, 20).unwrap();
    assert_eq!(q.pending_len(), 1);
    q.suspend_after(&hal, 30, true).unwrap();
    assert_eq!(observer(&hal).deactivates.load(SeqCst), 1);
    assert_eq!(q.stats().stops_ahead, 1);
    observer(&hal).hold_launches.store(false, SeqCst);
    dev.advance_to(1_000);
    q.resume(&hal, 1_000).unwrap();
    assert_eq!(q.pending_len(), 0, "launched by the resume");
    drain(&dev, &hal, &mut q, 1_000);
    assert_eq!(q.completed(), 2);
    assert_each_block_ran_once(&dev, &hal, 0..2);
}

#[test]
fn a_stop_ahead_is_taken_over_even_when_nothing_is_left_in_flight() {
    let (dev, hal, mut q) = setup();
    q.submit(&hal, kernel(1), || 0).unwrap();
    assert!(hal.stop_ahead());
    // The one-block kernel ends at its boundary: nothing is in flight when the suspension looks.
    dev.advance_to(500);
    q.suspend_after(&hal, 500, true).unwrap();
    assert_eq!(q.in_flight_len(), 0);
    assert_eq!(
        observer(&hal).deactivates.load(SeqCst),
        1,
        "the stop ahead is taken over"
    );
    q.resume(&hal, 600).unwrap();
    // Without the reactivate the queue would stay stopped and this never run.
    q.submit(&hal, kernel(2), || 0).unwrap();
    drain(&dev, &hal, &mut q, 700);
    assert_each_block_ran_once(&dev, &hal, 0..2);
}

#[test]
fn a_stop_ahead_on_a_queue_already_draining_is_taken_over() {
    let (dev, hal, mut q) = setup();
    q.submit(&hal, kernel(4), || 0).unwrap();
    observer(&hal).fail_deactivate.store(true, SeqCst);
    assert!(q.suspend(&hal, 10).is_err(), "the failed stop is reported");
    assert!(q.is_suspended());
    observer(&hal).fail_deactivate.store(false, SeqCst);
    // A second suspension, its stop ahead made while the first drains.
    assert!(hal.stop_ahead());
    assert!(
        !q.suspend_after(&hal, 20, true).unwrap(),
        "suspended already"
    );
    assert_eq!(observer(&hal).deactivates.load(SeqCst), 1);
    q.resume(&hal, 1_000).unwrap();
    q.submit(&hal, kernel(1), || 0).unwrap();
    drain(&dev, &hal, &mut q, 1_000);
    assert_each_block_ran_once(&dev, &hal, 0..2);
}

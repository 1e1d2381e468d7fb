//! A threaded queue's completion watcher, idle, looks for work by itself for a while
//! (`QueueConfig::with_idle_poll`): the submission that makes the queue busy again then does not
//! wake it, and the queue's Idle must still come, with or without a wait, and after the watcher
//! went back to sleeping until woken.

mod common;

use common::lv1_queue;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use xpreempt_core::sched::QueueReport;
use xpreempt_core::xqueue::threaded::ReportSink;
use xpreempt_core::{Command, CommandProps, QueueId};
use xpreempt_hal::reference::{RefDevice, RefKernel, WallClock};

/// How many Idle reports a queue made.
#[derive(Default)]
struct Idles(Mutex<usize>);

impl ReportSink for Idles {
    fn report(&self, _: QueueId, report: QueueReport) {
        if matches!(report, QueueReport::Idle { .. }) {
            *self.0.lock().unwrap() += 1;
        }
    }

    fn wants_work(&self) -> bool {
        false
    }
}

impl Idles {
    fn reach(&self, n: usize) -> bool {
        let t = Instant::now();
        while t.elapsed() < Duration::from_secs(2) {
            if *self.0.lock().unwrap() >= n {
                return true;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        false
    }
}

fn kernel() -> Command<RefKernel> {
    Command::kernel(RefKernel {
        blocks: 1,
        block_ns: 200_000,
    })
    .with_props(CommandProps::new(false, true, false))
}

#[test]
fn an_idle_queue_reports_its_next_work_done_whether_its_watcher_polls_or_sleeps() {
    for poll in [Duration::ZERO, Duration::from_millis(300)] {
        let dev = RefDevice::new();
        let _clock = WallClock::start(&dev);
        let idles = Arc::new(Idles::default());
        let q = lv1_queue(
            &dev,
            |c| c.with_idle_poll(poll.as_nanos() as u64),
            idles.clone(),
        );
        let seq = q.submit(kernel()).unwrap();
        q.wait(seq).unwrap();
        assert!(idles.reach(1), "poll {poll:?}: no Idle after a wait");

        // Idle a moment (the watcher polls, if it may): work, and nobody waits for it.
        std::thread::sleep(Duration::from_millis(5));
        q.submit(kernel()).unwrap();
        assert!(
            idles.reach(2),
            "poll {poll:?}: work submitted to a recently idle queue never reported done"
        );

        // Idle past the poll window (the watcher sleeps until woken): the same.
        std::thread::sleep(poll + Duration::from_millis(50));
        q.submit(kernel()).unwrap();
        assert!(
            idles.reach(3),
            "poll {poll:?}: work submitted to a long idle queue never reported done"
        );
    }
}

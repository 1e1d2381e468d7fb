//! A sink may hold back part of a Ready (the global-mode agent puts off its ring of the daemon,
//! a system call, when the board has acted already): the queue's completion watcher flushes
//! it, off the submitting thread, whether the watcher polls or sleeps and whether or not the
//! application waits.

mod common;

use common::{lv1_queue, within};
use std::sync::{Arc, Mutex};
use std::thread::ThreadId;
use std::time::Duration;
use xpreempt_core::sched::QueueReport;
use xpreempt_core::xqueue::threaded::ReportSink;
use xpreempt_core::{Command, CommandProps, QueueId};
use xpreempt_hal::reference::{RefDevice, RefKernel, WallClock};

#[derive(Debug, PartialEq)]
enum Seen {
    Ready,
    Idle,
    Flush,
}

/// What reached the sink, in order, and on which thread.
#[derive(Default)]
struct Calls(Mutex<Vec<(Seen, ThreadId)>>);

impl Calls {
    fn push(&self, seen: Seen) {
        self.0
            .lock()
            .unwrap()
            .push((seen, std::thread::current().id()));
    }

    /// Whether, within 2 s, a flush from another thread than `submitter` follows the first
    /// Ready.
    fn flushed_after_ready(&self, submitter: ThreadId) -> bool {
        within(|| {
            let calls = self.0.lock().unwrap();
            calls
                .iter()
                .position(|(s, _)| *s == Seen::Ready)
                .is_some_and(|ready| {
                    calls[ready..]
                        .iter()
                        .any(|(s, t)| *s == Seen::Flush && *t != submitter)
                })
        })
    }

    fn flushes_on(&self, thread: ThreadId) -> usize {
        let calls = self.0.lock().unwrap();
        calls
            .iter()
            .filter(|(s, t)| *s == Seen::Flush && *t == thread)
            .count()
    }
}

impl ReportSink for Calls {
    fn report(&self, _: QueueId, report: QueueReport) {
        match report {
            QueueReport::Ready { .. } => self.push(Seen::Ready),
            QueueReport::Idle { .. } => self.push(Seen::Idle),
            _ => {}
        }
    }

    fn wants_work(&self) -> bool {
        false
    }

    fn flush(&self, _: QueueId) {
        self.push(Seen::Flush);
    }
}

#[test]
fn the_watcher_flushes_what_a_ready_held_back() {
    for (poll, wait) in [
        (Duration::ZERO, false),
        (Duration::ZERO, true),
        (Duration::from_millis(300), false),
        (Duration::from_millis(300), true),
    ] {
        let dev = RefDevice::new();
        let _clock = WallClock::start(&dev);
        let calls = Arc::new(Calls::default());
        let q = lv1_queue(
            &dev,
            |c| c.with_idle_poll(poll.as_nanos() as u64),
            calls.clone(),
        );
        // The watcher settles into its idle state (polling, or asleep) first.
        std::thread::sleep(Duration::from_millis(20));
        let me = std::thread::current().id();
        let seq = q
            .submit(
                Command::kernel(RefKernel {
                    blocks: 1,
                    block_ns: 20_000_000,
                })
                .with_props(CommandProps::new(false, true, false)),
            )
            .unwrap();
        if wait {
            q.wait(seq).unwrap();
        }
        assert!(
            calls.flushed_after_ready(me),
            "poll {poll:?}, wait {wait}: nothing flushed the Ready"
        );
        assert_eq!(
            calls.flushes_on(me),
            0,
            "poll {poll:?}, wait {wait}: flushed on the application's thread"
        );
    }
}

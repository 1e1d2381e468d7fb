//! Local mode end to end: threaded XQueues, the scheduler on its own thread, and the reference
//! device whose virtual clock follows the wall clock.

mod common;

use common::{ThreadProbe, kernel, queue, ready, within};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};
use xpreempt_core::sched::QueueReport;
use xpreempt_core::sched::local::LocalScheduler;
use xpreempt_core::sched::{Hooks, QueueInfo, Scheduler, Work};
use xpreempt_core::xqueue::threaded::{Preemptible, TrySubmitError};
use xpreempt_core::{HwQueue, Level, OpKind, QueueConfig, QueueId, policy};
use xpreempt_hal::reference::{RefDevice, WallClock};

const BE_KERNELS: u64 = 100;

#[test]
fn a_high_priority_burst_overtakes_a_busy_low_queue_and_nothing_is_lost() {
    for level in [Level::Lv1, Level::Lv2, Level::Lv3] {
        let dev = RefDevice::new();
        let clock = WallClock::start(&dev);
        let sched = LocalScheduler::start(Scheduler::new(policy::by_name("hpf").unwrap())).unwrap();
        let make = |id, prio| {
            queue(
                &dev,
                &sched,
                id,
                prio,
                QueueConfig::new(4, 2, level).unwrap(),
            )
        };
        let low = make(0, 3);
        let high = make(1, 12);
        for _ in 0..BE_KERNELS {
            low.submit(kernel(1_000_000)).unwrap();
        }
        std::thread::sleep(Duration::from_millis(5));
        let mut last = high.submit(kernel(100_000)).unwrap();
        // Counted, not read from the state: at Lv3 the high kernel may already have finished
        // and the low queue been resumed by the time this thread runs again.
        assert_eq!(
            low.stats().preemptions,
            1,
            "{level}: the high queue's first submission suspends the low queue before it returns"
        );
        for _ in 1..5 {
            last = high.submit(kernel(100_000)).unwrap();
        }
        high.wait(last).unwrap();
        let low_done_when_high_finished = low.hal().completed();
        low.wait_all().unwrap();
        drop(clock);

        assert!(
            low_done_when_high_finished < BE_KERNELS,
            "{level}: the high queue waited for all of the low queue"
        );
        assert!(
            low.stats().preemptions >= 1,
            "{level}: the low queue was never suspended"
        );
        assert!(sched.stats().preemptions >= 1);
        for (q, n) in [(&low, BE_KERNELS), (&high, 5)] {
            assert_eq!(q.hal().completed(), n);
            for seq in 0..n {
                assert_eq!(
                    dev.block_runs(q.hal(), seq),
                    vec![1],
                    "{level}: command {seq}"
                );
            }
        }
    }
}

#[test]
fn the_timer_thread_rotates_round_robin_turns() {
    let dev = RefDevice::new();
    let clock = WallClock::start(&dev);
    let rr = policy::RoundRobin {
        timeslice_ns: 2_000_000,
    };
    let sched = LocalScheduler::start(Scheduler::new(Box::new(rr))).unwrap();
    let queues: Vec<_> = (0..2)
        .map(|id| {
            queue(
                &dev,
                &sched,
                id,
                0,
                QueueConfig::new(2, 1, Level::Lv3).unwrap(),
            )
        })
        .collect();
    for q in &queues {
        for _ in 0..20 {
            q.submit(kernel(1_000_000)).unwrap();
        }
    }
    for q in &queues {
        q.wait_all().unwrap();
    }
    drop(clock);
    // 2 x 20 ms of work in 2 ms turns: each queue is suspended several times, by timers alone.
    for q in &queues {
        assert!(q.stats().preemptions >= 3, "{:?}", q.stats().preemptions);
    }
    assert!(sched.stats().checks > 10);
}

#[test]
fn a_report_that_arrives_after_a_newer_one_is_ignored() {
    let sched = LocalScheduler::start(Scheduler::new(policy::by_name("hpf").unwrap())).unwrap();
    let low = Arc::new(ThreadProbe::default());
    let high = Arc::new(ThreadProbe {
        id: 1,
        ..ThreadProbe::default()
    });
    sched
        .register(QueueInfo::new(QueueId(0), 1), low.clone())
        .unwrap();
    sched
        .register(QueueInfo::new(QueueId(1), 9), high.clone())
        .unwrap();
    let sink = sched.sink();
    sink.report(QueueId(0), ready(1));
    sink.report(QueueId(1), ready(1));
    assert!(low.suspended.load(Ordering::Relaxed));
    // The high queue went idle (generation 2) and got work again (3), but the reports crossed.
    sink.report(QueueId(1), ready(3));
    sink.report(QueueId(1), QueueReport::Idle { generation: 2 });
    assert!(
        low.suspended.load(Ordering::Relaxed),
        "a stale Idle let the low queue run"
    );
    sink.report(QueueId(1), QueueReport::Idle { generation: 4 });
    assert!(!low.suspended.load(Ordering::Relaxed));
}

struct DenyUntilIdle;
impl Hooks for DenyUntilIdle {
    fn admit(&mut self, queue: QueueId, _: usize, _: usize) -> bool {
        queue.0 != 1
    }
}

#[test]
fn a_refused_submitter_gets_busy_and_others_keep_running() {
    let dev = RefDevice::new();
    let clock = WallClock::start(&dev);
    let sched = LocalScheduler::start(
        Scheduler::new(policy::by_name("hpf").unwrap()).with_hooks(Box::new(DenyUntilIdle)),
    )
    .unwrap();
    let make = |id, prio| {
        queue(
            &dev,
            &sched,
            id,
            prio,
            QueueConfig::new(4, 2, Level::Lv3).unwrap(),
        )
    };
    let low = make(0, 1);
    let refused = make(1, 9);
    for _ in 0..10 {
        low.submit(kernel(100_000)).unwrap();
    }
    // The first submission is taken and held; then the queue answers busy.
    refused.submit(kernel(100_000)).unwrap();
    let busy = refused.submit_with_retry(kernel(100_000), Duration::from_millis(2));
    assert!(matches!(busy, Err(TrySubmitError::Busy(..))), "{busy:?}");
    low.wait_all().unwrap();
    drop(clock);
    assert_eq!(
        low.hal().completed(),
        10,
        "the refused high queue starved the low one"
    );
    assert!(sched.stats().refusals >= 2, "{:?}", sched.stats());
}

/// Records what the `work_submit` hook hears.
#[derive(Clone, Default)]
struct RecordWork(Arc<std::sync::Mutex<Vec<(QueueId, Work)>>>);
impl Hooks for RecordWork {
    fn work_submit(&mut self, queue: QueueId, work: Work, _: u64) {
        self.0.lock().unwrap().push((queue, work));
    }
}

#[test]
fn work_submit_fires_for_every_submission_and_for_completions_through_a_shared_queue() {
    let dev = RefDevice::new();
    let clock = WallClock::start(&dev);
    let seen = RecordWork::default();
    let sched = LocalScheduler::start(
        Scheduler::new(policy::by_name("hpf").unwrap()).with_hooks(Box::new(seen.clone())),
    )
    .unwrap();
    let q = queue(
        &dev,
        &sched,
        7,
        3,
        QueueConfig::new(4, 2, Level::Lv1).unwrap(),
    );
    for _ in 0..6 {
        q.submit(kernel(10_000)).unwrap();
    }
    q.wait_all().unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    let last_completion = || last_completion_of(&seen.0.lock().unwrap());
    while last_completion() != Some(6) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(1));
    }
    drop(clock);
    let seen = seen.0.lock().unwrap().clone();
    let submitted: Vec<u64> = seen
        .iter()
        .filter_map(|(id, w)| match w {
            Work::Submitted { kind, seq } => {
                assert_eq!((*id, *kind), (QueueId(7), OpKind::Kernel));
                Some(*seq)
            }
            _ => None,
        })
        .collect();
    assert_eq!(submitted, (0..6).collect::<Vec<_>>());
    assert_eq!(last_completion_of(&seen), Some(6), "{seen:?}");
}

fn last_completion_of(seen: &[(QueueId, Work)]) -> Option<u64> {
    seen.iter().rev().find_map(|(_, w)| match w {
        Work::Completed { upto } => Some(*upto),
        _ => None,
    })
}

#[test]
fn once_preemptions_happen_the_spinning_preemption_thread_stops_the_low_queue() {
    let sched = LocalScheduler::start(Scheduler::new(policy::by_name("hpf").unwrap())).unwrap();
    let low = Arc::new(ThreadProbe::default());
    let high = Arc::new(ThreadProbe {
        id: 1,
        ..ThreadProbe::default()
    });
    sched
        .register(QueueInfo::new(QueueId(0), 1), low.clone())
        .unwrap();
    sched
        .register(QueueInfo::new(QueueId(1), 9), high.clone())
        .unwrap();
    let sink = sched.sink();
    sink.report(QueueId(0), ready(1));
    for round in 0..20u64 {
        sink.report(QueueId(1), ready(2 * round + 1));
        assert!(
            within(|| low.suspended.load(Ordering::SeqCst)),
            "round {round}: the low queue was not suspended"
        );
        sink.report(
            QueueId(1),
            QueueReport::Idle {
                generation: 2 * round + 2,
            },
        );
        assert!(
            !low.suspended.load(Ordering::SeqCst),
            "round {round}: not resumed"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    let on = low.suspended_on.lock().unwrap().clone();
    assert_eq!(on.len(), 20, "each preemption suspends once: {on:?}");
    assert_ne!(on[0], "xpreempt-preempt", "the first one runs inline");
    assert!(
        on.iter().filter(|t| *t == "xpreempt-preempt").count() >= 15,
        "later ones go to the spinning thread: {on:?}"
    );
    drop(sched);
}

#[test]
fn without_a_hot_window_every_suspension_runs_on_the_reporting_thread() {
    let sched = LocalScheduler::start_with(
        Scheduler::new(policy::by_name("hpf").unwrap()),
        Duration::ZERO,
    )
    .unwrap();
    let low = Arc::new(ThreadProbe::default());
    let high = Arc::new(ThreadProbe {
        id: 1,
        ..ThreadProbe::default()
    });
    sched
        .register(QueueInfo::new(QueueId(0), 1), low.clone())
        .unwrap();
    sched
        .register(QueueInfo::new(QueueId(1), 9), high.clone())
        .unwrap();
    let sink = sched.sink();
    sink.report(QueueId(0), ready(1));
    for round in 0..5u64 {
        sink.report(QueueId(1), ready(2 * round + 1));
        assert!(
            low.suspended.load(Ordering::SeqCst),
            "suspended before the report returns"
        );
        sink.report(
            QueueId(1),
            QueueReport::Idle {
                generation: 2 * round + 2,
            },
        );
    }
    let on = low.suspended_on.lock().unwrap().clone();
    assert!(on.iter().all(|t| t != "xpreempt-preempt"), "{on:?}");
}

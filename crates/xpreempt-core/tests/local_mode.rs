//! Local mode end to end: threaded XQueues, the scheduler on its own thread, and the reference
//! device whose virtual clock follows the wall clock.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};
use xpreempt_core::reference::{RefDevice, RefKernel};
use xpreempt_core::scheduler::local::LocalScheduler;
use xpreempt_core::scheduler::{QueueInfo, Scheduler};
use xpreempt_core::xqueue::threaded::{Preemptible, SharedXQueue};
use xpreempt_core::{Command, CommandProps, HwQueue, Level, QueueConfig, QueueId, XQueue, policy};

const BE_KERNELS: u64 = 100;

/// Moves the reference device's virtual clock along with the wall clock until dropped.
struct WallClock {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl WallClock {
    fn start(dev: &RefDevice) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let (dev, flag) = (dev.clone(), Arc::clone(&stop));
        let thread = std::thread::spawn(move || {
            let start = Instant::now();
            while !flag.load(Ordering::Relaxed) {
                dev.advance_to(start.elapsed().as_nanos() as u64);
                std::thread::sleep(Duration::from_micros(20));
            }
        });
        Self {
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for WallClock {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn kernel(block_ns: u64) -> Command<RefKernel> {
    Command::kernel(RefKernel {
        blocks: 1,
        block_ns,
    })
    .with_props(CommandProps::new(false, true, false))
}

#[test]
fn a_high_priority_burst_overtakes_a_busy_low_queue_and_nothing_is_lost() {
    for level in [Level::Lv1, Level::Lv2, Level::Lv3] {
        let dev = RefDevice::new();
        let clock = WallClock::start(&dev);
        let sched = LocalScheduler::start(Scheduler::new(policy::by_name("hpf").unwrap())).unwrap();
        let make = |id: u32, prio| {
            let hal = dev.create_queue(level);
            let q = XQueue::new(
                QueueId(id),
                QueueConfig::new(4, 2, level).unwrap(),
                hal.max_level(),
            );
            let shared = Arc::new(SharedXQueue::new(q, hal, Some(sched.sink())));
            sched.register(
                QueueInfo::new(QueueId(id), prio),
                shared.clone() as Arc<dyn Preemptible>,
            );
            shared
        };
        let low = make(0, 3);
        let high = make(1, 12);
        for _ in 0..BE_KERNELS {
            low.submit(kernel(1_000_000)).unwrap();
        }
        std::thread::sleep(Duration::from_millis(5));
        let mut last = high.submit(kernel(100_000)).unwrap();
        assert!(
            low.is_suspended(),
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
            let hal = dev.create_queue(Level::Lv3);
            let q = XQueue::new(
                QueueId(id),
                QueueConfig::new(2, 1, Level::Lv3).unwrap(),
                hal.max_level(),
            );
            let shared = Arc::new(SharedXQueue::new(q, hal, Some(sched.sink())));
            sched.register(
                QueueInfo::new(QueueId(id), 0),
                shared.clone() as Arc<dyn Preemptible>,
            );
            shared
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

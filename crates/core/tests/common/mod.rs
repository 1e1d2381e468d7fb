//! Test doubles shared by the local-mode integration tests.

// Each test binary uses a part.
#![allow(dead_code)]

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use xpreempt_core::sched::QueueInfo;
use xpreempt_core::sched::QueueReport;
use xpreempt_core::sched::local::LocalScheduler;
use xpreempt_core::xqueue::QueueOpError;
use xpreempt_core::xqueue::threaded::{EventSink, Preemptible, SharedXQueue};
use xpreempt_core::{Command, CommandProps, HwQueue, Level, QueueConfig, QueueId, XQueue};
use xpreempt_hal::reference::{RefDevice, RefKernel, RefQueue};

/// A queue that records whether it is suspended and on which threads it was; its stops can be
/// made slow (40 ms), and its resumptions held until released.
#[derive(Default)]
pub struct ThreadProbe {
    pub id: u32,
    pub suspended_on: Mutex<Vec<String>>,
    pub suspended: AtomicBool,
    pub slow_stop: AtomicBool,
    /// While set, a resumption waits (after setting `resuming`).
    pub hold_resume: AtomicBool,
    pub resuming: AtomicBool,
    /// The most a suspension or resumption takes (µs), as a driver call would; each call takes
    /// a different share of it, so that calls made one after the other can end out of order.
    pub op_us: AtomicU64,
    pub calls: AtomicU64,
}

impl ThreadProbe {
    fn take_time(&self) {
        let most = self.op_us.load(Ordering::SeqCst);
        if most > 0 {
            let call = self.calls.fetch_add(1, Ordering::SeqCst) + 1;
            let share = call.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 54; // 0..1024
            std::thread::sleep(Duration::from_micros(most * share / 1024));
        }
    }
}

impl Preemptible for ThreadProbe {
    fn queue_id(&self) -> QueueId {
        QueueId(self.id)
    }
    fn suspend(&self) -> Result<Option<QueueReport>, QueueOpError> {
        let name = std::thread::current().name().unwrap_or("").to_string();
        self.suspended_on.lock().unwrap().push(name);
        if self.slow_stop.load(Ordering::SeqCst) {
            std::thread::sleep(Duration::from_millis(40));
        }
        self.take_time();
        self.suspended.store(true, Ordering::SeqCst);
        Ok(None)
    }
    fn resume(&self) -> Result<Option<QueueReport>, QueueOpError> {
        self.resuming.store(true, Ordering::SeqCst);
        while self.hold_resume.load(Ordering::SeqCst) {
            std::thread::sleep(Duration::from_millis(1));
        }
        self.take_time();
        self.suspended.store(false, Ordering::SeqCst);
        self.resuming.store(false, Ordering::SeqCst);
        Ok(None)
    }
    fn stats(&self) -> xpreempt_core::stats::QueueStats {
        xpreempt_core::stats::QueueStats::default()
    }
    fn set_refused(&self, _: bool) {}
}

/// A Ready report of one pending command.
pub fn ready(generation: u64) -> QueueReport {
    QueueReport::Ready {
        pending: 1,
        generation,
    }
}

/// Whether `f` holds within 2 s.
pub fn within(mut f: impl FnMut() -> bool) -> bool {
    let t = Instant::now();
    while t.elapsed() < Duration::from_secs(2) {
        if f() {
            return true;
        }
        std::hint::spin_loop();
    }
    false
}

/// A threaded Lv1 queue (window 4, sync every 2 commands) on `dev`, with `config`'s other
/// settings, reporting to `sink`.
pub fn lv1_queue(
    dev: &RefDevice,
    config: impl FnOnce(QueueConfig) -> QueueConfig,
    sink: EventSink,
) -> SharedXQueue<RefQueue> {
    let hal = dev.create_queue(Level::Lv1);
    let config = config(QueueConfig::new(4, 2, Level::Lv1).expect("a valid window"));
    SharedXQueue::new(
        XQueue::new(QueueId(1), config, hal.max_level()),
        hal,
        Some(sink),
    )
}

pub type RefShared = Arc<SharedXQueue<RefQueue>>;

/// A threaded queue on `dev`, registered with `sched` at `priority`.
pub fn queue(
    dev: &RefDevice,
    sched: &LocalScheduler,
    id: u32,
    priority: i32,
    config: QueueConfig,
) -> RefShared {
    let hal = dev.create_queue(config.level());
    let q = XQueue::new(QueueId(id), config, hal.max_level());
    let shared = Arc::new(SharedXQueue::new(q, hal, Some(sched.sink())));
    sched
        .register(
            QueueInfo::new(QueueId(id), priority),
            shared.clone() as Arc<dyn Preemptible>,
        )
        .unwrap();
    shared
}

pub fn kernel(block_ns: u64) -> Command<RefKernel> {
    Command::kernel(RefKernel {
        blocks: 1,
        block_ns,
    })
    .with_props(CommandProps::new(false, true, false))
}

//! A threaded queue whose first command of a burst completes before the application's next
//! submission (here: while the first submission is still reporting its Ready) stays busy across
//! the burst with a burst gap (`QueueConfig::with_burst_gap`), and goes idle and busy again
//! inside it without one. With the gap, a waiter that saw the last completion also returns
//! before the queue reports Idle.

mod common;

use common::within;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};
use xpreempt_core::sched::QueueReport;
use xpreempt_core::xqueue::threaded::{ReportSink, SharedXQueue};
use xpreempt_core::{
    Command, CommandProps, HalError, HwQueue, Level, QueueConfig, QueueId, Seq, XQueue,
};
use xpreempt_hal::reference::{RefDevice, RefKernel, RefQueue, WallClock};

/// Records the Ready/Idle reports; the first Ready (made inside the first submission) returns
/// only once an Idle came or `first_ready_waits` passed.
struct Reports {
    seen: Mutex<Vec<(QueueReport, Instant)>>,
    changed: Condvar,
    first_ready_waits: Duration,
}

impl ReportSink for Reports {
    fn report(&self, _: QueueId, report: QueueReport) {
        let mut seen = self.seen.lock().unwrap();
        seen.push((report, Instant::now()));
        self.changed.notify_all();
        if seen.len() == 1 && matches!(report, QueueReport::Ready { .. }) {
            let _ = self
                .changed
                .wait_timeout_while(seen, self.first_ready_waits, |s| {
                    !s.iter().any(|(r, _)| matches!(r, QueueReport::Idle { .. }))
                })
                .unwrap();
        }
    }

    fn wants_work(&self) -> bool {
        false
    }
}

impl Reports {
    fn idles(&self) -> Vec<Instant> {
        let seen = self.seen.lock().unwrap();
        let idle =
            |(r, t): &(QueueReport, Instant)| matches!(r, QueueReport::Idle { .. }).then_some(*t);
        seen.iter().filter_map(idle).collect()
    }

    fn kinds(&self) -> Vec<&'static str> {
        let seen = self.seen.lock().unwrap();
        let kind = |(r, _): &(QueueReport, Instant)| match r {
            QueueReport::Ready { .. } => "ready",
            QueueReport::Idle { .. } => "idle",
            _ => "other",
        };
        seen.iter().map(kind).collect()
    }

    /// Whether the `n`th Idle comes within 2 s.
    fn idles_reach(&self, n: usize) -> bool {
        within(|| self.idles().len() >= n)
    }
}

fn kernel() -> Command<RefKernel> {
    Command::kernel(RefKernel {
        blocks: 1,
        block_ns: 100_000,
    })
    .with_props(CommandProps::new(false, true, false))
}

/// Two submissions of one burst; the first one's Ready waits (up to `first_ready_waits`) for the
/// queue's Idle, long after its command completed.
fn burst(gap: Duration, first_ready_waits: Duration) -> (Arc<Reports>, Instant) {
    let dev = RefDevice::new();
    let _clock = WallClock::start(&dev);
    let reports = Arc::new(Reports {
        seen: Mutex::default(),
        changed: Condvar::new(),
        first_ready_waits,
    });
    let config = QueueConfig::new(4, 2, Level::Lv1)
        .unwrap()
        .with_burst_gap(gap.as_nanos() as u64);
    let hal = dev.create_queue(Level::Lv1);
    let q = SharedXQueue::new(
        XQueue::new(QueueId(1), config, hal.max_level()),
        hal,
        Some(reports.clone()),
    );
    q.submit(kernel()).unwrap();
    let seq = q.submit(kernel()).unwrap();
    let returned = Instant::now();
    q.wait(seq).unwrap();
    assert!(reports.idles_reach(1), "the burst never went idle");
    (reports, returned)
}

#[test]
fn without_a_burst_gap_the_queue_goes_idle_inside_the_burst() {
    let (reports, _) = burst(Duration::ZERO, Duration::from_secs(2));
    assert!(reports.idles_reach(2), "{:?}", reports.kinds());
    assert_eq!(reports.kinds(), ["ready", "idle", "ready", "idle"]);
}

#[test]
fn with_a_burst_gap_it_stays_busy_across_the_burst_and_goes_idle_after_it() {
    let gap = Duration::from_millis(100);
    // Shorter than the longest hold for a call (10 ms).
    let (reports, returned) = burst(gap, Duration::from_millis(5));
    assert_eq!(reports.kinds(), ["ready", "idle"]);
    let idle = reports.idles()[0];
    assert!(
        idle >= returned + gap,
        "Idle {:?} after the last submission returned",
        idle - returned
    );
}

/// A reference queue whose synchronize returns 50 ms late to the application's threads (the
/// completion watcher's are named `xpreempt-…`), as a driver call held up would.
struct SlowReturn(RefQueue);

impl HwQueue for SlowReturn {
    type Payload = RefKernel;

    fn max_level(&self) -> Level {
        self.0.max_level()
    }

    fn launch(
        &self,
        seq: Seq,
        command: &mut Command<RefKernel>,
        sync_point: bool,
    ) -> Result<(), HalError> {
        self.0.launch(seq, command, sync_point)
    }

    fn record_sync(&self) -> Result<(), HalError> {
        self.0.record_sync()
    }

    fn completed(&self) -> Seq {
        self.0.completed()
    }

    fn synchronize(&self, upto: Seq) -> Result<(), HalError> {
        self.0.synchronize(upto)?;
        let name = std::thread::current().name().unwrap_or("").to_string();
        if !name.starts_with("xpreempt-") {
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(())
    }
}

/// Whether the application's waiter had returned when the queue reported Idle.
#[derive(Default)]
struct IdleAfterReturn {
    returned: AtomicBool,
    idle: Mutex<Option<bool>>,
}

impl ReportSink for IdleAfterReturn {
    fn report(&self, _: QueueId, report: QueueReport) {
        if matches!(report, QueueReport::Idle { .. }) {
            *self.idle.lock().unwrap() = Some(self.returned.load(Ordering::SeqCst));
        }
    }

    fn wants_work(&self) -> bool {
        false
    }
}

/// Whether the Idle came after the waiter returned.
fn idle_after_the_wait_returned(gap: Duration) -> bool {
    let dev = RefDevice::new();
    let _clock = WallClock::start(&dev);
    let sink = Arc::new(IdleAfterReturn::default());
    let config = QueueConfig::new(4, 2, Level::Lv1)
        .unwrap()
        .with_burst_gap(gap.as_nanos() as u64);
    let hal = SlowReturn(dev.create_queue(Level::Lv1));
    let q = SharedXQueue::new(
        XQueue::new(QueueId(1), config, hal.max_level()),
        hal,
        Some(sink.clone()),
    );
    let seq = q.submit(kernel()).unwrap();
    q.wait(seq).unwrap();
    sink.returned.store(true, Ordering::SeqCst);
    assert!(within(|| sink.idle.lock().unwrap().is_some()), "no Idle");
    sink.idle.lock().unwrap().unwrap_or_default()
}

#[test]
fn the_idle_waits_for_a_waiter_that_saw_the_completion_to_return() {
    assert!(idle_after_the_wait_returned(Duration::from_micros(20)));
    // Without the gap, the watcher reports it while the waiter is still held up.
    assert!(!idle_after_the_wait_returned(Duration::ZERO));
}

//! A threaded queue whose first command of a burst completes before the application's next
//! submission (here: while the first submission is still reporting its Ready) stays busy across
//! the burst with a burst gap (`QueueConfig::with_burst_gap`), and goes idle and busy again
//! inside it without one.

use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};
use xpreempt_core::sched::QueueReport;
use xpreempt_core::xqueue::threaded::{ReportSink, SharedXQueue};
use xpreempt_core::{Command, CommandProps, HwQueue, Level, QueueConfig, QueueId, XQueue};
use xpreempt_hal::reference::{RefDevice, RefKernel, WallClock};

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

    /// Waits up to 2 s for the `n`th Idle.
    fn idle_number(&self, n: usize) -> Option<Instant> {
        let t = Instant::now();
        while t.elapsed() < Duration::from_secs(2) {
            if let Some(&at) = self.idles().get(n - 1) {
                return Some(at);
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        None
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
    assert!(
        reports.idle_number(1).is_some(),
        "the burst never went idle"
    );
    (reports, returned)
}

#[test]
fn without_a_burst_gap_the_queue_goes_idle_inside_the_burst() {
    let (reports, _) = burst(Duration::ZERO, Duration::from_secs(2));
    assert!(reports.idle_number(2).is_some(), "{:?}", reports.kinds());
    assert_eq!(reports.kinds(), ["ready", "idle", "ready", "idle"]);
}

#[test]
fn with_a_burst_gap_it_stays_busy_across_the_burst_and_goes_idle_after_it() {
    let gap = Duration::from_millis(100);
    let (reports, returned) = burst(gap, Duration::from_millis(150));
    assert_eq!(reports.kinds(), ["ready", "idle"]);
    let idle = reports.idles()[0];
    assert!(
        idle >= returned + gap,
        "Idle {:?} after the last submission returned",
        idle - returned
    );
}

//! A threaded queue whose first command of a burst completes before the application's next
//! submission (here: while the first submission is still reporting its Ready) stays busy across
//! the burst with a burst gap (`QueueConfig::with_burst_gap`), and goes idle and busy again
//! inside it without one. With the gap, a waiter that saw the last completion also returns
//! before the queue reports Idle. A sink that asks for it (`ReportSink::idle_from_waiter`) gets
//! the Idle from the waiter, before it returns, however late the watcher wakes.

mod common;

use common::{lv1_queue, within};
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
    let q = lv1_queue(
        &dev,
        |c| c.with_burst_gap(gap.as_nanos() as u64),
        reports.clone(),
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

/// A reference queue whose synchronize blocks until the work completed (the reference queue's
/// own would say WouldBlock) and then returns `late` to the application's threads (the completion
/// watcher's are named `xpreempt-…`), as a driver call held up would. It notes when a call first
/// saw the completion, and when an application's call left: before it returns, so before the
/// queue's wait can end (a time the test took after the wait could come after an Idle that
/// rightly followed it).
struct SlowReturn {
    queue: RefQueue,
    late: Duration,
    /// How long the watcher's synchronize is held up after it saw the completion.
    watcher_late: Duration,
    times: Arc<Times>,
}

#[derive(Default)]
struct Times {
    /// When a synchronize first saw the completion, and when the application's left.
    done: Mutex<Option<Instant>>,
    left: Mutex<Option<Instant>>,
    idle: Mutex<Option<Instant>>,
    /// What `idle_from_waiter` answers.
    from_waiter: bool,
}

impl HwQueue for SlowReturn {
    type Payload = RefKernel;

    fn max_level(&self) -> Level {
        self.queue.max_level()
    }

    fn launch(
        &self,
        seq: Seq,
        command: &mut Command<RefKernel>,
        sync_point: bool,
    ) -> Result<(), HalError> {
        self.queue.launch(seq, command, sync_point)
    }

    fn record_sync(&self) -> Result<(), HalError> {
        self.queue.record_sync()
    }

    fn completed(&self) -> Seq {
        self.queue.completed()
    }

    fn synchronize(&self, upto: Seq) -> Result<(), HalError> {
        while let Err(e) = self.queue.synchronize(upto) {
            match e {
                HalError::WouldBlock(_) => std::thread::sleep(Duration::from_micros(50)),
                other => return Err(other),
            }
        }
        self.times
            .done
            .lock()
            .unwrap()
            .get_or_insert_with(Instant::now);
        let name = std::thread::current().name().unwrap_or("").to_string();
        if name.starts_with("xpreempt-") {
            std::thread::sleep(self.watcher_late);
        } else {
            std::thread::sleep(self.late);
            *self.times.left.lock().unwrap() = Some(Instant::now());
        }
        Ok(())
    }
}

impl ReportSink for Times {
    fn report(&self, _: QueueId, report: QueueReport) {
        if matches!(report, QueueReport::Idle { .. }) {
            self.idle.lock().unwrap().get_or_insert_with(Instant::now);
        }
    }

    fn wants_work(&self) -> bool {
        false
    }

    fn idle_from_waiter(&self, _: QueueId) -> bool {
        self.from_waiter
    }
}

/// A queue on `dev` whose synchronize returns `late` to the application's waiter and
/// `watcher_late` to the completion watcher, reporting to `times`.
fn slow_queue(
    dev: &RefDevice,
    config: QueueConfig,
    late: Duration,
    watcher_late: Duration,
    times: &Arc<Times>,
) -> SharedXQueue<SlowReturn> {
    let hal = SlowReturn {
        queue: dev.create_queue(Level::Lv1),
        late,
        watcher_late,
        times: times.clone(),
    };
    SharedXQueue::new(
        XQueue::new(QueueId(1), config, hal.max_level()),
        hal,
        Some(times.clone()),
    )
}

/// How long a call on the queue may hold its Idle back after the drain (the threaded queue's
/// bound).
const CALL_HOLD_MAX: Duration = Duration::from_millis(10);

/// The Idle's time, less the time the waiter (whose synchronize returns `late`) left the driver,
/// and less the time it saw the completion.
fn idle_against_the_wait(gap: Duration, late: Duration) -> (i128, Duration) {
    let dev = RefDevice::new();
    let _clock = WallClock::start(&dev);
    let times = Arc::new(Times::default());
    let config = QueueConfig::new(4, 2, Level::Lv1)
        .unwrap()
        .with_burst_gap(gap.as_nanos() as u64);
    let q = slow_queue(&dev, config, late, Duration::ZERO, &times);
    let seq = q.submit(kernel()).unwrap();
    q.wait(seq).unwrap();
    assert!(within(|| times.idle.lock().unwrap().is_some()), "no Idle");
    let at = |m: &Mutex<Option<Instant>>| m.lock().unwrap().expect("the waiter synchronized");
    let (idle, left, done) = (at(&times.idle), at(&times.left), at(&times.done));
    let signed = |a: Instant, b: Instant| match a.checked_duration_since(b) {
        Some(d) => d.as_nanos() as i128,
        None => -((b - a).as_nanos() as i128),
    };
    (signed(idle, left), idle.saturating_duration_since(done))
}

#[test]
fn the_idle_waits_for_a_waiter_that_saw_the_completion_to_return() {
    // Held up 3 ms, inside the 10 ms a call may hold the Idle back after the drain: the Idle
    // comes once the waiter left, or (a waiter the host kept off its CPU that long) at the bound.
    let (after_left, after_done) =
        idle_against_the_wait(Duration::from_micros(20), Duration::from_millis(3));
    assert!(
        after_left >= 0 || after_done >= CALL_HOLD_MAX,
        "Idle {after_left} ns after the waiter left, {after_done:?} after the completion"
    );
    // Without the gap, the watcher reports it while the waiter is still held up (50 ms).
    let (after_left, _) = idle_against_the_wait(Duration::ZERO, Duration::from_millis(50));
    assert!(after_left < 0, "Idle {after_left} ns after the waiter left");
}

/// Whether the queue's Idle had been reported when the waiter returned, the watcher's wake-up
/// being 50 ms late.
fn idle_before_the_wait_returns(from_waiter: bool) -> bool {
    let dev = RefDevice::new();
    let _clock = WallClock::start(&dev);
    let times = Arc::new(Times {
        from_waiter,
        ..Times::default()
    });
    let config = QueueConfig::new(4, 2, Level::Lv1).unwrap();
    let q = slow_queue(
        &dev,
        config,
        Duration::ZERO,
        Duration::from_millis(50),
        &times,
    );
    let seq = q.submit(kernel()).unwrap();
    q.wait(seq).unwrap();
    let reported = times.idle.lock().unwrap().is_some();
    assert!(within(|| times.idle.lock().unwrap().is_some()), "no Idle");
    reported
}

#[test]
fn a_sink_that_asks_gets_the_idle_from_the_waiter() {
    assert!(idle_before_the_wait_returns(true));
    // Otherwise the watcher reports it, once it has woken.
    assert!(!idle_before_the_wait_returns(false));
}

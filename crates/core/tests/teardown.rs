//! A queue's last owner may let go of it on the queue's own completion watcher (an agent or
//! scheduler dropped by the application while the watcher reports to it): the queue goes away
//! without the watcher waiting for itself.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use xpreempt_core::sched::QueueReport;
use xpreempt_core::xqueue::threaded::{ReportSink, SharedXQueue};
use xpreempt_core::{Command, CommandProps, HwQueue, Level, QueueConfig, QueueId, XQueue};
use xpreempt_hal::reference::{RefDevice, RefKernel, RefQueue, WallClock};

/// Holds the only other reference to the queue and drops it when the queue reports Idle, on
/// whichever thread reports.
#[derive(Default)]
struct LastOwner {
    queue: Mutex<Option<Arc<SharedXQueue<RefQueue>>>>,
    dropped_on: Mutex<Option<String>>,
}

impl ReportSink for LastOwner {
    fn report(&self, _: QueueId, report: QueueReport) {
        if matches!(report, QueueReport::Idle { .. }) {
            let queue = self.queue.lock().unwrap().take();
            drop(queue);
            let name = std::thread::current().name().unwrap_or("").to_string();
            *self.dropped_on.lock().unwrap() = Some(name);
        }
    }
    fn wants_work(&self) -> bool {
        false
    }
}

#[test]
fn a_queue_dropped_on_its_own_watcher_goes_away_cleanly() {
    let dev = RefDevice::new();
    let _clock = WallClock::start(&dev);
    let owner = Arc::new(LastOwner::default());
    let hal = dev.create_queue(Level::Lv1);
    let queue = Arc::new(SharedXQueue::new(
        XQueue::new(QueueId(3), QueueConfig::default(), hal.max_level()),
        hal,
        Some(owner.clone()),
    ));
    *owner.queue.lock().unwrap() = Some(queue.clone());
    let kernel = Command::kernel(RefKernel {
        blocks: 1,
        block_ns: 2_000_000,
    })
    .with_props(CommandProps::new(false, true, false));
    queue.submit(kernel).unwrap();
    drop(queue);
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(5) && owner.dropped_on.lock().unwrap().is_none() {
        std::thread::sleep(Duration::from_millis(1));
    }
    let on = owner.dropped_on.lock().unwrap().clone();
    assert_eq!(
        on.as_deref(),
        Some("xpreempt-q3"),
        "the drop did not finish"
    );
}

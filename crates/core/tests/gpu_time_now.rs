//! `Preemptible::gpu_time` of a shared queue reads its measurements on the queue's own clock:
//! the busy fraction of a queue that went idle keeps fading, as an operator watching it expects,
//! while the GPU time of one command stays what its completions measured.

use std::time::Duration;
use xpreempt_core::xqueue::threaded::{Preemptible, SharedXQueue};
use xpreempt_core::{Command, CommandProps, HwQueue, Level, QueueConfig, QueueId, XQueue};
use xpreempt_hal::reference::{RefDevice, RefKernel, WallClock};

#[test]
fn an_idle_queue_s_busy_fraction_fades_while_its_command_time_stays() {
    let dev = RefDevice::new();
    let _clock = WallClock::start(&dev);
    let hal = dev.create_queue(Level::Lv1);
    let config = QueueConfig::new(4, 1, Level::Lv1).unwrap();
    let q = SharedXQueue::new(XQueue::new(QueueId(1), config, hal.max_level()), hal, None);
    let block_ns = 5_000_000;
    for _ in 0..20 {
        let k = Command::kernel(RefKernel {
            blocks: 1,
            block_ns,
        })
        .with_props(CommandProps::new(false, true, false));
        q.submit(k).unwrap();
    }
    q.wait_all().unwrap();
    let busy = q.gpu_time();
    // 100 ms of back-to-back work on a wall clock: about 1 - e^-0.1 of the last second.
    assert!(busy.busy_fraction > 0.05, "{busy:?}");
    let per = busy.per_command_ns.expect("commands were measured");
    // Completions are seen by a watcher on a loaded machine, a little late or in pairs: the
    // average lands near the kernel's length, not exactly on it.
    assert!(
        (block_ns / 2..block_ns * 3).contains(&per),
        "one command is {per} ns, its kernel {block_ns} ns"
    );
    std::thread::sleep(Duration::from_millis(700));
    let later = q.gpu_time();
    assert!(
        later.busy_fraction < busy.busy_fraction * 0.6,
        "idle for 0.7 s: {} then {}",
        busy.busy_fraction,
        later.busy_fraction
    );
    assert_eq!(later.per_command_ns, busy.per_command_ns);
    // As of its last event the queue still says what it said when it went idle.
    let stale = Preemptible::stats(&q).gpu.last_summary();
    assert!(stale.busy_fraction > later.busy_fraction, "{stale:?}");
}

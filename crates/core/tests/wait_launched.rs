//! `wait_launched_within`: a buffer that cannot go out (its queue is suspended) ends the wait at
//! its limit; once the queue is resumed, the wait sees the buffer out.

use std::time::{Duration, Instant};
use xpreempt_core::xqueue::threaded::{Preemptible, SharedXQueue};
use xpreempt_core::{Command, CommandProps, HwQueue, Level, QueueConfig, QueueId, XQueue};
use xpreempt_hal::reference::{RefDevice, RefKernel, WallClock};

#[test]
fn a_bounded_wait_for_the_buffer_ends_at_its_limit_and_sees_a_resumed_queue_empty_it() {
    let dev = RefDevice::new();
    let _clock = WallClock::start(&dev);
    let hal = dev.create_queue(Level::Lv1);
    let config = QueueConfig::new(4, 2, Level::Lv1).unwrap();
    let q = SharedXQueue::new(XQueue::new(QueueId(1), config, hal.max_level()), hal, None);
    q.suspend().unwrap();
    let kernel = Command::kernel(RefKernel {
        blocks: 1,
        block_ns: 100_000,
    })
    .with_props(CommandProps::new(false, true, false));
    let seq = q.submit(kernel).unwrap();
    assert_eq!(q.pending_len(), 1, "a suspended queue buffers");

    let t = Instant::now();
    assert!(!q.wait_launched_within(Duration::from_millis(20)));
    let waited = t.elapsed();
    assert!(
        (Duration::from_millis(20)..Duration::from_secs(2)).contains(&waited),
        "waited {waited:?} for a limit of 20 ms"
    );

    q.resume().unwrap();
    assert!(q.wait_launched_within(Duration::from_secs(5)));
    assert_eq!(q.pending_len(), 0);
    q.wait(seq).unwrap();
}

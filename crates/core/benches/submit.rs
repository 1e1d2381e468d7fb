//! Cost of the submit hot path, on a hardware queue that costs nothing, so what is measured is
//! xpreempt's own overhead per command: the state machine alone, and through the threaded queue
//! (lock + window check + launch on the caller's thread).

use criterion::{Criterion, criterion_group, criterion_main};
use std::hint::black_box;
use std::sync::atomic::{AtomicU64, Ordering};
use xpreempt_core::xqueue::threaded::SharedXQueue;
use xpreempt_core::{Command, HalError, HwQueue, Level, QueueConfig, QueueId, Seq, XQueue};

/// Completes every command the moment it is launched.
#[derive(Default)]
struct Instant {
    launched: AtomicU64,
}

impl HwQueue for Instant {
    type Payload = u64;
    fn max_level(&self) -> Level {
        Level::Lv1
    }
    fn launch(&self, _: Seq, c: &mut Command<u64>, _: bool) -> Result<(), HalError> {
        black_box(&c.op);
        self.launched.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }
    fn record_sync(&self) -> Result<(), HalError> {
        Ok(())
    }
    fn completed(&self) -> Seq {
        self.launched.load(Ordering::Relaxed)
    }
    fn synchronize(&self, _: Seq) -> Result<(), HalError> {
        Ok(())
    }
}

fn submit(c: &mut Criterion) {
    let hal = Instant::default();
    let mut q = XQueue::new(QueueId(0), QueueConfig::default(), Level::Lv1);
    let mut now = 0;
    c.bench_function("xqueue_submit_and_poll", |b| {
        b.iter(|| {
            now += 1;
            let s = q.submit(&hal, Command::kernel(now), || now).ok();
            black_box(s);
            black_box(q.poll(&hal, now).ok());
        })
    });

    let shared = SharedXQueue::new(
        XQueue::new(QueueId(1), QueueConfig::default(), Level::Lv1),
        Instant::default(),
        None,
    );
    let mut n = 0;
    c.bench_function("shared_xqueue_submit", |b| {
        b.iter(|| {
            n += 1;
            black_box(shared.submit(Command::kernel(n)).ok());
        })
    });
}

criterion_group!(benches, submit);
criterion_main!(benches);

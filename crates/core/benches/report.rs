//! What a latency-critical queue's Ready and Idle cost its reporting thread in local mode while
//! the preemption thread spins (a best-effort queue below it has work): the decision, and the
//! cache lines the reporting thread shares with the spinning thread. The queues' hardware costs
//! nothing here, and the pauses between reports (excluded from the timing) let the spinning
//! thread settle back into its loop, as between an application's launches.

use criterion::{Criterion, criterion_group, criterion_main};
use std::sync::Arc;
use std::time::{Duration, Instant};
use xpreempt_core::sched::local::LocalScheduler;
use xpreempt_core::sched::{QueueInfo, QueueReport, Scheduler};
use xpreempt_core::stats::QueueStats;
use xpreempt_core::xqueue::QueueOpError;
use xpreempt_core::xqueue::threaded::Preemptible;
use xpreempt_core::{QueueId, policy};

struct Free(u32);

impl Preemptible for Free {
    fn queue_id(&self) -> QueueId {
        QueueId(self.0)
    }
    fn suspend(&self) -> Result<Option<QueueReport>, QueueOpError> {
        Ok(None)
    }
    fn resume(&self) -> Result<Option<QueueReport>, QueueOpError> {
        Ok(None)
    }
    fn set_refused(&self, _: bool) {}
    fn stats(&self) -> QueueStats {
        QueueStats::default()
    }
}

fn report(c: &mut Criterion) {
    let sched = LocalScheduler::start(Scheduler::new(policy::by_name("hpf").unwrap())).unwrap();
    let (low, high) = (QueueId(0), QueueId(1));
    sched
        .register(QueueInfo::new(low, 1), Arc::new(Free(0)))
        .unwrap();
    sched
        .register(QueueInfo::new(high, 9), Arc::new(Free(1)))
        .unwrap();
    let sink = sched.sink();
    sink.report(
        low,
        QueueReport::Ready {
            pending: 1,
            generation: 1,
        },
    );
    let mut generation = 1;
    c.bench_function("local_ready_then_idle_beside_a_spinning_preempter", |b| {
        b.iter_custom(|iters| {
            // Criterion pauses between batches, longer than the preemption thread stays hot.
            let cold = Instant::now();
            while !sched.preemption_thread_spins() {
                assert!(
                    cold.elapsed() < Duration::from_secs(5),
                    "the preemption thread does not spin"
                );
                generation += 2;
                sink.report(
                    high,
                    QueueReport::Ready {
                        pending: 1,
                        generation: generation - 1,
                    },
                );
                sink.report(high, QueueReport::Idle { generation });
                std::thread::sleep(Duration::from_micros(100));
            }
            let mut spent = Duration::ZERO;
            for _ in 0..iters {
                sink.submitting(high);
                std::thread::sleep(Duration::from_micros(5));
                generation += 1;
                let t = Instant::now();
                sink.report(
                    high,
                    QueueReport::Ready {
                        pending: 1,
                        generation,
                    },
                );
                spent += t.elapsed();
                std::thread::sleep(Duration::from_micros(20));
                generation += 1;
                let t = Instant::now();
                sink.report(high, QueueReport::Idle { generation });
                spent += t.elapsed();
                std::thread::sleep(Duration::from_micros(50));
            }
            spent
        })
    });
}

criterion_group!(benches, report);
criterion_main!(benches);

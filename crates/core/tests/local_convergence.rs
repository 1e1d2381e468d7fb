//! Local mode under concurrent reports: whatever order the queues' threads report in, and
//! whichever thread (a reporting one, the preemption thread) makes a suspension or resumption,
//! once the reports stop every queue is stopped or running as the policy wants it. A stop or a
//! restart that lands late must not stay in force.

mod common;

use common::{ThreadProbe, ready, within};
use proptest::prelude::*;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;
use xpreempt_core::sched::local::LocalScheduler;
use xpreempt_core::sched::{DEFAULT_HOT, QueueInfo, QueueReport, Scheduler};
use xpreempt_core::xqueue::threaded::ReportSink;
use xpreempt_core::{QueueId, policy};

const PRIORITIES: [i32; 3] = [1, 5, 9];

/// What HPF wants of queue `q` once `active` says which queues have work: the highest active
/// queue runs, and so does an idle queue above it; with nothing active, everything runs.
fn hpf_stops(q: usize, active: &[bool; 3]) -> bool {
    let Some(top) = (0..3).filter(|&i| active[i]).map(|i| PRIORITIES[i]).max() else {
        return false;
    };
    let runs = (active[q] && PRIORITIES[q] == top) || (!active[q] && PRIORITIES[q] > top);
    !runs
}

/// One queue's thread: `toggles` reports alternating Ready (announced first where `announce`
/// says so) and Idle, `gap_us` apart.
fn report_from_its_thread(
    sink: Arc<dyn ReportSink>,
    q: usize,
    toggles: Vec<(bool, u64)>,
) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        let id = QueueId(q as u32);
        for (i, (announce, gap_us)) in toggles.into_iter().enumerate() {
            let generation = i as u64 + 1;
            if i % 2 == 0 {
                if announce {
                    sink.submitting(id);
                }
                sink.report(id, ready(generation));
            } else {
                sink.report(id, QueueReport::Idle { generation });
            }
            std::thread::sleep(Duration::from_micros(gap_us));
        }
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(96))]

    #[test]
    fn once_reports_stop_every_queue_is_as_the_policy_wants_it(
        toggles in proptest::array::uniform3(
            proptest::collection::vec((any::<bool>(), 0u64..150), 1..12)
        ),
        spinning in any::<bool>(),
        op_us in prop_oneof![Just(0u64), 50u64..400],
    ) {
        let hot = if spinning { DEFAULT_HOT } else { Duration::ZERO };
        let sched = LocalScheduler::start_with(
            Scheduler::new(policy::by_name("hpf").unwrap()),
            hot,
        )
        .unwrap();
        let probes: Vec<Arc<ThreadProbe>> = (0..3)
            .map(|i| Arc::new(ThreadProbe { id: i, ..ThreadProbe::default() }))
            .collect();
        for p in &probes {
            p.op_us.store(op_us, Ordering::SeqCst);
        }
        for (i, p) in probes.iter().enumerate() {
            sched
                .register(QueueInfo::new(QueueId(i as u32), PRIORITIES[i]), p.clone())
                .unwrap();
        }
        // A queue that reported an odd number of times last said Ready.
        let active = [0, 1, 2].map(|q| toggles[q].len() % 2 == 1);
        let threads: Vec<_> = toggles
            .into_iter()
            .enumerate()
            .map(|(q, t)| report_from_its_thread(sched.sink(), q, t))
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        let settled = within(|| {
            (0..3).all(|q| probes[q].suspended.load(Ordering::SeqCst) == hpf_stops(q, &active))
        });
        let seen: Vec<bool> = probes.iter().map(|p| p.suspended.load(Ordering::SeqCst)).collect();
        let wanted: Vec<bool> = (0..3).map(|q| hpf_stops(q, &active)).collect();
        prop_assert!(settled, "active {active:?}: stopped {seen:?}, wanted {wanted:?}");
    }
}

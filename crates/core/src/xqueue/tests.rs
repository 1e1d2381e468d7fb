use super::*;
use proptest::prelude::*;
use xpreempt_hal::reference::{RefDevice, RefKernel, RefQueue};
use xpreempt_types::{Command, CommandProps};

fn kernel(blocks: u32, block_ns: Nanos) -> Command<RefKernel> {
    Command::kernel(RefKernel { blocks, block_ns })
}

fn setup(level: Level, threshold: u32, batch: u32) -> (RefDevice, RefQueue, XQueue<RefKernel>) {
    let dev = RefDevice::new();
    let hal = dev.create_queue(level);
    let q = XQueue::new(
        hal.queue_id(),
        QueueConfig::new(threshold, batch, level).unwrap(),
        hal.max_level(),
    );
    (dev, hal, q)
}

#[test]
fn submit_launches_directly_until_the_window_is_full() {
    let (dev, hal, mut q) = setup(Level::Lv1, 4, 2);
    let first = q.submit(&hal, kernel(1, 100), || 0).unwrap();
    assert_eq!(
        first,
        Submitted {
            seq: 0,
            report: Some(QueueReport::Ready {
                pending: 0,
                generation: 1
            })
        }
    );
    for _ in 1..10 {
        assert_eq!(q.submit(&hal, kernel(1, 100), || 0).unwrap().report, None);
    }
    assert_eq!((q.in_flight_len(), q.pending_len()), (4, 6));
    assert_eq!(dev.launch_order().len(), 4);
    assert_eq!(q.state(), QueueState::Running);
    let mut t = 0;
    let mut idle = None;
    while idle.is_none() {
        t = dev.next_event().unwrap();
        dev.advance_to(t);
        idle = q.poll(&hal, t).unwrap();
        assert!(q.in_flight_len() <= 4);
    }
    assert_eq!((t, q.completed(), q.state()), (1_000, 10, QueueState::Idle));
}

#[test]
fn the_watcher_plan_waits_for_sync_points_then_the_tail() {
    let (_dev, hal, mut q) = setup(Level::Lv1, 4, 2);
    assert_eq!(q.wait_plan(), WaitPlan::Nothing);
    q.submit(&hal, kernel(1, 10), || 0).unwrap();
    assert_eq!(q.wait_plan(), WaitPlan::RecordSyncThenSynchronize(1));
    for _ in 0..5 {
        q.submit(&hal, kernel(1, 10), || 0).unwrap();
    }
    // Sync points after commands 1 and 3; the window is full with work pending.
    assert_eq!(q.wait_plan(), WaitPlan::Synchronize(2));
    q.record_sync(&hal).unwrap();
    assert_eq!(q.wait_plan(), WaitPlan::Synchronize(2));
}

#[test]
fn a_waiter_gets_a_sync_point_that_covers_its_command() {
    let (_dev, hal, mut q) = setup(Level::Lv3, 8, 4);
    for _ in 0..6 {
        q.submit(&hal, kernel(1, 10), || 0).unwrap();
    }
    // Sync point after command 3 (watermark 4); nothing covers 4 and 5 yet.
    assert_eq!(q.sync_target(&hal, 2).unwrap(), Some(4));
    assert_eq!(q.sync_target(&hal, 5).unwrap(), Some(6));
    assert_eq!(
        q.sync_target(&hal, 4).unwrap(),
        Some(6),
        "the new sync point covers it"
    );
    assert_eq!(q.sync_target(&hal, 6).unwrap(), None, "not submitted");
    q.suspend(&hal, 0).unwrap();
    assert_eq!(
        q.sync_target(&hal, 2).unwrap(),
        None,
        "stopped work does not complete"
    );
}

#[test]
fn idle_is_reported_even_when_suspend_or_resume_saw_the_last_completion() {
    let (dev, hal, mut q) = setup(Level::Lv1, 4, 2);
    q.submit(&hal, kernel(1, 100), || 0).unwrap();
    dev.advance_to(100);
    q.suspend(&hal, 100).unwrap(); // takes in the completion itself
    assert!(q.is_idle());
    assert_eq!(
        q.poll(&hal, 100).unwrap(),
        Some(QueueReport::Idle { generation: 2 })
    );
    assert_eq!(q.poll(&hal, 100).unwrap(), None, "reported once");

    q.resume(&hal, 150).unwrap();
    q.submit(&hal, kernel(1, 100), || 0).unwrap();
    dev.advance_to(300);
    q.suspend(&hal, 300).unwrap();
    q.resume(&hal, 300).unwrap();
    assert_eq!(q.take_report(), Some(QueueReport::Idle { generation: 4 }));
    assert_eq!(q.transitions(), 4, "ready, idle, ready, idle");
}

#[test]
fn a_lv1_suspension_drains_the_window_and_measures_it() {
    let (dev, hal, mut q) = setup(Level::Lv1, 2, 1);
    for _ in 0..5 {
        q.submit(&hal, kernel(1, 100), || 0).unwrap();
    }
    assert!(q.suspend(&hal, 10).unwrap());
    assert!(!q.suspend(&hal, 10).unwrap(), "a second suspend is a no-op");
    dev.advance_to(200);
    q.poll(&hal, 200).unwrap();
    assert_eq!(
        (q.completed(), q.in_flight_len(), q.pending_len()),
        (2, 0, 3)
    );
    assert_eq!(
        dev.launch_order().len(),
        2,
        "a suspended queue launches nothing"
    );
    assert_eq!(q.stats().suspend_latency.summary().max, 190);
    assert!(q.resume(&hal, 500).unwrap());
    assert_eq!(dev.launch_order().len(), 4);
}

#[test]
fn lv3_stops_at_once_and_resumes_where_it_stopped() {
    let (dev, hal, mut q) = setup(Level::Lv3, 4, 2);
    q.submit(&hal, kernel(2, 100), || 0).unwrap();
    dev.advance_to(150);
    q.suspend(&hal, 150).unwrap();
    dev.advance_to(10_000);
    assert_eq!(q.poll(&hal, 10_000).unwrap(), None);
    assert_eq!(q.completed(), 0);
    q.resume(&hal, 10_000).unwrap();
    dev.advance_to(10_050);
    assert!(matches!(
        q.poll(&hal, 10_050).unwrap(),
        Some(QueueReport::Idle { .. })
    ));
    assert_eq!(dev.block_runs(&hal, 0), vec![1, 1]);
    assert_eq!(q.stats().suspend_latency.summary().max, 0);
}

#[test]
fn lv3_interrupts_only_commands_longer_than_an_interrupt_takes() {
    // (command length, measured interrupt cost, whether the suspension interrupts)
    for (block_ns, cost, interrupts) in [
        (100_000, Some(300_000), false),
        (1_000_000, Some(300_000), true),
        (100_000, None, true),
    ] {
        let (dev, hal, mut q) = setup(Level::Lv3, 4, 2);
        hal.set_interrupt_cost(cost);
        for _ in 0..4 {
            q.submit(&hal, kernel(1, block_ns), || 0).unwrap();
        }
        run_to_idle(&dev, &hal, &mut q);
        assert_eq!(q.stats().gpu.per_command_ns(), Some(block_ns));
        let t0 = dev.now();
        q.submit(&hal, kernel(1, block_ns), || t0).unwrap();
        dev.advance_to(t0 + block_ns / 2);
        q.suspend(&hal, t0 + block_ns / 2).unwrap();
        dev.advance_to(t0 + 10 * block_ns);
        q.poll(&hal, t0 + 10 * block_ns).unwrap();
        let case = format!("{block_ns} ns commands, interrupt {cost:?}");
        assert_eq!(q.completed(), if interrupts { 4 } else { 5 }, "{case}");
        q.resume(&hal, t0 + 10 * block_ns).unwrap();
        dev.advance_to(t0 + 20 * block_ns);
        q.poll(&hal, t0 + 20 * block_ns).unwrap();
        assert_eq!(q.completed(), 5, "{case}: each command ran once");
        assert_eq!(dev.block_runs(&hal, 4), vec![1], "{case}");
        // The stop is timed under the mechanism that made it.
        let (stops, drains) = (
            q.stats().suspend_latency.count(),
            q.stats().drain_latency.count(),
        );
        assert_eq!(
            (stops, drains),
            if interrupts { (1, 0) } else { (0, 1) },
            "{case}"
        );
    }
}

#[test]
fn the_level_is_capped_by_the_hardware() {
    let dev = RefDevice::new();
    let hal = dev.create_queue(Level::Lv1);
    let q: XQueue<RefKernel> = XQueue::new(QueueId(0), QueueConfig::default(), hal.max_level());
    assert_eq!(q.level(), Level::Lv1);
}

#[test]
fn a_refused_launch_gives_the_command_back() {
    let (_dev, hal, mut q) = setup(Level::Lv1, 4, 2);
    let err = q.submit(&hal, kernel(0, 1), || 0).unwrap_err();
    assert!(matches!(err.source, HalError::Refused { .. }));
    assert!(matches!(
        err.command.op,
        xpreempt_types::Op::Kernel(RefKernel { blocks: 0, .. })
    ));
    assert_eq!(q.next_seq(), 0, "the failed command did not take a number");
}

#[derive(Clone, Debug)]
enum Step {
    Submit {
        queue: usize,
        blocks: u32,
        block_ns: Nanos,
        deactivatable: bool,
    },
    Suspend(usize),
    Resume(usize),
    Advance(Nanos),
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        4 => (0..2usize, 1..4u32, 1..300u64, any::<bool>()).prop_map(|(queue, blocks, block_ns, deactivatable)| Step::Submit { queue, blocks, block_ns, deactivatable }),
        1 => (0..2usize).prop_map(Step::Suspend),
        1 => (0..2usize).prop_map(Step::Resume),
        3 => (1..500u64).prop_map(Step::Advance),
    ]
}

fn level() -> impl Strategy<Value = Level> {
    prop_oneof![Just(Level::Lv1), Just(Level::Lv2), Just(Level::Lv3)]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Exactly once, in order, and nothing launched while suspended, at every level; at Lv3
    /// with interrupt costs that make some suspensions interrupt and others drain.
    #[test]
    fn random_interleavings_keep_the_invariants(level in level(), threshold in 1..6u32, costs in proptest::collection::vec(proptest::option::of(1..600u64), 2), steps in proptest::collection::vec(step(), 1..80)) {
        let batch = 1 + threshold / 2;
        let dev = RefDevice::new();
        let hals: Vec<RefQueue> = (0..2).map(|_| dev.create_queue(level)).collect();
        for (h, &cost) in hals.iter().zip(&costs) {
            h.set_interrupt_cost(cost);
        }
        let mut qs: Vec<XQueue<RefKernel>> = hals.iter().map(|h| XQueue::new(h.queue_id(), QueueConfig::new(threshold, batch, level).unwrap(), level)).collect();
        let mut now = 0;
        let launched = |dev: &RefDevice, i: usize| dev.launch_order().iter().filter(|(q, _)| *q as usize == i).count();
        let mut frozen: [Option<usize>; 2] = [None, None];
        for s in steps {
            match s {
                Step::Submit { queue, blocks, block_ns, deactivatable } => {
                    let cmd = kernel(blocks, block_ns).with_props(CommandProps::new(false, deactivatable, false));
                    qs[queue].submit(&hals[queue], cmd, || 0).unwrap();
                }
                Step::Suspend(i) => {
                    qs[i].suspend(&hals[i], now).unwrap();
                    frozen[i] = Some(launched(&dev, i));
                }
                Step::Resume(i) => {
                    qs[i].resume(&hals[i], now).unwrap();
                    frozen[i] = None;
                }
                Step::Advance(dt) => {
                    now += dt;
                    dev.advance_to(now);
                    for (q, h) in qs.iter_mut().zip(&hals) {
                        q.poll(h, now).unwrap();
                    }
                }
            }
            for i in 0..2 {
                if let Some(n) = frozen[i] {
                    prop_assert_eq!(launched(&dev, i), n, "suspended queue {} launched", i);
                }
                prop_assert!(qs[i].in_flight_len() <= threshold as usize);
                let on_device = launched(&dev, i) as u64 - hals[i].completed();
                prop_assert!(on_device <= threshold as u64, "queue {} has {} on the device", i, on_device);
            }
        }
        for (q, h) in qs.iter_mut().zip(&hals) {
            q.resume(h, now).unwrap();
        }
        while let Some(t) = dev.next_event() {
            now = t;
            dev.advance_to(t);
            for (q, h) in qs.iter_mut().zip(&hals) {
                q.poll(h, now).unwrap();
            }
        }
        for (i, (q, h)) in qs.iter().zip(&hals).enumerate() {
            prop_assert!(q.is_idle());
            prop_assert_eq!(q.completed(), q.next_seq());
            for seq in 0..q.next_seq() {
                let runs = dev.block_runs(h, seq);
                prop_assert!(!runs.is_empty() && runs.iter().all(|&r| r == 1), "queue {} command {} ran {:?}", i, seq, runs);
            }
            let order: Vec<Seq> = dev.launch_order().iter().filter(|(q, _)| *q as usize == i).map(|&(_, s)| s).collect();
            prop_assert!(order.windows(2).all(|w| w[0] + 1 == w[1]), "queue {} launch order {:?}", i, order);
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Reports alternate Ready/Idle, an Idle comes only while the queue is drained, and a
    /// drained queue reports it in the end. So too for a queue whose Ready waits for a wait
    /// (`waits`: the application waits after every so many steps).
    #[test]
    fn a_queue_reports_idle_when_drained_and_always(
        steps in proptest::collection::vec(step(), 1..80),
        waits in proptest::option::of(1..5usize),
    ) {
        let dev = RefDevice::new();
        let hal = dev.create_queue(Level::Lv1);
        let config = QueueConfig::new(3, 2, Level::Lv1).unwrap();
        let config = if waits.is_some() { config.with_ready_when_waited() } else { config };
        let mut q = XQueue::new(hal.queue_id(), config, hal.max_level());
        let mut now = 0;
        let mut reports = Vec::new();
        let mut check = |q: &mut XQueue<RefKernel>, first: Option<QueueReport>, now: Nanos| -> Result<(), TestCaseError> {
            for r in first.into_iter().chain(q.take_report()) {
                if matches!(r, QueueReport::Idle { .. }) {
                    prop_assert!(q.is_idle(), "Idle at {} while the queue holds work", now);
                }
                reports.push(r);
            }
            Ok(())
        };
        for (n, s) in steps.into_iter().enumerate() {
            if waits.is_some_and(|k| n % k == 0) {
                let r = q.waited();
                check(&mut q, r, now)?;
            }
            let first = match s {
                Step::Submit { blocks, block_ns, .. } => q.submit(&hal, kernel(blocks, block_ns), || 0).unwrap().report,
                Step::Suspend(_) => {
                    q.suspend(&hal, now).unwrap();
                    None
                }
                Step::Resume(_) => {
                    q.resume(&hal, now).unwrap();
                    None
                }
                Step::Advance(dt) => {
                    now += dt;
                    dev.advance_to(now);
                    q.poll(&hal, now).unwrap()
                }
            };
            check(&mut q, first, now)?;
        }
        q.resume(&hal, now).unwrap();
        while let Some(t) = dev.next_event() {
            now = t;
            dev.advance_to(t);
            let r = q.poll(&hal, now).unwrap();
            check(&mut q, r, now)?;
        }
        let r = q.poll(&hal, now).unwrap();
        check(&mut q, r, now)?;
        for (i, r) in reports.iter().enumerate() {
            let ready = matches!(r, QueueReport::Ready { .. });
            prop_assert_eq!(ready, i % 2 == 0, "report {} is {:?}", i, r);
        }
        prop_assert!(reports.len() % 2 == 0, "the drained queue never reported Idle: {:?}", reports);
    }
}

fn waiting_queue() -> (RefDevice, RefQueue, XQueue<RefKernel>) {
    let dev = RefDevice::new();
    let hal = dev.create_queue(Level::Lv1);
    let config = QueueConfig::new(4, 2, Level::Lv1)
        .unwrap()
        .with_ready_when_waited();
    let q = XQueue::new(hal.queue_id(), config, hal.max_level());
    (dev, hal, q)
}

#[test]
fn a_queue_ready_when_waited_reports_a_burst_only_once_it_is_waited_for() {
    let (dev, hal, mut q) = waiting_queue();
    // A burst nobody waits for runs and ends without a report.
    assert_eq!(q.submit(&hal, kernel(1, 100), || 0).unwrap().report, None);
    assert_eq!(run_to_idle(&dev, &hal, &mut q), 0);
    assert_eq!((q.take_report(), q.transitions()), (None, 0));
    // Waited for: Ready at once, and it stands until the queue is idle.
    for _ in 0..2 {
        assert_eq!(q.submit(&hal, kernel(1, 100), || 0).unwrap().report, None);
    }
    let ready = QueueReport::Ready {
        pending: 0,
        generation: 1,
    };
    assert_eq!(q.waited(), Some(ready));
    assert_eq!(q.waited(), None);
    assert_eq!(
        poll_next(&dev, &hal, &mut q),
        None,
        "one command is still in flight"
    );
    assert_eq!(
        poll_next(&dev, &hal, &mut q),
        Some(QueueReport::Idle { generation: 2 })
    );
    // The wait was this burst's: the next one starts unreported again, and a wait on an idle
    // queue is not carried over to it.
    assert_eq!(q.waited(), None);
    assert_eq!(q.submit(&hal, kernel(1, 100), || 0).unwrap().report, None);
}

#[test]
fn work_held_back_by_a_suspension_reports_ready_without_a_wait() {
    let (dev, hal, mut q) = waiting_queue();
    q.suspend(&hal, 0).unwrap();
    let held = q.submit(&hal, kernel(1, 100), || 0).unwrap().report;
    assert_eq!(
        held,
        Some(QueueReport::Ready {
            pending: 1,
            generation: 1
        })
    );
    q.resume(&hal, 0).unwrap();
    assert_eq!(q.pending_len(), 0);
    assert_eq!(
        q.take_report(),
        None,
        "the Ready stands while the work runs"
    );
    assert_eq!(
        poll_next(&dev, &hal, &mut q),
        Some(QueueReport::Idle { generation: 2 })
    );
}

#[test]
fn a_window_found_empty_with_work_buffered_counts_as_run_dry_unless_suspended() {
    let (dev, hal, mut q) = setup(Level::Lv1, 4, 2);
    for _ in 0..20 {
        q.submit(&hal, kernel(1, 100), || 0).unwrap();
    }
    // Looked at only after the whole window completed: the device ran out of this queue's work.
    dev.advance_to(400);
    q.poll(&hal, 400).unwrap();
    assert_eq!((q.stats().ran_dry, q.stats().buffered_launches), (1, 4));
    // Looked at after every completion: never dry.
    let mut t = 400;
    while q.pending_len() > 12 {
        t = dev.next_event().unwrap();
        dev.advance_to(t);
        q.poll(&hal, t).unwrap();
    }
    assert_eq!(q.stats().ran_dry, 1);
    // Drained while suspended (seen before the resume, or by it), then resumed: stopped, not dry.
    for look_while_suspended in [true, false] {
        q.suspend(&hal, t).unwrap();
        t += 1_000;
        dev.advance_to(t);
        if look_while_suspended {
            q.poll(&hal, t).unwrap();
        }
        q.resume(&hal, t).unwrap();
        assert!(q.pending_len() > 0);
        assert_eq!(
            q.stats().ran_dry,
            1,
            "looked while suspended: {look_while_suspended}"
        );
    }
    assert_eq!(q.stats().buffered_launches, 20 - 4 - q.pending_len() as u64);
}

/// Advances the reference device to its next completion and polls the queue there.
fn poll_next(dev: &RefDevice, hal: &RefQueue, q: &mut XQueue<RefKernel>) -> Option<QueueReport> {
    let t = dev.next_event().expect("work in flight completes");
    dev.advance_to(t);
    q.poll(hal, t).unwrap()
}

/// Drives the queue to idle on the reference device; returns the most commands seen in flight
/// after the first completion.
fn run_to_idle(dev: &RefDevice, hal: &RefQueue, q: &mut XQueue<RefKernel>) -> usize {
    let mut most = 0;
    while !q.is_idle() {
        poll_next(dev, hal, q);
        most = most.max(q.in_flight_len());
    }
    most
}

#[test]
fn a_gpu_time_window_bounds_long_commands_in_flight() {
    for (block_ns, most) in [(100_000, 3), (40_000, 7), (1_000_000, 1), (1_000, 16)] {
        let dev = RefDevice::new();
        let hal = dev.create_queue(Level::Lv1);
        let config = QueueConfig::new(16, 8, Level::Lv1)
            .unwrap()
            .with_gpu_window(250_000);
        let mut q = XQueue::new(hal.queue_id(), config, hal.max_level());
        for _ in 0..40 {
            q.submit(&hal, kernel(1, block_ns), || 0).unwrap();
        }
        // Nothing measured yet: one at a time, and that one carries the sync point.
        assert_eq!(q.in_flight_len(), 1, "{block_ns} ns commands");
        assert_eq!(q.wait_plan(), WaitPlan::Synchronize(1));
        assert_eq!(
            run_to_idle(&dev, &hal, &mut q),
            most,
            "{block_ns} ns commands"
        );
        assert_eq!(q.completed(), 40);
        assert_eq!(q.stats().gpu.per_command_ns(), Some(block_ns));
    }
}

#[test]
fn without_a_gpu_time_window_the_count_alone_bounds_the_window() {
    let (dev, hal, mut q) = setup(Level::Lv1, 16, 8);
    for _ in 0..40 {
        q.submit(&hal, kernel(1, 1_000_000), || 0).unwrap();
    }
    assert_eq!(run_to_idle(&dev, &hal, &mut q).max(q.in_flight_len()), 16);
    let gpu = q.stats().gpu.last_summary();
    assert_eq!(gpu.per_command_ns, Some(1_000_000));
    assert_eq!(gpu.measured_commands, 40);
}

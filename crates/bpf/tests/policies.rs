//! The example policies, compiled by clang, driving the hooks as the scheduler calls them.

mod common;

use xpreempt_bpf::{BpfHooks, BpfProgram, ExecMode, Hook, LoadOptions};
use xpreempt_core::OpKind;
use xpreempt_core::sched::{Hooks, QueueInfo, Work};
use xpreempt_core::{Hints, QueueId};

fn queue(id: u32, priority: i32) -> QueueInfo {
    QueueInfo::new(QueueId(id), priority)
}

#[test]
fn lcbe_gives_lc_long_slice_exclusive_and_high_priority() {
    let mut h = BpfHooks::new(common::program("lcbe"));
    let mut lc = queue(1, 5);
    h.task_init(&mut lc);
    assert_eq!(lc.priority, 1005);
    assert_eq!(lc.hints.timeslice_ns, Some(10_000_000_000));
    assert_eq!(lc.interleave, Some(0));
    assert_eq!(lc.hints.latency_critical, Some(true));

    let mut be = queue(2, 0);
    h.task_init(&mut be);
    assert_eq!(be.priority, 0);
    assert_eq!(be.hints.timeslice_ns, Some(200_000));
    assert_eq!(be.interleave, None);
    assert_eq!(be.hints.latency_critical, Some(false));

    // An explicit BE hint beats a high priority.
    let mut hinted = queue(3, 9);
    hinted.hints = Hints {
        latency_critical: Some(false),
        ..Hints::default()
    };
    h.task_init(&mut hinted);
    assert_eq!(hinted.priority, 9);
    assert_eq!(hinted.hints.timeslice_ns, Some(200_000));
    assert!(h.admit(QueueId(1), 3, 1));
    assert!(h.last_error().is_none());
}

#[test]
fn lcbe_adapts_class_from_submit_rate() {
    let mut h = BpfHooks::new(common::program("lcbe"));
    let (fast, slow) = (QueueId(10), QueueId(11));
    h.task_init(&mut queue(10, 0));
    h.task_init(&mut queue(11, 5));
    // fast: 3000 submits in 1.5 s (2000/s); slow: 30 in 1.5 s (20/s).
    for i in 0..=3000u64 {
        h.work_submit(
            fast,
            Work::Submitted {
                kind: OpKind::Kernel,
                seq: i,
            },
            i * 500_000,
        );
    }
    for i in 0..=30u64 {
        h.work_submit(
            slow,
            Work::Submitted {
                kind: OpKind::Kernel,
                seq: i,
            },
            i * 50_000_000,
        );
    }
    let p = h.program().unwrap();
    let ty = p.map("task_type_map").unwrap();
    assert_eq!(
        ty.get(&10u64.to_le_bytes()).unwrap(),
        1u32.to_le_bytes(),
        "fast queue became LC"
    );
    assert_eq!(
        ty.get(&11u64.to_le_bytes()).unwrap(),
        0u32.to_le_bytes(),
        "slow queue became BE"
    );
    // The scheduler reclassifies a queue that becomes ready again: the rate-learned class wins
    // over what the queue declared (priority 0 would be BE, priority 5 LC).
    let fast_now = h.reclassify(&queue(10, 0)).unwrap();
    assert_eq!(fast_now.priority, 1000);
    assert_eq!(fast_now.hints.latency_critical, Some(true));
    assert_eq!(fast_now.interleave, Some(0));
    let slow_now = h.reclassify(&queue(11, 5)).unwrap();
    assert_eq!(slow_now.priority, 5);
    assert_eq!(slow_now.hints.latency_critical, Some(false));
    assert_eq!(slow_now.hints.timeslice_ns, Some(200_000));
    // task_destroy cleans both maps.
    h.task_destroy(fast, 123);
    let p = h.program().unwrap();
    assert!(
        p.map("task_type_map")
            .unwrap()
            .get(&10u64.to_le_bytes())
            .is_err()
    );
    assert!(
        p.map("task_stats_map")
            .unwrap()
            .get(&10u64.to_le_bytes())
            .is_err()
    );
}

#[test]
fn admission_refuses_lc_beyond_n_per_device() {
    let mut h = BpfHooks::new(common::program("admission"));
    for (id, prio, dev) in [(1, 5, 0), (2, 5, 0), (3, 5, 1), (4, 0, 0)] {
        let mut q = queue(id, prio);
        q.device = dev;
        h.task_init(&mut q);
    }
    assert!(h.admit(QueueId(1), 1, 0), "first LC on device 0");
    assert!(h.admit(QueueId(1), 1, 1), "same queue again keeps its slot");
    assert!(!h.admit(QueueId(2), 1, 1), "second LC on device 0 refused");
    assert!(h.admit(QueueId(3), 1, 1), "device 1 has its own slots");
    assert!(h.admit(QueueId(4), 1, 1), "BE queues are never refused");
    h.task_destroy(QueueId(1), 0);
    assert!(h.admit(QueueId(2), 1, 0), "slot freed by task_destroy");
    // N from the config map.
    let cfg = h.program_mut().unwrap().map_mut("config").unwrap();
    cfg.update(&0u32.to_le_bytes(), &3u64.to_le_bytes(), 0)
        .unwrap();
    let mut q5 = queue(5, 5);
    h.task_init(&mut q5);
    assert!(h.admit(QueueId(5), 1, 1), "N raised to 3");
    assert_eq!(h.stats().refusals, 1);
}

#[test]
fn fixed_priority_comes_from_maps() {
    let mut p = common::program("fixed_priority");
    p.map_mut("priorities")
        .unwrap()
        .update(&7u64.to_le_bytes(), &42i32.to_le_bytes(), 0)
        .unwrap();
    p.map_mut("process_priorities")
        .unwrap()
        .update(&300u32.to_le_bytes(), &(-3i32).to_le_bytes(), 0)
        .unwrap();
    let mut h = BpfHooks::new(p);
    let mut a = queue(7, 1);
    a.process = 300;
    h.task_init(&mut a);
    assert_eq!(a.priority, 42, "queue entry wins");
    let mut b = queue(8, 1);
    b.process = 300;
    h.task_init(&mut b);
    assert_eq!(b.priority, -3, "process entry");
    let mut c = queue(9, 1);
    h.task_init(&mut c);
    assert_eq!(c.priority, 1, "unchanged");
    assert!(!h.program().unwrap().has(Hook::Schedule));
}

#[test]
fn get_queue_info_and_trace_see_the_runtime_state() {
    let mut h = BpfHooks::new(common::program("trace_info"));
    let mut q = queue(4, 6);
    q.process = 99;
    q.device = 2;
    h.task_init(&mut q);
    h.work_submit(
        QueueId(4),
        Work::Submitted {
            kind: OpKind::Memcpy,
            seq: 0,
        },
        100,
    );
    h.work_submit(
        QueueId(4),
        Work::Submitted {
            kind: OpKind::Kernel,
            seq: 1,
        },
        200,
    );
    let v = h
        .program()
        .unwrap()
        .map("seen")
        .unwrap()
        .get(&4u64.to_le_bytes())
        .unwrap();
    let word = |o: usize| u64::from_le_bytes(v[o..o + 8].try_into().unwrap());
    assert_eq!(word(0), 4, "queue id");
    assert_eq!(
        u32::from_le_bytes(v[8..12].try_into().unwrap()),
        99,
        "process"
    );
    assert_eq!(
        u32::from_le_bytes(v[12..16].try_into().unwrap()),
        2,
        "device"
    );
    assert_eq!(
        i32::from_le_bytes(v[16..20].try_into().unwrap()),
        6,
        "priority"
    );
    assert_eq!(word(32), 2, "submits");
    assert_eq!(word(40), 200, "last submit");
}

#[cfg(target_arch = "x86_64")]
#[test]
fn jit_mode_compiles_helper_free_programs_and_interprets_the_rest() {
    let bytes = common::object("lcbe");
    let opts = LoadOptions {
        mode: ExecMode::Jit,
        ..LoadOptions::default()
    };
    let jit = BpfProgram::load("lcbe", &bytes, opts).unwrap();
    let modes: Vec<_> = jit.programs().iter().map(|p| (p.hook, p.mode)).collect();
    assert_eq!(
        modes,
        vec![
            (Hook::TaskInit, ExecMode::Interpreter),
            (Hook::Schedule, ExecMode::Jit),
            (Hook::WorkSubmit, ExecMode::Interpreter),
            (Hook::TaskDestroy, ExecMode::Interpreter),
        ]
    );
    let mut h = BpfHooks::new(jit);
    h.task_init(&mut queue(1, 5));
    assert!(h.admit(QueueId(1), 1, 0));
    assert_eq!(h.stats().failures, [0; 4]);
}

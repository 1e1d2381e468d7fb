//! The RM-level policies (and the LC/BE example) driven by `RmRuntime` as the shim and the
//! daemon drive them at libcuda's channel-group events.

mod common;

use xpreempt_bpf::BpfHooks;
use xpreempt_bpf::ctx::{WORK_CHANNEL, WORK_SUBMIT};
use xpreempt_bpf::rm::{RmGroup, RmRuntime, rm_queue_id};

fn group(pid: u32, tsg: u32) -> RmGroup {
    RmGroup {
        pid,
        device: 0,
        tsg,
        default_timeslice_us: 1024,
        ..RmGroup::default()
    }
}

fn entry_u64(h: &BpfHooks, map: &str, key: &[u8]) -> Option<u64> {
    let m = h.program()?.map(map)?;
    m.get(key)
        .ok()
        .map(|v| u64::from_le_bytes(v[..8].try_into().unwrap()))
}

#[test]
fn rm_timeslice_gives_each_process_its_timeslice() {
    let mut h = BpfHooks::new(common::program("rm_timeslice"));
    let m = h
        .program_mut()
        .unwrap()
        .map_mut("process_timeslice_us")
        .unwrap();
    m.update(&100u32.to_le_bytes(), &10_000u64.to_le_bytes(), 0)
        .unwrap();
    m.update(&200u32.to_le_bytes(), &2_000u64.to_le_bytes(), 0)
        .unwrap();
    let mut rt = RmRuntime::new();
    let a = rt.task_init(&mut h, &group(100, 1), 0);
    let b = rt.task_init(&mut h, &group(200, 2), 0);
    let other = rt.task_init(&mut h, &group(300, 3), 0);
    assert_eq!(a.timeslice_us, Some(10_000));
    assert_eq!(b.timeslice_us, Some(2_000));
    assert_eq!(other.timeslice_us, None, "no entry: the driver's default");
    let key = a.queue_id.to_le_bytes();
    assert_eq!(entry_u64(&h, "given_us", &key), Some(10_000));
    rt.task_destroy(&mut h, a.queue_id, 5);
    assert_eq!(entry_u64(&h, "given_us", &key), None);
}

#[test]
fn rm_admission_holds_one_group_per_device_until_it_is_destroyed() {
    let mut h = BpfHooks::new(common::program("rm_admission"));
    let mut rt = RmRuntime::new();
    let a = rt.task_init(&mut h, &group(100, 1), 0).queue_id;
    let b = rt.task_init(&mut h, &group(200, 2), 0).queue_id;
    assert!(rt.schedule(&mut h, a, 8, 1).allow);
    rt.enabled(a);
    assert!(rt.schedule(&mut h, a, 8, 1).allow, "a holder asks again");
    for t in 0..3 {
        assert!(!rt.schedule(&mut h, b, 8, 2 + t).allow);
    }
    assert_eq!(entry_u64(&h, "refusals", &b.to_le_bytes()), Some(3));
    // Another device has its own slot.
    let c = rt
        .task_init(
            &mut h,
            &RmGroup {
                device: 1,
                ..group(300, 3)
            },
            0,
        )
        .queue_id;
    assert!(rt.schedule(&mut h, c, 8, 3).allow);
    rt.task_destroy(&mut h, a, 10);
    assert!(rt.schedule(&mut h, b, 8, 11).allow, "the slot is free");
    assert_eq!(entry_u64(&h, "refusals", &b.to_le_bytes()), Some(3));
    // XQueues are not counted.
    h.program_mut()
        .unwrap()
        .map_mut("config")
        .unwrap()
        .update(&0u32.to_le_bytes(), &1u64.to_le_bytes(), 0)
        .unwrap();
    let mut xq = xpreempt_bpf::ctx::ScheduleCtx {
        queue_id: 7,
        allow_schedule: 1,
        ..Default::default()
    };
    assert!(h.run_ctx(&mut xq, 12).ran);
    assert_eq!(xq.allow_schedule, 1);
}

#[test]
fn lcbe_classes_channel_groups_from_the_launches_of_their_process() {
    let mut h = BpfHooks::new(common::program("lcbe"));
    let mut rt = RmRuntime::new();
    let small = rt.task_init(&mut h, &group(100, 1), 0);
    let trainer = rt.task_init(&mut h, &group(200, 2), 0);
    assert_eq!(small.timeslice_us, Some(200), "every group starts BE");
    // Channel tokens at creation are not submissions.
    for ch in 0..8u64 {
        rt.work_submit(&mut h, small.queue_id, WORK_CHANNEL, 0, ch, 1);
    }
    // small: 2000 launches/s for 1.5 s; trainer: 20/s.
    for i in 0..3000u64 {
        rt.work_submit(&mut h, small.queue_id, WORK_SUBMIT, 0, i, 10 + i * 500_000);
    }
    for i in 0..30u64 {
        rt.work_submit(
            &mut h,
            trainer.queue_id,
            WORK_SUBMIT,
            0,
            i,
            10 + i * 50_000_000,
        );
    }
    let class = |id: u64| {
        h.program()
            .unwrap()
            .map("task_type_map")
            .unwrap()
            .get(&id.to_le_bytes())
            .ok()
            .map(|v| v[0])
    };
    assert_eq!(class(small.queue_id), Some(1), "LC");
    assert_eq!(class(trainer.queue_id), Some(0), "BE");
    assert_eq!(small.queue_id, rm_queue_id(100, 0, 1));
    // A group created again for the learned process id gets its class (the same TSG id).
    let again = rt.task_init(&mut h, &group(100, 1), 2_000_000_000);
    assert_eq!(again.timeslice_us, Some(10_000_000), "LC: 10 s");
}

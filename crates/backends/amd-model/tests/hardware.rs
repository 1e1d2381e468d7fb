//! Acceptance tests of the hardware model: allocation order, EBUSY, hang detection, multi-XCC,
//! RESET refusal, ring untouched by preemption, malformed AQL, ownership of the new ioctls.

mod common;

use common::*;
use xpreempt_amd::cpsch::{CpschError, HqdSlot, Topology};
use xpreempt_amd::{Caller, DestroyMode, GpuConfig, ModelError, MqdState};

#[test]
fn first_eight_queues_land_across_pipes_then_in_the_next_slot() {
    let mut g = gpu(GpuConfig::default());
    let slots: Vec<(u32, u32)> = (0..8)
        .map(|i| {
            let q = queue(&mut g, 1, &format!("q{i}"), 0);
            let s = g.hqd_slot(q).unwrap().expect("mapped at once");
            (s.pipe, s.queue)
        })
        .collect();
    let pipes: Vec<u32> = slots.iter().map(|s| s.0).collect();
    let queues: Vec<u32> = slots.iter().map(|s| s.1).collect();
    assert_eq!(pipes, vec![0, 1, 2, 3, 0, 1, 2, 3]);
    assert_eq!(queues, vec![0, 0, 0, 0, 1, 1, 1, 1]);
}

#[test]
fn the_33rd_queue_on_a_full_mec_gets_ebusy() {
    let mut g = gpu(GpuConfig {
        oversubscription: false,
        ..GpuConfig::default()
    });
    for i in 0..32 {
        queue(&mut g, 1, &format!("q{i}"), 0);
    }
    let err = g
        .create_queue(Caller::process(1), xpreempt_amd::QueueProps::new("q32", 0))
        .unwrap_err();
    assert_eq!(
        err,
        ModelError::Cpsch(CpschError::Busy { mec: 0, slots: 32 })
    );
    assert!(err.to_string().starts_with("EBUSY"), "{err}");
    assert_eq!(g.mqd_hqd_counts(), (32, 32));
}

#[test]
fn oversubscribed_queues_take_turns_and_all_finish() {
    let mut g = gpu(GpuConfig {
        quantum_us: 200.0,
        ..small()
    });
    let k = kernel(&mut g, "k", 50, false);
    let qs: Vec<_> = (0..40)
        .map(|i| queue(&mut g, 1, &format!("q{i}"), 0))
        .collect();
    assert_eq!(g.mqd_hqd_counts(), (40, 32));
    assert_eq!(g.state(qs[39]).unwrap(), MqdState::Waiting);
    let signals: Vec<u64> = qs
        .iter()
        .flat_map(|&q| submit(&mut g, q, k, 3, 4))
        .collect();
    run_out(&mut g);
    assert!(signals.iter().all(|&s| g.signal_value(s) == Some(0)));
    assert!(
        g.stats().runlists > 1,
        "waiting queues were mapped by later runlists"
    );
    assert_eq!(g.stats().exactly_once_violations, 0);
    assert!(qs.iter().all(|&q| g.ring_ids(q).unwrap() == (3, 3)));
}

#[test]
fn an_unmap_past_its_timeout_marks_the_hws_hung() {
    let mut g = gpu(GpuConfig {
        unmap_timeout_us: 1_000.0,
        ..small()
    });
    let long = kernel(&mut g, "long", 50_000, false);
    let q = queue(&mut g, 1, "stuck", 0);
    submit(&mut g, q, long, 1, 4);
    advance(&mut g, 100_000);
    assert!(g.running_workgroups(q).unwrap() > 0);
    g.unmap_queue(Caller::process(1), q).unwrap();
    advance(&mut g, 500_000);
    assert!(!g.stats().hws_hung, "still within the fence timeout");
    advance(&mut g, 600_000);
    assert!(g.stats().hws_hung);
    assert!(matches!(
        g.queue_error(q),
        Some(ModelError::HwsHung { timeout_us: 1000 })
    ));
    let other = g.preempt_queue(Caller::kernel(), q, DestroyMode::WavefrontSave);
    assert!(matches!(other, Err(ModelError::HwsHung { .. })));
}

#[test]
fn a_drain_within_its_timeout_is_not_a_hang() {
    let mut g = gpu(small());
    let k = kernel(&mut g, "k", 100, false);
    let q = queue(&mut g, 1, "q", 0);
    submit(&mut g, q, k, 2, 8);
    advance(&mut g, 60_000);
    g.unmap_queue(Caller::process(1), q).unwrap();
    advance(&mut g, 1_000_000);
    assert_eq!(g.state(q).unwrap(), MqdState::Preempted);
    assert!(!g.stats().hws_hung);
}

#[test]
fn with_four_xccs_n_mapped_mqds_occupy_4n_hqds() {
    let topology = Topology {
        pipes_per_mec: 4,
        queues_per_pipe: 20,
        xcc_mask: 0xF,
        ..Topology::default()
    };
    let mut g = gpu(GpuConfig {
        topology,
        ..GpuConfig::default()
    });
    for n in 1..=80u32 {
        queue(&mut g, n % 8, &format!("q{n}"), 0);
        assert_eq!(g.mqd_hqd_counts(), (n, 4 * n));
    }
    let hist = g.occupancy_history();
    assert_eq!(hist.last().map(|h| (h.1, h.2)), Some((80, 320)));
    let q = xpreempt_types::QueueId(5);
    let phys = g.physical_hqds(q).unwrap();
    let s: HqdSlot = g.hqd_slot(q).unwrap().unwrap();
    assert_eq!(
        phys,
        (0..4).map(|x| (x, s.pipe, s.queue)).collect::<Vec<_>>()
    );
}

#[test]
fn reset_refuses_non_idempotent_kernels_and_redoes_idempotent_ones() {
    let mut g = gpu(small());
    let plain = kernel(&mut g, "plain", 100, false);
    let pure = kernel(&mut g, "pure", 100, true);
    let a = queue(&mut g, 1, "a", 0);
    let b = queue(&mut g, 1, "b", 0);
    let sa = submit(&mut g, a, plain, 2, 8);
    let sb = submit(&mut g, b, pure, 2, 8);
    advance(&mut g, 50_000);
    let err = g
        .preempt_queue(Caller::process(1), a, DestroyMode::Reset)
        .unwrap_err();
    assert!(matches!(err, ModelError::NonIdempotent { ref kernel, .. } if kernel == "plain"));
    assert_eq!(
        g.state(a).unwrap(),
        MqdState::Mapped,
        "a refused reset changes nothing"
    );
    g.preempt_queue(Caller::process(1), b, DestroyMode::Reset)
        .unwrap();
    advance(&mut g, 10_000);
    assert_eq!(g.state(b).unwrap(), MqdState::Preempted);
    assert!(g.stats().wgs_redone > 0);
    g.resume_queue(Caller::process(1), b).unwrap();
    run_out(&mut g);
    assert!(sa.iter().chain(&sb).all(|&s| g.signal_value(s) == Some(0)));
    assert_eq!(g.stats().wgs_completed, 4 * 8);
    assert_eq!(g.stats().exactly_once_violations, 0);
}

#[test]
fn cwsr_leaves_the_ring_alone_and_resumes_where_it_stopped() {
    let mut g = gpu(small());
    let k = kernel(&mut g, "k", 100, false);
    let q = queue(&mut g, 1, "q", 0);
    let signals = submit(&mut g, q, k, 6, 16);
    advance(&mut g, 250_000);
    let before = g.ring_ids(q).unwrap();
    assert!(before.0 > 0 && before.0 < 6);
    g.preempt_queue(Caller::process(1), q, DestroyMode::WavefrontSave)
        .unwrap();
    assert!(!g.settled(q));
    advance(&mut g, 10_000);
    assert!(g.settled(q));
    assert_eq!(g.running_workgroups(q).unwrap(), 0);
    advance(&mut g, 1_000_000);
    assert_eq!(
        g.ring_ids(q).unwrap(),
        before,
        "rptr and wptr untouched while preempted"
    );
    let saved = g.stats().wgs_saved;
    assert!(saved > 0);
    g.resume_queue(Caller::process(1), q).unwrap();
    run_out(&mut g);
    assert_eq!(g.ring_ids(q).unwrap(), (6, 6));
    assert!(signals.iter().all(|&s| g.signal_value(s) == Some(0)));
    assert_eq!(g.stats().wgs_restored, saved);
    assert_eq!(
        g.stats().wgs_completed,
        6 * 16,
        "nothing resubmitted, nothing run twice"
    );
}

#[test]
fn only_the_owner_or_a_privileged_caller_may_preempt() {
    let mut g = gpu(small());
    let q = queue(&mut g, 7, "mine", 0);
    advance(&mut g, 100_000);
    let err = g
        .preempt_queue(Caller::process(8), q, DestroyMode::WavefrontSave)
        .unwrap_err();
    assert!(matches!(
        err,
        ModelError::PermissionDenied {
            caller: 8,
            owner: 7,
            ..
        }
    ));
    assert!(g.resume_queue(Caller::process(8), q).is_err());
    g.preempt_queue(Caller::kernel(), q, DestroyMode::WavefrontSave)
        .unwrap();
    advance(&mut g, 20_000);
    g.resume_queue(Caller::process(7), q).unwrap();
    advance(&mut g, 20_000);
    assert_eq!(g.state(q).unwrap(), MqdState::Mapped);
}

#[test]
fn malformed_aql_puts_the_queue_in_an_error_state() {
    let mut g = gpu(small());
    let k = kernel(&mut g, "k", 10, false);
    let q = queue(&mut g, 1, "q", 0);
    let good = submit(&mut g, q, k, 1, 4);
    let mut bytes = xpreempt_amd::aql::Packet::Dispatch(xpreempt_amd::aql::KernelDispatch::linear(
        k, 4, 256, 0,
    ))
    .encode();
    bytes[1] |= 0x80; // reserved header bit 15
    g.submit_raw(q, &bytes).unwrap();
    run_out(&mut g);
    assert_eq!(
        g.signal_value(good[0]),
        Some(0),
        "the packet before it still ran"
    );
    let err = g.queue_error(q).expect("queue in error state");
    assert!(err.to_string().contains("reserved header bits"), "{err}");
    assert_eq!(g.stats().malformed_packets, 1);
    assert_eq!(
        g.ring_ids(q).unwrap(),
        (1, 2),
        "the bad packet is not consumed"
    );

    // An unknown kernel object is rejected the same way.
    let mut g2 = gpu(small());
    let q2 = queue(&mut g2, 1, "q", 0);
    let bad = xpreempt_amd::aql::Packet::Dispatch(xpreempt_amd::aql::KernelDispatch::linear(
        0xdead_beef,
        1,
        64,
        0,
    ));
    g2.submit_packet(q2, &bad).unwrap();
    run_out(&mut g2);
    assert!(matches!(
        g2.queue_error(q2),
        Some(ModelError::Aql {
            source: xpreempt_amd::aql::AqlError::UnknownKernelObject(_),
            ..
        })
    ));
}

#[test]
fn cu_masks_keep_queues_on_their_cus() {
    use xpreempt_amd::compute::CuMask;
    let mut g = gpu(small());
    let k = kernel(&mut g, "k", 100, false);
    let mut props = xpreempt_amd::QueueProps::new("left", 0);
    props.cu_mask = Some(CuMask::from_range(0, 2, 8));
    let q = g.create_queue(Caller::process(1), props).unwrap();
    submit(&mut g, q, k, 1, 64);
    advance(&mut g, 50_000);
    // Two CUs of 8 wave slots hold four 4-wave workgroups at most.
    assert_eq!(g.running_workgroups(q).unwrap(), 4);
    run_out(&mut g);
    assert_eq!(g.ring_ids(q).unwrap(), (1, 1));
}

#[test]
fn destroy_frees_the_hqd_and_update_changes_what_schedulers_see() {
    let mut g = gpu(GpuConfig {
        oversubscription: false,
        ..small()
    });
    let k = kernel(&mut g, "k", 100, false);
    let qs: Vec<_> = (0..32)
        .map(|i| queue(&mut g, 1, &format!("q{i}"), 0))
        .collect();
    submit(&mut g, qs[3], k, 1, 8);
    advance(&mut g, 50_000);
    let freed = g.hqd_slot(qs[3]).unwrap().unwrap();
    assert!(
        g.destroy_queue(Caller::process(2), qs[3]).is_err(),
        "not the owner"
    );
    g.destroy_queue(Caller::process(1), qs[3]).unwrap();
    assert!(matches!(g.state(qs[3]), Err(ModelError::NoQueue(_))));
    let again = queue(&mut g, 1, "again", 0);
    assert_eq!(g.hqd_slot(again).unwrap(), Some(freed));
    g.update_queue(Caller::process(1), again, Some(42), None)
        .unwrap();
    assert_eq!(g.logical_priority(again).unwrap(), 42);
    run_out(&mut g);
    assert_eq!(g.mqd_hqd_counts(), (32, 32));
}

#[test]
fn a_grid_too_large_to_track_is_rejected_not_allocated() {
    use xpreempt_amd::aql::{AqlError, KernelDispatch, Packet};
    let mut g = gpu(small());
    let k = kernel(&mut g, "k", 10, false);
    let q = queue(&mut g, 1, "q", 0);
    let mut d = KernelDispatch::linear(k, 1, 1, 0);
    d.dimensions = 2;
    d.grid_size = [65_536, 65_536, 1];
    g.submit_packet(q, &Packet::Dispatch(d)).unwrap();
    run_out(&mut g);
    assert!(matches!(
        g.queue_error(q),
        Some(ModelError::Aql {
            source: AqlError::TooManyWorkgroups(4_294_967_296),
            ..
        })
    ));
}

#[test]
fn cwsr_resume_needs_the_checkpoint() {
    let mut g = gpu(small());
    let k = kernel(&mut g, "k", 100, false);
    let q = queue(&mut g, 1, "q", 0);
    submit(&mut g, q, k, 1, 16);
    advance(&mut g, 60_000);
    // destroy_mqd without checkpoint_mqd first: the saved waves cannot be found again.
    g.destroy_mqd(q, DestroyMode::WavefrontSave).unwrap();
    advance(&mut g, 20_000);
    assert_eq!(g.state(q).unwrap(), MqdState::Preempted);
    let err = g.resume_queue(Caller::process(1), q).unwrap_err();
    assert_eq!(err, ModelError::NoSnapshot { queue: q });
    assert_eq!(
        g.state(q).unwrap(),
        MqdState::Preempted,
        "a failed resume changes nothing"
    );
}

#[test]
fn a_new_cu_mask_executes_the_runlist_again_and_loses_nothing() {
    use xpreempt_amd::compute::CuMask;
    let mut g = gpu(small());
    let k = kernel(&mut g, "k", 100, false);
    let a = queue(&mut g, 1, "a", 0);
    let b = queue(&mut g, 2, "b", 0);
    let signals: Vec<u64> = [a, b]
        .iter()
        .flat_map(|&q| submit(&mut g, q, k, 3, 16))
        .collect();
    advance(&mut g, 50_000);
    let unmaps = g.stats().unmaps;
    // The same mask again is no change: nothing is taken off.
    g.update_queue(Caller::process(1), a, None, Some(None))
        .unwrap();
    assert_eq!(g.stats().unmaps, unmaps);
    g.update_queue(
        Caller::process(1),
        a,
        None,
        Some(Some(CuMask::from_range(0, 4, 8))),
    )
    .unwrap();
    assert_eq!(g.stats().runlist_reexecutions, 1);
    assert_eq!(
        g.stats().unmaps,
        unmaps + 2,
        "both mapped queues, not only the updated one"
    );
    assert_eq!(g.cu_mask_words(a).unwrap(), Some(vec![0b1111]));
    run_out(&mut g);
    assert!(signals.iter().all(|&s| g.signal_value(s) == Some(0)));
    assert_eq!(g.stats().exactly_once_violations, 0);
    assert_eq!(g.stats().ring_moved_while_preempted, 0);
    assert!(g.stats().wgs_saved > 0 && g.stats().wgs_restored >= g.stats().wgs_saved);
    for q in [a, b] {
        assert_eq!(g.state(q).unwrap(), MqdState::Mapped);
        assert_eq!(g.ring_ids(q).unwrap(), (3, 3));
    }
}

//! HQD hand-off under oversubscription: a busy queue without an HQD gets one at once from an
//! idle or lower-priority queue (KFD remaps on demand), while equal priorities still take turns
//! by the HWS quantum.

mod common;

use common::{advance, gpu, kernel, queue, run_out, submit};
use xpreempt_amd::{GpuConfig, MqdState};

/// 32 HQD slots, a 1 ms quantum: a queue that waited for a rotation would wait ~1000 µs.
fn cfg() -> GpuConfig {
    GpuConfig {
        quantum_us: 1_000.0,
        ..GpuConfig::default()
    }
}

#[test]
fn a_busy_high_queue_is_mapped_without_waiting_for_a_quantum() {
    let mut g = gpu(cfg());
    let k = kernel(&mut g, "k", 200, false);
    let lows: Vec<_> = (0..32)
        .map(|i| queue(&mut g, 1, &format!("low{i}"), 1))
        .collect();
    for &q in &lows {
        submit(&mut g, q, k, 4, 40);
    }
    advance(&mut g, 50_000);
    assert!(
        lows.iter()
            .all(|&q| g.state(q).unwrap() == MqdState::Mapped)
    );
    let high = queue(&mut g, 2, "high", 12);
    assert_eq!(
        g.state(high).unwrap(),
        MqdState::Waiting,
        "every slot is taken"
    );
    submit(&mut g, high, k, 1, 40);
    // A CWSR save (≤ 10 µs) and one runlist (20 µs), far less than the 1000 µs quantum.
    advance(&mut g, 100_000);
    assert_eq!(g.state(high).unwrap(), MqdState::Mapped);
    let h = g.hqd_stats(high).unwrap();
    assert_eq!((h.maps, h.hqd_waits), (1, 1));
    assert!(h.hqd_wait_ns <= 40_000, "{h:?}");
    assert_eq!(g.stats().displacements, 1);
    assert_eq!(g.stats().rotations, 0);
    run_out(&mut g);
    assert_eq!(g.stats().exactly_once_violations, 0);
    assert_eq!(g.stats().wgs_completed, 32 * 4 * 40 + 40);
}

#[test]
fn idle_queues_give_their_hqd_to_a_busy_one() {
    let mut g = gpu(cfg());
    let k = kernel(&mut g, "k", 200, false);
    let idle: Vec<_> = (0..32)
        .map(|i| queue(&mut g, 1, &format!("idle{i}"), 5))
        .collect();
    advance(&mut g, 50_000);
    assert!(
        idle.iter()
            .all(|&q| g.state(q).unwrap() == MqdState::Mapped)
    );
    // Lower priority than every idle queue: idleness alone gives the slot away.
    let busy = queue(&mut g, 2, "busy", 1);
    submit(&mut g, busy, k, 1, 40);
    advance(&mut g, 100_000);
    assert_eq!(g.state(busy).unwrap(), MqdState::Mapped);
    assert_eq!(g.stats().idle_unmaps, 1);
    run_out(&mut g);
    assert_eq!(g.stats().wgs_completed, 40);
}

#[test]
fn equal_priorities_still_take_turns_by_quantum() {
    let mut g = gpu(cfg());
    let k = kernel(&mut g, "k", 500, false);
    let first: Vec<_> = (0..32)
        .map(|i| queue(&mut g, 1, &format!("q{i}"), 3))
        .collect();
    for &q in &first {
        submit(&mut g, q, k, 8, 40);
    }
    advance(&mut g, 50_000);
    let late = queue(&mut g, 2, "late", 3);
    submit(&mut g, late, k, 1, 40);
    advance(&mut g, 500_000);
    assert_eq!(
        g.state(late).unwrap(),
        MqdState::Waiting,
        "no hand-off among equals"
    );
    advance(&mut g, 600_000);
    assert_eq!(
        g.state(late).unwrap(),
        MqdState::Mapped,
        "the quantum rotated it in"
    );
    assert_eq!(g.stats().rotations, 1);
    let h = g.hqd_stats(late).unwrap();
    assert!(h.hqd_wait_ns >= 900_000, "{h:?}");
    run_out(&mut g);
    assert_eq!(g.stats().exactly_once_violations, 0);
}

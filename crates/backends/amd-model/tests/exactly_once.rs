//! Property: whatever sequence of preempt/resume calls (in any of the three destroy modes) hits
//! the queues while they run, every kernel completes exactly once, and RESET is refused exactly
//! when a non-idempotent kernel has waves running.

mod common;

use common::*;
use proptest::prelude::*;
use xpreempt_amd::aql::{BarrierAnd, Header, Packet};
use xpreempt_amd::{Caller, DestroyMode, ModelError, MqdState};
use xpreempt_types::QueueId;

#[derive(Clone, Debug)]
enum Step {
    Advance(u64),
    Preempt(usize, DestroyMode),
    Resume(usize),
}

fn step() -> impl Strategy<Value = Step> {
    let mode = prop_oneof![
        Just(DestroyMode::WavefrontSave),
        Just(DestroyMode::Drain),
        Just(DestroyMode::Reset)
    ];
    prop_oneof![
        (0u64..300_000).prop_map(Step::Advance),
        (0usize..3, mode).prop_map(|(q, m)| Step::Preempt(q, m)),
        (0usize..3).prop_map(Step::Resume),
    ]
}

const KERNELS: u32 = 4;
const WGS: u32 = 12;

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

    #[test]
    fn every_kernel_completes_exactly_once(steps in prop::collection::vec(step(), 1..40), seed in 0u64..1000) {
        let mut g = gpu(xpreempt_amd::GpuConfig { seed, ..small() });
        let pure = kernel(&mut g, "pure", 60, true);
        let plain = kernel(&mut g, "plain", 60, false);
        let qs: Vec<QueueId> = (0..3).map(|i| queue(&mut g, 1, &format!("q{i}"), i)).collect();
        let mut signals = Vec::new();
        for (i, &q) in qs.iter().enumerate() {
            let object = if i == 1 { plain } else { pure };
            signals.extend(submit(&mut g, q, object, KERNELS / 2, WGS));
            let s = g.create_signal(1);
            let barrier = Packet::Barrier(BarrierAnd {
                header: Header::barrier_and(),
                dep_signals: [0; 5],
                completion_signal: s,
            });
            g.submit_packet(q, &barrier).unwrap();
            signals.push(s);
            signals.extend(submit(&mut g, q, object, KERNELS / 2, WGS));
        }
        for s in &steps {
            match *s {
                Step::Advance(ns) => advance(&mut g, ns),
                Step::Preempt(i, mode) => {
                    let running = g.running_workgroups(qs[i]).unwrap();
                    let was_mapped = g.state(qs[i]).unwrap() == MqdState::Mapped;
                    let before = g.ring_ids(qs[i]).unwrap();
                    match g.preempt_queue(Caller::kernel(), qs[i], mode) {
                        Ok(()) => {
                            prop_assert!(!(mode == DestroyMode::Reset && i == 1 && was_mapped && running > 0));
                            prop_assert_eq!(g.ring_ids(qs[i]).unwrap(), before, "preempt touched the ring");
                        }
                        Err(ModelError::NonIdempotent { .. }) => {
                            prop_assert!(mode == DestroyMode::Reset && i == 1 && running > 0);
                        }
                        Err(ModelError::State { .. }) => {}
                        Err(e) => prop_assert!(false, "unexpected error {e}"),
                    }
                }
                Step::Resume(i) => match g.resume_queue(Caller::kernel(), qs[i]) {
                    Ok(()) | Err(ModelError::State { .. }) => {}
                    Err(e) => prop_assert!(false, "unexpected error {e}"),
                },
            }
        }
        // Let every transition land, then resume whatever is still off the hardware.
        for _ in 0..4 {
            run_out(&mut g);
            for &q in &qs {
                if g.state(q).unwrap() == MqdState::Preempted {
                    g.resume_queue(Caller::kernel(), q).unwrap();
                }
            }
        }
        run_out(&mut g);
        let st = g.stats();
        prop_assert!(!st.hws_hung);
        for &q in &qs {
            prop_assert_eq!(g.state(q).unwrap(), MqdState::Mapped);
            prop_assert_eq!(g.ring_ids(q).unwrap(), (u64::from(KERNELS) + 1, u64::from(KERNELS) + 1));
        }
        for &s in &signals {
            prop_assert_eq!(g.signal_value(s), Some(0));
        }
        prop_assert_eq!(st.wgs_completed, 3 * u64::from(KERNELS * WGS));
        prop_assert_eq!(st.wgs_restored, st.wgs_saved);
        prop_assert_eq!(st.exactly_once_violations, 0);
        prop_assert_eq!(st.ring_moved_while_preempted, 0);
        prop_assert_eq!(st.dispatches_completed, 3 * (u64::from(KERNELS) + 1));
    }
}

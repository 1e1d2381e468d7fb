//! What the model's hardware does shows in a scenario's results: which XCCs a queue occupies,
//! and Scheme A's monitor answering every inversion within one check interval.

use xpreempt_sim::runner::{Detection, Mode, RunOptions, run};
use xpreempt_sim::scenario::Scenario;

/// 100 workgroups that each fill a CU, on 80 CUs: one XCC places the 20 left over wherever a
/// CU frees first; four XCCs of 20 CUs each place 25 of them per XCC.
fn grid(xcc_mask: u32) -> Scenario {
    let text = format!(
        r#"
name = "xcc"
seed = 5
[gpu]
cus = 80
waves_per_cu = 16
[gpu.topology]
xcc_mask = {xcc_mask}
[[tasks]]
name = "a"
priority = 1
kernels = 4
kernel = {{ workgroups = 100, wg_threads = 1024, wg_us = 100.0, jitter = 0.3 }}
[[tasks]]
name = "b"
priority = 1
kernels = 3
kernel = {{ workgroups = 30, wg_threads = 512, wg_us = 70.0, jitter = 0.3 }}
arrival = {{ at_us = 30.0 }}
"#
    );
    Scenario::parse(&text).expect("scenario parses")
}

#[test]
fn the_xcc_mask_changes_where_and_when_workgroups_run() {
    let one = run(&grid(0x1), Mode::None, RunOptions::default()).unwrap();
    let four = run(&grid(0xF), Mode::None, RunOptions::default()).unwrap();
    assert!(one.exactly_once && four.exactly_once);
    let lat = |r: &xpreempt_sim::runner::ModeRun| -> Vec<Vec<u64>> {
        r.tasks.iter().map(|t| t.latencies.clone()).collect()
    };
    assert_ne!(lat(&one), lat(&four), "0x1 and 0xF gave the same timeline");
    assert_eq!(one.stats.wgs_completed, four.stats.wgs_completed);
}

/// Many lower queues busy at once, several equal higher ones arriving: the case where one
/// preemption per check left inversions standing for several intervals.
fn tiers(seed: u64) -> Scenario {
    let mut text = String::from(
        "name = \"tiers\"\n[gpu]\ncus = 16\nwaves_per_cu = 8\n[scheme_a]\ncheck_interval_us = 1000.0\n",
    );
    for i in 0..6 {
        text += &format!(
            "[[tasks]]\nname = \"low{i}\"\npriority = 1\nprocess = {p}\nkernels = 30\n\
             kernel = {{ workgroups = 64, wg_threads = 256, wg_us = 150.0, jitter = 0.2 }}\n\
             arrival = {{ at_us = {at}.0 }}\n",
            p = 10 + i,
            at = i * 50,
        );
    }
    for i in 0..3 {
        text += &format!(
            "[[tasks]]\nname = \"mid{i}\"\npriority = 6\nprocess = {p}\nkernels = 3\n\
             kernel = {{ workgroups = 32, wg_threads = 256, wg_us = 100.0, jitter = 0.2 }}\n\
             arrival = {{ at_us = 500.0, count = 4, every_us = 3000.0, poisson = true }}\n",
            p = 20 + i,
        );
    }
    let mut s = Scenario::parse(&text).expect("scenario parses");
    s.seed = seed;
    s.gpu.seed = seed;
    s
}

#[test]
fn scheme_a_detects_within_one_check_interval_on_every_seed() {
    for seed in 1..=8 {
        let s = tiers(seed);
        let r = run(&s, Mode::SchemeA, RunOptions::default()).unwrap();
        assert!(r.exactly_once, "seed {seed}: {:?}", r.problems);
        for t in &r.tasks {
            for &d in &t.detection_delays {
                assert!(d <= 1_000_000, "seed {seed} {}: {d} ns", t.name);
            }
            assert_eq!(t.detections.len(), t.latencies.len(), "one per request");
            for d in &t.detections {
                if let Detection::Acted { delay } = d {
                    assert!(*delay <= 1_000_000);
                }
            }
        }
        let acted = r
            .tasks
            .iter()
            .flat_map(|t| &t.detections)
            .filter(|d| matches!(d, Detection::Acted { .. }))
            .count();
        assert!(acted > 0, "seed {seed}: the monitor never had to act");
    }
}

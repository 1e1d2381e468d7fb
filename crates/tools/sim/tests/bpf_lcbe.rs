//! Acceptance: the LC/BE example, driving the AMD model's default scenario (train vs infer),
//! gives the high-priority task a latency within 5 % of an explicit HPF configuration.

use xpreempt_bpf::maps::MapSnapshot;
use xpreempt_bpf::{BpfHooks, BpfProgram as Policy, LoadOptions};
use xpreempt_sim::report::{SimOptions, SimReport, simulate};
use xpreempt_sim::runner::Mode;
use xpreempt_sim::scenario::Scenario;

/// The compiled example; fails the test (never skips it) when clang was missing.
fn object(name: &str) -> Vec<u8> {
    let path = xpreempt_bpf::built_object(name).unwrap_or_else(|e| panic!("{e}"));
    std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn policy(name: &str) -> Policy {
    Policy::load(name, &object(name), LoadOptions::default())
        .unwrap_or_else(|e| panic!("{name}: {e}"))
}

const MODES: [Mode; 3] = [Mode::Lv1, Mode::Lv2, Mode::Lv3];

fn infer_latency(r: &SimReport, mode: &str) -> f64 {
    let m = r.modes.iter().find(|m| m.mode == mode).expect("mode ran");
    m.tasks
        .iter()
        .find(|t| t.name == "infer")
        .expect("infer task")
        .latency_us
        .expect("infer completed")
}

/// task_type_map as an operator would set it: infer (queue 1) LC, train (queue 0) BE.
fn configured_maps() -> Vec<MapSnapshot> {
    let mut p = policy("lcbe");
    let m = p.map_mut("task_type_map").unwrap();
    m.update(&1u64.to_le_bytes(), &1u32.to_le_bytes(), 0)
        .unwrap();
    m.update(&0u64.to_le_bytes(), &0u32.to_le_bytes(), 0)
        .unwrap();
    vec![MapSnapshot::of(m)]
}

fn run(scenario: &Scenario, base: &str, pinned: Option<Vec<MapSnapshot>>) -> SimReport {
    let hooks = pinned.map(|pinned| {
        let make =
            BpfHooks::factory("lcbe", object("lcbe"), pinned, LoadOptions::default()).unwrap();
        Box::new(make) as Box<dyn Fn() -> Box<dyn xpreempt_core::sched::Hooks>>
    });
    let opts = SimOptions {
        trace: false,
        policy: Some(base.into()),
        hooks,
    };
    simulate(scenario, &MODES, &opts)
        .expect("simulation runs")
        .0
}

#[test]
fn lcbe_program_matches_explicit_hpf_within_5_percent() {
    let scenario = Scenario::default_scenario().unwrap();
    assert_eq!(scenario.tasks[0].name, "train");
    assert_eq!(scenario.tasks[1].name, "infer");
    let hpf = run(&scenario, "hpf", None);
    // The program classifies the queues; the LC/BE policy then runs only LC work while there is
    // any. Without the program, the same policy sees both queues as LC (priority >= 1).
    let with_program = run(&scenario, "lcbe", Some(configured_maps()));
    let without_program = run(&scenario, "lcbe", None);
    // The program alone on top of HPF (default classification, priorities boosted) too.
    let over_hpf = run(&scenario, "hpf", Some(Vec::new()));
    for mode in MODES.map(|m| m.name()) {
        let reference = infer_latency(&hpf, mode);
        for (what, r) in [
            ("lcbe program", &with_program),
            ("program over hpf", &over_hpf),
        ] {
            let got = infer_latency(r, mode);
            let off = (got - reference).abs() / reference;
            assert!(
                off <= 0.05,
                "{mode}: {what} gives infer {got} µs, HPF {reference} µs ({:.1} % off)",
                off * 100.0
            );
        }
        let control = infer_latency(&without_program, mode);
        assert!(
            control > reference * 1.05,
            "{mode}: without the program infer takes {control} µs vs HPF {reference} µs: the test would not notice a program that does nothing"
        );
    }
}

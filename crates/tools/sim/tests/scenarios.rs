//! Every scenario shipped in `scenarios/` parses and runs every kernel exactly once in all five
//! modes; the spatial-partition one shows what a CU mask costs compared with preemption.

use std::path::PathBuf;
use xpreempt_sim::report::{SimOptions, simulate};
use xpreempt_sim::runner::Mode;
use xpreempt_sim::scenario::Scenario;

fn dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../scenarios")
}

fn load(name: &str) -> Scenario {
    let text = std::fs::read_to_string(dir().join(name)).expect("scenario file");
    Scenario::parse(&text).expect("scenario parses")
}

#[test]
fn shipped_scenarios_run_exactly_once_in_every_mode() {
    let mut names: Vec<String> = std::fs::read_dir(dir())
        .expect("scenarios directory")
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.ends_with(".toml"))
        .collect();
    names.sort();
    assert!(names.len() >= 4, "{names:?}");
    for name in names {
        let s = load(&name);
        let (report, runs) = simulate(&s, &Mode::ALL, &SimOptions::default()).unwrap();
        for (m, r) in report.modes.iter().zip(&runs) {
            assert!(m.exactly_once, "{name} {}: {:?}", m.mode, r.problems);
        }
    }
}

#[test]
fn a_cu_partition_isolates_but_halves_the_gpu() {
    let part = load("spatial-partition.toml");
    let (r, _) = simulate(&part, &[Mode::None], &SimOptions::default()).unwrap();
    let infer = r.modes[0].tasks.iter().find(|t| t.name == "infer").unwrap();
    // Alone on half the CUs it is as slow as with the partition: nothing else interferes...
    assert!(
        (infer.latency_us.unwrap() - infer.standalone_us.unwrap()).abs()
            < 0.01 * infer.standalone_us.unwrap()
    );
    let full = Scenario::default_scenario().unwrap();
    let (f, _) = simulate(&full, &[Mode::Lv3], &SimOptions::default()).unwrap();
    let lv3 = f.modes[0].tasks.iter().find(|t| t.name == "infer").unwrap();
    // ...but preemption on the whole GPU answers far sooner.
    assert!(
        lv3.latency_us.unwrap() * 1.5 < infer.latency_us.unwrap(),
        "lv3 {lv3:?} vs partition {infer:?}"
    );
}

#[test]
fn a_ring_smaller_than_the_work_or_the_window_still_runs_everything() {
    let mut s = Scenario::default_scenario().unwrap();
    for t in &mut s.tasks {
        t.ring_size = 4;
        t.kernels = 12;
        t.kernel.workgroups = 160;
    }
    let (report, runs) = simulate(&s, &Mode::ALL, &SimOptions::default()).unwrap();
    for (m, r) in report.modes.iter().zip(&runs) {
        assert!(m.exactly_once, "{}: {:?}", m.mode, r.problems);
    }
}

/// The priority rule on the model: queues at one priority run together, so no mode stretches
/// the makespan of running them without a scheduler (`none`), and none preempts anything.
#[test]
fn equal_priorities_finish_in_the_makespan_of_none() {
    let s = load("equal-priorities.toml");
    let (r, _) = simulate(&s, &Mode::ALL, &SimOptions::default()).unwrap();
    let none = r
        .modes
        .iter()
        .find(|m| m.mode == "none")
        .unwrap()
        .makespan_us;
    for m in &r.modes {
        assert!(
            (m.makespan_us - none).abs() <= 0.02 * none,
            "{}: makespan {} µs against none's {none} µs",
            m.mode,
            m.makespan_us
        );
        assert_eq!((m.preemptions, m.resumes), (0, 0), "{}", m.mode);
    }
}

/// Equal replicas beside a lower queue: the replicas run together, the lower one is stopped
/// for them and resumed afterwards.
#[test]
fn equal_replicas_share_while_a_lower_queue_waits() {
    let mut text = std::fs::read_to_string(dir().join("equal-priorities.toml")).unwrap();
    text += "\n[[tasks]]\nname = \"trainer\"\npriority = 1\nprocess = 3\nkernels = 40\n\
             kernel = { workgroups = 640, wg_threads = 256, wg_us = 100.0, jitter = 0.0 }\n\
             arrival = { at_us = 0.0 }\n";
    let s = Scenario::parse(&text).unwrap();
    let (r, _) = simulate(&s, &[Mode::Lv3], &SimOptions::default()).unwrap();
    let lv3 = &r.modes[0];
    let task = |n: &str| lv3.tasks.iter().find(|t| t.name == n).unwrap();
    for n in ["replica-a", "replica-b"] {
        let t = task(n);
        assert!(
            t.latency_us.unwrap() <= 1.1 * t.standalone_us.unwrap(),
            "{n} waited behind its equal or the trainer: {t:?}"
        );
    }
    assert!(
        lv3.preemptions >= 1,
        "the trainer is stopped for the replicas"
    );
    assert!(lv3.exactly_once, "{:?}", lv3.problems);
}

/// Queues on disjoint CUs do not delay each other, so no mode stops the trainer for the
/// inference task beside it: every mode runs as `none` does.
#[test]
fn disjoint_compute_units_are_never_preempted() {
    let s = load("spatial-partition.toml");
    let (r, _) = simulate(&s, &Mode::ALL, &SimOptions::default()).unwrap();
    let none = r.modes.iter().find(|m| m.mode == "none").unwrap();
    let train = |m: &xpreempt_sim::report::ModeReport| {
        m.tasks
            .iter()
            .find(|t| t.name == "train")
            .unwrap()
            .latency_us
            .unwrap()
    };
    for m in &r.modes {
        assert_eq!((m.preemptions, m.resumes), (0, 0), "{}", m.mode);
        assert!(
            (train(m) - train(none)).abs() <= 0.01 * train(none),
            "{}: train {} µs against none's {} µs",
            m.mode,
            train(m),
            train(none)
        );
    }
}

/// A service confined to 16 CUs holds the training back on those 16 only: at every level the
/// training yields them instead of stopping, keeps the other 64, and the service still runs as
/// fast as alone. Stopping the training would leave it 1.17× its time alone.
#[test]
fn a_lower_queue_yields_a_confined_service_its_units_instead_of_stopping() {
    for (name, train_bound, infer_bound, yields) in [
        ("small-service.toml", 1.06, 1.01, 2),
        ("small-service-bursts.toml", 1.12, 1.06, 50),
    ] {
        let s = load(name);
        let (r, _) = simulate(
            &s,
            &[Mode::Lv1, Mode::Lv2, Mode::Lv3],
            &SimOptions::default(),
        )
        .unwrap();
        for m in &r.modes {
            let task = |n: &str| m.tasks.iter().find(|t| t.name == n).unwrap();
            let x = |n: &str| task(n).latency_us.unwrap() / task(n).standalone_us.unwrap();
            assert!(
                x("train") <= train_bound,
                "{name} {}: train {:.3}× alone",
                m.mode,
                x("train")
            );
            let infer = task("infer");
            let p99 = infer.latency_pct_us.unwrap().p99 / infer.standalone_us.unwrap();
            assert!(
                p99 <= infer_bound,
                "{name} {}: infer p99 {p99:.3}× alone",
                m.mode
            );
            assert_eq!((m.yields, m.preemptions), (yields, 0), "{name} {}", m.mode);
            assert!(m.exactly_once, "{name} {}: {:?}", m.mode, m.problems);
        }
    }
}

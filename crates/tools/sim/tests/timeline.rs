//! The train-vs-infer timeline, reproduced by the default scenario under all five modes.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use xpreempt_core::sched::{Hooks, Work};
use xpreempt_core::{Nanos, OpKind, QueueId, Seq};
use xpreempt_sim::report::{ModeReport, SimOptions, SimReport, TaskReport, simulate};
use xpreempt_sim::runner::{self, Mode, RunOptions};
use xpreempt_sim::scenario::Scenario;

fn default_report() -> &'static SimReport {
    static REPORT: OnceLock<SimReport> = OnceLock::new();
    REPORT.get_or_init(|| {
        let s = Scenario::default_scenario().expect("built-in scenario parses");
        simulate(&s, &Mode::ALL, &SimOptions::default())
            .expect("all modes run")
            .0
    })
}

fn mode(name: &str) -> &'static ModeReport {
    default_report()
        .modes
        .iter()
        .find(|m| m.mode == name)
        .expect("mode present")
}

fn task<'a>(m: &'a ModeReport, name: &str) -> &'a TaskReport {
    m.tasks
        .iter()
        .find(|t| t.name == name)
        .expect("task present")
}

#[test]
fn every_mode_runs_every_kernel_exactly_once() {
    let names: Vec<&str> = default_report().modes.iter().map(|m| m.mode).collect();
    assert_eq!(names, vec!["none", "lv1", "scheme-a", "lv2", "lv3"]);
    for m in &default_report().modes {
        assert!(m.exactly_once, "mode {}", m.mode);
        assert!(m.tasks.iter().all(|t| t.requests == 1), "mode {}", m.mode);
    }
}

#[test]
fn without_scheduling_inference_suffers() {
    let none = mode("none");
    let infer = task(none, "infer");
    assert!(
        infer.latency_us.unwrap() > 1.5 * infer.standalone_us.unwrap(),
        "{infer:?}"
    );
    assert_eq!((none.preemptions, none.resumes), (0, 0));
    assert_eq!(none.preempt_latency_us.p50, None);
}

#[test]
fn lv3_gives_standalone_latency_plus_the_cwsr_cost_and_a_ratio_above_3() {
    let lv3 = mode("lv3");
    let infer = task(lv3, "infer");
    let cost = lv3.preempt_latency_us.p99.expect("a preemption happened");
    assert!((1.0..=10.5).contains(&cost), "CWSR cost {cost} µs");
    let extra = infer.latency_us.unwrap() - infer.standalone_us.unwrap();
    // The doorbell and the first dispatch overlap the save; allow 50 µs of slack around it.
    assert!(extra.abs() <= cost + 50.0, "infer {infer:?}, cost {cost}");
    assert!(
        lv3.latency_ratio > Some(3.0),
        "ratio {:?}",
        lv3.latency_ratio
    );
    assert_eq!((lv3.preemptions, lv3.resumes), (1, 1));
}

#[test]
fn scheme_a_detects_within_one_check_interval() {
    let a = mode("scheme-a");
    let infer = task(a, "infer");
    let delay = infer
        .detection_delay_us
        .expect("the monitor preempted for inference");
    let interval = Scenario::default_scenario()
        .unwrap()
        .scheme_a
        .check_interval_us;
    assert!(delay > 0.0 && delay <= interval, "delay {delay} µs");
    let cost = a.preempt_latency_us.p99.expect("a preemption happened");
    // Before detection inference shares the GPU, so it loses at most the detection delay.
    let extra = infer.latency_us.unwrap() - infer.standalone_us.unwrap();
    assert!(
        extra > 0.0 && extra <= delay + cost + 50.0,
        "extra {extra}, delay {delay}"
    );
    assert!(a.latency_ratio > Some(3.0), "ratio {:?}", a.latency_ratio);
    assert_eq!((a.preemptions, a.resumes), (1, 1));
}

#[test]
fn lv1_preemption_takes_hundreds_of_microseconds() {
    let lv1 = mode("lv1");
    let p50 = lv1.preempt_latency_us.p50.expect("a preemption happened");
    assert!((100.0..1000.0).contains(&p50), "lv1 p50 {p50} µs");
    let lv3 = mode("lv3").preempt_latency_us.p50.unwrap_or(f64::MAX);
    assert!(p50 > 10.0 * lv3, "lv1 {p50} µs vs lv3 {lv3} µs");
}

#[test]
fn lv2_drains_for_about_one_workgroup() {
    let lv2 = mode("lv2");
    let p50 = lv2.preempt_latency_us.p50.expect("a preemption happened");
    // Train workgroups last 300 µs ± 10 %: a drain waits for the ones running.
    assert!((1.0..=330.0).contains(&p50), "lv2 p50 {p50} µs");
}

#[test]
fn same_scenario_same_bytes() {
    let s = Scenario::default_scenario().unwrap();
    let a = serde_json::to_string(&simulate(&s, &Mode::ALL, &SimOptions::default()).unwrap().0);
    let b = serde_json::to_string(&simulate(&s, &Mode::ALL, &SimOptions::default()).unwrap().0);
    assert_eq!(a.unwrap(), b.unwrap());
    let mut other = s.clone();
    other.seed += 1;
    other.gpu.seed += 1;
    let c = simulate(&other, &[Mode::None], &SimOptions::default())
        .unwrap()
        .0;
    assert_ne!(c.modes[0], default_report().modes[0], "the seed matters");
}

/// Counts submissions, and adds up how far each queue's completions got.
struct CountSubmits(Arc<AtomicU64>, Arc<AtomicU64>, Vec<Seq>);

impl Hooks for CountSubmits {
    fn work_submit(&mut self, queue: QueueId, work: Work, _now: Nanos) {
        match work {
            Work::Submitted { kind, .. } => {
                assert_eq!(kind, OpKind::Kernel);
                self.0.fetch_add(1, Ordering::Relaxed);
            }
            Work::Completed { upto } => {
                let i = queue.0 as usize;
                if self.2.len() <= i {
                    self.2.resize(i + 1, 0);
                }
                assert!(upto > self.2[i], "completions only move forward");
                self.1.fetch_add(upto - self.2[i], Ordering::Relaxed);
                self.2[i] = upto;
            }
        }
    }
}

#[test]
fn scheme_b_calls_the_work_submit_hook_for_every_kernel_and_takes_other_policies() {
    let s = Scenario::default_scenario().unwrap();
    let seen = Arc::new(AtomicU64::new(0));
    let done = Arc::new(AtomicU64::new(0));
    let opts = RunOptions {
        hooks: Some(Box::new(CountSubmits(
            seen.clone(),
            done.clone(),
            Vec::new(),
        ))),
        policy: Some("fifo".into()),
        ..RunOptions::default()
    };
    let run = runner::run(&s, Mode::Lv3, opts).unwrap();
    assert!(run.exactly_once, "{:?}", run.problems);
    assert_eq!(seen.load(Ordering::Relaxed), 150);
    assert_eq!(
        done.load(Ordering::Relaxed),
        150,
        "every completion reached the hook"
    );
}

#[test]
fn traces_have_queue_and_cu_group_tracks_with_markers() {
    let s = Scenario::default_scenario().unwrap();
    let run = runner::run(
        &s,
        Mode::Lv3,
        RunOptions {
            trace: true,
            ..RunOptions::default()
        },
    )
    .unwrap();
    let ev = run.trace.expect("trace kept").to_events(1, "lv3");
    let names: Vec<String> = ev
        .iter()
        .filter(|e| e["ph"] == "M" && e["name"] == "thread_name")
        .map(|e| e["args"]["name"].as_str().unwrap_or("").to_string())
        .collect();
    assert!(names.contains(&"queue train".to_string()));
    assert!(names.contains(&"CU group 7".to_string()));
    assert!(ev.iter().any(|e| e["ph"] == "i" && e["name"] == "preempt"));
    assert!(ev.iter().any(|e| e["ph"] == "i" && e["name"] == "resume"));
    assert!(
        ev.iter()
            .any(|e| e["ph"] == "C" && e["args"]["mqds"] == 2 && e["args"]["hqds"] == 2),
        "MQD/HQD counter track"
    );
    // A preempted kernel is split into parts; every kernel is there once.
    let kernels: std::collections::BTreeSet<(u64, u64)> = ev
        .iter()
        .filter(|e| e["ph"] == "X" && e["tid"].as_u64() < Some(1000))
        .map(|e| {
            (
                e["tid"].as_u64().unwrap(),
                e["args"]["dispatch_id"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(kernels.len(), 150);
}

#[test]
fn scheme_a_detection_delay_never_exceeds_the_check_interval() {
    let base = Scenario::default_scenario().unwrap();
    let interval = base.scheme_a.check_interval_us;
    for offset_us in [15_000.0, 15_001.0, 16_200.0, 17_500.0, 19_999.0] {
        let mut s = base.clone();
        s.tasks[0].kernels = 40;
        s.tasks[1].kernels = 10;
        s.tasks[1].arrival.at_us = offset_us;
        let run = runner::run(&s, Mode::SchemeA, RunOptions::default()).unwrap();
        assert!(run.exactly_once, "{:?}", run.problems);
        let delay = run.tasks[1].detection_delays[0] as f64 / 1000.0;
        assert!(
            (0.0..=interval).contains(&delay),
            "arrival {offset_us}: delay {delay} µs"
        );
        // The next check after arrival is the one that acts.
        let expected = (offset_us / interval).ceil() * interval - offset_us;
        assert!(
            (delay - expected).abs() < 0.01,
            "arrival {offset_us}: {delay} vs {expected}"
        );
    }
}

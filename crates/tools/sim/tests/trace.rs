//! What the trace shows: decisions that count like the table, request arrivals, and kernels
//! split where the hardware took them off.

use std::collections::BTreeMap;
use xpreempt_amd::trace::{KernelSpan, TraceBuf};
use xpreempt_sim::report::{SimOptions, simulate};
use xpreempt_sim::runner::{self, Mode, ModeRun, RunOptions};
use xpreempt_sim::scenario::Scenario;

fn traced(s: &Scenario, mode: Mode) -> (ModeRun, TraceBuf) {
    let mut run = runner::run(
        s,
        mode,
        RunOptions {
            trace: true,
            ..RunOptions::default()
        },
    )
    .unwrap();
    assert!(run.exactly_once, "{mode}: {:?}", run.problems);
    let t = run.trace.take().expect("trace kept");
    (run, t)
}

fn markers(t: &TraceBuf, name: &str) -> Vec<(u32, u64)> {
    t.markers()
        .filter(|m| m.1 == name)
        .map(|m| (m.0, m.2))
        .collect()
}

fn shipped(name: &str) -> Scenario {
    let path = format!("{}/../../../scenarios/{name}", env!("CARGO_MANIFEST_DIR"));
    Scenario::parse(&std::fs::read_to_string(path).unwrap()).unwrap()
}

#[test]
fn preempt_and_resume_markers_count_what_the_table_counts() {
    let bursty = Scenario::parse(
        "name = \"bursty\"\n[[tasks]]\nname = \"bg\"\npriority = 1\ncount = 3\nkernels = 20\n\
         kernel = { workgroups = 200, wg_us = 100.0 }\n\
         [[tasks]]\nname = \"hi\"\npriority = 9\nkernels = 2\n\
         kernel = { workgroups = 80, wg_us = 50.0 }\n\
         arrival = { times_us = [300, 2000, 2100], burst = 2, burst_every_us = 40 }\n",
    )
    .unwrap();
    let mut decided = 0;
    for s in [
        Scenario::default_scenario().unwrap(),
        shipped("multi-tenant.toml"),
        shipped("oversubscribed.toml"),
        bursty,
    ] {
        let opts = SimOptions {
            trace: true,
            ..SimOptions::default()
        };
        let (report, runs) = simulate(&s, &Mode::ALL, &opts).unwrap();
        for (m, r) in report.modes.iter().zip(&runs) {
            let t = r.trace.as_ref().unwrap();
            let what = format!("{} {}", s.name, m.mode);
            assert_eq!(markers(t, "preempt").len() as u64, m.preemptions, "{what}");
            assert_eq!(markers(t, "resume").len() as u64, m.resumes, "{what}");
            decided += m.preemptions;
            // One arrival marker per request, on its task's track.
            let arrivals = markers(t, "arrival");
            for (i, task) in m.tasks.iter().enumerate() {
                let n = arrivals.iter().filter(|a| a.0 == i as u32).count();
                assert_eq!(n, task.requests, "{what} {}", task.name);
            }
        }
    }
    assert!(decided > 10, "the scenarios preempt: {decided}");
}

#[test]
fn arrival_markers_sit_at_the_arrival_times() {
    let s = Scenario::default_scenario().unwrap();
    let (_, t) = traced(&s, Mode::Lv3);
    assert_eq!(markers(&t, "arrival"), [(0, 0), (1, 16_200_000)]);
    // The decision follows the arrival at once; the hardware's own marker is kept apart.
    assert_eq!(markers(&t, "preempt"), [(0, 16_200_000)]);
    assert_eq!(markers(&t, "hw-preempt").len(), 1);
}

/// The kernels of `queue` that have more than one part, by dispatch id.
fn split(t: &TraceBuf, queue: u32) -> BTreeMap<u64, Vec<KernelSpan>> {
    let mut by: BTreeMap<u64, Vec<KernelSpan>> = BTreeMap::new();
    for k in t.kernel_spans().filter(|k| k.queue == queue) {
        by.entry(k.dispatch).or_default().push(k);
    }
    by.retain(|_, parts| parts.len() > 1);
    by
}

#[test]
fn a_preempted_kernel_is_two_spans_with_the_gap_between() {
    // Training kernels of ten rounds of workgroups: the inference request lands mid-kernel,
    // with workgroups still to dispatch, so even DRAIN (lv2) leaves the kernel unfinished.
    let mut s = Scenario::default_scenario().unwrap();
    s.tasks[0].kernels = 20;
    s.tasks[0].kernel.workgroups = 6400;
    for mode in [Mode::SchemeA, Mode::Lv2, Mode::Lv3] {
        let (_, t) = traced(&s, mode);
        let parts = split(&t, 0);
        assert_eq!(
            parts.len(),
            1,
            "{mode}: one train kernel was preempted: {parts:?}"
        );
        let (_, p) = parts.into_iter().next().unwrap();
        assert_eq!(p.len(), 2, "{mode}");
        let (gap_start, gap_end) = (p[0].end, p[1].start);
        assert!(p[0].start < gap_start && gap_start < gap_end && gap_end < p[1].end);
        // The hardware took it off: CWSR stops the waves at once, DRAIN lets them finish
        // (about one 300 µs workgroup later).
        let hw: Vec<u64> = markers(&t, "hw-preempt")
            .into_iter()
            .filter(|m| m.0 == 0)
            .map(|m| m.1)
            .collect();
        assert_eq!(hw.len(), 1, "{mode}");
        let drained = gap_start - hw[0];
        if mode == Mode::Lv2 {
            assert!(
                (100_000..=400_000).contains(&drained),
                "{mode}: {drained} ns"
            );
        } else {
            assert_eq!(drained, 0, "{mode}");
        }
        // It runs again after the resume, and inference ran in the gap.
        let resumed = markers(&t, "hw-resume");
        assert!(
            resumed.iter().any(|&(q, at)| q == 0 && at <= gap_end),
            "{resumed:?}"
        );
        let infer_in_gap = t
            .kernel_spans()
            .filter(|k| k.queue == 1 && k.start >= gap_start && k.end <= gap_end)
            .count();
        assert!(
            infer_in_gap >= 40,
            "{mode}: {infer_in_gap} inference kernels in the gap"
        );
        // Nothing else is split, nor lost.
        let dispatches: std::collections::BTreeSet<(u32, u64)> =
            t.kernel_spans().map(|k| (k.queue, k.dispatch)).collect();
        assert_eq!(dispatches.len(), 70, "{mode}");
        assert_eq!(t.kernel_spans().count(), 71, "{mode}");
    }
    // Lv1 never stops a kernel in flight, and without preemption nothing is split.
    for mode in [Mode::Lv1, Mode::None] {
        let (_, t) = traced(&s, mode);
        assert!(split(&t, 0).is_empty() && split(&t, 1).is_empty(), "{mode}");
        assert_eq!(t.kernel_spans().count(), 70, "{mode}");
    }
}

//! A run that cannot be trusted says so: modes that give up or break exactly-once carry their
//! problems, tasks that completed nothing have no latency (not 0), and the give-up point grows
//! with what the scenario asks of the HWS (many queues, a long quantum) instead of a fixed 1 s.

use xpreempt_sim::report::{SimOptions, simulate};
use xpreempt_sim::runner::{self, Mode, RunOptions};
use xpreempt_sim::scenario::Scenario;

/// Scheme A drains with a 100 µs unmap fence while 3 ms workgroups run: the HWS hangs and the
/// training task never completes in the modes that preempt by draining.
const HANG: &str = "name = \"hang\"\n\
    [gpu]\nunmap_timeout_us = 100.0\n\
    [scheme_a]\ncheck_interval_us = 1000.0\nmode = \"drain\"\n\
    [[tasks]]\nname = \"train\"\npriority = 1\nkernels = 4\n\
    kernel = { workgroups = 2560, wg_us = 3000.0 }\n\
    [[tasks]]\nname = \"infer\"\npriority = 9\nkernels = 2\n\
    kernel = { workgroups = 10, wg_us = 100.0 }\narrival = { at_us = 500.0 }\n";

#[test]
fn a_mode_that_gives_up_lists_its_problems_and_has_no_latency_for_what_never_finished() {
    let s = Scenario::parse(HANG).unwrap();
    let (report, _) = simulate(&s, &[Mode::None, Mode::SchemeA], &SimOptions::default()).unwrap();
    let none = &report.modes[0];
    assert!(none.exactly_once && none.problems.is_empty(), "{none:?}");
    let a = &report.modes[1];
    assert!(!a.exactly_once);
    let train = &a.tasks[0];
    assert_eq!(
        (train.requests, train.latency_us, train.max_latency_us),
        (0, None, None)
    );
    assert!(train.standalone_us.is_some());
    assert_eq!(
        a.latency_ratio, None,
        "no ratio without the low tier's latency"
    );
    let all = a.problems.join("\n");
    for needle in [
        "hung",
        "work still outstanding",
        "task train completed 0 of its 1 requests",
    ] {
        assert!(all.contains(needle), "`{needle}` missing from:\n{all}");
    }
    let failures = report.failures();
    assert!(
        failures.iter().all(|f| f.starts_with("scheme-a: ")),
        "{failures:?}"
    );
    assert_eq!(failures.len(), a.problems.len());
}

/// `n` queues of two small kernels each, one every 10 µs, every tenth at high priority.
fn many_queues(n: usize, quantum_us: f64) -> Scenario {
    let mut text = format!("name = \"many\"\n[gpu]\nquantum_us = {quantum_us}\n");
    for i in 0..n {
        let prio = if i % 10 == 0 { 10 } else { 1 };
        text += &format!(
            "[[tasks]]\nname = \"t{i:04}\"\npriority = {prio}\nprocess = {}\nkernels = 2\n\
             kernel = {{ workgroups = 40, wg_us = 50.0 }}\narrival = {{ at_us = {}.0 }}\n",
            i % 8 + 1,
            i * 10
        );
    }
    Scenario::parse(&text).unwrap()
}

#[test]
fn a_100ms_quantum_over_64_queues_is_waited_for_not_given_up_on() {
    // 64 queues on 32 HQD slots. Queues used to wait a 100 ms quantum for a slot, more than
    // the old bound (serial work, 256 ms, plus 1 s) allowed once lv2 rotated a few times; now
    // idle queues hand their HQD over at once, so no busy queue waits for a quantum.
    let s = many_queues(64, 100_000.0);
    let (report, runs) = simulate(&s, &Mode::ALL, &SimOptions::default()).unwrap();
    for (m, r) in report.modes.iter().zip(&runs) {
        assert!(m.problems.is_empty(), "{}: {:?}", m.mode, m.problems);
        assert!(m.tasks.iter().all(|t| t.requests == 1), "{}", m.mode);
        assert!(
            r.stats.max_hqd_wait_ns < 100_000_000,
            "{}: a queue waited a quantum: {:?}",
            m.mode,
            r.stats
        );
    }
}

#[test]
fn a_thousand_queues_with_a_100ms_quantum_run_to_the_end() {
    // lv1 launches one kernel at a time, so each queue goes idle between kernels. It used to
    // lose its HQD and wait ~32 quanta (1000 queues, 32 slots) for the next, seconds of
    // simulated time; an idle queue's HQD now goes to a busy one at once.
    let s = many_queues(1000, 100_000.0);
    let r = runner::run(&s, Mode::Lv1, RunOptions::default()).unwrap();
    assert!(r.exactly_once && r.problems.is_empty(), "{:?}", r.problems);
    assert!(r.tasks.iter().all(|t| t.latencies.len() == 1));
    assert!(r.end < 1_000_000_000, "queues waited for quanta: {}", r.end);
    assert!(r.stats.idle_unmaps > 0);
}

//! Stream capture under the shim: a capture starts after the buffered work, captured launches
//! pass straight through, a graph launch is one command, and other streams' work during a capture
//! does not break it.

use crate::harness::{Outcome, at_priority, chaos, defaults, everywhere, run, window1};

#[test]
fn a_capture_begins_after_buffered_work_and_a_graph_launch_is_one_command() {
    everywhere("capture", |o| {
        let log = &o.log;
        log.assert_in_order(&[1, 2]);
        let begin = log.position("capture-begin", "").expect("a capture began");
        let submitted = log.position("submit ", "id=2").unwrap();
        assert!(
            submitted < begin,
            "{}: the capture began before kernel 2 reached the driver",
            o.label
        );
        assert_eq!(log.lines_with("captured ").len(), 2, "{}", o.label);
        // 20, the graph (10, 11), 21, the graph again: in this order on the device (one stream:
        // the order they ended in).
        let order: Vec<(i64, u64)> = log
            .done
            .iter()
            .filter(|d| d.kind == 'K' && d.id >= 10)
            .map(|d| (d.id, d.graph))
            .collect();
        assert_eq!(
            order,
            [(20, 0), (10, 1), (11, 1), (21, 0), (10, 2), (11, 2)],
            "{}",
            o.label
        );
    });
}

#[test]
fn work_on_other_streams_during_a_capture_does_not_break_it() {
    everywhere("capture-beside-work", |o| {
        no_capture_broke(o);
        for m in 1..=3 {
            o.log.assert_ran((0..30).map(|j| 1000 * m + j));
            o.log.assert_ran((0..10).map(|j| 1000 * m + 100 + j));
            o.log.assert_ran((0..8).map(|j| 1000 * m + 500 + j));
        }
    });
}

#[test]
fn captures_begun_behind_work_in_many_threads_stay_whole() {
    everywhere("captures-in-threads", no_capture_broke);
}

/// The simulated driver logs a `capture-error` wherever a call broke a capture.
fn no_capture_broke(o: &Outcome) {
    let errors = o.log.lines_with("capture-error");
    assert!(errors.is_empty(), "{}: {errors:?}", o.label);
}

fn graph_in_legacy_order(o: &Outcome) {
    o.log.assert_in_order(&[1, 2, 10, 11, 3]);
    o.log.assert_before(11, 4);
}

/// A graph launched on the legacy stream keeps that stream's order in every mode (buffered and
/// under random suspensions too) and stays at the legacy stream's priority, which cannot change;
/// created streams of a process above priority 0 get its stream priority (the simulated
/// device's range is 0 to -5: -5 at priority 10).
#[test]
fn a_graph_on_the_legacy_stream_keeps_its_order() {
    everywhere("graph-legacy", |o| {
        graph_in_legacy_order(o);
        assert_eq!(o.log.kernel(10).prio, 0, "{}", o.label);
    });
    for config in [defaults(), window1(), chaos(5)] {
        let o = run("graph-legacy", &at_priority(config, 10));
        graph_in_legacy_order(&o);
        let prio = |id| o.log.kernel(id).prio;
        assert_eq!(
            [prio(10), prio(11), prio(1), prio(2), prio(3)],
            [0, 0, -5, 0, 0],
            "{}",
            o.label
        );
    }
}

/// A graph on the legacy stream across a primary context reset: the order holds on both
/// contexts, at every window and under random suspensions.
#[test]
fn a_graph_on_the_legacy_stream_keeps_its_order_across_a_context_reset() {
    let check = |o: &Outcome| {
        o.log.assert_in_order(&[1, 10, 11, 2, 3, 12, 13, 4]);
        let prio = |id| o.log.kernel(id).prio;
        assert_eq!([prio(10), prio(12), prio(2)], [0, 0, 0], "{}", o.label);
    };
    check(&run("graph-legacy-reset", &crate::harness::native()));
    for config in [defaults(), window1(), chaos(6)] {
        check(&run("graph-legacy-reset", &at_priority(config, 10)));
    }
}

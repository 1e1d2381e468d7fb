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
        assert!(
            o.log.lines_with("capture-error").is_empty(),
            "{}: {:?}",
            o.label,
            o.log.lines_with("capture-error")
        );
        for m in 1..=3 {
            o.log.assert_ran((0..30).map(|j| 1000 * m + j));
            o.log.assert_ran((0..10).map(|j| 1000 * m + 100 + j));
            o.log.assert_ran((0..8).map(|j| 1000 * m + 500 + j));
        }
    });
}

fn graph_in_legacy_order(o: &Outcome) {
    o.log.assert_in_order(&[1, 2, 10, 11, 3]);
    o.log.assert_before(11, 4);
}

/// A graph launched on the legacy stream keeps that stream's order in every mode. With
/// `XPREEMPT_GRAPH_PROXY=1` a process above priority 0 runs it at its own stream priority (the
/// simulated device's range is 0 to -5: -3 at priority 5, -5 at 10), buffered and under random
/// suspensions too, while the legacy stream's kernels stay at the legacy stream's priority;
/// without it the graph stays there.
#[test]
fn a_graph_on_the_legacy_stream_keeps_its_order_and_runs_at_the_process_priority() {
    everywhere("graph-legacy", |o| {
        graph_in_legacy_order(o);
        assert_eq!(o.log.kernel(10).prio, 0, "{}", o.label);
    });
    for (priority, want) in [(5, -3), (10, -5)] {
        for mut config in [defaults(), window1(), chaos(5)] {
            config.env.push(("XPREEMPT_GRAPH_PROXY".into(), "1".into()));
            let o = run("graph-legacy", &at_priority(config, priority));
            graph_in_legacy_order(&o);
            let prio = |id| o.log.kernel(id).prio;
            assert_eq!(
                [prio(10), prio(11), prio(1), prio(2), prio(3)],
                [want, want, want, 0, 0],
                "{}",
                o.label
            );
        }
    }
    let o = run("graph-legacy", &at_priority(defaults(), 10));
    graph_in_legacy_order(&o);
    assert_eq!(o.log.kernel(10).prio, 0);
    assert_eq!(
        o.log.kernel(1).prio,
        -5,
        "created streams get the priority anyway"
    );
}

/// The graph proxy and a context reset: the first context's private stream and events go before
/// the context does (the simulated driver reports a use of a destroyed stream as a violation),
/// and the new context's graph gets a private stream of its own.
#[test]
fn a_reset_context_takes_its_graph_proxy_along() {
    let check = |o: &Outcome, want: i64| {
        o.log.assert_in_order(&[1, 10, 11, 2, 3, 12, 13, 4]);
        let prio = |id| o.log.kernel(id).prio;
        assert_eq!(
            [prio(10), prio(12), prio(2)],
            [want, want, 0],
            "{}",
            o.label
        );
    };
    check(&run("graph-legacy-reset", &crate::harness::native()), 0);
    for mut config in [defaults(), window1(), chaos(6)] {
        config.env.push(("XPREEMPT_GRAPH_PROXY".into(), "1".into()));
        check(&run("graph-legacy-reset", &at_priority(config, 10)), -5);
    }
}
